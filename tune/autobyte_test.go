package tune_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/autobyte/autobyte/model"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/sim"
	"github.com/autobyte/autobyte/tune"
)

// dropJob is a parameter-server job whose bandwidth drops from 25 to 2.5
// Gbps at iteration 40, started with ByteScheduler's defaults.
func dropJob(t testing.TB, name string) sim.Options {
	p, err := model.Get(name)
	if err != nil {
		t.Fatal(err)
	}
	return sim.Options{Profile: p, Arch: sim.PS, Workers: 8, Servers: 8, BandwidthBps: 25e9 / 8, LatencyS: 50e-6,
		ShardBytes: 4_000_000, Iterations: 100,
		Sched:          sched.Config{PartitionBytes: 4_000_000, CreditBytes: 16_000_000, Order: sched.OrderPriority},
		BandwidthTrace: []sim.Step{{Iteration: 40, Value: 2.5e9 / 8}}}
}

// TestAutoByteBandwidthDrop runs the tuner in the simulator through a
// bandwidth drop: it must detect the change, re-tune within 30 iterations,
// and beat the initial static configuration over the run.
func TestAutoByteBandwidthDrop(t *testing.T) {
	for _, name := range []string{"resnet50", "vgg16"} {
		t.Run(name, func(t *testing.T) {
			o := dropJob(t, name)
			static, err := sim.Run(o)
			if err != nil {
				t.Fatal(err)
			}
			a, err := tune.NewAutoByte(tune.AutoByteOptions{Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			o.Tuner = a
			r, err := sim.Run(o)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range a.Events() {
				t.Logf("%3d %-6s partition %9d credit %11d gain %6.3f measured %.4g (was %.4g) %s", e.Iteration, e.Kind,
					e.Config.PartitionBytes, e.Config.CreditBytes, e.PredictedGain, e.MeasuredS, e.PreviousS, e.Detail)
			}
			t.Logf("mean iteration: static %.4g s, autobyte %.4g s (%.1f%% faster); configs %+v", static.MeanIterationTimeS, r.MeanIterationTimeS,
				100*(1-r.MeanIterationTimeS/static.MeanIterationTimeS), r.Configs)
			if r.MeanIterationTimeS >= static.MeanIterationTimeS {
				t.Errorf("autobyte %.4g s per iteration, static %.4g s", r.MeanIterationTimeS, static.MeanIterationTimeS)
			}
			detected, retuned := -1, -1
			for _, e := range a.Events() {
				if e.Kind == "change" && detected < 0 && e.Iteration >= 40 {
					detected = e.Iteration
				}
			}
			for _, c := range r.Configs {
				if c.FromIteration > 40 && retuned < 0 {
					retuned = c.FromIteration
				}
			}
			if detected < 0 || detected > 45 {
				t.Errorf("change detected at %d, want soon after iteration 40", detected)
			}
			if retuned < 0 || retuned > 70 {
				t.Errorf("first new configuration after the drop from iteration %d, want by 70", retuned)
			}
		})
	}
}

// TestAutoByteDeterministic runs the same job twice with the same seed.
func TestAutoByteDeterministic(t *testing.T) {
	run := func() (*sim.Result, []tune.AutoByteEvent) {
		o := dropJob(t, "resnet50")
		o.Iterations = 70
		a, err := tune.NewAutoByte(tune.AutoByteOptions{Seed: 7})
		if err != nil {
			t.Fatal(err)
		}
		o.Tuner = a
		r, err := sim.Run(o)
		if err != nil {
			t.Fatal(err)
		}
		return r, a.Events()
	}
	r1, e1 := run()
	r2, e2 := run()
	if !slices.Equal(r1.IterationTimesS, r2.IterationTimesS) || !slices.Equal(r1.Configs, r2.Configs) || !slices.Equal(e1, e2) {
		t.Errorf("runs differ:\n%+v\n%+v", r1.Configs, r2.Configs)
	}
}

// linearMeta is a hand-made network that predicts shorter iterations for
// smaller partitions, whatever the statistics.
func linearMeta() *tune.Meta {
	n := len(tune.MetaFeatureNames)
	m := &tune.Meta{Features: slices.Clone(tune.MetaFeatureNames), InMean: make([]float64, n), InStd: make([]float64, n), OutStd: 1,
		Layers: []tune.MetaLayer{{In: n, Out: 1, W: make([]float64, n), B: []float64{0}}}}
	for i := range m.InStd {
		m.InStd[i] = 1
	}
	m.Layers[0].W[slices.Index(tune.MetaFeatureNames, "log_partition_model")] = 1
	return m
}

// TestAutoByteReverts drives the tuner with a network that always wants
// smaller partitions and a job where every change is slower: it tries
// the predicted best, reverts it, never tries it again, and keeps the
// initial configuration in force otherwise.
func TestAutoByteReverts(t *testing.T) {
	initial := sched.Config{PartitionBytes: 64 << 20, CreditBytes: 64 << 20, Order: sched.OrderPriority}
	a, err := tune.NewAutoByte(tune.AutoByteOptions{Meta: linearMeta(), Partitions: []int64{1 << 20, 4 << 20, 16 << 20},
		Credits: []int64{64 << 20}, FineTuneSteps: -1})
	if err != nil {
		t.Fatal(err)
	}
	inForce := initial
	var pending []tune.Proposal
	var tried []sched.Config
	for k := range 120 {
		for len(pending) > 0 && pending[0].FromIteration <= k {
			inForce, pending = pending[0].Config, pending[1:]
		}
		time := 1.0
		if inForce != initial {
			time = 1.5
		}
		s := tune.Stats{Iteration: k, IterationTimeS: time, ForwardS: 0.2, BackwardS: 0.4, BandwidthBps: 1e9, Config: inForce,
			ModelBytes: 100 << 20, Tensors: 100, SizeSkew: 5, Workers: 4, Servers: 4, Arch: "ps"}
		p, ok := a.Observe(s)
		if !ok {
			continue
		}
		if p.FromIteration < k+tune.Lead {
			t.Fatalf("after %d: proposal from %d", k, p.FromIteration)
		}
		if p.Config != initial {
			if slices.Contains(tried, p.Config) {
				t.Fatalf("after %d: %+v tried again after it was reverted", k, p.Config)
			}
			tried = append(tried, p.Config)
		}
		pending = append(pending, p)
	}
	var kinds []string
	for _, e := range a.Events() {
		kinds = append(kinds, e.Kind)
	}
	// Smallest partition first, then the next, then the last: each reverted.
	if len(tried) != 3 || tried[0].PartitionBytes != 1<<20 || tried[1].PartitionBytes != 4<<20 {
		t.Errorf("tried %+v (events %v)", tried, kinds)
	}
	if strings.Count(strings.Join(kinds, " "), "revert") != 3 || strings.Contains(strings.Join(kinds, " "), "keep") {
		t.Errorf("events %v, want 3 reverts and no keep", kinds)
	}
	if inForce != initial {
		t.Errorf("in force at the end %+v, want the initial %+v", inForce, initial)
	}
}

func TestNewAutoByteErrors(t *testing.T) {
	for _, c := range []struct {
		o    tune.AutoByteOptions
		want string
	}{
		{tune.AutoByteOptions{Partitions: []int64{1 << 20, -3}}, "-3"},
		{tune.AutoByteOptions{Credits: []int64{0}}, "got 0"},
		{tune.AutoByteOptions{Margin: -0.1}, "-0.1"},
		{tune.AutoByteOptions{Measure: -2}, "-2"},
		{tune.AutoByteOptions{Change: tune.ChangeOptions{Window: -4}}, "-4"},
		{tune.AutoByteOptions{Base: sched.Config{Order: 9}}, "order 9"},
	} {
		if _, err := tune.NewAutoByte(c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one naming %s", c.o, err, c.want)
		}
	}
	a, err := tune.NewAutoByte(tune.AutoByteOptions{})
	if err != nil || a.Name() != "autobyte" || len(a.Candidates()) != 42 {
		t.Errorf("defaults: %v, %d candidates", err, len(a.Candidates()))
	}
}
