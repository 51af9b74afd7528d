package tune

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/autobyte/autobyte/sched"
)

// ByteScheduler's auto-tuner as released: one-shot Bayesian optimisation of
// the credit size (and, for all-reduce, the partition size), then frozen.
// BO's doc comment gives the exact sequence.

// ByteScheduler's tuning box, in elements (it tunes "million parameters"),
// and the element size that turns it into bytes (fp32 gradients).
const (
	boElemBytes          = sched.DefaultElemBytes
	boCreditLoPS         = 1_000_000
	boCreditHiPS         = 16_000_000
	boCreditLoAllReduce  = 4_000_000
	boCreditHiAllReduce  = 64_000_000
	boPartitionLo        = 2_000_000
	boPartitionHi        = 32_000_000
	boCandidates         = 2000 // random candidates when maximising EI
	boRefined            = 5    // best candidates refined by pattern search
	boDroppedFirst       = 3    // iterations of a trial not averaged, at its start
	boDroppedLast        = 2    // and at its end
	boMinTrialIterations = boDroppedFirst + boDroppedLast + 1
)

// BOOptions configure NewBO. Zero fields take the released defaults.
type BOOptions struct {
	// Arch is "ps" or "allreduce"; it chooses the box.
	Arch string
	// Base is the job's initial configuration: the default trial, and the
	// source of every field the tuner does not tune (order, admission and,
	// on parameter servers, the partition size).
	Base sched.Config
	// TrialIterations is how many iterations each trial runs (default
	// 100). Its mean drops the first 3 and last 2, so it must be >= 6.
	TrialIterations int
	// ApplyDelay is how many iterations after a trial's last one a newly
	// chosen configuration applies (default 10; at least Lead).
	ApplyDelay int
	// Random is the number of uniformly random trials (default 10) and EI
	// the number of expected-improvement trials after them (default 4).
	Random, EI int
	// Xi is expected improvement's exploration margin, in seconds of mean
	// iteration time (default 0.1). bayes_opt, which ByteScheduler uses,
	// applies it to the raw target (minus the mean step time in seconds),
	// so it is in seconds here too. That is a wide margin when iterations
	// take a fraction of a second: EI then favours uncertainty over the
	// predicted mean, i.e. explores. 0 means the default; use a tiny
	// positive value for no margin.
	Xi float64
	// Seed seeds the random trials, the EI candidate search and the GP's
	// hyper-parameter restarts.
	Seed uint64
}

// BOTrial is one configuration the BO tried.
type BOTrial struct {
	Config sched.Config
	// FromIteration is the first iteration the configuration is in force.
	FromIteration int
	// MeanIterationS is the mean iteration time over the trial's measured
	// iterations (NaN until one is measured); Measured counts them.
	MeanIterationS float64
	Measured       int
	// Kind is "default" (the initial configuration, measured and
	// discarded), "random", "ei", or "random-fallback" (an EI step whose
	// GP could not be fitted; GPError says why).
	Kind    string
	GPError string
	sum     float64
}

// BO is ByteScheduler's one-shot Bayesian-optimisation auto-tuner, as
// released (its bytescheduler/common/tuner.py and search.py):
//
//   - The box is credit 1–16 M elements on parameter servers (4–64 MB) or
//     4–64 M elements for all-reduce (16–256 MB), and, for all-reduce only,
//     partition 2–32 M elements (8–128 MB); elements are 4 bytes. On
//     parameter servers the partition stays Base's: the release refuses to
//     re-partition on servers at run time.
//   - Trial 0 is Base, measured and discarded (never used by the GP and
//     never chosen). Then Random points drawn uniformly in the box (in
//     bytes, linearly, as the release samples; drawn up front from Seed),
//     then EI points, each maximising expected improvement (minimisation,
//     margin Xi) of a Matérn-5/2 GP fitted to the trials so far (inputs on
//     a log scale in [0, 1], targets normalised; see FitGP). EI is
//     maximised over 2000 seeded random candidates, uniform in the GP's
//     unit cube, with the best five refined by a pattern search; a point
//     that rounds to a configuration already tried is skipped, as the
//     release re-suggests. Then the configuration of the trial with the
//     lowest mean is frozen for the rest of the run: BO never proposes
//     again.
//   - Timing: with T = TrialIterations and D = ApplyDelay, trial i runs T
//     iterations from F_i = k0 + i·(T+D), k0 being the first iteration
//     observed (trial 0 runs from k0 under Base). Its mean is over
//     iterations F_i+3 … F_i+T-3 (T-5 of them: the released tuner averages
//     ≈ 96 intervals of 100 steps). On observing its last iteration
//     F_i+T-1, BO chooses the next configuration and proposes it from
//     F_i+T+D = F_{i+1}, so D iterations keep the old configuration
//     unmeasured (the release applies a choice 10 steps later on every
//     rank). The frozen configuration applies from k0 + 15·(T+D) with the
//     defaults (1,650 iterations); no proposal is made if it is already in
//     force.
//
// Iterations whose time is not a finite positive number are not averaged.
// BO is not safe for concurrent use.
type BO struct {
	o      BOOptions
	dims   []Dim // the GP's inputs: credit[, partition], in bytes
	random []sched.Config
	cand   *rand.Rand // EI candidate search
	trials []BOTrial
	frozen bool
	best   int
}

// NewBO returns a BO tuner; errors name the bad option.
func NewBO(o BOOptions) (*BO, error) {
	b := &BO{best: -1}
	switch o.Arch {
	case "ps":
		b.dims = []Dim{{Lo: boCreditLoPS * boElemBytes, Hi: boCreditHiPS * boElemBytes, Log: true}}
	case "allreduce":
		b.dims = []Dim{
			{Lo: boCreditLoAllReduce * boElemBytes, Hi: boCreditHiAllReduce * boElemBytes, Log: true},
			{Lo: boPartitionLo * boElemBytes, Hi: boPartitionHi * boElemBytes, Log: true},
		}
	default:
		return nil, fmt.Errorf("tune: BO architecture must be \"ps\" or \"allreduce\", got %q", o.Arch)
	}
	if err := o.Base.Validate(); err != nil {
		return nil, fmt.Errorf("tune: BO base configuration %+v: %w", o.Base, err)
	}
	if o.TrialIterations == 0 {
		o.TrialIterations = 100
	}
	if o.TrialIterations < boMinTrialIterations {
		return nil, fmt.Errorf("tune: BO trials must last >= %d iterations (%d and %d dropped, 1 measured), got %d",
			boMinTrialIterations, boDroppedFirst, boDroppedLast, o.TrialIterations)
	}
	if o.ApplyDelay == 0 {
		o.ApplyDelay = 10
	}
	if o.ApplyDelay < Lead {
		return nil, fmt.Errorf("tune: BO apply delay must be >= %d iterations (tune.Lead), got %d", Lead, o.ApplyDelay)
	}
	if o.Random == 0 {
		o.Random = 10
	}
	if o.Random < 1 {
		return nil, fmt.Errorf("tune: BO needs >= 1 random trial to fit its GP, got %d", o.Random)
	}
	if o.EI == 0 {
		o.EI = 4
	}
	if o.EI < 0 {
		return nil, fmt.Errorf("tune: BO expected-improvement trials must be >= 0, got %d", o.EI)
	}
	if o.Xi == 0 {
		o.Xi = 0.1
	}
	if !(o.Xi >= 0) || math.IsInf(o.Xi, 0) {
		return nil, fmt.Errorf("tune: BO xi must be finite and >= 0 seconds, got %v", o.Xi)
	}
	b.o = o
	rng := rand.New(rand.NewPCG(o.Seed, 0x626f)) // "bo"
	for range o.Random {
		x := make([]float64, len(b.dims))
		for d, dim := range b.dims {
			x[d] = dim.Lo + rng.Float64()*(dim.Hi-dim.Lo)
		}
		b.random = append(b.random, b.config(x))
	}
	b.cand = rand.New(rand.NewPCG(o.Seed, 0x6569)) // "ei"
	return b, nil
}

// Name returns "bo".
func (*BO) Name() string { return "bo" }

// config turns a point of the box (bytes) into a configuration, rounding
// to whole elements within the box.
func (b *BO) config(x []float64) sched.Config {
	c := b.o.Base
	round := func(v float64, d Dim) int64 {
		e := math.Round(min(max(v, d.Lo), d.Hi) / boElemBytes)
		return int64(e) * boElemBytes
	}
	c.CreditBytes = round(x[0], b.dims[0])
	if len(b.dims) > 1 {
		c.PartitionBytes = round(x[1], b.dims[1])
	}
	return c
}

// point is a configuration's coordinates in the box.
func (b *BO) point(c sched.Config) []float64 {
	if len(b.dims) > 1 {
		return []float64{float64(c.CreditBytes), float64(c.PartitionBytes)}
	}
	return []float64{float64(c.CreditBytes)}
}

// Observe measures s in the trial in force and, at a trial's last
// iteration, proposes the next trial or freezes the best.
func (b *BO) Observe(s Stats) (Proposal, bool) {
	if b.frozen {
		return Proposal{}, false
	}
	it := s.Iteration
	if len(b.trials) == 0 {
		b.trials = append(b.trials, BOTrial{Config: b.o.Base, FromIteration: it, MeanIterationS: math.NaN(), Kind: "default"})
	}
	t := &b.trials[len(b.trials)-1]
	if it < t.FromIteration {
		return Proposal{}, false // the previous configuration still runs
	}
	T := b.o.TrialIterations
	if j := it - t.FromIteration; j >= boDroppedFirst && j < T-boDroppedLast && s.IterationTimeS > 0 && !math.IsInf(s.IterationTimeS, 0) {
		t.sum += s.IterationTimeS
		t.Measured++
		t.MeanIterationS = t.sum / float64(t.Measured)
	}
	if it < t.FromIteration+T-1 {
		return Proposal{}, false
	}
	from := it + 1 + b.o.ApplyDelay
	n := len(b.trials) // trials done, the default included
	var next BOTrial
	switch {
	case n <= b.o.Random:
		next = BOTrial{Config: b.random[n-1], Kind: "random"}
	case n <= b.o.Random+b.o.EI:
		next = b.nextEI(n)
	default:
		return b.freeze(from)
	}
	next.FromIteration, next.MeanIterationS = from, math.NaN()
	b.trials = append(b.trials, next)
	return Proposal{Config: next.Config, FromIteration: from}, true
}

// freeze fixes the measured trial (not the default) with the lowest mean,
// the earliest on ties, and proposes it from from unless it is in force.
func (b *BO) freeze(from int) (Proposal, bool) {
	b.frozen = true
	for i := 1; i < len(b.trials); i++ {
		if m := b.trials[i].MeanIterationS; !math.IsNaN(m) && (b.best < 0 || m < b.trials[b.best].MeanIterationS) {
			b.best = i
		}
	}
	if b.best < 0 {
		b.best = 0 // nothing measured: keep the initial configuration
	}
	cfg := b.trials[b.best].Config
	if cfg == b.trials[len(b.trials)-1].Config {
		return Proposal{}, false
	}
	return Proposal{Config: cfg, FromIteration: from}, true
}

// nextEI chooses the configuration maximising expected improvement given
// the measured trials (the default excluded), for the trial numbered n.
func (b *BO) nextEI(n int) BOTrial {
	var x [][]float64
	var y []float64
	tried := map[sched.Config]bool{}
	for _, t := range b.trials[1:] {
		tried[t.Config] = true
		if !math.IsNaN(t.MeanIterationS) {
			x = append(x, b.point(t.Config))
			y = append(y, t.MeanIterationS)
		}
	}
	fallback := func(why string) BOTrial {
		u := make([]float64, len(b.dims))
		for d := range u {
			u[d] = b.dims[d].Lo + b.cand.Float64()*(b.dims[d].Hi-b.dims[d].Lo)
		}
		return BOTrial{Config: b.config(u), Kind: "random-fallback", GPError: why}
	}
	if len(x) == 0 {
		return fallback("tune: BO has no measured trial to fit")
	}
	g, err := FitGP(x, y, GPOptions{Dims: b.dims, Seed: b.o.Seed ^ uint64(n)<<32})
	if err != nil {
		return fallback(err.Error())
	}
	best := slices.Min(y)
	ei := func(u []float64) float64 {
		m, s := g.predictUnit(u)
		return ExpectedImprovement(m, s, best, b.o.Xi)
	}
	type cand struct {
		u  []float64
		ei float64
	}
	cands := make([]cand, boCandidates)
	for i := range cands {
		u := make([]float64, len(b.dims))
		for d := range u {
			u[d] = b.cand.Float64()
		}
		cands[i] = cand{u, ei(u)}
	}
	// Stable sort: equal EI keeps draw order, so the choice is seeded.
	slices.SortStableFunc(cands, func(p, q cand) int { return cmp.Compare(q.ei, p.ei) })
	for i := range min(boRefined, len(cands)) {
		cands[i].u, cands[i].ei = patternSearch(ei, cands[i].u, cands[i].ei)
	}
	slices.SortStableFunc(cands, func(p, q cand) int { return cmp.Compare(q.ei, p.ei) })
	for _, c := range cands {
		x := make([]float64, len(c.u))
		for d, v := range c.u {
			x[d] = b.dims[d].value(v)
		}
		if cfg := b.config(x); !tried[cfg] {
			return BOTrial{Config: cfg, Kind: "ei"}
		}
	}
	return fallback("tune: BO found no untried candidate")
}

// patternSearch improves f (to maximise) from u by a compass search inside
// the unit cube, from step 0.05 down to 0.001 (at most 2000 evaluations).
func patternSearch(f func([]float64) float64, u []float64, fu float64) ([]float64, float64) {
	u = append([]float64(nil), u...)
	v := make([]float64, len(u))
	for step, evals := 0.05, 0; step >= 1e-3 && evals < 2000; {
		improved := false
		for d := range u {
			for _, sgn := range []float64{1, -1} {
				copy(v, u)
				v[d] = min(max(u[d]+sgn*step, 0), 1)
				evals++
				if fv := f(v); fv > fu {
					copy(u, v)
					fu, improved = fv, true
				}
			}
		}
		if !improved {
			step /= 2
		}
	}
	return u, fu
}

// Trials returns a copy of the trials so far, the default first.
func (b *BO) Trials() []BOTrial { return append([]BOTrial(nil), b.trials...) }

// Frozen returns the configuration fixed for the rest of the run once
// every trial was measured.
func (b *BO) Frozen() (sched.Config, bool) {
	if !b.frozen {
		return sched.Config{}, false
	}
	return b.trials[b.best].Config, true
}
