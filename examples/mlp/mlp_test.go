package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/autobyte/autobyte/worker"
)

// tolerance is the largest relative difference allowed between a
// data-parallel parameter and the single-process reference: they differ
// only in how float32 sums are rounded.
const tolerance = 1e-5

// diff compares two models parameter by parameter. rel is the largest
// |a-b| / max(|a|, |b|, rms), rms being the root mean square of b's tensor:
// a relative difference, except that a parameter much nearer 0 than its
// tensor's scale is compared with that scale. raw is the plain
// |a-b| / max(|a|,|b|), which such a parameter can make large: rounding
// errors are absolute (about lr·ulp of the gradient per step), so a weight
// that happens to be 4e-5 in a tensor of scale 0.3 shows 1e-4 from 3e-9
// of noise.
func diff(a, b *MLP) (rel, raw float64, where string) {
	for t := range numTensors {
		var ss float64
		for _, y := range b.Params[t] {
			ss += float64(y) * float64(y)
		}
		rms := math.Sqrt(ss / float64(len(b.Params[t])))
		for i := range a.Params[t] {
			x, y := float64(a.Params[t][i]), float64(b.Params[t][i])
			if x == y {
				continue
			}
			d := math.Abs(x - y)
			raw = max(raw, d/max(math.Abs(x), math.Abs(y)))
			if r := d / max(math.Abs(x), math.Abs(y), rms); !(r <= rel) { // NaN counts as the worst
				rel, where = r, fmt.Sprintf("%s[%d] = %g vs %g", a.specs[t].name, i, x, y)
			}
		}
	}
	return rel, raw, where
}

func testConfig(workers, iterations int) Config {
	c := DefaultConfig()
	c.Workers, c.Iterations = workers, iterations
	return c
}

func run1(t *testing.T, c Config, cl Cluster) []*MLP {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	train, _ := MakeData(c)
	models, err := RunInProcess(ctx, c, cl, train, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Every worker applies the same sums: the replicas are bit-identical.
	for r, m := range models[1:] {
		for tt := range numTensors {
			if !slices.Equal(m.Params[tt], models[0].Params[tt]) {
				t.Fatalf("worker %d's %s differs from worker 0's", r+1, m.specs[tt].name)
			}
		}
	}
	return models
}

// localSGD is the reference without autobyte: one process, plain SGD on
// the global batch of Workers·Batch points every iteration, from the same
// initial parameters and the same data order.
//
// With micro, the global batch's mean gradient is computed as the mean of
// the Workers per-shard means, in rank order (gradient accumulation over
// micro-batches of Batch points): the same float32 operations as the
// workers do, except the order of the Workers-term sum, which a parameter
// server takes in arrival order and a ring in ring order. Without micro it
// is one mean over all Workers·Batch points: mathematically the same
// gradient, but rounded differently all through the backward pass.
func localSGD(c Config, train *Dataset, micro bool) *MLP {
	rows, shards := c.Workers*c.Batch, 1
	if micro {
		rows, shards = c.Batch, c.Workers
	}
	one := c
	one.Workers, one.Batch = shards, rows
	m := NewMLP(one)
	sum, g := m.NewGrads(), m.NewGrads()
	b := m.NewBatch(rows)
	perm := order(one)
	var idx []int
	for it := range c.Iterations {
		for r := range shards {
			idx = shard(one, perm, it, r, idx)
			b.Load(train, idx)
			for l := range numLayers {
				m.Forward(l, b)
			}
			m.Backward(b, &g, func(int) {})
			for t := range numTensors {
				if r == 0 {
					copy(sum[t], g[t])
					continue
				}
				for i, v := range g[t] {
					sum[t][i] += v
				}
			}
		}
		for l := range numLayers {
			m.Step(l, &sum, shards)
		}
	}
	return m
}

// TestMatchesSingleProcess: data-parallel SGD on N workers of batch b
// through autobyte ends with the parameters of single-process SGD with
// batch N·b, to a relative 1e-5 on every parameter, for parameter servers
// (1 and 2) and ring all-reduce.
func TestMatchesSingleProcess(t *testing.T) {
	const iterations = 30
	clusters := []struct {
		name string
		cl   Cluster
	}{
		{"ps1", Cluster{Arch: worker.PS, Servers: 1, Sched: DefaultSched}},
		{"ps2", Cluster{Arch: worker.PS, Servers: 2, Sched: DefaultSched}},
		{"allreduce", Cluster{Arch: worker.AllReduce, Sched: DefaultSched}},
	}
	for _, n := range []int{1, 2, 3, 4} {
		for _, k := range clusters {
			t.Run(fmt.Sprintf("%s/workers%d", k.name, n), func(t *testing.T) {
				c := testConfig(n, iterations)
				train, _ := MakeData(c)
				got := run1(t, c, k.cl)[0]

				d, raw, where := diff(got, localSGD(c, train, true))
				t.Logf("vs the mean of %d shard means: max relative difference %.3g (%s); without the floor %.3g", n, d, where, raw)
				if !(d <= tolerance) {
					t.Fatalf("data-parallel and single-process SGD differ by %.3g > %g at %s", d, tolerance, where)
				}
				// A sum of one or two float32 gradients has one rounding
				// whatever the order: the results must be bit-identical.
				if n <= 2 && raw != 0 {
					t.Fatalf("with %d workers the result must be exact, differs by %.3g", n, raw)
				}

				// Against one mean over all N·b points, rounded differently
				// all through the backward pass.
				d, raw, where = diff(got, localSGD(c, train, false))
				t.Logf("vs one mean over %d points:   max relative difference %.3g (%s); without the floor %.3g", n*c.Batch, d, where, raw)
				if !(d <= tolerance) {
					t.Fatalf("data-parallel and single-process SGD (one mean) differ by %.3g > %g at %s", d, tolerance, where)
				}

				if n > 1 {
					// The comparison can fail: SGD on the local batch alone
					// (what a worker would do if Post summed nothing) is
					// far from the result.
					alone := c
					alone.Workers = 1
					if d, _, _ := diff(got, localSGD(alone, train, false)); d < 100*tolerance {
						t.Fatalf("local-batch-only SGD is within %.3g of the data-parallel result: the comparison cannot tell", d)
					}
				}
			})
		}
	}
}

// TestFifo: the unscheduled engine (no partitions, no window) gives the
// same result.
func TestFifo(t *testing.T) {
	c := testConfig(3, 10)
	train, _ := MakeData(c)
	got := run1(t, c, Cluster{Arch: worker.PS, Servers: 2})[0]
	if d, _, where := diff(got, localSGD(c, train, true)); !(d <= tolerance) {
		t.Fatalf("differs by %.3g at %s", d, where)
	}
}

// TestLossDecreases: training works: the loss over the training set falls
// and the test accuracy is high.
func TestLossDecreases(t *testing.T) {
	c := testConfig(2, 100)
	train, test := MakeData(c)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var losses []float64
	models, err := RunInProcess(ctx, c, Cluster{Arch: worker.AllReduce, Sched: DefaultSched}, train, 25, func(it int, m *MLP) {
		l, _ := m.Evaluate(train)
		losses = append(losses, l)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("training loss at iterations 0, 25, …, 100: %.4f", losses)
	if len(losses) != 5 {
		t.Fatalf("reported %d times, want 5 (0, 25, 50, 75, 100)", len(losses))
	}
	for i := 1; i < len(losses); i++ {
		if !(losses[i] < losses[i-1]) {
			t.Errorf("loss rose from %.4f to %.4f", losses[i-1], losses[i])
		}
	}
	if !(losses[4] < 0.5*losses[0]) {
		t.Errorf("loss %.4f after 100 iterations is not below half the initial %.4f", losses[4], losses[0])
	}
	if _, acc := models[0].Evaluate(test); acc < 0.9 {
		t.Errorf("test accuracy %.3f, want >= 0.9", acc)
	}
}

// TestCommandInProcess runs the program's default mode.
func TestCommandInProcess(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), strings.Fields("--workers 3 --servers 2 --arch ps --iterations 40 --batch 8 --seed 2"), &out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"iteration    0", "iteration   20", "iteration   40", "test accuracy", "3 replicas identical: true"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestCommandRoles runs the one-process-per-role mode, each role a run()
// call of its own, rendezvous through MASTER_ADDR/AUTOBYTE_MASTER_PORT.
func TestCommandRoles(t *testing.T) {
	for _, arch := range []string{"ps", "allreduce"} {
		t.Run(arch, func(t *testing.T) {
			master, err := freeLoopback()
			if err != nil {
				t.Fatal(err)
			}
			host, port, _ := strings.Cut(master, ":")
			t.Setenv("MASTER_ADDR", host)
			t.Setenv("AUTOBYTE_MASTER_PORT", port) // autobyte's own rendezvous port (MASTER_PORT+1 by default)
			t.Setenv("AUTOBYTE_TOKEN", "test-token")
			common := []string{"--workers", "2", "--servers", "1", "--arch", arch, "--iterations", "30", "--listen", "127.0.0.1:0"}
			roles := [][]string{{"--role", "worker", "--rank", "0"}, {"--role", "worker", "--rank", "1"}}
			if arch == "ps" {
				roles = append(roles, []string{"--role", "server", "--index", "0"})
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			outs := make([]bytes.Buffer, len(roles))
			errs := make([]error, len(roles))
			var wg sync.WaitGroup
			for i, r := range roles {
				wg.Go(func() { errs[i] = run(ctx, append(slices.Clone(common), r...), &outs[i]) })
			}
			wg.Wait()
			for i := range roles {
				if errs[i] != nil {
					t.Fatalf("%v: %v", roles[i], errs[i])
				}
			}
			if s := outs[0].String(); !strings.Contains(s, "iteration   20") || !strings.Contains(s, "worker 0: test accuracy") {
				t.Errorf("rank 0 printed:\n%s", s)
			}
			if s := outs[1].String(); !strings.Contains(s, "worker 1: test accuracy") {
				t.Errorf("rank 1 printed:\n%s", s)
			}
		})
	}
}
