package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/autobyte/autobyte/internal/outfile"
	"github.com/autobyte/autobyte/model"
	"github.com/autobyte/autobyte/tune"
	"github.com/autobyte/autobyte/tunedata"
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
	// The results are written after minutes of simulation: a path that
	// cannot take them is refused before any.
	if err := outfile.Check(f.out); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	if f.data != "" {
		if err := outfile.Check(f.data); err != nil {
			return fmt.Errorf("--data: %w", err)
		}
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
	plan, err := tunedata.NewPlan(tunedata.PlanOptions{Seed: f.seed, TrainModels: train, HeldOutModels: heldOut,
		Scenarios: f.scenarios, HeldOutScenarios: f.heldOutScenarios, Configs: f.configs, Synthetic: f.synthetic})
	if err != nil {
		return err
	}
	trainJobs, evalJobs := plan.Train, plan.Eval
	total := plan.Simulations()
	fmt.Fprintf(log, "tune train: %d training scenarios (%d of synthetic models, the others of %s), %d held-out scenarios of %s, %d simulations of %d iterations on %d goroutines\n",
		len(trainJobs), plan.Synthetic, strings.Join(train, ","), len(evalJobs), strings.Join(heldOut, ","), total, f.iterations, f.parallel)
	trainData, evalData, err := metaData(f, plan, &metaProgress{log: log, total: total, start: start})
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
	if err := outfile.WriteFile(f.out, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	fmt.Fprintf(log, "tune train: wrote %s\n", f.out)
	return nil
}

// metaData simulates the plan, reusing the runs of the --data cache and
// adding the new ones to it. The cache is saved when the simulations end,
// fail or are interrupted (SIGINT, SIGTERM), so a run that stops early
// keeps every simulation it finished.
func metaData(f tuneTrainFlags, plan tunedata.Plan, prog *metaProgress) (train, eval []tune.MetaScenarioRuns, err error) {
	cache := &tunedata.Cache{}
	if f.data != "" {
		if cache, err = tunedata.LoadCache(f.data); err != nil {
			return nil, nil, fmt.Errorf("--data: %w", err)
		}
		fmt.Fprintf(prog.log, "tune train: %d simulated runs in %s\n", cache.Len(), f.data)
		defer saveOnInterrupt(cache, f.data, prog.log)()
		defer func() {
			if serr := cache.Save(f.data); serr != nil {
				err = errors.Join(err, fmt.Errorf("--data: %w", serr))
			}
		}()
	}
	if train, err = tunedata.Simulate(plan.Train, f.iterations, f.parallel, cache, prog.add); err != nil {
		return nil, nil, err
	}
	if eval, err = tunedata.Simulate(plan.Eval, f.iterations, f.parallel, cache, prog.add); err != nil {
		return nil, nil, err
	}
	return train, eval, nil
}

// saveOnInterrupt saves cache to path and ends the process when it is
// interrupted, until the function it returns is called.
func saveOnInterrupt(cache *tunedata.Cache, path string, log io.Writer) (stop func()) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sig:
			if err := cache.Save(path); err != nil {
				fmt.Fprintf(log, "tune train: %v: saving the %d simulated runs to %s failed: %v\n", s, cache.Len(), path, err)
			} else {
				fmt.Fprintf(log, "tune train: %v: saved %d simulated runs to %s; run the same command to go on from there\n", s, cache.Len(), path)
			}
			os.Exit(130)
		case <-done:
		}
	}()
	return func() {
		signal.Stop(sig)
		close(done)
	}
}

func intsList(xs []int) string {
	var s []string
	for _, x := range xs {
		s = append(s, fmt.Sprint(x))
	}
	return strings.Join(s, ",")
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

func (p *metaProgress) add(int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done++
	if now := time.Now(); now.Sub(p.last) > 5*time.Second || p.done == p.total {
		p.last = now
		fmt.Fprintf(p.log, "tune train: simulated %d/%d (%.0f s)\n", p.done, p.total, now.Sub(p.start).Seconds())
	}
}
