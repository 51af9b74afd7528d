package allreduce

import (
	"sync"
	"testing"
	"time"

	"github.com/autobyte/autobyte/dtype"
)

// BenchmarkRing4x64MiB: 4 ranks on loopback all-reduce 64 pieces of 1 MiB
// each per iteration, all started at once on every rank. The reported
// throughput (MB/s) is per rank: the bytes of data each rank all-reduces.
func BenchmarkRing4x64MiB(b *testing.B) {
	const size, pieces, elems = 4, 64, 1 << 18 // 1 MiB of float32
	tr := newRing(b, size)
	data := make([][][]float32, size)
	for r := range size {
		data[r] = make([][]float32, pieces)
		for k := range pieces {
			data[r][k] = make([]float32, elems)
			for i := range data[r][k] {
				data[r][k][i] = float32(i % 7)
			}
		}
	}
	b.SetBytes(pieces * elems * 4)
	b.ResetTimer()
	start := time.Now()
	for it := 0; b.Loop(); it++ {
		var wg sync.WaitGroup
		errs := make(chan error, size*pieces)
		for r := range size {
			for k := range pieces {
				wg.Add(1)
				p := pieceOf(k, elems)
				p.Iteration = it
				tr.rings[r].Start(p, uint64(k), dtype.F32, data[r][k], func(err error) {
					if err != nil {
						errs <- err
					}
					wg.Done()
				})
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
	}
	el := time.Since(start).Seconds()
	n := float64(b.N)
	b.ReportMetric(n*pieces*elems*4/el/(1<<20), "MiB/s/rank")
	b.ReportMetric(n*pieces*elems*4*2*(size-1)/size/el/(1<<20), "wireMiB/s/rank")
}
