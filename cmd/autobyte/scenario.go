package main

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/model"
	"github.com/autobyte/autobyte/proto"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/sim"
	"github.com/autobyte/autobyte/tune"
	"github.com/autobyte/autobyte/units"
)

// scenarioFlags are the flags shared by every command that describes a job:
// what model, what network, which scheduler.
type scenarioFlags struct {
	model, profile       string
	arch                 string
	workers, servers     int
	bandwidth, latency   string
	computeScale         float64
	scheduler, admission string
	partition, credit    string
	shard                string
	fusion               string
	pull                 bool
	iterations           int
	jitter               float64
	seed                 uint64
	bandwidthTrace       string
	computeTrace         string
	compression          string
	stragglers           []string
	linkTraces           []string
	serverWeights        string
}

func (f *scenarioFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.model, "model", "", "built-in model (see 'autobyte models')")
	fs.StringVar(&f.profile, "profile", "", "model profile JSON file (see docs/models.md)")
	fs.StringVar(&f.arch, "arch", "ps", "aggregation: ps or allreduce")
	fs.IntVar(&f.workers, "workers", 8, "number of workers")
	fs.IntVar(&f.servers, "servers", 0, "parameter servers (default: as many as workers; ps only)")
	fs.StringVar(&f.bandwidth, "bandwidth", "10Gbps", "link rate per host and direction (e.g. 10Gbps, 1MB/s)")
	fs.StringVar(&f.latency, "latency", "50us", "one-way latency of a message between two hosts")
	fs.Float64Var(&f.computeScale, "compute-scale", 1, "multiply the profile's compute times (2 = a GPU half as fast)")
	fs.StringVar(&f.scheduler, "scheduler", "bytescheduler", "fifo (no partitioning, production order, global barrier), priority (layer order, per-layer gates), or bytescheduler (partition + priority + credit)")
	fs.StringVar(&f.admission, "admission", "positive", "credit rule: positive (ByteScheduler: start while credit > 0) or strict (BytePS: piece must fit)")
	fs.StringVar(&f.partition, "partition", "", "partition size (bytescheduler; default 4MB for ps, 32MB for allreduce)")
	fs.StringVar(&f.credit, "credit", "", "credit size (bytescheduler; default for ps 16MB, or one partition per server up to one per worker where that is more; 64MB for allreduce)")
	fs.StringVar(&f.shard, "shard", "4MB", "ps: split a piece larger than this into ceil(size/shard) shards, at most one per server, as MXNet's kvstore does (0 = never)")
	fs.StringVar(&f.fusion, "fusion", "0", "fuse runs of neighbouring tensors smaller than this into units of at most this size, each sent as one tensor (fewer messages for models of many small tensors, like DDP's buckets; 0 = never; auto: --tuner autobyte switches between none and 1MiB as it measures). launch: the replay's workers, and AUTOBYTE_FUSION for a script's plugin")
	fs.StringVar(&f.compression, "compression", "none", "wire type of float32 gradients: none, bf16 or fp16 (halves the bytes; sums stay float32 and are rounded once per server answer or ring hop), or auto (--tuner autobyte turns bf16 on while the job is communication-bound). launch: the replay's workers, and AUTOBYTE_COMPRESSION for a script's plugin")
	fs.BoolVar(&f.pull, "ps-pull", false, "runtime, ps: fetch each sum with a separate pull request instead of as the answer to the push")
	fs.IntVar(&f.iterations, "iterations", 10, "training iterations to run")
	fs.Float64Var(&f.jitter, "jitter", 0, "sim: slow each compute step by a random factor in [1, 1+jitter)")
	fs.Uint64Var(&f.seed, "seed", 1, "random seed of --jitter and of the bo tuner")
	fs.StringVar(&f.bandwidthTrace, "bandwidth-trace", "", "sim: link rate by iteration, e.g. 0:10Gbps,300:2Gbps,600:10Gbps")
	fs.StringVar(&f.computeTrace, "compute-trace", "", "sim: compute-time multiplier by iteration, e.g. 0:1,200:2")
	fs.StringArrayVar(&f.linkTraces, "link-trace", nil, "HOST=TRACE: one host's link rate by iteration, in place of --bandwidth and --bandwidth-trace for that host, e.g. server1=0:10Gbps,150:1Gbps,300:10Gbps or worker3=...; repeatable, once per host. launch: a worker's trace needs --testbed (tc on that host); a parameter server follows its own in-process")
	fs.StringVar(&f.serverWeights, "server-weights", "", "ps: the share of the bytes each server is given, one number per server, e.g. 4:4:1 (default: even by bytes); --tuner autobyte moves them as it measures each server")
	fs.StringArrayVar(&f.stragglers, "straggler", nil, "RANK:FACTOR[@FROM[-TO]]: worker RANK computes FACTOR times slower, for the whole run or from iteration FROM (to TO, exclusive); repeatable, once per rank")
}

// dynamics parses the changing-conditions flags into o.
func (f *scenarioFlags) dynamics(o *sim.Options) error {
	var err error
	if f.bandwidthTrace != "" {
		if o.BandwidthTrace, err = sim.ParseSteps(f.bandwidthTrace, units.ParseRate); err != nil {
			return fmt.Errorf("--bandwidth-trace: %w", err)
		}
	}
	if f.computeTrace != "" {
		parse := func(s string) (float64, error) {
			x, err := strconv.ParseFloat(s, 64)
			if err != nil || !(x > 0) || math.IsInf(x, 0) {
				return 0, fmt.Errorf("compute multiplier %q is not a positive number", s)
			}
			return x, nil
		}
		if o.ComputeTrace, err = sim.ParseSteps(f.computeTrace, parse); err != nil {
			return fmt.Errorf("--compute-trace: %w", err)
		}
	}
	for _, lt := range f.linkTraces {
		if err := o.ParseLinkTrace(lt, units.ParseRate); err != nil {
			return fmt.Errorf("--link-trace: %w", err)
		}
	}
	if err := o.ValidateDynamics(); err != nil {
		return err // e.g. a link trace of a host the job does not have
	}
	seen := map[int]bool{}
	for _, s := range f.stragglers {
		r, x, window, err := parseStraggler(s, o.Workers)
		if err != nil {
			return err
		}
		if seen[r] {
			return fmt.Errorf("--straggler %q: rank %d already has a --straggler", s, r)
		}
		seen[r] = true
		switch {
		case window == nil:
			if o.Stragglers == nil {
				o.Stragglers = map[int]float64{}
			}
			o.Stragglers[r] = x
		default:
			if o.StragglerTraces == nil {
				o.StragglerTraces = map[int][]sim.Step{}
			}
			o.StragglerTraces[r] = window
		}
	}
	if o.Profile != nil {
		return o.ValidateCompute()
	}
	return nil
}

// parseStraggler parses --straggler RANK:FACTOR[@FROM[-TO]]: worker RANK
// computes FACTOR times slower for the whole run, or from iteration FROM
// (until TO, exclusive, if given). A window comes back as the steps of a
// straggler trace.
func parseStraggler(s string, workers int) (rank int, factor float64, window []sim.Step, err error) {
	bad := func(why string) error {
		return fmt.Errorf("--straggler %q: %s; want RANK:FACTOR[@FROM[-TO]] with 0 <= RANK < %d workers, FACTOR >= 1 and 0 <= FROM < TO", s, why, workers)
	}
	spec, when, timed := strings.Cut(s, "@")
	rs, fs, ok := strings.Cut(spec, ":")
	if !ok {
		return 0, 0, nil, bad("no ':'")
	}
	if rank, err = strconv.Atoi(rs); err != nil || rank < 0 || rank >= workers {
		return 0, 0, nil, bad(fmt.Sprintf("rank %q", rs))
	}
	if factor, err = strconv.ParseFloat(fs, 64); err != nil || !(factor >= 1) || math.IsInf(factor, 0) {
		return 0, 0, nil, bad(fmt.Sprintf("factor %q", fs))
	}
	if !timed {
		return rank, factor, nil, nil
	}
	from, to, bounded := strings.Cut(when, "-")
	a, err := strconv.Atoi(from)
	if err != nil || a < 0 {
		return 0, 0, nil, bad(fmt.Sprintf("iterations %q", when))
	}
	window = []sim.Step{{Iteration: a, Value: factor}}
	if bounded {
		b, err := strconv.Atoi(to)
		if err != nil || b <= a {
			return 0, 0, nil, bad(fmt.Sprintf("iterations %q", when))
		}
		window = append(window, sim.Step{Iteration: b, Value: 1})
	}
	return rank, factor, window, nil
}

// loadProfile returns the model chosen by --model or --profile, scaled.
func (f *scenarioFlags) loadProfile() (*model.Profile, error) {
	var p *model.Profile
	var err error
	switch {
	case f.model != "" && f.profile != "":
		return nil, fmt.Errorf("give --model or --profile, not both (got --model %q and --profile %q)", f.model, f.profile)
	case f.model != "":
		p, err = model.Get(f.model)
	case f.profile != "":
		p, err = model.Load(f.profile)
	default:
		return nil, fmt.Errorf("no model: give --model NAME (one of %v) or --profile FILE", model.Zoo())
	}
	if err != nil {
		return nil, err
	}
	if !(f.computeScale > 0) || math.IsInf(f.computeScale, 0) {
		return nil, fmt.Errorf("--compute-scale must be a positive number, got %v", f.computeScale)
	}
	p = p.Scaled(f.computeScale)
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("--compute-scale %v: %w", f.computeScale, err)
	}
	return p, nil
}

// schedConfig returns the core configuration (fifo's global barrier comes
// with its order: proto.Epoch.Barrier) of a job on servers parameter
// servers; a credit not given is proto.DefaultCredit's.
func (f *scenarioFlags) schedConfig(cmd *cobra.Command, arch sim.Arch, servers int) (sched.Config, error) {
	var adm sched.Admission
	switch f.admission {
	case "positive":
		adm = sched.AdmitPositive
	case "strict":
		adm = sched.AdmitStrict
	default:
		return sched.Config{}, fmt.Errorf("unknown --admission %q (want positive or strict)", f.admission)
	}
	tuned := cmd.Flags().Changed("partition") || cmd.Flags().Changed("credit")
	switch f.scheduler {
	case "fifo", "priority":
		if tuned {
			return sched.Config{}, fmt.Errorf("--partition and --credit apply to --scheduler bytescheduler, not %q", f.scheduler)
		}
		if f.scheduler == "fifo" {
			return sched.Config{Order: sched.OrderFIFO, Admission: adm}, nil
		}
		return sched.Config{Order: sched.OrderPriority, Admission: adm}, nil
	case "bytescheduler":
	default:
		return sched.Config{}, fmt.Errorf("unknown --scheduler %q (want fifo, priority or bytescheduler)", f.scheduler)
	}
	part := proto.ByteSchedulerDefaults(arch).PartitionBytes
	var err error
	if f.partition != "" {
		if part, err = units.ParseBytes(f.partition); err != nil {
			return sched.Config{}, fmt.Errorf("--partition: %w", err)
		}
	}
	credit := proto.DefaultCredit(arch, f.workers, servers, part)
	if f.credit != "" {
		if credit, err = units.ParseBytes(f.credit); err != nil {
			return sched.Config{}, fmt.Errorf("--credit: %w", err)
		}
	}
	return sched.Config{PartitionBytes: part, CreditBytes: credit, Order: sched.OrderPriority, Admission: adm}, nil
}

// options turns the flags into simulator options.
func (f *scenarioFlags) options(cmd *cobra.Command) (sim.Options, error) {
	return f.optionsFor(cmd, true)
}

// optionsFor is options; without needModel the profile is left nil (a
// parameter server, or a script that brings its own model).
func (f *scenarioFlags) optionsFor(cmd *cobra.Command, needModel bool) (sim.Options, error) {
	var o sim.Options
	arch, err := sim.ParseArch(f.arch)
	if err != nil {
		return o, fmt.Errorf("--arch: %w", err)
	}
	if f.workers < 1 {
		return o, fmt.Errorf("--workers must be >= 1, got %d", f.workers)
	}
	servers := f.servers
	switch {
	case arch == sim.AllReduce && cmd.Flags().Changed("servers"):
		return o, fmt.Errorf("--servers %d: all-reduce has no parameter servers", f.servers)
	case arch == sim.PS && !cmd.Flags().Changed("servers"):
		servers = f.workers
	case arch == sim.PS && servers < 1:
		return o, fmt.Errorf("--servers must be >= 1, got %d", f.servers)
	}
	bw, err := units.ParseRate(f.bandwidth)
	if err != nil {
		return o, fmt.Errorf("--bandwidth: %w", err)
	}
	lat, err := units.ParseDuration(f.latency)
	if err != nil {
		return o, fmt.Errorf("--latency: %w", err)
	}
	if f.iterations < 1 {
		return o, fmt.Errorf("--iterations must be >= 1, got %d", f.iterations)
	}
	if !(f.jitter >= 0) || math.IsInf(f.jitter, 0) {
		return o, fmt.Errorf("--jitter must be >= 0, got %v", f.jitter)
	}
	var shard int64
	if arch == sim.PS && f.shard != "0" {
		if shard, err = units.ParseBytes(f.shard); err != nil {
			return o, fmt.Errorf("--shard: %w", err)
		}
	}
	cfg, err := f.schedConfig(cmd, arch, servers)
	if err != nil {
		return o, err
	}
	if f.fusion != "0" && f.fusion != "auto" {
		if cfg.FusionBytes, err = units.ParseBytes(f.fusion); err != nil {
			return o, fmt.Errorf("--fusion: %w (or auto)", err)
		}
	}
	var p *model.Profile
	if needModel || f.model != "" || f.profile != "" {
		if p, err = f.loadProfile(); err != nil {
			return o, err
		}
	}
	if f.compression != "auto" {
		if cfg.Compression, err = dtype.Parse(f.compression); err != nil {
			return o, fmt.Errorf("--compression: %w (or auto)", err)
		}
	}
	if f.serverWeights != "" {
		if arch != sim.PS {
			return o, fmt.Errorf("--server-weights %s: all-reduce has no parameter servers", f.serverWeights)
		}
		if cfg.ServerWeights, err = sched.ParseServerWeightsFor(f.serverWeights, servers); err != nil {
			return o, fmt.Errorf("--server-weights: %w", err)
		}
	}
	o = sim.Options{Profile: p, Arch: arch, Workers: f.workers, Servers: servers,
		BandwidthBps: bw, LatencyS: lat, ShardBytes: shard, Sched: cfg,
		Iterations: f.iterations, Jitter: f.jitter, Seed: f.seed}
	if err := f.dynamics(&o); err != nil {
		return o, err
	}
	return o, nil
}

// autoKnobs are the knobs the user left to the autobyte tuner: it may
// switch compression to bfloat16 under --compression auto (the job starts
// uncompressed) and fusion to tune.AutoFusionBytes under --fusion auto (the
// job starts unfused); otherwise they are pinned.
func (f *scenarioFlags) autoKnobs() autoKnobs {
	var k autoKnobs
	if f.compression == "auto" {
		k.Compress = dtype.BF16
	}
	if f.fusion == "auto" {
		k.Fuse = tune.AutoFusionBytes
	}
	return k
}

// autoKnobs are the knobs a tuner may choose beyond partition and credit
// (tune.NewOptions).
type autoKnobs struct {
	Compress dtype.DType
	Fuse     int64
}

// check refuses knobs left to a tuner that does not choose them.
func (k autoKnobs) check(tuner string) error {
	switch {
	case tuner == "autobyte":
	case k.Compress != dtype.F32:
		return fmt.Errorf("--compression auto: only --tuner autobyte chooses the compression, got --tuner %s", tuner)
	case k.Fuse != 0:
		return fmt.Errorf("--fusion auto: only --tuner autobyte chooses the fusion, got --tuner %s", tuner)
	}
	return nil
}

// budgetFlag names the flag and value behind a budget refusal (see
// sim.Options.Budget), so that the user knows what to change.
func (f *scenarioFlags) budgetFlag(o sim.Options, err error) error {
	var be *sim.BudgetError
	if !errors.As(err, &be) {
		return err
	}
	switch be.Cause {
	case "partition":
		v := f.partition
		if v == "" {
			v = units.FormatBytes(o.Sched.PartitionBytes)
		}
		return fmt.Errorf("--partition %s: %w", v, err)
	case "servers":
		return fmt.Errorf("--servers %d: %w", o.Servers, err)
	case "iterations":
		return fmt.Errorf("--iterations %d: %w", o.Iterations, err)
	case "model":
		return fmt.Errorf("model %s (%s of gradients): %w", o.Profile.Name, units.FormatBytes(o.Profile.TotalBytes()), err)
	}
	return fmt.Errorf("--workers %d: %w", o.Workers, err)
}

// simOnly refuses, on a command that runs real processes, the scenario
// flags only the simulator implements: the replay's compute is timed
// sleeps that --straggler and --compute-trace scale, not random draws.
func simOnly(cmd *cobra.Command) error {
	if cmd.Flags().Changed("jitter") {
		return fmt.Errorf("--jitter applies to autobyte sim only (a real run's compute varies by itself; --straggler and --compute-trace slow the replay)")
	}
	return nil
}
