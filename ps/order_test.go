package ps

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/autobyte/autobyte/internal/sumorder"
	"github.com/autobyte/autobyte/proto"
	"github.com/autobyte/autobyte/transport"
)

// valuesStream is the PCG stream of this package's sumorder.Values.
const valuesStream = 99

func identity(n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	return p
}

// arrivalOrders returns every order of n ranks when there are at most max,
// otherwise max of them: rank order, its reverse, rank 0 last, rank 0
// first with the rest reversed, and random ones.
func arrivalOrders(n, max int, rng *rand.Rand) [][]int {
	var all [][]int
	var gen func(p []int, k int)
	gen = func(p []int, k int) {
		if len(all) > max {
			return
		}
		if k == len(p) {
			all = append(all, append([]int(nil), p...))
			return
		}
		for i := k; i < len(p); i++ {
			p[k], p[i] = p[i], p[k]
			gen(p, k+1)
			p[k], p[i] = p[i], p[k]
		}
	}
	gen(identity(n), 0)
	if len(all) <= max {
		return all
	}
	rev := identity(n)
	for i := range rev {
		rev[i] = n - 1 - i
	}
	last := append(identity(n)[1:], 0)
	firstRev := append([]int{0}, rev[:n-1]...)
	out := [][]int{identity(n), rev, last, firstRev}
	for len(out) < max {
		out = append(out, rng.Perm(n))
	}
	return out
}

// encode returns v as wire bytes, at an odd address when unaligned so that
// the server cannot view them as float32s and sums in a pooled accumulator.
func encode(v []float32, unaligned bool) []byte {
	if !unaligned {
		b := make([]byte, 4*len(v))
		transport.PutFloat32s(b, v)
		return b
	}
	b := make([]byte, 4*len(v)+1)[1:]
	transport.PutFloat32s(b, v)
	return b
}

// pushAll has the server's summation take vals in the given arrival order,
// as push does once a push is checked, and returns the sum and the most
// bytes held at once. A buffer the server did not keep is overwritten with
// NaNs at once, as the reader reuses it, so a server that kept reading
// one would sum garbage.
func pushAll(t *testing.T, s *Server, vals [][]float32, order []int, unaligned bool) (sum []float32, peak int64) {
	t.Helper()
	shard, err := proto.NewShardSum(len(vals))
	if err != nil {
		t.Fatal(err)
	}
	a := &accum{order: shard}
	bufs := make([][]byte, len(vals))
	for _, r := range order {
		bufs[r] = encode(vals[r], unaligned)
		kept := s.take(a, r, bufs[r], 0)
		if wantKept := r == 0 || a.order.Next() <= r; !s.arrivalOrder && kept != wantKept {
			t.Fatalf("%d workers, order %v: take of rank %d reported kept=%v, want %v", len(vals), order, r, kept, wantKept)
		}
		if !kept {
			for i := 0; i+4 <= len(bufs[r]); i += 4 {
				copy(bufs[r][i:], []byte{0, 0, 0xc0, 0x7f}) // a NaN
			}
		}
	}
	if !a.complete {
		t.Fatalf("%d workers, order %v: piece not complete after every push", len(vals), order)
	}
	sum = make([]float32, len(vals[0]))
	transport.Float32s(sum, a.result)
	return sum, s.heldPeak.Load()
}

// wantPeak is the most pushes held at once for an arrival order: those
// that arrived before some lower rank.
func wantPeak(order []int) int {
	arrived := make([]bool, len(order))
	next, peak := 0, 0
	for k, r := range order {
		arrived[r] = true
		for next < len(order) && arrived[next] {
			next++
		}
		peak = max(peak, k+1-next)
	}
	return peak
}

// TestRankOrderSums: whatever order the pushes of 1-8 workers arrive in,
// the sum is the rank-order sum bit for bit, the server holds exactly the
// pushes that arrived before a lower rank's (never more than Workers-1)
// and releases them all. Odd piece sizes; pushes the server can view as
// float32s and pushes it must decode.
func TestRankOrderSums(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for w := 1; w <= 8; w++ {
		for _, n := range []int{1, 3, 17, 301} {
			for _, unaligned := range []bool{false, true} {
				vals := sumorder.Values(uint64(100*w+n), valuesStream, w, n)
				want := sumorder.InOrder(vals, identity(w))
				for _, order := range arrivalOrders(w, 150, rng) {
					s, err := New(Options{Workers: w, Logger: quiet})
					if err != nil {
						t.Fatal(err)
					}
					got, peak := pushAll(t, s, vals, order, unaligned)
					if i := sumorder.FirstDiff(got, want); i >= 0 {
						t.Fatalf("%d workers, %d elements (unaligned %v), arrival order %v: element %d = %v, rank-order sum is %v (values %v)",
							w, n, unaligned, order, i, got[i], want[i], column(vals, i))
					}
					if wp := int64(wantPeak(order) * 4 * n); peak != wp || peak > int64((w-1)*4*n) {
						t.Fatalf("%d workers, %d elements, arrival order %v: held at most %d bytes, want %d (at most Workers-1 = %d pushes of %d bytes)",
							w, n, order, peak, wp, w-1, 4*n)
					}
					if h := s.held.Load(); h != 0 {
						t.Fatalf("%d workers, arrival order %v: %d bytes still held after the piece completed", w, order, h)
					}
				}
			}
		}
	}
}

func column(vals [][]float32, i int) []float32 {
	c := make([]float32, len(vals))
	for r := range vals {
		c[r] = vals[r][i]
	}
	return c
}

// TestArrivalOrderIsCaught is the negative control of TestRankOrderSums:
// a server that adds pushes as they arrive gives the arrival-order sum,
// which for these values differs from the rank-order sum in most orders
// of 3 or more workers, so the check above fails on arrival-order
// summation. With 1 or 2 workers every order gives the same bits
// (addition is commutative), which is why order matters only from 3 on.
func TestArrivalOrderIsCaught(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for w := 1; w <= 8; w++ {
		const n = 17
		vals := sumorder.Values(uint64(100*w+n), valuesStream, w, n)
		want := sumorder.InOrder(vals, identity(w))
		orders := arrivalOrders(w, 150, rng)
		differ := 0
		for _, order := range orders {
			s, err := New(Options{Workers: w, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			s.arrivalOrder = true
			got, peak := pushAll(t, s, vals, order, false)
			if i := sumorder.FirstDiff(got, sumorder.InOrder(vals, order)); i >= 0 {
				t.Fatalf("arrival-order server, %d workers, order %v: element %d = %v, arrival-order sum is %v", w, order, i, got[i], sumorder.InOrder(vals, order)[i])
			}
			if peak != 0 {
				t.Fatalf("arrival-order server held %d bytes", peak)
			}
			if sumorder.FirstDiff(got, want) >= 0 {
				differ++
			}
		}
		switch {
		case w <= 2 && differ != 0:
			t.Errorf("%d workers: %d of %d arrival orders give other bits than rank order; addition is commutative, so none should", w, differ, len(orders))
		case w >= 3 && 2*differ < len(orders):
			t.Errorf("%d workers: only %d of %d arrival orders give other bits than rank order: the values do not make the check sensitive to order", w, differ, len(orders))
		}
		t.Logf("%d workers: arrival-order sums differ from rank order in %d of %d orders", w, differ, len(orders))
	}
}

// wirePieces are the pieces of the over-the-wire tests for iteration it:
// a whole piece, three shards of one piece at their offsets, and one
// element; all odd sizes.
func wirePieces(it uint32) []piece {
	return []piece{
		{iter: it, key: 0, piece: 0, elems: 301, prio: 5},
		{iter: it, key: 1, piece: 2, aux: 0, offset: 800, elems: 7, prio: 3},
		{iter: it, key: 1, piece: 2, aux: 1, offset: 828, elems: 7, prio: 3},
		{iter: it, key: 1, piece: 2, aux: 2, offset: 856, elems: 3, prio: 3},
		{iter: it, key: 2, piece: 0, elems: 1, prio: 9},
	}
}

// wireValues are every rank's values for piece p.
func wireValues(w int, p piece) [][]float32 {
	return sumorder.Values(uint64(p.iter)<<32|uint64(p.key)<<16|uint64(p.piece)<<8|uint64(p.aux), valuesStream, w, p.elems)
}

// pushInOrder has the workers push every piece of wirePieces(it) one
// worker after the other in the given order, each after the server handled
// the previous one's pushes (Stats counts a push's bytes once it is
// summed or held), so the server sees exactly that arrival order; then, in
// pull mode, every worker pulls.
func (r *rig) pushInOrder(it uint32, order []int) {
	r.t.Helper()
	pieces := wirePieces(it)
	w := len(r.workers)
	_, base := r.srv.Stats()
	for _, rank := range order {
		for _, p := range pieces {
			b := encode(wireValues(w, p)[rank], false)
			base += int64(len(b))
			if err := r.workers[rank].Send(transport.Frame{Header: p.header(transport.KindPush), Payload: b}); err != nil {
				r.t.Fatalf("worker %d push %v: %v", rank, p, err)
			}
		}
		deadline := time.Now().Add(5 * time.Second)
		for _, in := r.srv.Stats(); in < base; _, in = r.srv.Stats() {
			if time.Now().After(deadline) {
				r.t.Fatalf("server handled %d bytes of pushes within 5 s, want %d (worker %d's pushes of iteration %d)", in, base, rank, it)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	if r.mode == SeparatePull {
		for rank := range w {
			for _, p := range pieces {
				r.pull(rank, p)
			}
		}
	}
}

// answers collects every worker's answers to wirePieces(it) and returns,
// per piece (in wirePieces order), worker 0's sum, after checking that
// every worker got the same bits with the right header.
func (r *rig) answers(it uint32) [][]float32 {
	r.t.Helper()
	pieces := wirePieces(it)
	out := make([][]float32, len(pieces))
	for rank := range r.workers {
		for range pieces {
			f := r.next(rank)
			k := -1
			for i, p := range pieces {
				if p.iter == f.Iteration && p.key == f.Key && p.piece == f.Piece && p.aux == f.Aux {
					k = i
				}
			}
			if k < 0 || f.Kind != transport.KindAggregate || f.Offset != pieces[k].offset || f.Priority != pieces[k].prio || int(f.Length) != 4*pieces[k].elems {
				r.t.Fatalf("worker %d: unexpected answer %+v for iteration %d", rank, f.Header, it)
			}
			sum := make([]float32, pieces[k].elems)
			transport.Float32s(sum, f.Payload)
			if out[k] == nil {
				out[k] = sum
			} else if i := sumorder.FirstDiff(sum, out[k]); i >= 0 {
				r.t.Fatalf("worker %d: %v element %d = %v, another worker got %v", rank, pieces[k], i, sum[i], out[k][i])
			}
		}
	}
	return out
}

// TestRankOrderOverTheWire: real servers for 1-8 workers, in both modes,
// answer the rank-order sum bit for bit whatever order the workers'
// pushes arrive in, for whole pieces and shards. Its negative control is
// the same run against an arrival-order server, whose answers are the
// arrival-order sums and differ from rank order.
func TestRankOrderOverTheWire(t *testing.T) {
	for _, w := range []int{1, 2, 3, 5, 8} {
		for _, mode := range []Mode{AnswerPush, SeparatePull} {
			for _, arrival := range []bool{false, true} {
				t.Run(fmt.Sprintf("workers%d/mode%d/arrival=%v", w, mode, arrival), func(t *testing.T) {
					r := newRigWith(t, context.Background(), w, mode, func(s *Server) { s.arrivalOrder = arrival })
					orders := arrivalOrders(w, 6, rand.New(rand.NewPCG(uint64(w), 5)))
					differ := 0
					for it, order := range orders {
						r.pushInOrder(uint32(it), order)
						for k, got := range r.answers(uint32(it)) {
							p := wirePieces(uint32(it))[k]
							vals := wireValues(w, p)
							rank := sumorder.InOrder(vals, identity(w))
							want, what := rank, "rank-order"
							if arrival {
								want, what = sumorder.InOrder(vals, order), "arrival-order"
							}
							if i := sumorder.FirstDiff(got, want); i >= 0 {
								t.Fatalf("arrival order %v: %v element %d = %v, %s sum is %v (values %v)", order, p, i, got[i], what, want[i], column(vals, i))
							}
							if sumorder.FirstDiff(got, rank) >= 0 {
								differ++
							}
						}
					}
					if arrival && w >= 3 && differ == 0 {
						t.Errorf("no arrival-order answer of %d orders differs from the rank-order sum: the check would not catch arrival-order summation", len(orders))
					}
					if err := r.bye(); err != nil {
						t.Fatal(err)
					}
				})
			}
		}
	}
}

// TestRankOrderConcurrent: workers push many pieces (whole and sharded,
// odd sizes, several iterations) at once, each in its own random order
// with random pauses, and every answer is the rank-order sum bit for bit;
// the server holds no more than Workers-1 pushes per piece and nothing
// once every piece is answered.
func TestRankOrderConcurrent(t *testing.T) {
	for _, w := range []int{3, 4, 7} {
		for _, mode := range []Mode{AnswerPush, SeparatePull} {
			t.Run(fmt.Sprintf("workers%d/mode%d", w, mode), func(t *testing.T) {
				r := newRig(t, w, mode)
				rng := rand.New(rand.NewPCG(uint64(w), uint64(mode)))
				var pieces []piece
				var bound int64
				for it := range uint32(3) {
					for key := range uint32(8) {
						n := 1 + 2*rng.IntN(1500)
						if key%3 == 0 { // sharded: three shards of one piece
							for aux := range uint32(3) {
								pieces = append(pieces, piece{iter: it, key: key, aux: aux, offset: uint64(aux) * 4 * uint64(n), elems: n, prio: uint64(key)})
							}
						} else {
							pieces = append(pieces, piece{iter: it, key: key, elems: n, prio: uint64(key)})
						}
					}
				}
				for _, p := range pieces {
					bound += int64((w - 1) * 4 * p.elems)
				}
				var wg sync.WaitGroup
				for rank := range w {
					order := rng.Perm(len(pieces))
					pause := rand.New(rand.NewPCG(uint64(rank), 8))
					wg.Add(1)
					go func() {
						defer wg.Done()
						for _, i := range order {
							p := pieces[i]
							// Send never blocks; errors fail below as missing answers.
							_ = r.workers[rank].Send(transport.Frame{Header: p.header(transport.KindPush), Payload: encode(wireValues(w, p)[rank], false)})
							if mode == SeparatePull {
								_ = r.workers[rank].Send(transport.Frame{Header: p.header(transport.KindPull)})
							}
							if pause.IntN(4) == 0 {
								time.Sleep(time.Duration(pause.IntN(300)) * time.Microsecond)
							}
						}
					}()
				}
				wg.Wait()
				for rank := range w {
					for range pieces {
						f := r.next(rank)
						p := findPiece(t, pieces, f.Header)
						got := make([]float32, p.elems)
						transport.Float32s(got, f.Payload)
						vals := wireValues(w, p)
						want := sumorder.InOrder(vals, identity(w))
						if i := sumorder.FirstDiff(got, want); i >= 0 {
							t.Fatalf("worker %d: %v element %d = %v, rank-order sum is %v (values %v)", rank, p, i, got[i], want[i], column(vals, i))
						}
					}
				}
				if err := r.bye(); err != nil {
					t.Fatal(err)
				}
				if h, peak := r.srv.held.Load(), r.srv.heldPeak.Load(); h != 0 || peak > bound {
					t.Errorf("held %d bytes after every answer (want 0), at most %d (bound: Workers-1 pushes of every piece, %d)", h, peak, bound)
				}
				t.Logf("held at most %d bytes of pushes (%d bytes pushed per worker)", r.srv.heldPeak.Load(), bound/int64(w-1))
			})
		}
	}
}
