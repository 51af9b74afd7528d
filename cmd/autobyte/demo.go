package main

import (
	"fmt"
	"math"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/autobyte/autobyte/sim"
	"github.com/autobyte/autobyte/units"
)

// newDemoCmd is the README's main job: a real local cluster, fifo then
// bytescheduler, next to the simulator's prediction for the same job.
func newDemoCmd() *cobra.Command {
	var f scenarioFlags
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run a real local cluster under fifo and then bytescheduler, next to the simulator's prediction",
		Long: `demo starts 2 parameter servers and 4 workers as separate processes on
loopback, each shaping its links to 2 Gbps, and replays AlexNet (a
communication-heavy model: 244 MB of gradients for 17.5 ms of compute) for a
few iterations with real gradient data, first unscheduled (fifo) and then with
ByteScheduler's partitioning, priority and credit. It prints each run's
steady-state iteration time next to what 'autobyte sim' predicts for the same
job, and checks every sum it receives against the exact value. It takes about
a minute on 2 cores.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			type row struct {
				name              string
				measured, predict float64
				verified          bool
			}
			var rows []row
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
				rep := newLaunchReport(f, o, spec, res)
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
			fmt.Fprintln(out, "\nNext: autobyte launch --help, autobyte sim --help, autobyte sweep, autobyte models;\nPyTorch: autobyte launch --workers 3 --servers 3 -- /usr/bin/python3 examples/torch_cnn.py (docs/pytorch.md)")
			return nil
		},
	}
	f.register(cmd)
	// The demo's scenario; the flags stay hidden but let tests shrink it.
	for name, value := range map[string]string{"model": "alexnet", "workers": "4", "servers": "2", "bandwidth": "2Gbps", "iterations": "6"} {
		_ = cmd.Flags().Set(name, value)
	}
	cmd.Flags().VisitAll(func(fl *pflag.Flag) { fl.Hidden = true })
	return cmd
}
