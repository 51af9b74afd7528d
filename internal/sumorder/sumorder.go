// Package sumorder holds what the tests of order-sensitive reductions
// (allreduce's ring, ps's server) share: float32 values whose sum depends
// on the order of addition, summation in a given order, and a bitwise
// comparison. Only tests use it.
package sumorder

import (
	"math"
	"math/rand/v2"
)

// Pool holds float32 values so far apart in magnitude that the order of
// addition changes their sum: (1e8 + 1) + -1e8 is 0, (1e8 + -1e8) + 1 is 1.
var Pool = []float32{1e8, -1e8, 1, -1, 3, 0.5, 1e-3, 1 << 24, -(1 << 24), 7e7, -3e7, 0.1, 33554431}

// Values returns each of ranks ranks' n values, drawn from Pool by a PCG
// generator seeded with seed and stream: the same arguments give the same
// values.
func Values(seed, stream uint64, ranks, n int) [][]float32 {
	rng := rand.New(rand.NewPCG(seed, stream))
	v := make([][]float32, ranks)
	for r := range v {
		v[r] = make([]float32, n)
		for i := range v[r] {
			v[r][i] = Pool[rng.IntN(len(Pool))]
		}
	}
	return v
}

// InOrder adds vals[order[0]], vals[order[1]], ... element by element,
// left to right: the rank-order sum for order 0..N-1, the arrival-order
// sum for an arrival order.
func InOrder(vals [][]float32, order []int) []float32 {
	s := append([]float32(nil), vals[order[0]]...)
	for _, r := range order[1:] {
		for i, v := range vals[r] {
			s[i] += v
		}
	}
	return s
}

// FirstDiff returns the first element of want whose bits differ in got, or
// -1.
func FirstDiff(got, want []float32) int {
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return i
		}
	}
	return -1
}
