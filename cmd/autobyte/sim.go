package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/sim"
	"github.com/autobyte/autobyte/stats"
	"github.com/autobyte/autobyte/trace"
	"github.com/autobyte/autobyte/units"
)

func newSimCmd() *cobra.Command {
	var f scenarioFlags
	var traceFile string
	var tf tunerFlags
	var asJSON bool
	var messageCost, wire string
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Simulate a training job's iterations on a virtual clock",
		Long: `sim replays a model's compute on every worker and schedules its gradient
communication with the scheduling core over a simulated network of duplex host
links, with parameter servers or ring all-reduce. It reports the steady-state
iteration time next to lower bounds for the same job. --message-cost adds a
fixed processing time to every message (push, pull, ring step), charged to
its sender's link before its bytes (measure yours with
scripts/message-cost.sh). --wire connections gives every pair of hosts its
own sender and lets the messages in flight share each link fairly, as the
runtime's connections and TCP do; the default, host, sends the most urgent
message of each host first. A run longer than 5 s reports its progress on
stderr every 5 s.`,
		Example: `  autobyte sim --model vgg16 --arch ps --workers 8 --bandwidth 10Gbps --scheduler bytescheduler
  autobyte sim --model toy3 --workers 1 --servers 1 --bandwidth 1MB/s --latency 0 --scheduler fifo --json
  autobyte sim --model resnet50 --workers 8 --bandwidth 100Gbps --partition 256KB --message-cost 15us`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := f.options(cmd)
			if err != nil {
				return err
			}
			if o.Wire, err = sim.ParseWire(wire); err != nil {
				return fmt.Errorf("--wire: %w", err)
			}
			if _, err := o.Budget(); err != nil {
				return f.budgetFlag(o, err)
			}
			if o.MessageCostS, err = units.ParseDuration(messageCost); err != nil {
				return fmt.Errorf("--message-cost: %w", err)
			}
			tn, err := tf.build(o, f.seed, f.autoKnobs())
			if err != nil {
				return err
			}
			if tf.name != "static" {
				o.Tuner = tn // static runs without a tuner: the configuration stays as given
			}
			var tf *os.File
			if traceFile != "" {
				if tf, err = os.Create(traceFile); err != nil {
					return fmt.Errorf("--trace: %w", err)
				}
				defer tf.Close()
				o.Trace = trace.NewWriter(tf)
			}
			o.Progress = simProgress(cmd.ErrOrStderr(), o.Iterations, progressEvery)
			start := time.Now()
			r, err := sim.Run(o)
			if err != nil {
				return err
			}
			if o.Trace != nil {
				if err := o.Trace.Close(); err != nil {
					return fmt.Errorf("--trace %s: %w", traceFile, err)
				}
				if err := tf.Close(); err != nil {
					return fmt.Errorf("--trace %s: %w", traceFile, err)
				}
			}
			rep := newSimReport(f, o, r, time.Since(start))
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				return enc.Encode(rep)
			}
			return rep.writeText(cmd.OutOrStdout())
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&traceFile, "trace", "", "write rank 0's Chrome-trace timeline (chrome://tracing, Perfetto) to this file")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	cmd.Flags().StringVar(&messageCost, "message-cost", "0", "fixed processing time per message (push, pull, ring step) on its sender's link, e.g. 15us (0 = none)")
	cmd.Flags().StringVar(&wire, "wire", "host", "how messages share the links: host (one priority queue per host) or connections (one sender per connection, fair shares, as the runtime)")
	tf.register(cmd)
	return cmd
}

// runReport is what 'autobyte sim --json' and 'autobyte launch --json'
// share: the job, its first configuration, its iteration times and the
// configurations it ran, summarised by one rule (stats.Summarize). Scripts
// depend on the field names.
type runReport struct {
	Model           string     `json:"model"`
	Arch            string     `json:"arch"`
	Workers         int        `json:"workers"`
	Servers         int        `json:"servers"`
	ComputeScale    float64    `json:"compute_scale"`
	Scheduler       string     `json:"scheduler"`
	PartitionBytes  int64      `json:"partition_bytes"`
	CreditBytes     int64      `json:"credit_bytes"`
	Iterations      int        `json:"iterations"`
	IterationTimeS  float64    `json:"iteration_time_s"`
	IterationTimesS []float64  `json:"iteration_times_s"`
	SamplesPerS     float64    `json:"samples_per_s"`
	MeanIterationS  float64    `json:"mean_iteration_time_s"`
	Configs         []configAt `json:"configs"`
	WallS           float64    `json:"wall_s"`
}

func newRunReport(f scenarioFlags, o sim.Options, times []float64, configs []sim.ConfigChange, wall time.Duration) runReport {
	sum := stats.Summarize(times, o.Profile.BatchSize*o.Workers)
	return runReport{Model: o.Profile.Name, Arch: o.Arch.String(), Workers: o.Workers, Servers: o.Servers,
		ComputeScale: f.computeScale, Scheduler: f.scheduler,
		PartitionBytes: o.Sched.PartitionBytes, CreditBytes: o.Sched.CreditBytes, Iterations: o.Iterations,
		IterationTimeS: sum.SteadyS, IterationTimesS: times, SamplesPerS: sum.SamplesPerS, MeanIterationS: sum.MeanS,
		Configs: configsOf(configs), WallS: wall.Seconds()}
}

// simReport is the JSON contract of 'autobyte sim --json'.
type simReport struct {
	runReport
	BandwidthBps  float64    `json:"bandwidth_bytes_per_s"`
	LatencyS      float64    `json:"latency_s"`
	MessageCostS  float64    `json:"message_cost_s,omitempty"`
	Wire          string     `json:"wire"`
	Admission     string     `json:"admission"`
	LowerBoundS   float64    `json:"lower_bound_s"`
	BoundRatio    float64    `json:"achieved_over_bound"`
	Bounds        sim.Bounds `json:"bounds"`
	PiecesPerIter int        `json:"pieces_per_iteration"`
	GradientBytes int64      `json:"gradient_bytes"`
	Links         linkReport `json:"link_bytes"`
	// LinkTraces are the --link-trace values, as given.
	LinkTraces       []string `json:"link_traces,omitempty"`
	Events           int64    `json:"events"`
	SimEventsPerWall float64  `json:"events_per_wall_s"`
}

// configAt is a configuration and the iteration it applied from.
type configAt struct {
	FromIteration  int    `json:"from_iteration"`
	PartitionBytes int64  `json:"partition_bytes"`
	CreditBytes    int64  `json:"credit_bytes"`
	Order          string `json:"order"`
	Admission      string `json:"admission"`
	// Compression is the gradients' wire type when compressed (absent:
	// float32).
	Compression string `json:"compression,omitempty"`
	// ServerWeights are the parameter servers' shares of the bytes when
	// not even (absent: by bytes alone).
	ServerWeights sched.ServerWeights `json:"server_weights,omitzero"`
	// FusionBytes is the fusion size when tensors are fused (absent: none).
	FusionBytes int64 `json:"fusion_bytes,omitempty"`
	config      sched.Config
}

// linkReport summarises the bytes carried per link over the run.
type linkReport struct {
	WorkerEgressMax  int64 `json:"worker_egress_max"`
	WorkerIngressMax int64 `json:"worker_ingress_max"`
	ServerEgressMax  int64 `json:"server_egress_max,omitempty"`
	ServerIngressMax int64 `json:"server_ingress_max,omitempty"`
	// ServerIngressMean is what the servers received on average: far below
	// the max, the placement could not spread the pieces evenly.
	ServerIngressMean int64 `json:"server_ingress_mean,omitempty"`
	Total             int64 `json:"total_egress"`
}

func newSimReport(f scenarioFlags, o sim.Options, r *sim.Result, wall time.Duration) simReport {
	bound := lowerBound(o, r)
	maxOf := func(xs []int64) int64 {
		if len(xs) == 0 {
			return 0
		}
		return slices.Max(xs)
	}
	var total, serverIn int64
	for _, x := range r.Links.ServerIngress {
		serverIn += x
	}
	if n := len(r.Links.ServerIngress); n > 0 {
		serverIn /= int64(n)
	}
	for _, xs := range [][]int64{r.Links.WorkerEgress, r.Links.ServerEgress} {
		for _, x := range xs {
			total += x
		}
	}
	run := newRunReport(f, o, r.IterationTimesS, r.Configs, wall)
	return simReport{
		runReport:    run,
		BandwidthBps: o.BandwidthBps, LatencyS: o.LatencyS, MessageCostS: o.MessageCostS, Wire: o.Wire.String(),
		Admission:   o.Sched.Admission.String(),
		LowerBoundS: bound, BoundRatio: run.IterationTimeS / bound, Bounds: r.Bounds,
		PiecesPerIter: r.Pieces, GradientBytes: o.Profile.TotalBytes(),
		Links: linkReport{
			WorkerEgressMax: maxOf(r.Links.WorkerEgress), WorkerIngressMax: maxOf(r.Links.WorkerIngress),
			ServerEgressMax: maxOf(r.Links.ServerEgress), ServerIngressMax: maxOf(r.Links.ServerIngress),
			ServerIngressMean: serverIn, Total: total,
		},
		LinkTraces: f.linkTraces,
		Events:     r.Events, SimEventsPerWall: float64(r.Events) / wall.Seconds(),
	}
}

// lowerBound bounds the steady-state iteration time: the job's bound when
// conditions are fixed; with traces or stragglers, the steady-state mean of
// each iteration's fluid bound (which holds iteration by iteration).
func lowerBound(o sim.Options, r *sim.Result) float64 {
	if len(o.BandwidthTrace) == 0 && len(o.ComputeTrace) == 0 && len(o.Stragglers) == 0 && len(o.ServerLinkTraces)+len(o.WorkerLinkTraces) == 0 {
		return r.Bounds.MaxS
	}
	var per []float64
	for _, b := range r.LowerBoundsAt {
		per = append(per, b.FluidS)
	}
	return stats.SteadyState(per)
}

func configsOf(cs []sim.ConfigChange) []configAt {
	out := []configAt{}
	for _, c := range cs {
		ca := configAt{FromIteration: c.FromIteration, PartitionBytes: c.Config.PartitionBytes,
			CreditBytes: c.Config.CreditBytes, Order: c.Config.Order.String(), Admission: c.Config.Admission.String(), config: c.Config}
		if c.Config.Compression != dtype.F32 {
			ca.Compression = c.Config.Compression.String()
		}
		ca.ServerWeights, ca.FusionBytes = c.Config.ServerWeights, c.Config.FusionBytes
		out = append(out, ca)
	}
	return out
}

func (r simReport) writeText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	sz := func(n int64) string {
		if n == 0 {
			return "none"
		}
		return units.FormatBytes(n)
	}
	fmt.Fprintf(tw, "model\t%s (%s of gradients, %d pieces/iteration)\n", r.Model, units.FormatBytes(r.GradientBytes), r.PiecesPerIter)
	cluster := fmt.Sprintf("%s, %d workers", r.Arch, r.Workers)
	if r.Arch == "ps" {
		cluster += fmt.Sprintf(", %d servers", r.Servers)
	}
	cost := ""
	if r.MessageCostS > 0 {
		cost = fmt.Sprintf(", %s per message", units.FormatSeconds(r.MessageCostS))
	}
	fmt.Fprintf(tw, "cluster\t%s, %s per link, %s latency%s\n", cluster, units.FormatRate(r.BandwidthBps), units.FormatSeconds(r.LatencyS), cost)
	if len(r.LinkTraces) > 0 {
		fmt.Fprintf(tw, "links\t%s\n", strings.Join(r.LinkTraces, "; "))
	}
	fmt.Fprintf(tw, "scheduler\t%s (partition %s, credit %s, admission %s)\n", r.Scheduler, sz(r.PartitionBytes), sz(r.CreditBytes), r.Admission)
	fmt.Fprintf(tw, "iteration\t%s steady state (%d iterations), %.1f samples/s\n", units.FormatSeconds(r.IterationTimeS), r.Iterations, r.SamplesPerS)
	fmt.Fprintf(tw, "lower bound\t%s (achieved/bound %.3f): compute %s, worker link %s, server link %s, first layer %s, fluid %s\n",
		units.FormatSeconds(r.LowerBoundS), r.BoundRatio, units.FormatSeconds(r.Bounds.ComputeS), units.FormatSeconds(r.Bounds.WorkerLinkS),
		units.FormatSeconds(r.Bounds.ServerLinkS), units.FormatSeconds(r.Bounds.FirstLayerS), units.FormatSeconds(r.Bounds.FluidS))
	if len(r.Configs) > 1 {
		fmt.Fprintf(tw, "configs\t")
		for i, c := range r.Configs {
			if i > 0 {
				fmt.Fprint(tw, "; ")
			}
			fmt.Fprintf(tw, "from %d: %s", c.FromIteration, c.config.Knobs())
		}
		fmt.Fprintf(tw, "\n\tmean over the run %s\n", units.FormatSeconds(r.MeanIterationS))
	}
	fmt.Fprintf(tw, "link bytes\tworker egress max %s, server ingress max %s, total %s\n", units.FormatBytes(r.Links.WorkerEgressMax), units.FormatBytes(r.Links.ServerIngressMax), units.FormatBytes(r.Links.Total))
	if hint := r.balanceHint(); hint != "" {
		fmt.Fprintf(tw, "balance\t%s\n", hint)
	}
	fmt.Fprintf(tw, "simulated\t%d events in %s (%.2g events/s)\n", r.Events, units.FormatSeconds(r.WallS), r.SimEventsPerWall)
	return tw.Flush()
}

// balanceHint says when the busiest parameter server received far more
// than the servers' mean (1.5x): the pieces are too few and too large to
// spread over that many servers, as with the default 4 MB partition and
// hundreds of servers. It suggests a partition giving each server about
// four pieces per iteration. "" when the load is even.
func (r simReport) balanceHint() string {
	l := r.Links
	if r.Arch != "ps" || l.ServerIngressMean <= 0 || float64(l.ServerIngressMax) < 1.5*float64(l.ServerIngressMean) {
		return ""
	}
	suggest := int64(4 << 10)
	for suggest*2 <= r.GradientBytes/int64(4*r.Servers) {
		suggest *= 2
	}
	hint := fmt.Sprintf("the busiest server received %.1fx the servers' mean: %d pieces per iteration do not spread evenly over %d servers",
		float64(l.ServerIngressMax)/float64(l.ServerIngressMean), r.PiecesPerIter, r.Servers)
	if r.PartitionBytes > suggest {
		size := fmt.Sprintf("%dKiB", suggest>>10)
		if suggest >= 1<<20 {
			size = fmt.Sprintf("%dMiB", suggest>>20)
		}
		hint += fmt.Sprintf("; smaller pieces would (e.g. --partition %s), or --tuner autobyte, which tunes the partition", size)
	}
	return hint
}

// progressEvery is how often a long simulation reports its progress.
const progressEvery = 5 * time.Second

// simProgress is a sim.Options.Progress that reports a long run on w (the
// command's stderr, so that --json's stdout stays one object): nothing for
// its first interval, then at most one line per interval, with the time
// left extrapolated from the iterations done.
func simProgress(w io.Writer, iterations int, every time.Duration) func(int, int64) {
	start := time.Now()
	last := start
	return func(k int, events int64) {
		now := time.Now()
		if now.Sub(last) < every || k+1 >= iterations {
			return
		}
		last = now
		done, elapsed := k+1, now.Sub(start)
		left := time.Duration(float64(elapsed) * float64(iterations-done) / float64(done))
		fmt.Fprintf(w, "sim: iteration %d of %d, %.3g events in %s, about %s left\n",
			done, iterations, float64(events), elapsed.Round(time.Second), left.Round(time.Second))
	}
}
