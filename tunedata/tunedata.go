// Package tunedata generates the meta-network's training data: it samples
// training and held-out scenarios (package tune's scenario space), picks
// the configurations to simulate for each, simulates them in parallel
// (package sim) and keeps the runs in a cache file keyed by everything
// that determines a run, so that a retraining simulates only what is new.
package tunedata

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"slices"
	"sync"

	"github.com/autobyte/autobyte/internal/outfile"
	"github.com/autobyte/autobyte/proto"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/sim"
	"github.com/autobyte/autobyte/tune"
)

// Job is one scenario and the configurations to simulate for it.
type Job struct {
	Index    int
	Scenario tune.MetaScenario
	Configs  []sched.Config
}

// PlanOptions choose the scenarios of a training run.
type PlanOptions struct {
	Seed uint64
	// TrainModels and HeldOutModels are zoo models; held-out scenarios are
	// evaluated over the whole grid.
	TrainModels, HeldOutModels  []string
	Scenarios, HeldOutScenarios int
	// Configs is how many grid configurations are simulated per training
	// scenario, besides ByteScheduler's default.
	Configs int
	// Synthetic is the fraction of training scenarios whose model is a
	// random synthetic profile instead of a zoo model.
	Synthetic float64
}

// Plan is what a training run simulates.
type Plan struct {
	Train, Eval []Job
	// Synthetic counts the training scenarios of synthetic models.
	Synthetic int
}

// Simulations is the number of runs of the plan.
func (p Plan) Simulations() int {
	n := 0
	for _, j := range append(slices.Clone(p.Train), p.Eval...) {
		n += len(j.Configs)
	}
	return n
}

// NewPlan samples the scenarios and configurations. Equal options give
// equal plans: the training scenarios, the synthetic models and the
// held-out scenarios draw from separate streams of the seed, so the
// held-out scenarios are the same for every training setting of a seed.
func NewPlan(o PlanOptions) (Plan, error) {
	var p Plan
	switch {
	case len(o.TrainModels) == 0:
		return p, errors.New("tunedata: no model to train on")
	case o.Scenarios < 1:
		return p, fmt.Errorf("tunedata: scenarios must be >= 1, got %d", o.Scenarios)
	case o.HeldOutScenarios < 0:
		return p, fmt.Errorf("tunedata: held-out scenarios must be >= 0, got %d", o.HeldOutScenarios)
	case o.Configs < 1:
		return p, fmt.Errorf("tunedata: configurations per scenario must be >= 1, got %d", o.Configs)
	case !(o.Synthetic >= 0 && o.Synthetic <= 1):
		return p, fmt.Errorf("tunedata: synthetic fraction must be in [0, 1], got %v", o.Synthetic)
	}
	rng := rand.New(rand.NewPCG(o.Seed, 1))
	synRng := rand.New(rand.NewPCG(o.Seed, 2))
	heldRng := rand.New(rand.NewPCG(o.Seed, 3))
	grid := Grid()
	for i, sc := range tune.SampleMetaScenarios(rng, o.TrainModels, o.Scenarios) {
		if synRng.Float64() < o.Synthetic {
			sc.Model = tune.SyntheticName(synRng.Uint64())
			p.Synthetic++
		}
		cfgs := []sched.Config{DefaultConfig(sc.Arch)}
		for _, j := range rng.Perm(len(grid))[:min(o.Configs, len(grid))] {
			cfgs = append(cfgs, grid[j])
		}
		p.Train = append(p.Train, Job{Index: i, Scenario: sc, Configs: cfgs})
	}
	if len(o.HeldOutModels) > 0 {
		for i, sc := range tune.SampleMetaScenarios(heldRng, o.HeldOutModels, o.HeldOutScenarios) {
			p.Eval = append(p.Eval, Job{Index: i, Scenario: sc, Configs: append([]sched.Config{DefaultConfig(sc.Arch)}, grid...)})
		}
	}
	return p, nil
}

// Grid is the meta-network's candidate grid (partitions x credits).
func Grid() []sched.Config {
	return tune.Cross(sched.Config{Order: sched.OrderPriority}, tune.DefaultMetaPartitions, tune.DefaultMetaCredits)
}

// DefaultConfig is ByteScheduler's default configuration for arch.
func DefaultConfig(arch string) sched.Config {
	if arch == "allreduce" {
		return proto.ByteSchedulerDefaults(proto.AllReduce)
	}
	return proto.ByteSchedulerDefaults(proto.PS)
}

// Cache holds simulated runs by Key; it is the --data file of tune train.
// Simulate adds each run as it finishes, so that Save keeps every finished
// run even when the work stops early; Save may run while Simulate does.
type Cache struct {
	mu   sync.Mutex
	Runs map[string]tune.MetaRun `json:"runs"`
}

// add records a finished run.
func (c *Cache) add(key string, r tune.MetaRun) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.Runs[key] = r
}

// get returns the run held for key, if any.
func (c *Cache) get(key string) (tune.MetaRun, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.Runs[key]
	return r, ok
}

// Len is the number of runs held.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.Runs)
}

// Key identifies one simulation: scenario, configuration and length, every
// field in full (MetaScenario's String rounds); v2: the statistics carry
// the round trip.
func Key(sc tune.MetaScenario, cfg sched.Config, iterations int) string {
	return fmt.Sprintf("v2|%s|%s|%d|%d|%v|%v|%v|%+v|%d", sc.Model, sc.Arch, sc.Workers, sc.Servers, sc.BandwidthBps, sc.LatencyS, sc.ComputeScale, cfg, iterations)
}

// LoadCache reads a cache file; a missing file is an empty cache.
func LoadCache(path string) (*Cache, error) {
	c := &Cache{Runs: map[string]tune.MetaRun{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, c); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if c.Runs == nil {
		c.Runs = map[string]tune.MetaRun{}
	}
	return c, nil
}

// Save writes the cache to path whole (outfile.WriteFile): an interrupted
// save leaves the previous file.
func (c *Cache) Save(path string) error {
	c.mu.Lock()
	b, err := json.Marshal(c)
	c.mu.Unlock()
	if err != nil {
		return err
	}
	return outfile.WriteFile(path, b, 0o644)
}

// Simulate runs every job's configurations on par goroutines, taking runs
// found in cache (which may be nil) and adding the new ones to it;
// progress, if set, is called after each run (found or simulated) with the
// count so far, by one goroutine at a time. Results are in job and
// configuration order whatever the interleaving.
func Simulate(jobs []Job, iterations, par int, cache *Cache, progress func(done int)) ([]tune.MetaScenarioRuns, error) {
	if cache == nil {
		cache = &Cache{}
	}
	if cache.Runs == nil {
		cache.Runs = map[string]tune.MetaRun{}
	}
	var mu sync.Mutex
	done := 0
	tick := func() {
		mu.Lock() // progress is called by one goroutine at a time
		defer mu.Unlock()
		done++
		if progress != nil {
			progress(done)
		}
	}
	out := make([]tune.MetaScenarioRuns, len(jobs))
	type task struct{ j, c int }
	var tasks []task
	for j, jb := range jobs {
		out[j] = tune.MetaScenarioRuns{Scenario: jb.Scenario, Runs: make([]tune.MetaRun, len(jb.Configs))}
		for c, cfg := range jb.Configs {
			if r, ok := cache.get(Key(jb.Scenario, cfg, iterations)); ok {
				out[j].Runs[c] = r
				tick()
				continue
			}
			tasks = append(tasks, task{j, c})
		}
	}
	// Expensive scenarios first, so the last goroutine does not run alone.
	slices.SortStableFunc(tasks, func(a, b task) int {
		return jobs[b.j].Scenario.Workers - jobs[a.j].Scenario.Workers
	})
	err := sim.Parallel(len(tasks), par, func(i int) error {
		t := tasks[i]
		jb := jobs[t.j]
		defer tick() // after the run is in the cache
		r, err := SimulateRun(jb.Scenario, jb.Configs[t.c], iterations)
		if err != nil {
			return fmt.Errorf("scenario %d (%s), configuration %+v: %w", jb.Index, jb.Scenario, jb.Configs[t.c], err)
		}
		out[t.j].Runs[t.c] = r
		cache.add(Key(jb.Scenario, jb.Configs[t.c], iterations), r)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// SimulateRun simulates one scenario under cfg for the given number of
// iterations and returns the mean statistics after the warm-up (the first
// fifth, at least one) and the steady-state iteration time. Parameter
// servers shard pieces above 4 MB, as autobyte sim does by default.
func SimulateRun(sc tune.MetaScenario, cfg sched.Config, iterations int) (tune.MetaRun, error) {
	if iterations < 2 {
		return tune.MetaRun{}, fmt.Errorf("tunedata: iterations must be >= 2 (one warm-up), got %d", iterations)
	}
	p, err := tune.MetaProfile(sc.Model)
	if err != nil {
		return tune.MetaRun{}, err
	}
	arch, err := sim.ParseArch(sc.Arch)
	if err != nil {
		return tune.MetaRun{}, err
	}
	o := sim.Options{Profile: p.Scaled(sc.ComputeScale), Arch: arch, Workers: sc.Workers, Servers: sc.Servers,
		BandwidthBps: sc.BandwidthBps, LatencyS: sc.LatencyS, Sched: cfg, Iterations: iterations}
	if arch == sim.PS {
		o.ShardBytes = proto.DefaultShardBytes
	}
	r, err := sim.Run(o)
	if err != nil {
		return tune.MetaRun{}, err
	}
	skip := max(1, len(r.Stats)/5)
	return tune.MetaRun{Config: cfg, Stats: tune.MeanStats(r.Stats[skip:]), IterationTimeS: r.IterationTimeS}, nil
}
