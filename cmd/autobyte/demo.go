package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/autobyte/autobyte/model"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/sim"
	"github.com/autobyte/autobyte/units"
)

// newDemoCmd is the README's main job. Until the real runtime lands it is a
// simulator comparison of the three schedulers on a communication-heavy job.
func newDemoCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "demo",
		Short: "Compare fifo, priority and bytescheduler on a communication-heavy job (simulated)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := model.Get("vgg16")
			if err != nil {
				return err
			}
			base := sim.Options{Profile: p, Arch: sim.PS, Workers: 8, Servers: 8,
				BandwidthBps: 10e9 / 8, LatencyS: 50e-6, ShardBytes: defaultShardBytes, Iterations: 10}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "VGG16 (%s of fp32 gradients), 8 workers + 8 parameter servers, 10 Gbps links, 50 µs latency (simulated)\n\n",
				units.FormatBytes(p.TotalBytes()))
			runs := []struct {
				name    string
				cfg     sched.Config
				barrier bool
			}{
				{"fifo", sched.Config{}, true},
				{"priority", sched.Config{Order: sched.OrderPriority}, false},
				{"bytescheduler", sched.Config{PartitionBytes: psPartitionBytes, CreditBytes: psCreditBytes, Order: sched.OrderPriority}, false},
			}
			var fifo float64
			for i, r := range runs {
				o := base
				o.Sched, o.GlobalBarrier = r.cfg, r.barrier
				res, err := sim.Run(o)
				if err != nil {
					return err
				}
				if i == 0 {
					fifo = res.IterationTimeS
				}
				fmt.Fprintf(out, "  %-14s %9s per iteration  %6.1f samples/s  speedup %.2fx  (lower bound %s)\n",
					r.name, units.FormatSeconds(res.IterationTimeS), res.SamplesPerS, fifo/res.IterationTimeS, units.FormatSeconds(res.Bounds.MaxS))
			}
			fmt.Fprintln(out, "\nTry: autobyte sim --help, autobyte sweep --help, autobyte models")
			return nil
		},
	}
}
