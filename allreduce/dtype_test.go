package allreduce

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/internal/sumorder"
)

// hopSum is the order and rounding the package comment states for 16-bit
// pieces: chunk c leaves rank c as its values rounded to d, and each rank
// after it adds its own float32 values to the partial sums it received and
// rounds the chunk once (float16's scale is the chunk's).
func hopSum(d dtype.DType, vals [][]float32) []float32 {
	size, n := len(vals), len(vals[0])
	out := make([]float32, n)
	for c := range size {
		lo, hi := chunk(n, size, c)
		s := out[lo:hi]
		copy(s, vals[c][lo:hi])
		buf := make([]byte, d.Size()*len(s))
		d.Round(buf, s)
		for j := 1; j < size; j++ {
			for i := range s {
				s[i] = vals[(c+j)%size][lo+i] + s[i]
			}
			d.Round(buf, s)
		}
	}
	return out
}

// TestSixteenBitRing: 16-bit pieces travel in 2 bytes per element and every
// rank ends with the same bits, those of hopSum (the float32 data is not
// 16-bit, so every hop rounds), 1 to 8 ranks, odd piece sizes, values over
// many binades (float16's scale changes hop by hop). Integer data whose
// partial sums all fit the type comes out exact. As a negative control,
// the float32 ring sum of the same data differs from hopSum, so the check
// sees the rounding.
func TestSixteenBitRing(t *testing.T) {
	for _, d := range []dtype.DType{dtype.BF16, dtype.F16} {
		for size := 1; size <= 8; size++ {
			t.Run(fmt.Sprintf("%v/ranks%d", d, size), func(t *testing.T) {
				tr := newRing(t, size)
				defer func() { tr.stop() }()
				sizes := []int{1, 7, 33, 1001}
				rng := rand.New(rand.NewPCG(uint64(size), uint64(d)))
				vals := make([][][]float32, len(sizes)) // piece, rank, element
				exact := make([][][]float32, len(sizes))
				for k, n := range sizes {
					vals[k], exact[k] = make([][]float32, size), make([][]float32, size)
					for r := range size {
						vals[k][r], exact[k][r] = make([]float32, n), make([]float32, n)
						for i := range n {
							vals[k][r][i] = float32(rng.NormFloat64() * math.Ldexp(1, rng.IntN(16)-8))
							exact[k][r][i] = float32((r + i) % 4) // partial sums <= 24: exact in both types
						}
					}
				}
				// Every piece at once, in piece order and priority.
				run := func(in [][][]float32) [][][]float32 {
					return reduceAll(t, tr, d, in, func(int, int) time.Duration { return 0 }, func(_, k int) uint64 { return uint64(k) }, false)
				}
				got := run(vals)
				for k := range sizes {
					want := hopSum(d, vals[k])
					for r := range size {
						if i := sumorder.FirstDiff(got[k][r], want); i >= 0 {
							t.Fatalf("piece %d rank %d element %d: got %v, want %v (the hop-by-hop rounded sum)", k, r, i, got[k][r][i], want[i])
						}
					}
					if size >= 3 && sizes[k] > 30 && sumorder.FirstDiff(ringSum(vals[k]), want) < 0 {
						t.Errorf("negative control: piece %d's float32 ring sum equals the rounded one", k)
					}
				}
				// The tests reuse piece keys: a fresh ring per data set.
				tr.stop()
				tr = newRing(t, size)
				got = run(exact)
				for k := range sizes {
					want := ringSum(exact[k])
					for r := range size {
						if i := sumorder.FirstDiff(got[k][r], want); i >= 0 {
							t.Fatalf("integer piece %d rank %d element %d: got %v, want the exact %v", k, r, i, got[k][r][i], want[i])
						}
					}
				}
			})
		}
	}
}
