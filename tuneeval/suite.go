// Package tuneeval evaluates the tuners of package tune on a suite of
// simulated scenarios: every tuner runs on every scenario in the
// simulator, and the results become a Markdown table, a JSON file and PNG
// plots (see docs/tuner-eval.md).
package tuneeval

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/autobyte/autobyte/model"
	"github.com/autobyte/autobyte/proto"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/sim"
	"github.com/autobyte/autobyte/units"
)

// Scenario is one simulated job and its conditions.
type Scenario struct {
	Name    string `json:"name"`
	Model   string `json:"model"`
	Arch    string `json:"arch"`
	Workers int    `json:"workers"`
	// Servers is the number of parameter servers (0 for all-reduce).
	Servers int `json:"servers"`
	// Bandwidth is the link rate before the trace's first step, and Trace
	// the bandwidth trace ("ITERATION:RATE,..."; "" for steady).
	Bandwidth string `json:"bandwidth"`
	Trace     string `json:"trace,omitempty"`
	// ComputeTrace multiplies every worker's compute times from given
	// iterations on ("ITERATION:FACTOR,...", 2 = half as fast; "" for
	// none).
	ComputeTrace string `json:"compute_trace,omitempty"`
	// Kind names the conditions in the scenario's name: "steady", or what
	// changes ("change" when empty and something changes).
	Kind string `json:"kind,omitempty"`
	// Stragglers slows a worker's compute by a factor, and StragglerTraces
	// from given iterations on ("ITERATION:FACTOR,...", 1 = recovered): a
	// straggler that comes and goes.
	Stragglers      map[int]float64 `json:"stragglers,omitempty"`
	StragglerTraces map[int]string  `json:"straggler_traces,omitempty"`
	// LinkTraces set one host's link rate from given iterations on, by
	// host ("server1", "worker3"): "ITERATION:RATE,..." (sim's
	// --link-trace).
	LinkTraces map[string]string `json:"link_traces,omitempty"`
	Iterations int               `json:"iterations"`
	// MessageCost is the simulator's fixed processing time per message
	// (sim.Options.MessageCostS), a duration such as "15us"; "" is none.
	// The suites leave it empty.
	MessageCost string `json:"message_cost,omitempty"`
}

// Changing reports whether the scenario's bandwidth or compute speed
// changes during the run.
func (s Scenario) Changing() bool {
	return strings.TrimSpace(s.Trace) != "" || strings.TrimSpace(s.ComputeTrace) != "" || len(s.StragglerTraces) > 0 || len(s.LinkTraces) > 0
}

// Options are the simulator options of the scenario (no tuner, ByteScheduler's
// default configuration; parameter servers shard pieces above 4 MB, as
// 'autobyte sim' does).
func (s Scenario) Options() (sim.Options, error) {
	p, err := model.Get(s.Model)
	if err != nil {
		return sim.Options{}, fmt.Errorf("scenario %s: %w", s.Name, err)
	}
	arch, err := sim.ParseArch(s.Arch)
	if err != nil {
		return sim.Options{}, fmt.Errorf("scenario %s: %w", s.Name, err)
	}
	bw, err := units.ParseRate(s.Bandwidth)
	if err != nil {
		return sim.Options{}, fmt.Errorf("scenario %s: bandwidth: %w", s.Name, err)
	}
	tr, err := sim.ParseSteps(s.Trace, units.ParseRate)
	if err != nil {
		return sim.Options{}, fmt.Errorf("scenario %s: trace: %w", s.Name, err)
	}
	ct, err := sim.ParseSteps(s.ComputeTrace, parseFactor)
	if err != nil {
		return sim.Options{}, fmt.Errorf("scenario %s: compute trace: %w", s.Name, err)
	}
	var cost float64
	if strings.TrimSpace(s.MessageCost) != "" {
		if cost, err = units.ParseDuration(s.MessageCost); err != nil {
			return sim.Options{}, fmt.Errorf("scenario %s: message cost: %w", s.Name, err)
		}
	}
	o := sim.Options{Profile: p, Arch: arch, Workers: s.Workers, Servers: s.Servers, BandwidthBps: bw, LatencyS: 50e-6,
		MessageCostS: cost, Sched: ByteSchedulerDefault(s.Arch), Iterations: s.Iterations, BandwidthTrace: tr, ComputeTrace: ct}
	if len(s.Stragglers) > 0 {
		o.Stragglers = maps.Clone(s.Stragglers)
	}
	for r, tr := range s.StragglerTraces {
		steps, err := sim.ParseSteps(tr, parseFactor)
		if err != nil {
			return sim.Options{}, fmt.Errorf("scenario %s: straggler trace of rank %d: %w", s.Name, r, err)
		}
		if o.StragglerTraces == nil {
			o.StragglerTraces = map[int][]sim.Step{}
		}
		o.StragglerTraces[r] = steps
	}
	for _, host := range slices.Sorted(maps.Keys(s.LinkTraces)) {
		if err := o.ParseLinkTrace(host+"="+s.LinkTraces[host], units.ParseRate); err != nil {
			return sim.Options{}, fmt.Errorf("scenario %s: %w", s.Name, err)
		}
	}
	if arch == sim.PS {
		o.ShardBytes = 4_000_000
	}
	if err := o.Validate(); err != nil {
		return sim.Options{}, fmt.Errorf("scenario %s: %w", s.Name, err)
	}
	return o, nil
}

// parseFactor parses a compute-trace factor.
func parseFactor(v string) (float64, error) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, fmt.Errorf("factor %q is not a number", v)
	}
	return f, nil
}

// Phases are the iteration ranges [From, To) under constant conditions
// (one phase for a steady scenario). A bandwidth or link step at iteration
// c starts a phase at c. A compute step at c starts one at c-1: iteration
// c-1's span ends with forward pass c, which already runs at the new speed
// (sim's rule, sim/dynamics.go), so c-1 is the first iteration the change
// shows in; a straggler's step too.
func (s Scenario) Phases() []Phase {
	tr, _ := sim.ParseSteps(s.Trace, units.ParseRate)
	ct, _ := sim.ParseSteps(s.ComputeTrace, parseFactor)
	var cuts []int
	add := func(c int) {
		if c > 0 && c < s.Iterations && !slices.Contains(cuts, c) {
			cuts = append(cuts, c)
		}
	}
	for _, st := range tr {
		add(st.Iteration)
	}
	for _, st := range ct {
		add(st.Iteration - 1)
	}
	for _, tr := range s.StragglerTraces {
		steps, _ := sim.ParseSteps(tr, parseFactor)
		for _, st := range steps {
			add(st.Iteration - 1)
		}
	}
	for _, tr := range s.LinkTraces {
		steps, _ := sim.ParseSteps(tr, units.ParseRate)
		for _, st := range steps {
			add(st.Iteration)
		}
	}
	slices.Sort(cuts)
	var out []Phase
	from := 0
	for _, c := range cuts {
		out = append(out, Phase{From: from, To: c})
		from = c
	}
	return append(out, Phase{From: from, To: s.Iterations})
}

// Phase is a range of iterations [From, To) under constant conditions.
type Phase struct {
	From int `json:"from"`
	To   int `json:"to"`
}

// ByteSchedulerDefault is ByteScheduler's default configuration: 4 MB
// partitions and 16 MB credit on parameter servers, 32 MB and 64 MB for
// all-reduce, priority order.
func ByteSchedulerDefault(arch string) sched.Config {
	if arch == "allreduce" {
		return proto.ByteSchedulerDefaults(proto.AllReduce)
	}
	return proto.ByteSchedulerDefaults(proto.PS)
}

// The default suite's traces and run length. Each changing trace has three
// phases of 150 iterations.
const (
	steady = "10Gbps"
	// change: the bandwidth drops 5x and comes back.
	change = "0:10Gbps,150:2Gbps,300:10Gbps"
	// bw10x: a 10x swing down from a fast network (100 -> 10 Gbps).
	bw10x = "0:100Gbps,150:10Gbps,300:100Gbps"
	// bw10xLow: a 10x swing down from 10 Gbps (10 -> 1 Gbps).
	bw10xLow = "0:10Gbps,150:1Gbps,300:10Gbps"
	// compute4x: every worker computes 4x slower (a co-located job, a
	// throttled GPU) in the middle phase.
	compute4x  = "0:1,150:4,300:1"
	iterations = 450
)

// DefaultSuite is the evaluation suite, 16 scenarios of 450 iterations.
// Parameter servers (8 workers, 8 servers, unless stated) and ring
// all-reduce (16 workers, unless stated), under a steady 10 Gbps, with a
// straggler (worker 3 computes twice as slowly), and under changing
// conditions: a 5x bandwidth drop (10 -> 2 Gbps), 10x bandwidth swings
// (100 -> 10 Gbps, or 10 -> 1 Gbps), compute 4x slower, and worker 3
// computing 3x slower, each from iteration 150 to 300; the changing ones
// have 8 to 64 workers. Where
// conditions change the best configuration of the grid moves (for example
// vgg16 on parameter servers: 256 KB / 1 MB at 100 Gbps, 256 KB / 32 MB
// at 10 Gbps), so that the per-phase oracle and the best static
// configuration in hindsight can differ.
func DefaultSuite() []Scenario {
	ps := func(m string, workers, servers int, kind, bw, trace, compute string) Scenario {
		return Scenario{Model: m, Arch: "ps", Workers: workers, Servers: servers, Bandwidth: bw, Trace: trace, ComputeTrace: compute,
			Kind: kind, Iterations: iterations}
	}
	ar := func(m string, workers int, kind, bw, trace, compute string) Scenario {
		return Scenario{Model: m, Arch: "allreduce", Workers: workers, Bandwidth: bw, Trace: trace, ComputeTrace: compute,
			Kind: kind, Iterations: iterations}
	}
	straggler := ps("resnet50", 8, 8, "steady", steady, "", "")
	straggler.Stragglers = map[int]float64{3: 2}
	midrun := ps("resnet50", 8, 8, "straggler-midrun", steady, "", "")
	midrun.StragglerTraces = map[int]string{3: "150:3,300:1"}
	suite := []Scenario{
		ps("resnet50", 8, 8, "steady", steady, "", ""),
		ps("vgg16", 8, 8, "steady", steady, "", ""),
		ps("bert-base", 8, 8, "steady", steady, "", ""),
		straggler,
		ps("resnet50", 8, 8, "change", steady, change, ""),
		midrun,
		ps("vgg16", 8, 8, "bw10x", "100Gbps", bw10x, ""),
		ps("alexnet", 8, 8, "compute4x", "100Gbps", "", compute4x),
		ps("resnet50", 16, 4, "bw10x", "100Gbps", bw10x, ""),
		ar("resnet50", 16, "steady", steady, "", ""),
		ar("transformer", 16, "steady", steady, "", ""),
		ar("resnet50", 16, "change", steady, change, ""),
		ar("gpt2", 32, "bw10x", steady, bw10xLow, ""),
		ar("vgg16", 64, "bw10x", steady, bw10xLow, ""),
		ar("gpt2", 32, "compute4x", "100Gbps", "", compute4x),
		ar("bert-base", 64, "bw10x", "100Gbps", bw10x, ""),
	}
	return named(suite)
}

// QuickSuite is a small suite for tests and smoke runs: two short jobs, one
// with a bandwidth change.
func QuickSuite() []Scenario {
	return named([]Scenario{
		{Model: "resnet50", Arch: "allreduce", Workers: 4, Bandwidth: "10Gbps", Trace: "0:10Gbps,20:2Gbps,40:10Gbps", Iterations: 60},
		{Model: "alexnet", Arch: "ps", Workers: 2, Servers: 2, Bandwidth: "10Gbps", Iterations: 30},
	})
}

// LongSuite runs BO at its released timing: 15 trials of 100 iterations
// and 10 of apply delay, frozen after 1,650 iterations. Its scenarios are
// two of DefaultSuite's changing ones stretched to 3,000 iterations, with
// phases of 1,000, so that BO explores through the first phase and into
// the second and keeps its frozen choice through the third:
// resnet50-ps-8w-change (10 -> 2 -> 10 Gbps) and vgg16-ps-8w-bw10x
// (100 -> 10 -> 100 Gbps).
func LongSuite() []Scenario {
	const n = 3 * longPhase
	trace := func(a, b string) string { return fmt.Sprintf("0:%s,%d:%s,%d:%s", a, longPhase, b, 2*longPhase, a) }
	return named([]Scenario{
		{Model: "resnet50", Arch: "ps", Workers: 8, Servers: 8, Bandwidth: "10Gbps", Trace: trace("10Gbps", "2Gbps"), Kind: "change-long", Iterations: n},
		{Model: "vgg16", Arch: "ps", Workers: 8, Servers: 8, Bandwidth: "100Gbps", Trace: trace("100Gbps", "10Gbps"), Kind: "bw10x-long", Iterations: n},
	})
}

// longPhase is the length of each of a LongSuite scenario's three phases.
const longPhase = 1000

// named gives each scenario its name: model-arch-workers-KIND
// [-straggler], KIND being Kind or else steady or change.
func named(s []Scenario) []Scenario {
	for i := range s {
		c := s[i].Kind
		switch {
		case c != "":
		case s[i].Changing():
			c = "change"
		default:
			c = "steady"
		}
		s[i].Name = fmt.Sprintf("%s-%s-%dw-%s", s[i].Model, s[i].Arch, s[i].Workers, c)
		if len(s[i].Stragglers) > 0 {
			s[i].Name += "-straggler"
		}
	}
	return s
}

// Select keeps the scenarios named in the comma-separated list only ("" keeps
// all); an unknown name is an error that names it.
func Select(suite []Scenario, only string) ([]Scenario, error) {
	if strings.TrimSpace(only) == "" {
		return suite, nil
	}
	var out []Scenario
	for _, n := range strings.Split(only, ",") {
		n = strings.TrimSpace(n)
		i := slices.IndexFunc(suite, func(s Scenario) bool { return s.Name == n })
		if i < 0 {
			names := make([]string, len(suite))
			for j, s := range suite {
				names[j] = s.Name
			}
			return nil, fmt.Errorf("--only: unknown scenario %q (the suite's: %s)", n, strings.Join(names, ", "))
		}
		out = append(out, suite[i])
	}
	return out, nil
}
