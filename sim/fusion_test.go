package sim

import (
	"testing"

	schedpkg "github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/tune"
)

// runAutoByte runs job o under a new AutoByte tuner with opts.
func runAutoByte(t *testing.T, o Options, opts tune.AutoByteOptions) *Result {
	t.Helper()
	tn, err := tune.NewAutoByte(opts)
	if err != nil {
		t.Fatal(err)
	}
	o.Tuner = tn
	r, err := Run(o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestTunerChoosesFusion: the autobyte tuner allowed to fuse (--fusion
// auto) turns fusion on where messages are costly (ResNet-50's 161
// tensors, most of them small, at 200 µs per message) and ends faster
// than without the knob; where messages cost nothing it tries fusion,
// finds it no faster and ends without; not allowed, it never changes the
// fusion in force, pinned on or off, while it tunes partition and credit.
func TestTunerChoosesFusion(t *testing.T) {
	p := profile(t, "resnet50")
	const fuse = 1 << 20
	base := schedpkg.Config{PartitionBytes: 4_000_000, CreditBytes: 16_000_000, Order: schedpkg.OrderPriority}
	tuned := func(messageCost float64, initial, allowed int64) *Result {
		t.Helper()
		cfg := base
		cfg.FusionBytes = initial
		return runAutoByte(t, Options{Profile: p, Arch: PS, Workers: 8, Servers: 4, BandwidthBps: 1.25e9, MessageCostS: messageCost,
			Iterations: 120, Sched: cfg},
			tune.AutoByteOptions{Base: schedpkg.Config{Order: schedpkg.OrderPriority}, Fuse: allowed, Seed: 1})
	}
	last := func(r *Result) int64 { return r.Configs[len(r.Configs)-1].Config.FusionBytes }
	ever := func(r *Result, f int64) bool {
		for _, c := range r.Configs {
			if c.Config.FusionBytes == f {
				return true
			}
		}
		return false
	}

	costly := 200e-6
	auto, fixed := tuned(costly, 0, fuse), tuned(costly, 0, 0)
	if last(auto) != fuse {
		t.Errorf("costly messages: the tuner ended with fusion %d, want %d (configs %v)", last(auto), fuse, auto.Configs)
	}
	if !(auto.IterationTimeS < 0.95*fixed.IterationTimeS) {
		t.Errorf("costly messages: %.4f s per iteration with the knob, %.4f s without; want at least 5%% faster", auto.IterationTimeS, fixed.IterationTimeS)
	}
	if ever(fixed, fuse) {
		t.Errorf("not allowed to fuse, the tuner turned it on: %v", fixed.Configs)
	}

	free := tuned(0, 0, fuse)
	if !ever(free, fuse) {
		t.Errorf("free messages: the tuner never tried fusion (%v), so the check below is empty", free.Configs)
	}
	if last(free) != 0 {
		t.Errorf("free messages: the tuner ended with fusion %d, want none (configs %v)", last(free), free.Configs)
	}

	pinned := tuned(costly, fuse, 0)
	for _, c := range pinned.Configs {
		if c.Config.FusionBytes != fuse {
			t.Errorf("pinned fusion: the tuner proposed %+v", c)
		}
	}
	if len(pinned.Configs) < 2 {
		t.Errorf("pinned fusion: the tuner changed nothing (%v), so the check above is empty", pinned.Configs)
	}
}
