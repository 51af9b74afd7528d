package sim

// Changing conditions: link bandwidth and compute speed that change at
// given iterations, and slow workers.
//
// Rule. Conditions are indexed by iteration, not by time:
//   - the bandwidth in force for a message is the trace's value at the
//     iteration of the gradient it carries (a push, a pull, a ring
//     transfer of a piece of iteration k all run at the bandwidth of k),
//     on the sender's egress and the receiver's ingress alike;
//   - a compute step of forward or backward pass k takes its profile time
//     times the compute trace's value at k, times the worker's straggler
//     factor (then jitter).
//
// So iteration k's span (backward k, k's communication, forward k+1) runs
// backward and communication under the conditions of k and the forward
// under the compute of k+1; LowerBoundsAt(o, k) is computed for exactly
// that mix. The rule needs no notion of a "current iteration" for servers
// or the ring, and a message's rate never changes while it is on a link.

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/autobyte/autobyte/model"
)

// Step is one step of a piecewise-constant trace over iterations: from
// Iteration on (until the next step) the traced quantity is Value.
type Step struct {
	Iteration int
	Value     float64
}

// ParseSteps parses a trace written "ITERATION:VALUE,ITERATION:VALUE,...",
// for example "0:10Gbps,300:2Gbps,600:10Gbps", with parse turning each
// VALUE into a number. Iterations must be >= 0 and strictly increasing and
// values positive and finite. Spaces around items are ignored; "" is no
// trace (nil). Errors name the bad item.
func ParseSteps(s string, parse func(string) (float64, error)) ([]Step, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var steps []Step
	for i, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		it, val, ok := strings.Cut(item, ":")
		if !ok {
			return nil, fmt.Errorf("trace item %d %q: want ITERATION:VALUE", i+1, item)
		}
		k, err := strconv.Atoi(strings.TrimSpace(it))
		if err != nil || k < 0 {
			return nil, fmt.Errorf("trace item %d %q: iteration %q is not an integer >= 0", i+1, item, it)
		}
		v, err := parse(strings.TrimSpace(val))
		if err != nil {
			return nil, fmt.Errorf("trace item %d %q: %w", i+1, item, err)
		}
		if !(v > 0) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("trace item %d %q: value must be positive and finite, got %v", i+1, item, v)
		}
		if n := len(steps); n > 0 && k <= steps[n-1].Iteration {
			return nil, fmt.Errorf("trace item %d %q: iteration %d must come after the previous item's %d", i+1, item, k, steps[n-1].Iteration)
		}
		steps = append(steps, Step{Iteration: k, Value: v})
	}
	return steps, nil
}

// validateSteps checks a trace; what names it in errors.
func validateSteps(what string, steps []Step) error {
	for i, st := range steps {
		switch {
		case st.Iteration < 0:
			return fmt.Errorf("sim: %s step %d (iteration %d): iteration must be >= 0", what, i, st.Iteration)
		case i > 0 && st.Iteration <= steps[i-1].Iteration:
			return fmt.Errorf("sim: %s step %d (iteration %d): iterations must increase, but step %d is at iteration %d",
				what, i, st.Iteration, i-1, steps[i-1].Iteration)
		case !(st.Value > 0) || math.IsInf(st.Value, 0):
			return fmt.Errorf("sim: %s step %d (iteration %d): value must be positive and finite, got %v", what, i, st.Iteration, st.Value)
		}
	}
	return nil
}

// ValidateDynamics checks the traces and stragglers of o against its
// workers and servers (Validate does too; a runtime job, which does not
// call Validate, checks them with it).
func (o *Options) ValidateDynamics() error {
	if err := validateSteps("bandwidth trace", o.BandwidthTrace); err != nil {
		return err
	}
	if err := validateSteps("compute trace", o.ComputeTrace); err != nil {
		return err
	}
	ranks := make([]int, 0, len(o.Stragglers))
	for r := range o.Stragglers {
		ranks = append(ranks, r)
	}
	slices.Sort(ranks) // report the same bad rank every time
	for _, r := range ranks {
		f := o.Stragglers[r]
		if r < 0 || r >= o.Workers {
			return fmt.Errorf("sim: straggler rank %d: no such worker (ranks 0..%d)", r, o.Workers-1)
		}
		if !(f >= 1) || math.IsInf(f, 0) {
			return fmt.Errorf("sim: straggler rank %d: slowdown must be a finite factor >= 1, got %v", r, f)
		}
	}
	for _, hosts := range []struct {
		role  string
		n     int
		trace map[int][]Step
	}{{"worker", o.Workers, o.WorkerLinkTraces}, {"server", o.Servers, o.ServerLinkTraces}} {
		for _, r := range slices.Sorted(maps.Keys(hosts.trace)) {
			if r < 0 || r >= hosts.n {
				return fmt.Errorf("sim: link trace of %s%d: no such %s (the job has %d)", hosts.role, r, hosts.role, hosts.n)
			}
			if err := validateSteps(fmt.Sprintf("link trace of %s%d", hosts.role, r), hosts.trace[r]); err != nil {
				return err
			}
		}
	}
	ranks = slices.Sorted(maps.Keys(o.StragglerTraces))
	for _, r := range ranks {
		if r < 0 || r >= o.Workers {
			return fmt.Errorf("sim: straggler trace of rank %d: no such worker (ranks 0..%d)", r, o.Workers-1)
		}
		what := fmt.Sprintf("straggler trace of rank %d", r)
		if err := validateSteps(what, o.StragglerTraces[r]); err != nil {
			return err
		}
		for i, st := range o.StragglerTraces[r] {
			if !(st.Value >= 1) {
				return fmt.Errorf("sim: %s step %d (iteration %d): slowdown must be >= 1, got %v", what, i, st.Iteration, st.Value)
			}
		}
	}
	return nil
}

// stepAt is the value of a trace at iteration k: the last step at or
// before k, or def before the first step.
func stepAt(steps []Step, k int, def float64) float64 {
	if len(steps) == 0 {
		return def
	}
	// The first step after k; the one before it is in force.
	i, _ := slices.BinarySearchFunc(steps, k+1, func(s Step, k int) int { return s.Iteration - k })
	if i == 0 {
		return def
	}
	return steps[i-1].Value
}

// BandwidthAt is the link bandwidth (bytes/s) in force for the messages of
// iteration k's gradients.
func (o *Options) BandwidthAt(k int) float64 { return stepAt(o.BandwidthTrace, k, o.BandwidthBps) }

// hostRateAt is host h's link rate (bytes/s) for iteration k's messages:
// its link trace's step in force, else BandwidthAt(k). Hosts are the
// simulator's: workers 0..Workers-1, then the servers.
func (o *Options) hostRateAt(h, k int) float64 {
	def := o.BandwidthAt(k)
	if h < o.Workers {
		return stepAt(o.WorkerLinkTraces[h], k, def)
	}
	return stepAt(o.ServerLinkTraces[h-o.Workers], k, def)
}

// WorkerRateAt and ServerRateAt are one worker's or server's link rate
// (bytes/s) for iteration k's messages.
func (o *Options) WorkerRateAt(rank, k int) float64 { return o.hostRateAt(rank, k) }
func (o *Options) ServerRateAt(rank, k int) float64 { return o.hostRateAt(o.Workers+rank, k) }

// slowestWorkerAt is the smallest worker link rate at iteration k: a ring
// runs at it.
func (o *Options) slowestWorkerAt(k int) float64 {
	if len(o.WorkerLinkTraces) == 0 {
		return o.BandwidthAt(k)
	}
	r := math.Inf(1)
	for w := range o.Workers {
		r = min(r, o.hostRateAt(w, k))
	}
	return r
}

// serverRatesAt is the sum of the servers' link rates at iteration k (0
// for all-reduce).
func (o *Options) serverRatesAt(k int) float64 {
	if o.Arch != PS {
		return 0
	}
	if len(o.ServerLinkTraces) == 0 {
		return float64(o.Servers) * o.BandwidthAt(k)
	}
	var sum float64
	for s := range o.Servers {
		sum += o.ServerRateAt(s, k)
	}
	return sum
}

// ValidateCompute refuses conditions under which one worker's iteration
// would compute for longer than model.MaxIterationComputeS: the profile's
// compute times the largest compute-trace value, straggler factor and
// jitter of the run. A replay would sleep that long for real, and far
// beyond it the durations wrap. o.Profile must be set.
func (o *Options) ValidateCompute() error {
	worst := 1.0
	for _, st := range o.ComputeTrace {
		worst = max(worst, st.Value)
	}
	slowest := 1.0
	for r := range o.Workers {
		window := 1.0
		for _, st := range o.StragglerTraces[r] {
			window = max(window, st.Value)
		}
		slowest = max(slowest, o.slowdown(r)*window)
	}
	worst *= slowest * (1 + o.Jitter)
	profile := o.Profile.ForwardS() + o.Profile.BackwardS()
	if c := profile * worst; !(c <= model.MaxIterationComputeS) {
		return fmt.Errorf("sim: an iteration could compute for %.4g s (the profile's %.4g s times %.4g from the compute trace, stragglers and jitter), more than the %d s (a day) allowed",
			c, profile, worst, model.MaxIterationComputeS)
	}
	return nil
}

// ComputeScaleAt is the multiplier of compute times of iteration k's
// forward and backward passes (2 = half as fast; 1 without a trace).
func (o *Options) ComputeScaleAt(k int) float64 { return stepAt(o.ComputeTrace, k, 1) }

// slowdown is worker rank's straggler factor for the whole run (1 if it is
// not a straggler).
func (o *Options) slowdown(rank int) float64 {
	if f, ok := o.Stragglers[rank]; ok {
		return f
	}
	return 1
}

// SlowdownAt is worker rank's straggler factor at iteration k: Stragglers
// times StragglerTraces.
func (o *Options) SlowdownAt(rank, k int) float64 {
	return o.slowdown(rank) * stepAt(o.StragglerTraces[rank], k, 1)
}

// minSlowdownAt is the smallest straggler factor over all workers at
// iteration k: no worker computes iteration k faster than the profile
// times this.
func (o *Options) minSlowdownAt(k int) float64 {
	if len(o.Stragglers) == 0 && len(o.StragglerTraces) == 0 {
		return 1
	}
	m := math.Inf(1)
	for r := range o.Workers {
		m = min(m, o.SlowdownAt(r, k))
	}
	return m
}

// LowerBoundsAt are the lower bounds under the conditions of iteration k:
// bandwidth BandwidthAt(k), backward compute at ComputeScaleAt(k) and
// forward compute at ComputeScaleAt(k+1), both times the smallest straggler
// factor. FluidS (and with it ComputeS, WorkerLinkS and FirstLayerS) bounds
// IterationTimesS[k] itself: the argument of the fluid bound follows the
// worker that ends forward k last, whose iteration-k messages all run at
// BandwidthAt(k). MaxS, which includes the servers' links, bounds the
// steady state of a run held at these conditions. Without traces or
// stragglers it equals LowerBounds(o) for every k. o must be valid.
func LowerBoundsAt(o Options, k int) Bounds {
	return conditionBounds(o, o.conditionsAt(k))
}

// initialBounds are the bounds under the conditions of iteration 0.
func initialBounds(o Options) Bounds {
	c := o.conditionsAt(0)
	c.fwd = c.bwd
	return conditionBounds(o, c)
}

// conditionsAt are the conditions of iteration k's bounds.
func (o *Options) conditionsAt(k int) conditions {
	return conditions{bw: o.slowestWorkerAt(k), servers: o.serverRatesAt(k),
		bwd: o.ComputeScaleAt(k) * o.minSlowdownAt(k), fwd: o.ComputeScaleAt(k+1) * o.minSlowdownAt(k+1)}
}

// conditionBounds are the bounds of o under c: the slowest worker's link
// at c.bw, the servers' links adding up to c.servers, backward and
// forward compute times multiplied by c.bwd and c.fwd.
func conditionBounds(o Options, c conditions) Bounds {
	bwdScale, fwdScale := c.bwd, c.fwd
	if bwdScale != 1 || fwdScale != 1 {
		p := o.Profile.Clone()
		for i := range p.Layers {
			p.Layers[i].ForwardS *= fwdScale
			p.Layers[i].BackwardS *= bwdScale
		}
		o.Profile = p
	}
	return lowerBounds(o, c.bw, c.servers)
}

// conditions identify the bounds of one iteration, to compute each once.
type conditions struct{ bw, servers, bwd, fwd float64 }

// boundsPerIteration returns LowerBoundsAt(o, k) for every iteration.
func boundsPerIteration(o Options) []Bounds {
	cache := map[conditions]Bounds{}
	out := make([]Bounds, o.Iterations)
	for k := range out {
		c := o.conditionsAt(k)
		b, ok := cache[c]
		if !ok {
			b = conditionBounds(o, c)
			cache[c] = b
		}
		out[k] = b
	}
	return out
}

// ParseLinkTrace reads one host's link trace, "ROLE RANK=TRACE" written
// "server1=0:25Gbps,150:2.5Gbps,300:25Gbps" or "worker3=...", with rates
// parsed by parseRate, into o's WorkerLinkTraces or ServerLinkTraces. A
// host may have one trace. Errors name the item; the rank is checked
// against the job by Validate.
func (o *Options) ParseLinkTrace(spec string, parseRate func(string) (float64, error)) error {
	host, trace, ok := strings.Cut(strings.TrimSpace(spec), "=")
	if !ok {
		return fmt.Errorf("link trace %q: want ROLE RANK=TRACE, e.g. server1=0:25Gbps,150:2.5Gbps", spec)
	}
	var role string
	var traces *map[int][]Step
	switch {
	case strings.HasPrefix(host, "server"):
		role, traces = "server", &o.ServerLinkTraces
	case strings.HasPrefix(host, "worker"):
		role, traces = "worker", &o.WorkerLinkTraces
	default:
		return fmt.Errorf("link trace %q: host %q is not serverN or workerN", spec, host)
	}
	rank, err := strconv.Atoi(strings.TrimPrefix(host, role))
	if err != nil || rank < 0 {
		return fmt.Errorf("link trace %q: %s rank %q is not an integer >= 0", spec, role, strings.TrimPrefix(host, role))
	}
	steps, err := ParseSteps(trace, parseRate)
	if err != nil {
		return fmt.Errorf("link trace %q: %w", spec, err)
	}
	if len(steps) == 0 {
		return fmt.Errorf("link trace %q: no steps", spec)
	}
	if _, dup := (*traces)[rank]; dup {
		return fmt.Errorf("link trace %q: %s%d already has a link trace", spec, role, rank)
	}
	if *traces == nil {
		*traces = map[int][]Step{}
	}
	(*traces)[rank] = steps
	return nil
}
