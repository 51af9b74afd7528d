package sim

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/autobyte/autobyte/model"
	"github.com/autobyte/autobyte/sched"
)

func toyOptions(t *testing.T, cfg sched.Config) Options {
	t.Helper()
	p, err := model.Get("toy3")
	if err != nil {
		t.Fatal(err)
	}
	return Options{Profile: p, Arch: PS, Workers: 1, Servers: 1, BandwidthBps: 1e6,
		Sched: cfg, Iterations: 10}
}

// TestToy3 reproduces ByteScheduler's documented three-layer example exactly:
// 13 units unscheduled, 9 units with priority, 0.5-unit pieces and one piece
// in flight per direction.
func TestToy3(t *testing.T) {
	cases := []struct {
		name string
		cfg  sched.Config
		want float64
	}{
		{"fifo", sched.Config{}, 13},
		{"bytescheduler", sched.Config{PartitionBytes: 500_000, CreditBytes: 1_000_000, Order: sched.OrderPriority}, 9},
	}
	for _, c := range cases {
		r, err := Run(toyOptions(t, c.cfg))
		if err != nil {
			t.Fatal(err)
		}
		for k, it := range r.IterationTimesS {
			if math.Abs(it-c.want) > 1e-9 {
				t.Errorf("%s: iteration %d took %v s, want %v (all: %v)", c.name, k, it, c.want, r.IterationTimesS)
			}
		}
	}
}

// TestEgressHonoursPriority: a host's egress sends the most urgent queued
// message next, as the runtime's senders do. Backward takes no time, so
// layers 2, 1 and 0 are posted at once; layer 2's push is on the wire
// first, and of the two queued behind it layer 0's leaves before layer
// 1's under priority order, in production order under fifo.
func TestEgressHonoursPriority(t *testing.T) {
	p := &model.Profile{Name: "three", BatchSize: 1, Device: "none", BytesPerParam: 4}
	for l := range 3 {
		p.Layers = append(p.Layers, model.Layer{Name: fmt.Sprint("l", l), Tensors: []model.Tensor{{Name: fmt.Sprint("t", l), Params: 250_000}}})
	}
	for _, c := range []struct {
		cfg  sched.Config
		want []int32
	}{
		{sched.Config{Order: sched.OrderPriority}, []int32{2, 0, 1}},
		{sched.Config{}, []int32{2, 1, 0}},
	} {
		o := Options{Profile: p, Arch: PS, Workers: 1, Servers: 1, BandwidthBps: 1e6, Sched: c.cfg, Iterations: 1}
		var got []int32
		runPushes(t, o, func(_ *simulation, k pieceKey) { got = append(got, k.tensor) })
		if !slices.Equal(got, c.want) {
			t.Errorf("%v: pushes arrived in tensor order %v, want %v", c.cfg.Order, got, c.want)
		}
	}
}

// TestProgressObservesEveryIteration: Progress sees each iteration once, in
// order, with the events handled so far, and the run is the same with it
// as without it.
func TestProgressObservesEveryIteration(t *testing.T) {
	o := toyOptions(t, sched.Config{PartitionBytes: 500_000, CreditBytes: 1_000_000, Order: sched.OrderPriority})
	plain, err := Run(o)
	if err != nil {
		t.Fatal(err)
	}
	var seen []int
	var last int64
	o.Progress = func(k int, events int64) {
		if events < last || events > plain.Events {
			t.Errorf("iteration %d: %d events after %d, of %d in the run", k, events, last, plain.Events)
		}
		seen, last = append(seen, k), events
	}
	watched, err := Run(o)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]int, o.Iterations)
	for k := range want {
		want[k] = k
	}
	if !slices.Equal(seen, want) {
		t.Errorf("Progress saw iterations %v, want %v", seen, want)
	}
	if !slices.Equal(watched.IterationTimesS, plain.IterationTimesS) || watched.Events != plain.Events {
		t.Errorf("watching changed the run: %v (%d events) vs %v (%d)", watched.IterationTimesS, watched.Events, plain.IterationTimesS, plain.Events)
	}
}
