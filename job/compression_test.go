package job

import (
	"fmt"
	"testing"

	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/worker"
)

// TestCompressedAggregation: a job whose float32 gradients travel as
// bfloat16 or float16 delivers exact sums (the replay's values and partial
// sums are exact in 16 bits) on parameter servers and the ring, and its
// workers send about half the bytes of the same job uncompressed.
func TestCompressedAggregation(t *testing.T) {
	p := testProfile()
	for _, arch := range []worker.Arch{worker.PS, worker.AllReduce} {
		for _, workers := range []int{1, 3, 5} {
			spec := Spec{Profile: p, Arch: arch, Workers: workers, Iterations: 3, ShardBytes: 64_000,
				Sched: sched.Config{PartitionBytes: 100_000, CreditBytes: 300_000, Order: sched.OrderPriority}}
			if arch == worker.PS {
				spec.Servers = 2
			}
			sent := func(sums []*Summary) (n int64) {
				for _, s := range sums {
					n += s.BytesSent
				}
				return n
			}
			base, err := runCluster(t, spec, worker.VerifyFull)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range []dtype.DType{dtype.BF16, dtype.F16} {
				t.Run(fmt.Sprintf("arch%d/w%d/%v", arch, workers, d), func(t *testing.T) {
					c := spec
					c.Sched.Compression = d
					sums, err := runCluster(t, c, worker.VerifyFull)
					if err != nil {
						t.Fatal(err)
					}
					for r, s := range sums {
						if s.Checked == 0 {
							t.Errorf("worker %d checked no element", r)
						}
					}
					if workers > 1 {
						ratio := float64(sent(sums)) / float64(sent(base))
						if ratio < 0.45 || ratio > 0.55 {
							t.Errorf("workers sent %d bytes compressed, %d uncompressed: ratio %.3f, want about 0.5", sent(sums), sent(base), ratio)
						}
					}
				})
			}
		}
	}
}
