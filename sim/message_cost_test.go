package sim

import (
	"math"
	"slices"
	"testing"

	"github.com/autobyte/autobyte/model"
	"github.com/autobyte/autobyte/sched"
)

// oneTensor is a one-layer profile whose single tensor has bytes bytes
// (fp32), with 0.5 s of forward and of backward compute.
func oneTensor(bytes int64) *model.Profile {
	return &model.Profile{Name: "one", BatchSize: 1, Device: "none", BytesPerParam: 4,
		Layers: []model.Layer{{Name: "l0", ForwardS: 0.5, BackwardS: 0.5, Tensors: []model.Tensor{{Name: "t0", Params: bytes / 4}}}}}
}

// TestMessageCostByHand checks the per-message cost against iteration
// times worked out by hand on a one-tensor job (4 MB at 1 MB/s, 1 ms
// latency, 0.5 s backward and forward), cut into k pieces of s = 4/k MB
// that all start at once (credit 16 MB).
//
// Parameter servers, one worker and one server: the worker's egress sends
// the k pushes back to back, c + s/B each; the server answers each as it
// arrives, its egress busy c + s/B per answer, so the last answer arrives
// (k+1)(c + s/B) + 2L after the backward pass: iteration = 0.5 + (k+1)(c +
// s/B) + 2L + 0.5, that is (k+1)·c more than without the cost.
//
// Ring all-reduce of 4 workers: the followers start the pieces when the
// leader's announcements reach them, one latency L after the leader did;
// each piece occupies the ring for 2(N-1)/N·s/B + 2(N-1)·c and the last
// completes 2(N-1)·L after the ring finished it: iteration = 0.5 + L +
// k(1.5s/B + 6c) + 6L + 0.5, 6k·c more.
func TestMessageCostByHand(t *testing.T) {
	const bw, lat, size = 1e6, 1e-3, 4e6
	for _, c := range []float64{0, 0.01, 0.25} {
		for _, k := range []int64{1, 4} {
			s := size / float64(k) / bw // seconds of bytes per piece
			cfg := sched.Config{PartitionBytes: size / k, CreditBytes: 4 * size, Order: sched.OrderPriority}
			cases := []struct {
				arch             Arch
				workers, servers int
				want             float64
			}{
				{PS, 1, 1, 0.5 + float64(k+1)*(c+s) + 2*lat + 0.5},
				{AllReduce, 4, 0, 0.5 + lat + float64(k)*(1.5*s+6*c) + 6*lat + 0.5},
			}
			for _, tc := range cases {
				o := Options{Profile: oneTensor(size), Arch: tc.arch, Workers: tc.workers, Servers: tc.servers,
					BandwidthBps: bw, LatencyS: lat, MessageCostS: c, Sched: cfg, Iterations: 5}
				r := run(t, o)
				if n := r.Pieces; n != int(k) {
					t.Fatalf("%v k=%d: %d pieces per iteration, want %d", tc.arch, k, n, k)
				}
				for i, it := range r.IterationTimesS {
					if math.Abs(it-tc.want) > 1e-9 {
						t.Errorf("%v, %d pieces, cost %v s: iteration %d took %.12g s, want %.12g", tc.arch, k, c, i, it, tc.want)
					}
				}
			}
		}
	}
}

// TestMessageCostZeroChangesNothing: MessageCostS 0 (the zero value) gives
// the run without it, bit for bit, and the toy example stays exact; a
// positive cost slows every job, the more the more pieces it has, and the
// lower bounds (which ignore the cost) still hold.
func TestMessageCostZeroChangesNothing(t *testing.T) {
	for _, tp := range []topology{{PS, 4, 2}, {AllReduce, 4, 0}} {
		for _, part := range []int64{256_000, 4_000_000} {
			o := job(profile(t, "resnet50"), tp.arch, tp.workers, tp.servers, gbps10)
			o.Sched = sched.Config{PartitionBytes: part, CreditBytes: 16_000_000, Order: sched.OrderPriority}
			base := run(t, o)
			o.MessageCostS = 0
			zero := run(t, o)
			if !slices.Equal(base.IterationTimesS, zero.IterationTimesS) || base.Events != zero.Events {
				t.Errorf("%v partition %d: MessageCostS 0 changed the run: %v vs %v", tp, part, base.IterationTimesS, zero.IterationTimesS)
			}
			o.MessageCostS = 20e-6
			slow := run(t, o)
			if !(slow.IterationTimeS > base.IterationTimeS) {
				t.Errorf("%v partition %d: a 20 us message cost did not slow the job: %v s vs %v s", tp, part, slow.IterationTimeS, base.IterationTimeS)
			}
			for k, it := range slow.IterationTimesS {
				if it < slow.LowerBoundsAt[k].FluidS*(1-rel) {
					t.Errorf("%v partition %d: iteration %d took %v s, below the fluid bound %v s", tp, part, k, it, slow.LowerBoundsAt[k].FluidS)
				}
			}
		}
	}
	o := toyOptions(t, sched.Config{PartitionBytes: 500_000, CreditBytes: 1_000_000, Order: sched.OrderPriority})
	o.MessageCostS = 0
	for k, it := range run(t, o).IterationTimesS {
		if math.Abs(it-9) > 1e-9 {
			t.Errorf("toy3 with MessageCostS 0: iteration %d took %v s, want 9", k, it)
		}
	}
}

// TestMessageCostFavoursLargePieces: with a per-message cost, 256 KB pieces
// lose more than 4 MB pieces where communication is the bottleneck
// (resnet50 at 100 Gbps with compute 20x faster: about 3x the messages).
func TestMessageCostFavoursLargePieces(t *testing.T) {
	for _, tp := range []topology{{PS, 4, 4}, {AllReduce, 8, 0}} {
		slowdown := map[int64]float64{}
		for _, part := range []int64{256_000, 4_000_000} {
			o := job(profile(t, "resnet50").Scaled(0.05), tp.arch, tp.workers, tp.servers, gbps100)
			o.Sched = sched.Config{PartitionBytes: part, CreditBytes: 16_000_000, Order: sched.OrderPriority}
			base := run(t, o).IterationTimeS
			o.MessageCostS = 20e-6
			slowdown[part] = run(t, o).IterationTimeS - base
		}
		if !(slowdown[256_000] > slowdown[4_000_000]) {
			t.Errorf("%v: a 20 us message cost slowed 256 KB pieces by %v s, 4 MB pieces by %v s; want more for the small ones", tp, slowdown[256_000], slowdown[4_000_000])
		}
		t.Logf("%v: a 20 us message cost slows 256 KB pieces by %.3g s, 4 MB pieces by %.3g s", tp, slowdown[256_000], slowdown[4_000_000])
	}
}
