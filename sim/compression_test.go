package sim

import (
	"testing"

	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/model"
	schedpkg "github.com/autobyte/autobyte/sched"
)

// TestCompressionHalvesBytes: with a 16-bit wire every link carries half
// the gradient bytes of the float32 run, on parameter servers and the
// ring, and a communication-bound job gets faster; a 2-byte profile is not
// compressed again.
func TestCompressionHalvesBytes(t *testing.T) {
	p, err := model.Get("resnet50")
	if err != nil {
		t.Fatal(err)
	}
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
