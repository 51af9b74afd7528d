package allreduce

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/internal/sumorder"
)

// valuesStream is the PCG stream of this package's sumorder.Values.
const valuesStream = 17

// ringSum is the order the package comment states: element i of chunk c is
// summed along the ring from rank c, ((g_c + g_c+1) + g_c+2) + ... +
// g_c-1, ranks mod size, each rank adding its own value to the partial sum
// it received.
func ringSum(vals [][]float32) []float32 {
	size, n := len(vals), len(vals[0])
	out := make([]float32, n)
	for c := range size {
		lo, hi := chunk(n, size, c)
		for i := lo; i < hi; i++ {
			s := vals[c][i]
			for j := 1; j < size; j++ {
				s = vals[(c+j)%size][i] + s
			}
			out[i] = s
		}
	}
	return out
}

// reduceAll starts every piece on every rank as type d with vals[k][r] as
// rank r's data for piece k, each rank in piece order from its own goroutine after
// sleeping delay(r, k), with priority prio(r, k); when oneAtATime, piece k
// starts only once piece k-1 is done on every rank. It returns every
// rank's result per piece.
func reduceAll(t *testing.T, tr *ring, d dtype.DType, vals [][][]float32, delay func(r, k int) time.Duration, prio func(r, k int) uint64, oneAtATime bool) [][][]float32 {
	t.Helper()
	size := len(tr.rings)
	data := make([][][]float32, len(vals))
	for k := range vals {
		data[k] = make([][]float32, size)
		for r := range size {
			data[k][r] = append([]float32(nil), vals[k][r]...)
		}
	}
	res := make(chan result, size*len(vals))
	// gate[k] is closed once piece k is done on every rank.
	gate := make([]chan struct{}, len(vals))
	left := make([]int, len(vals))
	var mu sync.Mutex
	for k := range gate {
		gate[k], left[k] = make(chan struct{}), size
	}
	for r := range size {
		go func() {
			for k := range vals {
				if oneAtATime && k > 0 {
					<-gate[k-1]
				}
				time.Sleep(delay(r, k))
				tr.rings[r].Start(pieceOf(k, len(vals[k][r])), prio(r, k), d, data[k][r], func(err error) {
					mu.Lock()
					if left[k]--; left[k] == 0 {
						close(gate[k])
					}
					mu.Unlock()
					res <- result{r, k, err}
				})
			}
		}()
	}
	awaitPieces(t, res, size, len(vals), 30*time.Second)
	return data
}

// TestRingOrder: each piece's sum is the ring order that the package
// comment states, bit for bit on every rank, with values whose sum depends
// on the order of addition, whatever the timing: pieces started one at a
// time, or all at once after random delays on every rank with random
// priorities, so frames of many pieces interleave differently each round
// and often arrive before their piece started.
func TestRingOrder(t *testing.T) {
	for _, size := range []int{2, 3, 4, 5, 8} {
		t.Run(fmt.Sprintf("ranks=%d", size), func(t *testing.T) {
			tr := newRing(t, size)
			rng := rand.New(rand.NewPCG(uint64(size), 11))
			vals := make([][][]float32, 30)
			for k := range vals {
				n := 1 + 2*rng.IntN(2500)
				if k%6 == 0 {
					n = 1 + rng.IntN(size) // fewer elements than chunks
				}
				vals[k] = sumorder.Values(uint64(1000*size+k), valuesStream, size, n)
			}
			none := func(int, int) time.Duration { return 0 }
			byPiece := func(_, k int) uint64 { return uint64(k) }
			type round struct {
				name       string
				delay      func(r, k int) time.Duration
				prio       func(r, k int) uint64
				oneAtATime bool
			}
			rounds := []round{
				{"one piece at a time", none, byPiece, true},
				{"all at once", none, byPiece, false},
			}
			for seed := range uint64(3) {
				d := rand.New(rand.NewPCG(seed, uint64(size)))
				delays, prios := make([][]time.Duration, size), make([][]uint64, size)
				for r := range size {
					for range vals {
						delays[r] = append(delays[r], time.Duration(d.IntN(2000))*time.Microsecond)
						prios[r] = append(prios[r], d.Uint64N(8))
					}
				}
				rounds = append(rounds, round{fmt.Sprintf("random delays and priorities %d", seed),
					func(r, k int) time.Duration { return delays[r][k] },
					func(r, k int) uint64 { return prios[r][k] }, false})
			}
			for _, round := range rounds {
				got := reduceAll(t, tr, dtype.F32, vals, round.delay, round.prio, round.oneAtATime)
				for k := range vals {
					want := ringSum(vals[k])
					for r := range size {
						if i := sumorder.FirstDiff(got[k][r], want); i >= 0 {
							col := make([]float32, size)
							for q := range size {
								col[q] = vals[k][q][i]
							}
							t.Fatalf("%s: rank %d piece %d (%d elements): element %d = %v, ring-order sum is %v (values by rank %v)",
								round.name, r, k, len(want), i, got[k][r][i], want[i], col)
						}
					}
				}
			}
		})
	}
}

// TestRingOrderIsSensitive is the negative control of TestRingOrder: for
// its values, summing a piece in another order of the ranks (rank order,
// or a random one, as a timing-dependent reduction would) gives other
// bits than the ring order in most cases from 3 ranks on, so TestRingOrder
// would catch a reduction whose order changed. With 2 ranks every order
// gives the same bits (addition is commutative), and the ring order is
// also rank order.
func TestRingOrderIsSensitive(t *testing.T) {
	for _, size := range []int{2, 3, 4, 5, 8} {
		const n = 301
		vals := sumorder.Values(uint64(size), valuesStream, size, n)
		ring := ringSum(vals)
		rng := rand.New(rand.NewPCG(uint64(size), 3))
		rankOrder := make([]int, size)
		for i := range rankOrder {
			rankOrder[i] = i
		}
		differ, tries := 0, 100
		for j := range tries {
			perm := rankOrder
			if j > 0 {
				perm = rng.Perm(size)
			}
			if sumorder.FirstDiff(sumorder.InOrder(vals, perm), ring) >= 0 {
				differ++
			}
		}
		rankDiffers := sumorder.FirstDiff(sumorder.InOrder(vals, rankOrder), ring) >= 0
		switch {
		case size == 2 && differ != 0:
			t.Errorf("2 ranks: %d of %d orders give other bits than the ring; addition is commutative, so none should", differ, tries)
		case size >= 3 && (!rankDiffers || 2*differ < tries):
			t.Errorf("%d ranks: rank order differs from ring order: %v; %d of %d orders differ: the values do not make TestRingOrder sensitive to order", size, rankDiffers, differ, tries)
		}
		t.Logf("%d ranks: %d of %d orders (the first rank order) give other bits than the ring order", size, differ, tries)
	}
}
