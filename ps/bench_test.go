package ps

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/autobyte/autobyte/cluster"
	"github.com/autobyte/autobyte/proto"
	"github.com/autobyte/autobyte/transport"
)

// Both benchmarks measure what summing in rank order costs against adding
// pushes as they arrive (Server.arrivalOrder), on the same machine in the
// same run: each alternates operations between a rank-order server and an
// arrival-order one, so both see the same load, and reports the median
// time of each (rank-ms, arrival-ms), their ratio (rank/arrival above 1:
// rank order is slower) and the most bytes rank order held at once
// (heldMiB); BenchmarkServe also reports the bytes allocated per
// iteration by each (rank-allocMiB, arrival-allocMiB). Run them with
//
//	go test -run '^$' -bench . -count 5 ./ps/

// abTimes collects the duration of each operation of the two servers.
type abTimes [2][]time.Duration

func (t *abTimes) report(b *testing.B, held int64) {
	med := func(d []time.Duration) float64 {
		d = slices.Clone(d)
		slices.Sort(d)
		return d[len(d)/2].Seconds() * 1e3
	}
	if len(t[0]) == 0 || len(t[1]) == 0 {
		return // fewer than two operations (-benchtime 1x)
	}
	r, a := med(t[0]), med(t[1])
	b.ReportMetric(r, "rank-ms")
	b.ReportMetric(a, "arrival-ms")
	b.ReportMetric(r/a, "rank/arrival")
	b.ReportMetric(float64(held)/(1<<20), "heldMiB")
}

// BenchmarkSum is the summation alone, in memory: one piece of 8 workers'
// 1 MiB pushes taken in rank order or in reverse (rank 0 last, so rank
// order holds 7 of them). Each push is first copied into its receive
// buffer, outside the times, as a reader receives it.
func BenchmarkSum(b *testing.B) {
	const workers, elems = 8, 1 << 18
	for _, pushes := range []string{"inorder", "reverse"} {
		b.Run("pushes="+pushes, func(b *testing.B) {
			order := identity(workers)
			if pushes == "reverse" {
				slices.Reverse(order)
			}
			var srv [2]*Server
			for k := range srv {
				s, err := New(Options{Workers: workers, Logger: quiet})
				if err != nil {
					b.Fatal(err)
				}
				s.arrivalOrder = k == 1
				srv[k] = s
			}
			sent, recv := make([][]byte, workers), make([][]byte, workers)
			for r := range sent {
				v := make([]float32, elems)
				for i := range v {
					v[i] = float32(r*i%1000) * 0.25
				}
				sent[r], recv[r] = encode(v, false), make([]byte, 4*elems)
			}
			var t abTimes
			b.SetBytes(workers * 4 * elems)
			for i := 0; b.Loop(); i++ {
				s := srv[i%2]
				for r := range recv {
					copy(recv[r], sent[r])
				}
				sum, _ := proto.NewShardSum(workers) // workers >= 1
				a := &accum{order: sum}
				start := time.Now()
				for _, r := range order {
					s.take(a, r, recv[r], 0)
				}
				t[i%2] = append(t[i%2], time.Since(start))
			}
			t.report(b, srv[0].heldPeak.Load())
		})
	}
}

// BenchmarkServe is a whole server on loopback: 4 workers each push 16
// pieces of 1 MiB per iteration at once and receive the 16 sums. With
// pushes=same every worker pushes the pieces in the same order, so they
// arrive interleaved as the connections deliver them; with
// pushes=rank0reversed rank 0 pushes them in the opposite order, so it is
// last for the first half of the pieces, the case that makes rank order
// hold buffers. MB/s is the bytes each worker pushes.
func BenchmarkServe(b *testing.B) {
	for _, pushes := range []string{"same", "rank0reversed"} {
		b.Run("pushes="+pushes, func(b *testing.B) {
			const workers, pieces, elems = 4, 16, 1 << 18
			rigs := [2]*benchRig{newBenchRig(b, workers, false), newBenchRig(b, workers, true)}
			payloads := make([][][]byte, workers)
			for r := range payloads {
				payloads[r] = make([][]byte, pieces)
				for k := range payloads[r] {
					v := make([]float32, elems)
					for i := range v {
						v[i] = float32((r+1)*(i%100) + k)
					}
					payloads[r][k] = encode(v, false)
				}
			}
			var t abTimes
			var alloc [2]uint64
			var ms runtime.MemStats
			b.SetBytes(pieces * 4 * elems)
			for i := 0; b.Loop(); i++ {
				runtime.ReadMemStats(&ms)
				a0 := ms.TotalAlloc
				start := time.Now()
				if err := rigs[i%2].iteration(uint32(i/2), payloads, pushes == "rank0reversed"); err != nil {
					b.Fatal(err)
				}
				t[i%2] = append(t[i%2], time.Since(start))
				runtime.ReadMemStats(&ms)
				alloc[i%2] += ms.TotalAlloc - a0
			}
			b.ReportMetric(float64(alloc[0])/float64(len(t[0]))/(1<<20), "rank-allocMiB")
			b.ReportMetric(float64(alloc[1])/float64(len(t[1]))/(1<<20), "arrival-allocMiB")
			b.StopTimer()
			t.report(b, rigs[0].srv.heldPeak.Load())
			for _, r := range rigs {
				r.close(b)
			}
		})
	}
}

// benchRig is a server and its workers' connections on loopback.
type benchRig struct {
	srv   *Server
	conns []*transport.Conn
	serve chan error
	// bufs are the workers' receive buffers, kept across iterations so
	// that allocations are the server's.
	bufs [][]byte
}

func newBenchRig(b *testing.B, workers int, arrival bool) *benchRig {
	srv, err := New(Options{Workers: workers, Mode: AnswerPush, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	srv.arrivalOrder = arrival
	r := &benchRig{srv: srv, serve: make(chan error, 1), bufs: make([][]byte, workers)}
	var server []*transport.Conn
	r.conns, server = connectWorkers(b, workers)
	go func() { r.serve <- srv.Serve(context.Background(), server) }()
	return r
}

// iteration has every worker push its pieces at once and waits for all
// the sums.
func (r *benchRig) iteration(it uint32, payloads [][][]byte, rank0Reversed bool) error {
	var wg sync.WaitGroup
	errs := make(chan error, len(r.conns))
	for rank, c := range r.conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := len(payloads[rank])
			for j := range n {
				k := j
				if rank0Reversed && rank == 0 {
					k = n - 1 - j
				}
				h := transport.Header{Kind: transport.KindPush, Iteration: it, Key: uint32(k), Priority: uint64(k)}
				if err := c.Send(transport.Frame{Header: h, Payload: payloads[rank][k]}); err != nil {
					errs <- fmt.Errorf("worker %d: %w", rank, err)
					return
				}
			}
			for range n {
				f, err := c.RecvInto(r.bufs[rank])
				if err != nil {
					errs <- fmt.Errorf("worker %d: %w", rank, err)
					return
				}
				r.bufs[rank] = f.Payload[:cap(f.Payload)]
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func (r *benchRig) close(b *testing.B) {
	for rank, c := range r.conns {
		if err := c.Send(cluster.ByeFrame(rank)); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-r.serve; err != nil {
		b.Fatal(err)
	}
}
