package main

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/autobyte/autobyte/model"
	"github.com/autobyte/autobyte/proto"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/sim"
	"github.com/autobyte/autobyte/units"
)

func newSweepCmd() *cobra.Command {
	var (
		models, archs, workers, bandwidths, partitions, credits string
		latency, format                                         string
		iterations                                              int
	)
	cmd := &cobra.Command{
		Use:   "sweep",
		Short: "Speedup of bytescheduler over fifo, at default settings and over a partition × credit grid (simulated)",
		Long: `sweep simulates every combination of the listed models, architectures, worker
counts and bandwidths under fifo, priority, bytescheduler at ByteScheduler's
defaults, and bytescheduler at every point of a partition × credit grid, and
prints one row per scenario. Parameter-server runs use as many servers as
workers. Progress goes to stderr.`,
		Example: `  autobyte sweep --models vgg16,resnet50 --arch ps --workers 8 --bandwidth 10Gbps`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			names := splitList(models)
			if models == "all" {
				names = nil
				for _, n := range model.Zoo() {
					if n != "toy3" {
						names = append(names, n)
					}
				}
			}
			var profiles []*model.Profile
			for _, n := range names {
				p, err := model.Get(n)
				if err != nil {
					return fmt.Errorf("--models: %w", err)
				}
				profiles = append(profiles, p)
			}
			var archList []sim.Arch
			for _, a := range splitList(archs) {
				arch, err := sim.ParseArch(a)
				if err != nil {
					return fmt.Errorf("--arch: %w", err)
				}
				archList = append(archList, arch)
			}
			var nList []int
			for _, w := range splitList(workers) {
				var n int
				if _, err := fmt.Sscanf(w, "%d", &n); err != nil || n < 1 || fmt.Sprint(n) != w {
					return fmt.Errorf("--workers: %q is not a positive integer", w)
				}
				nList = append(nList, n)
			}
			var bwList []float64
			for _, b := range splitList(bandwidths) {
				bw, err := units.ParseRate(b)
				if err != nil {
					return fmt.Errorf("--bandwidth: %w", err)
				}
				bwList = append(bwList, bw)
			}
			parts, err := parseSizes("--partitions", partitions)
			if err != nil {
				return err
			}
			creds, err := parseSizes("--credits", credits)
			if err != nil {
				return err
			}
			lat, err := units.ParseDuration(latency)
			if err != nil {
				return fmt.Errorf("--latency: %w", err)
			}
			if iterations < 2 {
				return fmt.Errorf("--iterations must be >= 2 for a steady state, got %d", iterations)
			}
			if format != "md" && format != "json" {
				return fmt.Errorf("unknown --format %q (want md or json)", format)
			}
			var scenarios []sim.Options
			for _, p := range profiles {
				for _, a := range archList {
					for _, n := range nList {
						for _, bw := range bwList {
							o := sim.Options{Profile: p, Arch: a, Workers: n, BandwidthBps: bw, LatencyS: lat, Iterations: iterations}
							if a == sim.PS {
								o.Servers, o.ShardBytes = n, proto.DefaultShardBytes
							}
							scenarios = append(scenarios, o)
						}
					}
				}
			}
			if len(scenarios) == 0 {
				return fmt.Errorf("no scenarios: --models, --arch, --workers and --bandwidth must each name at least one value")
			}
			rows, err := runSweep(scenarios, parts, creds, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if format == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				for _, r := range rows {
					if err := enc.Encode(r); err != nil {
						return err
					}
				}
				return nil
			}
			return writeSweepTable(cmd.OutOrStdout(), rows)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&models, "models", "all", "comma-separated zoo models, or all (every model but toy3)")
	fs.StringVar(&archs, "arch", "ps,allreduce", "comma-separated architectures")
	fs.StringVar(&workers, "workers", "8,64", "comma-separated worker counts")
	fs.StringVar(&bandwidths, "bandwidth", "1Gbps,10Gbps,100Gbps", "comma-separated link rates")
	fs.StringVar(&partitions, "partitions", "512KB,2MB,8MB,32MB,128MB", "grid of partition sizes")
	fs.StringVar(&credits, "credits", "1MB,4MB,16MB,64MB,256MB,1GB", "grid of credit sizes")
	fs.StringVar(&latency, "latency", "50us", "one-way message latency")
	fs.IntVar(&iterations, "iterations", 10, "iterations per simulation")
	fs.StringVar(&format, "format", "md", "output: md (a Markdown table) or json (one object per scenario)")
	return cmd
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseSizes(flag, s string) ([]int64, error) {
	var out []int64
	for _, f := range splitList(s) {
		n, err := units.ParseBytes(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: empty list", flag)
	}
	return out, nil
}

// sweepRow is one scenario's results; its JSON is the --format json output.
type sweepRow struct {
	Model            string  `json:"model"`
	Arch             string  `json:"arch"`
	Workers          int     `json:"workers"`
	BandwidthBps     float64 `json:"bandwidth_bytes_per_s"`
	FifoS            float64 `json:"fifo_s"`
	PriorityS        float64 `json:"priority_s"`
	DefaultS         float64 `json:"bytescheduler_default_s"`
	BestS            float64 `json:"bytescheduler_best_s"`
	BestPartition    int64   `json:"best_partition_bytes"`
	BestCredit       int64   `json:"best_credit_bytes"`
	LowerBoundS      float64 `json:"lower_bound_s"`
	DefaultSpeedup   float64 `json:"default_speedup"`
	BestSpeedup      float64 `json:"best_speedup"`
	CommComputeRatio float64 `json:"comm_compute_ratio"`
}

type sweepJob struct {
	scenario int
	opts     sim.Options
	// kind: 0 fifo, 1 priority, 2 default, 3 grid point
	kind int
}

// sweepEventsPerS is the simulator's speed for the sweep's estimate of
// its duration: the 2-2.5 million events/s measured on this project's
// 2-core machine (sim.MaxEvents).
const sweepEventsPerS = 2.3e6

// runSweep runs every scenario's simulations on all CPUs and gathers rows
// in scenario order.
func runSweep(scenarios []sim.Options, parts, creds []int64, progress io.Writer) ([]sweepRow, error) {
	var jobs []sweepJob
	for i, base := range scenarios {
		fifo, prio, def := base, base, base
		prio.Sched = sched.Config{Order: sched.OrderPriority}
		def.Sched = proto.ByteSchedulerDefaults(base.Arch)
		jobs = append(jobs, sweepJob{i, fifo, 0}, sweepJob{i, prio, 1}, sweepJob{i, def, 2})
		for _, p := range parts {
			for _, c := range creds {
				g := base
				g.Sched = sched.Config{PartitionBytes: p, CreditBytes: c, Order: sched.OrderPriority}
				jobs = append(jobs, sweepJob{i, g, 3})
			}
		}
	}
	// Every run is checked, and the whole sweep's cost told, before the
	// first one starts: a refusal should not come after hours of others.
	var events float64
	for _, j := range jobs {
		if err := j.opts.Validate(); err != nil {
			o := j.opts
			return nil, fmt.Errorf("%s %s %d workers: %w", o.Profile.Name, o.Arch, o.Workers, err)
		}
		e, _ := j.opts.Budget()
		events += e.Events
	}
	fmt.Fprintf(progress, "sweep: %d simulations, an estimated %.3g events (about %s at %.3g events/s on one core)\n",
		len(jobs), events, time.Duration(events/sweepEventsPerS*float64(time.Second)).Round(time.Second), sweepEventsPerS)
	rows := make([]sweepRow, len(scenarios))
	for i, o := range scenarios {
		b := sim.LowerBounds(o)
		rows[i] = sweepRow{Model: o.Profile.Name, Arch: o.Arch.String(), Workers: o.Workers, BandwidthBps: o.BandwidthBps,
			LowerBoundS: b.MaxS, CommComputeRatio: b.WorkerLinkS / b.ComputeS}
	}
	var (
		mu    sync.Mutex
		done  int
		start = time.Now()
		shown = start
		times = make([]float64, len(jobs))
	)
	err := sim.Parallel(len(jobs), runtime.GOMAXPROCS(0), func(i int) error {
		r, err := sim.Run(jobs[i].opts)
		mu.Lock()
		done++
		// Every 50 simulations, or every 5 s when they are long.
		if done%50 == 0 || done == len(jobs) || time.Since(shown) > 5*time.Second {
			fmt.Fprintf(progress, "\rsweep: %d/%d simulations, %s", done, len(jobs), time.Since(start).Round(time.Second))
			shown = time.Now()
		}
		mu.Unlock()
		if err != nil {
			o := jobs[i].opts
			return fmt.Errorf("%s %s %d workers: %w", o.Profile.Name, o.Arch, o.Workers, err)
		}
		times[i] = r.IterationTimeS
		return nil
	})
	fmt.Fprintln(progress)
	if err != nil {
		return nil, err
	}
	// Gathered in job order, so ties in the grid go to the first point.
	for i, j := range jobs {
		row, t := &rows[j.scenario], times[i]
		switch j.kind {
		case 0:
			row.FifoS = t
		case 1:
			row.PriorityS = t
		case 2:
			row.DefaultS = t
		case 3:
			if row.BestS == 0 || t < row.BestS {
				row.BestS, row.BestPartition, row.BestCredit = t, j.opts.Sched.PartitionBytes, j.opts.Sched.CreditBytes
			}
		}
	}
	for i := range rows {
		rows[i].DefaultSpeedup = rows[i].FifoS / rows[i].DefaultS
		rows[i].BestSpeedup = rows[i].FifoS / rows[i].BestS
	}
	return rows, nil
}

func writeSweepTable(w io.Writer, rows []sweepRow) error {
	fmt.Fprintln(w, "| model | arch | workers | bandwidth | comm/compute | fifo | priority | bytescheduler default | speedup | best grid | speedup | best (partition, credit) | lower bound | best/bound |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %s | %d | %s | %.2f | %s | %s | %s | %.2fx | %s | %.2fx | %s, %s | %s | %.2f |\n",
			r.Model, r.Arch, r.Workers, units.FormatRate(r.BandwidthBps), r.CommComputeRatio,
			units.FormatSeconds(r.FifoS), units.FormatSeconds(r.PriorityS), units.FormatSeconds(r.DefaultS), r.DefaultSpeedup,
			units.FormatSeconds(r.BestS), r.BestSpeedup, units.FormatBytes(r.BestPartition), units.FormatBytes(r.BestCredit),
			units.FormatSeconds(r.LowerBoundS), r.BestS/r.LowerBoundS)
	}
	_, err := fmt.Fprintln(w)
	if err != nil {
		return fmt.Errorf("writing table: %w", err)
	}
	return nil
}
