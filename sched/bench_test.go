package sched

import (
	"fmt"
	"testing"
)

const (
	benchPiece   = 256 * kib // partition size
	benchPieces  = 10        // pieces per task
	benchBacklog = 200       // ready pieces waiting behind the window
	benchTensors = 50        // tensors per iteration
)

// benchTasks returns a generator of distinct tasks of n pieces each, in
// training order: iterations ascending, last layer first within one.
func benchTasks(n int64) func() Task {
	i := 0
	return func() Task {
		t := Task{
			Iteration: i / benchTensors,
			Tensor:    i % benchTensors,
			Layer:     benchTensors - 1 - i%benchTensors,
			Bytes:     n * benchPiece,
		}
		i++
		return t
	}
}

// BenchmarkDecision measures one scheduling decision in steady state: each
// op posts a task of 10 pieces, calls Next until it declines and reports
// each started piece done. The credit admits exactly 10 pieces, so the
// ready queue stays at 200 pieces throughout. ns/decision is the op's
// whole cost (Post, Next including the declining call, Done) divided by
// the pieces started.
func BenchmarkDecision(b *testing.B) {
	for _, adm := range []Admission{AdmitPositive, AdmitStrict} {
		for _, order := range []Order{OrderFIFO, OrderPriority} {
			b.Run(fmt.Sprintf("%v/%v", adm, order), func(b *testing.B) {
				benchDecision(b, Config{
					PartitionBytes: benchPiece,
					CreditBytes:    benchPieces * benchPiece,
					Order:          order,
					Admission:      adm,
				})
			})
		}
	}
}

func benchDecision(b *testing.B, cfg Config) {
	s, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	next := benchTasks(benchPieces)
	for range benchBacklog / benchPieces {
		if err := s.Post(next()); err != nil {
			b.Fatal(err)
		}
	}
	started := make([]PieceID, 0, 2*benchPieces)
	decisions := 0
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Post(next()); err != nil {
			b.Fatal(err)
		}
		started = started[:0]
		for {
			p, ok := s.Next()
			if !ok {
				break
			}
			started = append(started, p.PieceID)
		}
		for _, id := range started {
			if _, err := s.Done(id); err != nil {
				b.Fatal(err)
			}
		}
		decisions += len(started)
	}
	// The measurement is only meaningful if the steady state held.
	if s.Queued() != benchBacklog || decisions != b.N*benchPieces {
		b.Fatalf("queued %d, %d decisions in %d ops: not the intended steady state", s.Queued(), decisions, b.N)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(decisions), "ns/decision")
}

// BenchmarkPostPartition measures Post alone: partitioning a task and
// queueing its pieces. The scheduler is drained (off the clock) whenever its
// ready queue grows past a few thousand pieces, so heap depth stays
// realistic and its storage is reused as in a long run.
func BenchmarkPostPartition(b *testing.B) {
	for _, n := range []int64{1, 10, 100} {
		b.Run(fmt.Sprintf("pieces=%d", n), func(b *testing.B) {
			cfg := Config{PartitionBytes: benchPiece, CreditBytes: 4 * benchPiece, Order: OrderPriority}
			s, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			next := benchTasks(n)
			b.ReportAllocs()
			for b.Loop() {
				if s.Queued() > 4096 {
					b.StopTimer()
					drain(b, s)
					b.StartTimer()
				}
				if err := s.Post(next()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(int64(b.N)*n), "ns/piece")
		})
	}
}

// drain starts and finishes every queued piece.
func drain(b *testing.B, s *Scheduler) {
	for s.Queued() > 0 {
		p, ok := s.Next()
		if !ok {
			b.Fatal("Next declined with nothing in flight")
		}
		if _, err := s.Done(p.PieceID); err != nil {
			b.Fatal(err)
		}
	}
}
