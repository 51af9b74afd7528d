package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/autobyte/autobyte/model"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/sim"
	"github.com/autobyte/autobyte/tune"
)

func newTuneCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tune",
		Short: "The meta-network auto-tuner: train its weights",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newTuneTrainCmd())
	cmd.AddCommand(newTuneEvalCmd())
	cmd.AddCommand(newTuneGapCmd())
	return cmd
}

// tuneTrainFlags are the settings of 'autobyte tune train'.
type tuneTrainFlags struct {
	seed             uint64
	out              string
	scenarios        int
	heldOutScenarios int
	configs          int
	iterations       int
	epochs           int
	hidden           []int
	heldOut          string
	parallel         int
	data             string
	synthetic        float64
	target           string
	members          int
}

func newTuneTrainCmd() *cobra.Command {
	var f tuneTrainFlags
	cmd := &cobra.Command{
		Use:   "train",
		Short: "Train the meta-network on simulated runs and write its weights",
		Long: `train samples training scenarios (zoo models except the held-out ones,
architectures, 4-64 workers, servers, 1-100 Gbps, latencies, compute scales),
simulates a random subset of the candidate grid (partitions 256 KB-64 MB x
credits 1 MB-1 GB, log-spaced) plus ByteScheduler's default for each, trains
the meta-network (an ensemble of --members networks) on every pair of runs of a
scenario, evaluates it on scenarios of the held-out models over the whole grid,
and writes the weights with a header of how they were made. Equal flags give
equal weights. See docs/tuner.md.`,
		Example: `  autobyte tune train --seed 1 --out tune/weights.json`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runTuneTrain(f, cmd.ErrOrStderr())
		},
	}
	fs := cmd.Flags()
	fs.Uint64Var(&f.seed, "seed", 1, "random seed of the scenarios, the configurations sampled and the training")
	fs.StringVar(&f.out, "out", "tune/weights.json", "weights file to write")
	fs.IntVar(&f.scenarios, "scenarios", 200, "training scenarios")
	fs.IntVar(&f.heldOutScenarios, "held-out-scenarios", 16, "evaluation scenarios of the held-out models (whole grid each)")
	fs.IntVar(&f.configs, "configs", 16, "grid configurations simulated per training scenario (plus ByteScheduler's default)")
	fs.IntVar(&f.iterations, "iterations", 6, "iterations per simulation")
	fs.IntVar(&f.epochs, "epochs", 40, "training epochs (of each member)")
	fs.IntSliceVar(&f.hidden, "hidden", []int{64, 64}, "hidden layer widths")
	fs.StringVar(&f.heldOut, "held-out", "resnet101,gpt2", "zoo models kept out of training, to evaluate on")
	fs.IntVar(&f.parallel, "parallel", runtime.GOMAXPROCS(0), "simulations run at once")
	fs.StringVar(&f.data, "data", "", "cache of simulated runs: runs found in it are not simulated again, new ones are added to it")
	fs.IntVar(&f.members, "members", 3, "networks in the ensemble, each from its own random draw (the prediction is their mean)")
	fs.Float64Var(&f.synthetic, "synthetic", 0, "fraction of training scenarios whose model is a random synthetic profile instead of a zoo model (0-1)")
	fs.StringVar(&f.target, "target", tune.MetaTargetCurrent, "what the network predicts: log time relative to the reference (reference) or to the current configuration's measured time (current)")
	return cmd
}

func (f tuneTrainFlags) check() error {
	switch {
	case f.scenarios < 1:
		return fmt.Errorf("--scenarios must be >= 1, got %d", f.scenarios)
	case f.heldOutScenarios < 0:
		return fmt.Errorf("--held-out-scenarios must be >= 0, got %d", f.heldOutScenarios)
	case f.configs < 1:
		return fmt.Errorf("--configs must be >= 1, got %d", f.configs)
	case f.iterations < 2:
		return fmt.Errorf("--iterations must be >= 2 (one warm-up), got %d", f.iterations)
	case f.members < 1:
		return fmt.Errorf("--members must be >= 1, got %d", f.members)
	case f.epochs < 1:
		return fmt.Errorf("--epochs must be >= 1, got %d", f.epochs)
	case f.parallel < 1:
		return fmt.Errorf("--parallel must be >= 1, got %d", f.parallel)
	case !(f.synthetic >= 0 && f.synthetic <= 1):
		return fmt.Errorf("--synthetic must be a fraction in [0, 1], got %v", f.synthetic)
	case f.target != tune.MetaTargetReference && f.target != tune.MetaTargetCurrent:
		return fmt.Errorf("--target must be %s or %s, got %q", tune.MetaTargetReference, tune.MetaTargetCurrent, f.target)
	}
	for _, h := range f.hidden {
		if h < 1 {
			return fmt.Errorf("--hidden widths must be >= 1, got %d", h)
		}
	}
	return nil
}

func runTuneTrain(f tuneTrainFlags, log io.Writer) error {
	if err := f.check(); err != nil {
		return err
	}
	heldOut := splitList(f.heldOut)
	for _, m := range heldOut {
		if _, err := model.Get(m); err != nil {
			return fmt.Errorf("--held-out: %w", err)
		}
	}
	var train []string
	for _, m := range model.Zoo() {
		if m != "toy3" && !slices.Contains(heldOut, m) {
			train = append(train, m)
		}
	}
	if len(train) == 0 {
		return fmt.Errorf("--held-out %q leaves no zoo model to train on", f.heldOut)
	}
	start := time.Now()
	rng := rand.New(rand.NewPCG(f.seed, 1))
	// Separate streams: the synthetic models, and the held-out scenarios
	// (the same for every training setting of a seed).
	synRng := rand.New(rand.NewPCG(f.seed, 2))
	heldRng := rand.New(rand.NewPCG(f.seed, 3))
	grid := tune.Cross(sched.Config{Order: sched.OrderPriority}, tune.DefaultMetaPartitions, tune.DefaultMetaCredits)

	// Training: a random subset of the grid and the default per scenario.
	var trainJobs []metaJob
	synthetic := 0
	for i, sc := range tune.SampleMetaScenarios(rng, train, f.scenarios) {
		if synRng.Float64() < f.synthetic {
			sc.Model = tune.SyntheticName(synRng.Uint64())
			synthetic++
		}
		cfgs := []sched.Config{defaultConfig(sc.Arch)}
		for _, j := range rng.Perm(len(grid))[:min(f.configs, len(grid))] {
			cfgs = append(cfgs, grid[j])
		}
		trainJobs = append(trainJobs, metaJob{index: i, scenario: sc, configs: cfgs})
	}
	var evalJobs []metaJob
	if len(heldOut) > 0 {
		for i, sc := range tune.SampleMetaScenarios(heldRng, heldOut, f.heldOutScenarios) {
			evalJobs = append(evalJobs, metaJob{index: i, scenario: sc, configs: append([]sched.Config{defaultConfig(sc.Arch)}, grid...)})
		}
	}
	total := 0
	for _, j := range append(slices.Clone(trainJobs), evalJobs...) {
		total += len(j.configs)
	}
	fmt.Fprintf(log, "tune train: %d training scenarios (%d of synthetic models, the others of %s), %d held-out scenarios of %s, %d simulations of %d iterations on %d goroutines\n",
		len(trainJobs), synthetic, strings.Join(train, ","), len(evalJobs), strings.Join(heldOut, ","), total, f.iterations, f.parallel)
	trainData, evalData, err := metaData(f, trainJobs, evalJobs, &metaProgress{log: log, total: total, start: start})
	if err != nil {
		return err
	}
	simS := time.Since(start).Seconds()

	examples := tune.MetaExamples(trainData, f.target)
	fmt.Fprintf(log, "tune train: simulated in %.0f s; training on %d examples, %d epochs\n", simS, len(examples), f.epochs)
	trainStart := time.Now()
	m, loss, err := tune.TrainMeta(examples, tune.MetaTrainOptions{Hidden: f.hidden, Epochs: f.epochs, Batch: 64, LR: 3e-3, Seed: f.seed, Target: f.target,
		Members: f.members,
		Progress: func(member, epoch int, mse float64) {
			if epoch%10 == 0 || epoch == f.epochs-1 {
				fmt.Fprintf(log, "tune train: member %d/%d epoch %d/%d mse %.4f (%.0f s)\n", member+1, f.members, epoch+1, f.epochs, mse, time.Since(trainStart).Seconds())
			}
		}})
	if err != nil {
		return err
	}
	h := &m.Header
	h.Command = fmt.Sprintf("autobyte tune train --seed %d --scenarios %d --synthetic %v --held-out-scenarios %d --configs %d --iterations %d --epochs %d --members %d --hidden %s --held-out %s --target %s",
		f.seed, f.scenarios, f.synthetic, f.heldOutScenarios, f.configs, f.iterations, f.epochs, f.members, intsList(f.hidden), f.heldOut, f.target)
	h.TrainModels, h.HeldOutModels = train, heldOut
	h.TrainScenarios, h.HeldOutScenarios = len(trainJobs), len(evalJobs)
	h.Simulations, h.Iterations = total, f.iterations
	h.TrainLoss = loss
	h.Partitions, h.Credits = tune.DefaultMetaPartitions, tune.DefaultMetaCredits
	h.SimulateSeconds = simS
	h.TrainSeconds = time.Since(trainStart).Seconds()
	if len(evalData) > 0 {
		ev := tune.EvaluateMeta(m, evalData)
		h.HeldOutLoss, h.HeldOutSpearman, h.HeldOutBestGap = ev.MSE, ev.MeanSpearman, ev.MeanBestGap
		h.HeldOutWorstGap, h.HeldOutWithin5 = ev.WorstBestGap, ev.Within5
		for _, s := range ev.Scenarios {
			fmt.Fprintf(log, "tune train: held out %-50s spread %5.1f%% spearman %5.2f best gap %5.1f%%\n", s.Scenario, 100*s.Spread, s.Spearman, 100*s.BestGap)
		}
	}
	fmt.Fprintf(log, "tune train: train mse %.4f; held out: mse %.4f, mean spearman %.3f, mean best gap %.1f%% (worst %.1f%%, %.0f%% within 5%%); %.0f s in all\n",
		loss, h.HeldOutLoss, h.HeldOutSpearman, 100*h.HeldOutBestGap, 100*h.HeldOutWorstGap, 100*h.HeldOutWithin5, time.Since(start).Seconds())
	data, err := json.MarshalIndent(m, "", " ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(f.out, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	fmt.Fprintf(log, "tune train: wrote %s\n", f.out)
	return nil
}

// metaCache is the --data file: simulated runs by metaRunKey.
type metaCache struct {
	Runs map[string]tune.MetaRun `json:"runs"`
}

// metaRunKey identifies one simulation: scenario, configuration and length.
func metaRunKey(sc tune.MetaScenario, cfg sched.Config, iterations int) string {
	// Every field in full (MetaScenario's String rounds); v2: the
	// statistics carry the round trip.
	return fmt.Sprintf("v2|%s|%s|%d|%d|%v|%v|%v|%+v|%d", sc.Model, sc.Arch, sc.Workers, sc.Servers, sc.BandwidthBps, sc.LatencyS, sc.ComputeScale, cfg, iterations)
}

// metaData simulates the jobs, reusing the runs of the --data cache and
// adding the new ones to it.
func metaData(f tuneTrainFlags, trainJobs, evalJobs []metaJob, prog *metaProgress) (train, eval []tune.MetaScenarioRuns, err error) {
	cache := metaCache{Runs: map[string]tune.MetaRun{}}
	if f.data != "" {
		if b, err := os.ReadFile(f.data); err == nil {
			if err := json.Unmarshal(b, &cache); err != nil {
				return nil, nil, fmt.Errorf("--data %s: %w", f.data, err)
			}
			if cache.Runs == nil {
				cache.Runs = map[string]tune.MetaRun{}
			}
			fmt.Fprintf(prog.log, "tune train: %d simulated runs in %s\n", len(cache.Runs), f.data)
		}
	}
	if train, err = simulateMeta(trainJobs, f.iterations, f.parallel, prog, cache); err != nil {
		return nil, nil, err
	}
	if eval, err = simulateMeta(evalJobs, f.iterations, f.parallel, prog, cache); err != nil {
		return nil, nil, err
	}
	if f.data != "" {
		b, err := json.Marshal(cache)
		if err != nil {
			return nil, nil, err
		}
		if err := os.WriteFile(f.data, b, 0o644); err != nil {
			return nil, nil, fmt.Errorf("--data: %w", err)
		}
	}
	return train, eval, nil
}

func intsList(xs []int) string {
	var s []string
	for _, x := range xs {
		s = append(s, fmt.Sprint(x))
	}
	return strings.Join(s, ",")
}

// defaultConfig is ByteScheduler's default configuration for arch.
func defaultConfig(arch string) sched.Config {
	if arch == "allreduce" {
		return sched.Config{PartitionBytes: arPartitionBytes, CreditBytes: arCreditBytes, Order: sched.OrderPriority}
	}
	return sched.Config{PartitionBytes: psPartitionBytes, CreditBytes: psCreditBytes, Order: sched.OrderPriority}
}

// metaJob is one scenario and the configurations to simulate.
type metaJob struct {
	index    int
	scenario tune.MetaScenario
	configs  []sched.Config
}

// metaProgress reports simulations done on the log, every few seconds.
type metaProgress struct {
	mu    sync.Mutex
	log   io.Writer
	total int
	done  int
	start time.Time
	last  time.Time
}

func (p *metaProgress) add() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done++
	if now := time.Now(); now.Sub(p.last) > 5*time.Second || p.done == p.total {
		p.last = now
		fmt.Fprintf(p.log, "tune train: simulated %d/%d (%.0f s)\n", p.done, p.total, now.Sub(p.start).Seconds())
	}
}

// simulateMeta runs every job's configurations on par goroutines; results
// are in job and configuration order whatever the interleaving.
func simulateMeta(jobs []metaJob, iterations, par int, prog *metaProgress, cache metaCache) ([]tune.MetaScenarioRuns, error) {
	out := make([]tune.MetaScenarioRuns, len(jobs))
	type task struct{ j, c int }
	var tasks []task
	for j, job := range jobs {
		out[j] = tune.MetaScenarioRuns{Scenario: job.scenario, Runs: make([]tune.MetaRun, len(job.configs))}
		for c, cfg := range job.configs {
			if r, ok := cache.Runs[metaRunKey(job.scenario, cfg, iterations)]; ok {
				out[j].Runs[c] = r
				prog.add()
				continue
			}
			tasks = append(tasks, task{j, c})
		}
	}
	// Expensive scenarios first, so the last goroutine does not run alone.
	slices.SortStableFunc(tasks, func(a, b task) int {
		return jobs[b.j].scenario.Workers - jobs[a.j].scenario.Workers
	})
	err := sim.Parallel(len(tasks), par, func(i int) error {
		t := tasks[i]
		job := jobs[t.j]
		r, err := simulateMetaRun(job.scenario, job.configs[t.c], iterations)
		prog.add()
		if err != nil {
			return fmt.Errorf("scenario %d (%s), configuration %+v: %w", job.index, job.scenario, job.configs[t.c], err)
		}
		out[t.j].Runs[t.c] = r
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, t := range tasks {
		cache.Runs[metaRunKey(jobs[t.j].scenario, jobs[t.j].configs[t.c], iterations)] = out[t.j].Runs[t.c]
	}
	return out, nil
}

// simulateMetaRun simulates one scenario under cfg for the given number of
// iterations and returns the mean statistics and the steady-state
// iteration time (parameter servers shard pieces above 4 MB, as the sim
// command does by default).
func simulateMetaRun(sc tune.MetaScenario, cfg sched.Config, iterations int) (tune.MetaRun, error) {
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
		o.ShardBytes = 4_000_000
	}
	r, err := sim.Run(o)
	if err != nil {
		return tune.MetaRun{}, err
	}
	skip := max(1, len(r.Stats)/5)
	return tune.MetaRun{Config: cfg, Stats: tune.MeanStats(r.Stats[skip:]), IterationTimeS: r.IterationTimeS}, nil
}
