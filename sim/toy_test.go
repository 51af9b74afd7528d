package sim

import (
	"math"
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
