package ps

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/transport"
)

// pushAs sends vals as rank's push of p in type d, with the scale d picks,
// and returns the values as sent (rounded to d).
func (r *rig) pushAs(rank int, p piece, d dtype.DType, vals []float32) []float32 {
	r.t.Helper()
	sent := append([]float32(nil), vals...)
	b := make([]byte, d.Size()*len(sent))
	exp := d.Round(b, sent)
	h := p.header(transport.KindPush)
	h.Elem, h.Scale = uint8(d), int8(exp)
	if err := r.workers[rank].Send(transport.Frame{Header: h, Payload: b}); err != nil {
		r.t.Fatalf("worker %d push %v: %v", rank, p, err)
	}
	return sent
}

// halfUlp is half the spacing of d's values just above 1: 1 + halfUlp is a
// tie that rounds to even, back to 1.
func halfUlp(d dtype.DType) float32 {
	if d == dtype.BF16 {
		return 1.0 / 256 // 7 fraction bits
	}
	return 1.0 / 2048 // 10 fraction bits
}

// TestSixteenBitSumsRoundOnce: pushes of 16-bit values are summed in
// float32, in rank order, and rounded once to the pushes' type. Element 0
// is 1 from worker 0 and half an ulp of 1 from every other worker: the
// float32 sum 1 + (n-1)/2 ulp rounds to a value above 1 from 3 workers on,
// where summing in the 16-bit type (1 + half an ulp is a tie that rounds
// back to 1, n-1 times) stays at 1 — the answer must be the former. The
// other elements are random over many binades, so float16's scale and
// every rounding case are exercised; 1 to 8 workers, odd piece sizes, both
// protocols.
func TestSixteenBitSumsRoundOnce(t *testing.T) {
	for _, d := range []dtype.DType{dtype.BF16, dtype.F16} {
		for _, n := range []int{1, 2, 3, 5, 8} {
			for ei, elems := range []int{1, 7, 33} {
				mode := Mode((ei + n) % 2)
				t.Run(fmt.Sprintf("%v/workers%d/elems%d/mode%d", d, n, elems, mode), func(t *testing.T) {
					r := newRig(t, n, mode)
					p := piece{key: 3, piece: 1, offset: uint64(d.Size() * 5), elems: elems}
					rng := rand.New(rand.NewPCG(uint64(n), uint64(elems)))
					sent := make([][]float32, n)
					for _, rank := range rng.Perm(n) {
						vals := make([]float32, elems)
						for i := range vals {
							vals[i] = float32(rng.NormFloat64() * math.Ldexp(1, rng.IntN(20)-10))
						}
						vals[0] = halfUlp(d)
						if rank == 0 {
							vals[0] = 1
						}
						sent[rank] = r.pushAs(rank, p, d, vals)
						if mode == SeparatePull {
							r.pull(rank, p)
						}
					}
					want := make([]float32, elems)
					for rank := range n { // rank order, in float32
						for i, v := range sent[rank] {
							want[i] += v
						}
					}
					wantBytes := make([]byte, d.Size()*elems)
					wantExp := d.Round(wantBytes, want)
					stepwise := float32(1)
					for range n - 1 {
						v := []float32{stepwise + halfUlp(d)}
						d.Round(make([]byte, 2), v)
						stepwise = v[0]
					}
					if n >= 3 && (want[0] <= 1 || stepwise != 1) {
						t.Fatalf("test data: float32 sum rounds to %v, stepwise %v; want above 1 and 1", want[0], stepwise)
					}
					for rank := range n {
						f := r.next(rank)
						if f.Kind != transport.KindAggregate || dtype.DType(f.Elem) != d || int(f.Scale) != wantExp || f.Offset != p.offset {
							t.Fatalf("worker %d: answer %v elem %d scale %d offset %d; want aggregate, %v, scale %d, offset %d", rank, f.Kind, f.Elem, f.Scale, f.Offset, d, wantExp, p.offset)
						}
						got := make([]float32, elems)
						d.Decode(got, f.Payload, int(f.Scale))
						for i := range got {
							if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
								t.Fatalf("worker %d element %d: got %v, want the float32 sum rounded once, %v", rank, i, got[i], want[i])
							}
						}
					}
				})
			}
		}
	}
}

// TestMixedElementTypesRefused: a piece pushed as float32 by one worker and
// as bfloat16 by another is a protocol error that names both; an unknown
// element type is refused with its value.
func TestMixedElementTypesRefused(t *testing.T) {
	p := piece{key: 4, elems: 8}
	r := newRig(t, 2, AnswerPush)
	r.pushAs(0, p, dtype.F32, make([]float32, 8))
	r.barrier(piece{key: 99, elems: 1})
	r.pushAs(1, piece{key: 4, elems: 16}, dtype.BF16, make([]float32, 16)) // 32 bytes, as float32's 8
	err := r.wait(2 * time.Second)
	if err == nil || !contains(err.Error(), "bfloat16", "float32", "worker 1") {
		t.Errorf("mixed types: Serve = %v, want it to name bfloat16, float32 and worker 1", err)
	}

	r = newRig(t, 2, AnswerPush)
	h := p.header(transport.KindPush)
	h.Elem = 7
	_ = r.workers[0].Send(transport.Frame{Header: h, Payload: make([]byte, 8)})
	err = r.wait(2 * time.Second)
	if err == nil || !contains(err.Error(), "element type 7", "worker 0") {
		t.Errorf("unknown type: Serve = %v, want it to name element type 7 and worker 0", err)
	}

	r = newRig(t, 2, AnswerPush)
	h = p.header(transport.KindPush)
	h.Elem = uint8(dtype.F16)
	_ = r.workers[1].Send(transport.Frame{Header: h, Payload: make([]byte, 5)})
	err = r.wait(2 * time.Second)
	if err == nil || !contains(err.Error(), "5 bytes", "float16") {
		t.Errorf("odd length: Serve = %v, want it to name 5 bytes and float16", err)
	}
}

func contains(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
