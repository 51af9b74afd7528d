package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/autobyte/autobyte/internal/outfile"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/sim"
	"github.com/autobyte/autobyte/tune"
	"github.com/autobyte/autobyte/tuneeval"
	"github.com/autobyte/autobyte/units"
)

// newDemoCmd is the README's main job: a real local cluster, fifo then
// bytescheduler, next to the simulator's prediction for the same job.
func newDemoCmd() *cobra.Command {
	var f scenarioFlags
	var load demoLoadFlags
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run a real local cluster under fifo and then bytescheduler, next to the simulator's prediction",
		Long: `demo starts 2 parameter servers and 4 workers as separate processes on
loopback, each shaping its links to 2 Gbps, and replays AlexNet (a
communication-heavy model: 244 MB of gradients for 17.5 ms of compute) for a
few iterations with real gradient data, first unscheduled (fifo) and then with
ByteScheduler's partitioning, priority and credit. It prints each run's
steady-state iteration time next to what 'autobyte sim' predicts for the same
job, and checks every sum it receives against the exact value.

Then it replays ResNet-50 on the same cluster under the autobyte tuner while
one parameter server's link drops to a quarter of its rate mid-run, as a NIC
shared with another job would: the tuner sees that server set the pace and
moves load off it, printed as it happens, and the run is drawn (iteration time
and each server's share of the bytes) beside the best static server weights
and even weights, as the simulator predicts them, in autobyte-demo-load.png.
It takes about two minutes on 2 cores.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			type row struct {
				name              string
				measured, predict float64
				verified          bool
			}
			var rows []row
			// The plot is drawn after minutes of runs: a path that cannot
			// take it is refused first.
			if load.plot != "" {
				if err := outfile.Check(load.plot); err != nil {
					return fmt.Errorf("--load-plot: %w", err)
				}
			}
			ctx, stop := signalContext()
			defer stop()
			for _, scheduler := range []string{"fifo", "bytescheduler"} {
				f.scheduler = scheduler
				spec, o, err := f.spec(cmd)
				if err != nil {
					return err
				}
				if scheduler == "fifo" {
					fmt.Fprintf(out, "%s (%s of gradients) on %d workers + %d parameter servers, real processes on loopback, links shaped to %s\n",
						o.Profile.Name, units.FormatBytes(o.Profile.TotalBytes()), o.Workers, o.Servers, units.FormatRate(o.BandwidthBps))
				}
				fmt.Fprintf(out, "\n== %s: %d iterations\n", scheduler, o.Iterations)
				var args []string
				for _, a := range scenarioArgs(cmd) {
					if !strings.HasPrefix(a, "--scheduler=") {
						args = append(args, a)
					}
				}
				args = append(args, "--scheduler="+scheduler)
				res, err := launchLocal(ctx, args, spec, launchConfig{verify: "sample", logLevel: "warn", peerTimeout: 5e9, progress: out})
				if err != nil {
					return err
				}
				rep := newLaunchReport(f, o, res)
				// In-process shaping on loopback adds no latency of note.
				o.LatencyS = 20e-6
				pr, err := sim.Run(o)
				if err != nil {
					return err
				}
				rows = append(rows, row{scheduler, rep.IterationTimeS, pr.IterationTimeS, rep.Verified})
			}
			fmt.Fprintf(out, "\n%-14s %12s %12s %8s  %s\n", "scheduler", "measured", "simulated", "diff", "sums exact")
			for _, r := range rows {
				fmt.Fprintf(out, "%-14s %12s %12s %+7.1f%%  %v\n", r.name, units.FormatSeconds(r.measured), units.FormatSeconds(r.predict),
					100*(r.measured/r.predict-1), r.verified)
			}
			fmt.Fprintf(out, "\nbytescheduler speedup over fifo: measured %.2fx, simulated %.2fx\n",
				rows[0].measured/rows[1].measured, rows[0].predict/rows[1].predict)
			if math.IsNaN(rows[0].measured) {
				return fmt.Errorf("demo: no iteration was measured")
			}
			if err := demoLoad(ctx, cmd, &f, load, out); err != nil {
				return err
			}
			fmt.Fprintln(out, "\nNext: autobyte launch --help, autobyte sim --help, autobyte sweep, autobyte models;\nPyTorch: autobyte launch --workers 3 --servers 3 -- /usr/bin/python3 examples/torch_cnn.py (docs/pytorch.md)")
			return nil
		},
	}
	f.register(cmd)
	load.register(cmd)
	// The demo's scenario; the flags stay hidden but let tests shrink it.
	for name, value := range map[string]string{"model": "alexnet", "workers": "4", "servers": "2", "bandwidth": "2Gbps", "iterations": "6"} {
		_ = cmd.Flags().Set(name, value)
	}
	cmd.Flags().VisitAll(func(fl *pflag.Flag) { fl.Hidden = true })
	return cmd
}

// demoLoadFlags shape the demo's last part (hidden; tests shrink it).
type demoLoadFlags struct {
	model      string
	iterations int
	slowFrom   int
	slowdown   float64
	plot       string
}

func (l *demoLoadFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&l.model, "load-model", "resnet50", "model of the slow-server part")
	fs.IntVar(&l.iterations, "load-iterations", 30, "iterations of the slow-server part")
	fs.IntVar(&l.slowFrom, "load-slow-from", 8, "iteration from which server 1's link is slow")
	fs.Float64Var(&l.slowdown, "load-slowdown", 4, "how many times slower server 1's link gets")
	fs.StringVar(&l.plot, "load-plot", "autobyte-demo-load.png", "PNG of the slow-server part (empty: none)")
}

// demoLoad is the demo's last part: a real run under the autobyte tuner
// while server 1's link slows down, next to the simulator's best static
// server weights and even weights for the same job.
func demoLoad(ctx context.Context, cmd *cobra.Command, f *scenarioFlags, l demoLoadFlags, out io.Writer) error {
	if l.slowFrom < 1 || l.slowFrom >= l.iterations || !(l.slowdown > 1) || math.IsInf(l.slowdown, 0) {
		return fmt.Errorf("demo: the slow link must start within the run and slow down (from iteration %d of %d, %vx)", l.slowFrom, l.iterations, l.slowdown)
	}
	fl := cmd.Flags()
	rate, err := units.ParseRate(f.bandwidth)
	if err != nil {
		return fmt.Errorf("--bandwidth: %w", err)
	}
	trace := fmt.Sprintf("server1=%d:%gB/s", l.slowFrom, rate/l.slowdown)
	for name, v := range map[string]string{"model": l.model, "iterations": strconv.Itoa(l.iterations), "scheduler": "bytescheduler", "link-trace": trace} {
		if err := fl.Set(name, v); err != nil {
			return fmt.Errorf("demo: --%s %s: %w", name, v, err)
		}
	}
	spec, o, err := f.spec(cmd)
	if err != nil {
		return err
	}
	if o.Servers < 2 {
		return fmt.Errorf("demo: moving load needs 2 or more servers, got %d", o.Servers)
	}
	fmt.Fprintf(out, "\n== %s under the autobyte tuner: server 1's link drops to %s (1/%g) from iteration %d of %d\n",
		o.Profile.Name, units.FormatRate(rate/l.slowdown), l.slowdown, l.slowFrom, l.iterations)
	res, err := launchLocal(ctx, scenarioArgs(cmd), spec, launchConfig{verify: "sample", logLevel: "warn", peerTimeout: 5e9,
		progress: out, workerArgs: []string{"--tuner=autobyte"}})
	if err != nil {
		return err
	}
	rep := newLaunchReport(*f, o, res)
	o.LatencyS = 20e-6 // in-process shaping on loopback adds no latency of note
	phases := []tuneeval.Phase{{From: 0, To: l.slowFrom}, {From: l.slowFrom, To: l.iterations}}
	var best, even *sim.Result
	var bestW sched.ServerWeights
	for _, w := range tuneeval.WeightCandidates(o, phases) {
		so := o
		so.Sched.ServerWeights = w
		r, err := sim.Run(so)
		if err != nil {
			return err
		}
		if !w.Weighted() {
			even = r
		}
		if best == nil || r.MeanIterationTimeS < best.MeanIterationTimeS {
			best, bestW = r, w
		}
	}
	tuner, err := tune.NewAutoByte(tune.AutoByteOptions{Base: sched.Config{Order: sched.OrderPriority, Admission: o.Sched.Admission}, Seed: f.seed})
	if err != nil {
		return err
	}
	so := o
	so.Tuner = tuner
	simTuned, err := sim.Run(so)
	if err != nil {
		return err
	}
	slowMean := func(ts []float64) float64 {
		if len(ts) <= l.slowFrom {
			return math.NaN()
		}
		var s float64
		for _, t := range ts[l.slowFrom:] {
			s += t
		}
		return s / float64(len(ts)-l.slowFrom)
	}
	bestName := "best static weights " + bestW.String()
	if !bestW.Weighted() {
		bestName = "best static weights (even)"
	}
	fmt.Fprintf(out, "\n%-46s %12s %15s\n", "run", "mean", "mean once slow")
	for _, r := range []struct {
		name  string
		times []float64
	}{{"autobyte, measured", rep.IterationTimesS}, {"autobyte, simulated", simTuned.IterationTimesS},
		{bestName + ", simulated", best.IterationTimesS}, {"even weights, simulated", even.IterationTimesS}} {
		var mean float64
		for _, t := range r.times {
			mean += t / float64(len(r.times))
		}
		fmt.Fprintf(out, "%-46s %12s %15s\n", r.name, units.FormatSeconds(mean), units.FormatSeconds(slowMean(r.times)))
	}
	fmt.Fprintf(out, "sums exact: %v\n", rep.Verified)
	if l.plot != "" {
		var changes []tune.ConfigChange
		for _, c := range rep.Configs {
			changes = append(changes, tune.ConfigChange{FromIteration: c.FromIteration, Config: c.config})
		}
		runs := []tuneeval.LoadRun{{Name: "autobyte, measured", IterationTimesS: rep.IterationTimesS, Configs: changes},
			{Name: bestName + ", simulated", IterationTimesS: best.IterationTimesS, Configs: best.Configs},
			{Name: "even weights, simulated", IterationTimesS: even.IterationTimesS, Configs: even.Configs}}
		title := fmt.Sprintf("%s, %d workers + %d servers: server 1 at 1/%g from iteration %d", o.Profile.Name, o.Workers, o.Servers, l.slowdown, l.slowFrom)
		if err := tuneeval.PlotLoad(l.plot, title, o.Servers, runs, []int{l.slowFrom}); err != nil {
			return fmt.Errorf("demo: --load-plot %s: %w", l.plot, err)
		}
		fmt.Fprintf(out, "plot: %s\n", l.plot)
	}
	if !rep.Verified {
		return fmt.Errorf("demo: the slow-server run's sums were not verified")
	}
	return nil
}
