package tunedata

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/tune"
)

func plan(t *testing.T, o PlanOptions) Plan {
	t.Helper()
	p, err := NewPlan(o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPlan: equal options give equal plans; the held-out scenarios do not
// depend on the training settings; every scenario starts with
// ByteScheduler's default.
func TestPlan(t *testing.T) {
	o := PlanOptions{Seed: 7, TrainModels: []string{"resnet50", "vgg16"}, HeldOutModels: []string{"gpt2"},
		Scenarios: 5, HeldOutScenarios: 2, Configs: 3, Synthetic: 0.4}
	a, b := plan(t, o), plan(t, o)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two plans of the same options differ")
	}
	if len(a.Train) != 5 || len(a.Eval) != 2 || a.Simulations() != 5*4+2*(1+len(Grid())) {
		t.Fatalf("plan of %d training and %d held-out scenarios, %d simulations; want 5, 2 and %d", len(a.Train), len(a.Eval), a.Simulations(), 5*4+2*(1+len(Grid())))
	}
	for _, j := range append(a.Train, a.Eval...) {
		if j.Configs[0] != DefaultConfig(j.Scenario.Arch) {
			t.Errorf("scenario %s: first configuration %+v, want the default", j.Scenario, j.Configs[0])
		}
	}
	o2 := o
	o2.Scenarios, o2.Configs, o2.Synthetic = 9, 1, 0
	if c := plan(t, o2); !reflect.DeepEqual(c.Eval, a.Eval) || reflect.DeepEqual(c.Train[:5], a.Train) {
		t.Error("changing the training settings changed the held-out scenarios, or not the training ones")
	}
	o3 := o
	o3.Seed = 8
	if reflect.DeepEqual(plan(t, o3).Train, a.Train) {
		t.Error("another seed gave the same training scenarios")
	}
	synthetic := 0
	for _, j := range a.Train {
		if strings.HasPrefix(j.Scenario.Model, tune.SyntheticPrefix) {
			synthetic++
		}
	}
	if synthetic != a.Synthetic {
		t.Errorf("%d synthetic models in the plan, it counts %d", synthetic, a.Synthetic)
	}
	for _, bad := range []PlanOptions{{Scenarios: 1, Configs: 1}, {TrainModels: o.TrainModels, Configs: 1}, {TrainModels: o.TrainModels, Scenarios: 1}, {TrainModels: o.TrainModels, Scenarios: 1, Configs: 1, Synthetic: 2}} {
		if _, err := NewPlan(bad); err == nil {
			t.Errorf("NewPlan(%+v) accepted", bad)
		}
	}
}

// TestSimulateAndCache: runs land in the cache; a second pass simulates
// nothing and gives the same runs; the cache survives a file.
func TestSimulateAndCache(t *testing.T) {
	jobs := []Job{{Scenario: tune.MetaScenario{Model: "resnet50", Arch: "ps", Workers: 4, Servers: 2, BandwidthBps: 1.25e9, LatencyS: 50e-6, ComputeScale: 1}},
		{Scenario: tune.MetaScenario{Model: "alexnet", Arch: "allreduce", Workers: 3, BandwidthBps: 1.25e9, LatencyS: 50e-6, ComputeScale: 1}}}
	for i := range jobs {
		jobs[i].Configs = append([]sched.Config{DefaultConfig(jobs[i].Scenario.Arch)}, Grid()[0])
	}
	cache := &Cache{} // a zero cache is usable
	calls := 0
	first, err := Simulate(jobs, 4, 2, cache, func(int) { calls++ })
	if err != nil {
		t.Fatal(err)
	}
	if calls != 4 || len(cache.Runs) != 4 {
		t.Fatalf("%d progress calls and %d cached runs for 4 simulations", calls, len(cache.Runs))
	}
	for _, sr := range first {
		for _, r := range sr.Runs {
			if !(r.IterationTimeS > 0) {
				t.Errorf("%s %+v: iteration time %v", sr.Scenario, r.Config, r.IterationTimeS)
			}
		}
	}
	path := filepath.Join(t.TempDir(), "data.json")
	if err := cache.Save(path); err != nil {
		t.Fatal(err)
	}
	loaded, err := LoadCache(path)
	if err != nil {
		t.Fatal(err)
	}
	// A cached run is used as is, so a changed value shows.
	k := Key(jobs[0].Scenario, jobs[0].Configs[0], 4)
	r := loaded.Runs[k]
	r.IterationTimeS = 123
	loaded.Runs[k] = r
	second, err := Simulate(jobs, 4, 2, loaded, nil)
	if err != nil {
		t.Fatal(err)
	}
	if second[0].Runs[0].IterationTimeS != 123 {
		t.Errorf("the cached run was not used: %v", second[0].Runs[0].IterationTimeS)
	}
	second[0].Runs[0].IterationTimeS = first[0].Runs[0].IterationTimeS
	if !reflect.DeepEqual(first, second) {
		t.Error("runs from the cache differ from the simulated ones")
	}
	if empty, err := LoadCache(filepath.Join(t.TempDir(), "none.json")); err != nil || len(empty.Runs) != 0 {
		t.Errorf("missing cache file: %v, %v; want an empty cache", empty, err)
	}
	if _, err := SimulateRun(jobs[0].Scenario, jobs[0].Configs[0], 1); err == nil || !strings.Contains(err.Error(), "got 1") {
		t.Errorf("one iteration: %v", err)
	}
	if _, err := SimulateRun(tune.MetaScenario{Model: "nosuch", Arch: "ps", Workers: 1, Servers: 1, BandwidthBps: 1, ComputeScale: 1}, jobs[0].Configs[0], 3); err == nil || !strings.Contains(err.Error(), "nosuch") {
		t.Errorf("unknown model: %v", err)
	}
}

// TestCacheKeepsRunsOfAFailedSimulate: the runs that finished stay in the
// cache when another simulation of the same call fails, so that a saved
// cache keeps them (tune train saves it on failure and interrupt).
func TestCacheKeepsRunsOfAFailedSimulate(t *testing.T) {
	good := Job{Scenario: tune.MetaScenario{Model: "alexnet", Arch: "allreduce", Workers: 3, BandwidthBps: 1.25e9, LatencyS: 50e-6, ComputeScale: 1}}
	good.Configs = []sched.Config{DefaultConfig("allreduce"), Grid()[0]}
	bad := Job{Scenario: tune.MetaScenario{Model: "nosuch", Arch: "ps", Workers: 1, Servers: 1, BandwidthBps: 1, ComputeScale: 1}, Configs: good.Configs[:1]}
	cache := &Cache{}
	if _, err := Simulate([]Job{bad, good}, 4, 1, cache, nil); err == nil || !strings.Contains(err.Error(), "nosuch") {
		t.Fatalf("Simulate with an unknown model: %v, want its error", err)
	}
	if cache.Len() != 2 {
		t.Fatalf("%d runs cached after the failure, want the 2 that finished", cache.Len())
	}
	path := filepath.Join(t.TempDir(), "data.json")
	if err := cache.Save(path); err != nil {
		t.Fatal(err)
	}
	if loaded, err := LoadCache(path); err != nil || loaded.Len() != 2 {
		t.Fatalf("saved cache: %v runs, %v", loaded, err)
	}
}
