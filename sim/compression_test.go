package sim

import (
	"testing"

	"github.com/autobyte/autobyte/dtype"
	schedpkg "github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/tune"
)

// TestCompressionHalvesBytes: with a 16-bit wire every link carries half
// the gradient bytes of the float32 run, on parameter servers and the
// ring, and a communication-bound job gets faster; a 2-byte profile is not
// compressed again.
func TestCompressionHalvesBytes(t *testing.T) {
	p := profile(t, "resnet50")
	cfg := func(arch Arch) schedpkg.Config {
		if arch == PS {
			return schedpkg.Config{PartitionBytes: 4_000_000, CreditBytes: 16_000_000, Order: schedpkg.OrderPriority}
		}
		return schedpkg.Config{PartitionBytes: 32_000_000, CreditBytes: 64_000_000, Order: schedpkg.OrderPriority}
	}
	total := func(l LinkBytes) (n int64) {
		for _, xs := range [][]int64{l.WorkerEgress, l.WorkerIngress, l.ServerEgress, l.ServerIngress} {
			for _, x := range xs {
				n += x
			}
		}
		return n
	}
	for _, arch := range []Arch{PS, AllReduce} {
		o := Options{Profile: p, Arch: arch, Workers: 4, BandwidthBps: 125e6, Iterations: 6, Sched: cfg(arch)}
		if arch == PS {
			o.Servers = 2
		}
		base, err := Run(o)
		if err != nil {
			t.Fatal(err)
		}
		o.Sched.Compression = dtype.BF16
		half, err := Run(o)
		if err != nil {
			t.Fatal(err)
		}
		if b, h := total(base.Links), total(half.Links); h*2 != b {
			t.Errorf("arch %v: %d link bytes compressed, %d uncompressed; want exactly half", arch, h, b)
		}
		if half.IterationTimeS >= base.IterationTimeS {
			t.Errorf("arch %v: compressed iteration %.3f s, not faster than %.3f s at 1 Gbit/s", arch, half.IterationTimeS, base.IterationTimeS)
		}
	}
	bf := *p
	bf.BytesPerParam = 2
	o := Options{Profile: &bf, Arch: PS, Workers: 2, Servers: 1, BandwidthBps: 125e6, Iterations: 2, Sched: cfg(PS)}
	a, _ := Run(o)
	o.Sched.Compression = dtype.F16
	b, _ := Run(o)
	if a == nil || b == nil || total(a.Links) != total(b.Links) {
		t.Error("a 2-byte profile's bytes changed under compression")
	}
	o.Sched.Compression = 9
	if _, err := Run(o); err == nil {
		t.Error("Run accepted compression 9")
	}
}

// TestTunerChoosesCompression: the autobyte tuner allowed to compress
// (--compression auto) turns bfloat16 on in a communication-bound job and
// ends faster than without the knob; in a compute-bound job it leaves
// compression off (a tie goes to float32); not allowed, it never changes
// the compression in force, pinned on or off, while it tunes partition
// and credit.
func TestTunerChoosesCompression(t *testing.T) {
	p := profile(t, "resnet50")
	base := schedpkg.Config{PartitionBytes: 4_000_000, CreditBytes: 16_000_000, Order: schedpkg.OrderPriority}
	tuned := func(bw float64, initial, compress dtype.DType) *Result {
		t.Helper()
		cfg := base
		cfg.Compression = initial
		return runAutoByte(t, Options{Profile: p, Arch: PS, Workers: 8, Servers: 4, BandwidthBps: bw, Iterations: 120, Sched: cfg},
			tune.AutoByteOptions{Base: schedpkg.Config{Order: schedpkg.OrderPriority}, Compress: compress, Seed: 1})
	}
	last := func(r *Result) dtype.DType { return r.Configs[len(r.Configs)-1].Config.Compression }
	ever := func(r *Result, d dtype.DType) bool {
		for _, c := range r.Configs {
			if c.Config.Compression == d {
				return true
			}
		}
		return false
	}

	slow := 125e6 // 1 Gbit/s: communication-bound
	auto, fixed := tuned(slow, dtype.F32, dtype.BF16), tuned(slow, dtype.F32, dtype.F32)
	if last(auto) != dtype.BF16 {
		t.Errorf("communication-bound: the tuner ended with compression %v, want bfloat16 (configs %v)", last(auto), auto.Configs)
	}
	if !(auto.IterationTimeS < 0.8*fixed.IterationTimeS) {
		t.Errorf("communication-bound: %.3f s per iteration with the knob, %.3f s without; want at least 20%% faster", auto.IterationTimeS, fixed.IterationTimeS)
	}
	if ever(fixed, dtype.BF16) {
		t.Errorf("not allowed to compress, the tuner turned it on: %v", fixed.Configs)
	}

	fast := 12.5e9 // 100 Gbit/s: compute-bound
	if r := tuned(fast, dtype.F32, dtype.BF16); ever(r, dtype.BF16) {
		t.Errorf("compute-bound: the tuner tried compression: %v", r.Configs)
	}
	if r := tuned(fast, dtype.BF16, dtype.BF16); last(r) != dtype.F32 {
		t.Errorf("compute-bound, starting compressed: the tuner ended with %v, want float32 (configs %v)", last(r), r.Configs)
	}
	pinned := tuned(slow, dtype.BF16, dtype.F32)
	for _, c := range pinned.Configs {
		if c.Config.Compression != dtype.BF16 {
			t.Errorf("pinned bfloat16: the tuner proposed %+v", c)
		}
	}
	if len(pinned.Configs) < 2 {
		t.Errorf("pinned bfloat16: the tuner changed nothing (%v), so the check above is empty", pinned.Configs)
	}
}
