package stats

import (
	"math"
	"reflect"
	"slices"
	"testing"
)

func TestSteadyState(t *testing.T) {
	cases := []struct {
		in   []float64
		want float64
	}{
		{[]float64{5}, 5},
		{[]float64{9, 1}, 1},                           // the first is warm-up
		{[]float64{100, 2, 2, 2, 2}, 2},                // one fifth dropped
		{[]float64{50, 50, 1, 1, 1, 1, 1, 1, 1, 1}, 1}, // two of ten dropped
	}
	for _, c := range cases {
		if got := SteadyState(c.in); got != c.want {
			t.Errorf("SteadyState(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	if !math.IsNaN(SteadyState(nil)) {
		t.Error("SteadyState(nil) should be NaN")
	}
}

func TestSummarize(t *testing.T) {
	got := Summarize([]float64{10, 2, 2, 2, 4}, 64)
	// Steady state drops the first fifth: (2+2+2+4)/4; the mean keeps it.
	want := Summary{SteadyS: 2.5, MeanS: 4, SamplesPerS: 64 / 2.5}
	if got != want {
		t.Errorf("Summarize = %+v, want %+v", got, want)
	}
	empty := Summarize(nil, 64)
	if !math.IsNaN(empty.SteadyS) || !math.IsNaN(empty.MeanS) || !math.IsNaN(empty.SamplesPerS) {
		t.Errorf("Summarize(nil) = %+v, want NaN fields", empty)
	}
}

func TestIntervals(t *testing.T) {
	got := Intervals([]float64{3, 12, 21, 31})
	want := []float64{9, 9, 10}
	if len(got) != len(want) {
		t.Fatalf("Intervals = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("Intervals = %v, want %v", got, want)
		}
	}
	if len(Intervals([]float64{1})) != 0 {
		t.Error("one forward end gives no interval")
	}
}

func TestJobIterationTimes(t *testing.T) {
	got := JobIterationTimes([][]float64{{1, 5, 2}, {3, 4}, {}})
	if want := []float64{3, 5, 2}; !slices.Equal(got, want) {
		t.Errorf("JobIterationTimes = %v, want %v (the slowest worker's, per iteration)", got, want)
	}
	if got := JobIterationTimes(nil); len(got) != 0 {
		t.Errorf("no workers: %v", got)
	}
}

// TestCollectorByHand: backward 0 runs [0, 1] and posts a 100-byte piece at
// 1 that starts at 1.5 and is done at 4; forward 1 computes [3, 5] and ends
// iteration 0 at 5. The span is [0, 5], communication [1.5, 4] (2.5 s), of
// which [3, 4] overlaps compute: overlap 0.4, 100 B x 2.5 s / 5 s = 50 B in
// flight, queueing 0.5 s, goodput 100 B x 0.5 (a ring share) / 5 s.
func TestCollectorByHand(t *testing.T) {
	c := NewCollector(0.5)
	c.Compute(false, 0, 0, 1)
	c.PieceStarted(0, 100, 1, 1.5, 100)
	c.PieceDone(4, 0)
	c.Compute(true, 1, 3, 5) // reported at its end, after the piece finished
	got := c.IterationEnded(0, 5, 5)
	want := Iteration{Iteration: 0, IterationS: 5, ForwardS: 2, BackwardS: 1, SentBytes: 50, GoodputBps: 10,
		QueueDelayS: 0.5, Overlap: 0.4, InFlightBytes: 50, CommS: 2.5, Pieces: 1}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("measured %+v\nwant     %+v", got, want)
	}
}

// TestCollectorPerServer: each server's busy time is the union of the
// intervals it had a shard unanswered, its goodput its bytes over that
// time, its response time the mean push-to-answer whichever shard each
// answer is for, and shards of another iteration stay out.
func TestCollectorPerServer(t *testing.T) {
	c := NewCollector(1)
	c.Servers = 3
	c.Compute(false, 0, 0, 1) // backward 0 opens the span
	// Server 0: two overlapping shards [1,3] and [2,4] -> busy 3 s, 200 B.
	c.ShardPushed(0, 0, 100, 1)
	c.ShardPushed(0, 0, 100, 2)
	c.ShardAnswered(0, 0, 3) // the collector cannot tell which shard
	c.ShardAnswered(0, 0, 4) // each answer is for, nor needs to
	// Server 1: two disjoint shards [1,2] and [5,7] -> busy 3 s, 600 B.
	c.ShardPushed(0, 1, 300, 1)
	c.ShardAnswered(0, 1, 2)
	c.ShardPushed(0, 1, 300, 5)
	c.ShardAnswered(0, 1, 7)
	// Iteration 1's shard on server 0 and an unmatched answer count for
	// nothing here.
	c.ShardPushed(1, 0, 999, 6)
	c.ShardAnswered(0, 2, 6)
	c.Compute(true, 1, 7, 8)
	m := c.IterationEnded(0, 8, 8)
	want := struct{ bytes, busy, goodput, resp []float64 }{
		[]float64{200, 600, 0}, []float64{3, 3, 0}, []float64{200.0 / 3, 200, 0}, []float64{2, 1.5, 0}}
	for i := range 3 {
		if m.ServerBytes[i] != want.bytes[i] || m.ServerBusyS[i] != want.busy[i] ||
			math.Abs(m.ServerGoodputBps[i]-want.goodput[i]) > 1e-12 || m.ServerResponseS[i] != want.resp[i] {
			t.Errorf("server %d: %v B, busy %v s, %v B/s, response %v s; want %v, %v, %v, %v", i,
				m.ServerBytes[i], m.ServerBusyS[i], m.ServerGoodputBps[i], m.ServerResponseS[i],
				want.bytes[i], want.busy[i], want.goodput[i], want.resp[i])
		}
	}
	// A ring job measures no servers.
	r := NewCollector(RingShare(4))
	r.Compute(false, 0, 0, 1)
	if m := r.IterationEnded(0, 1, 1); m.ServerBytes != nil || m.ServerGoodputBps != nil {
		t.Errorf("all-reduce iteration has per-server measurements %+v", m)
	}
}
