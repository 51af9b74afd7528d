package sim

import (
	"testing"

	"github.com/autobyte/autobyte/sched"
)

// The benchmarks time whole simulations of large jobs. events/s is the
// simulator's throughput, comparable across models and topologies; ns/op is
// one whole run.

// BenchmarkRunResNet50PS64 is a many-tensor, many-host job: 64 workers and
// 64 servers under the bytescheduler preset.
func BenchmarkRunResNet50PS64(b *testing.B) {
	o := job(profile(b, "resnet50"), PS, 64, 64, gbps10)
	o.Sched = sched.Config{PartitionBytes: 4e6, CreditBytes: 16e6, Order: sched.OrderPriority}
	o.Iterations = 5
	benchRun(b, o)
}

// BenchmarkRunVGG16AllReduce64 is a few-huge-tensor ring job.
func BenchmarkRunVGG16AllReduce64(b *testing.B) {
	o := job(profile(b, "vgg16"), AllReduce, 64, 0, gbps10)
	o.Sched = sched.Config{PartitionBytes: 32e6, CreditBytes: 64e6, Order: sched.OrderPriority}
	o.Iterations = 5
	benchRun(b, o)
}

func benchRun(b *testing.B, o Options) {
	b.ReportAllocs()
	var events int64
	for b.Loop() {
		events += run(b, o).Events
	}
	b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(events)/float64(b.N), "events/op")
}
