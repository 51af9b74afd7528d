// Package tuneeval evaluates the tuners of package tune on a suite of
// simulated scenarios: every tuner runs on every scenario in the
// simulator, and the results become a Markdown table, a JSON file and PNG
// plots (see docs/tuner-eval.md).
package tuneeval

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/autobyte/autobyte/model"
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
	// Stragglers slows a worker's compute by a factor.
	Stragglers map[int]float64 `json:"stragglers,omitempty"`
	Iterations int             `json:"iterations"`
}

// Changing reports whether the scenario's bandwidth changes during the run.
func (s Scenario) Changing() bool { return strings.TrimSpace(s.Trace) != "" }

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
	o := sim.Options{Profile: p, Arch: arch, Workers: s.Workers, Servers: s.Servers, BandwidthBps: bw, LatencyS: 50e-6,
		Sched: ByteSchedulerDefault(s.Arch), Iterations: s.Iterations, BandwidthTrace: tr}
	if len(s.Stragglers) > 0 {
		o.Stragglers = maps.Clone(s.Stragglers)
	}
	if arch == sim.PS {
		o.ShardBytes = 4_000_000
	}
	if err := o.Validate(); err != nil {
		return sim.Options{}, fmt.Errorf("scenario %s: %w", s.Name, err)
	}
	return o, nil
}

// Phases are the iteration ranges [From, To) between the trace's steps
// (one phase for a steady scenario).
func (s Scenario) Phases() []Phase {
	tr, _ := sim.ParseSteps(s.Trace, units.ParseRate)
	var cuts []int
	for _, st := range tr {
		if st.Iteration > 0 && st.Iteration < s.Iterations {
			cuts = append(cuts, st.Iteration)
		}
	}
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
		return sched.Config{PartitionBytes: 32_000_000, CreditBytes: 64_000_000, Order: sched.OrderPriority}
	}
	return sched.Config{PartitionBytes: 4_000_000, CreditBytes: 16_000_000, Order: sched.OrderPriority}
}

// The default suite's bandwidth trace and run length.
const (
	steady     = "10Gbps"
	change     = "0:10Gbps,150:2Gbps,300:10Gbps"
	iterations = 450
)

// DefaultSuite is the evaluation suite: zoo models on parameter servers
// (8 workers, 8 servers) and ring all-reduce (16 workers), under a steady
// 10 Gbps and under a drop to 2 Gbps from iteration 150 to 300, plus one
// job with a straggler (worker 3 computes twice as slowly), 450 iterations
// each.
func DefaultSuite() []Scenario {
	ps := func(m, trace string) Scenario {
		return Scenario{Model: m, Arch: "ps", Workers: 8, Servers: 8, Bandwidth: steady, Trace: trace, Iterations: iterations}
	}
	ar := func(m, trace string) Scenario {
		return Scenario{Model: m, Arch: "allreduce", Workers: 16, Bandwidth: steady, Trace: trace, Iterations: iterations}
	}
	straggler := ps("resnet50", "")
	straggler.Stragglers = map[int]float64{3: 2}
	suite := []Scenario{
		ps("resnet50", ""), ps("resnet50", change),
		ps("vgg16", ""), ps("vgg16", change),
		ps("transformer", change), ps("bert-base", ""),
		ar("resnet50", ""), ar("resnet50", change),
		ar("vgg16", change), ar("transformer", ""),
		ar("bert-base", change),
		straggler,
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

// named gives each scenario its name: model-arch-workers-steady|change
// [-straggler].
func named(s []Scenario) []Scenario {
	for i := range s {
		c := "steady"
		if s[i].Changing() {
			c = "change"
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
			return nil, fmt.Errorf("--only: unknown scenario %q", n)
		}
		out = append(out, suite[i])
	}
	return out, nil
}
