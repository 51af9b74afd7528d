package tune

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/units"
)

// AutoByteOptions configure the meta-network tuner. Zero fields take the
// defaults stated per field.
type AutoByteOptions struct {
	// Meta is the network; nil means DefaultMeta (the shipped weights).
	// The tuner fine-tunes its own copy, never Meta itself.
	Meta *Meta
	// Partitions and Credits span the candidate grid (every pair); default
	// DefaultMetaPartitions × DefaultMetaCredits.
	Partitions, Credits []int64
	// Base gives the candidates' order and admission rule (default
	// priority order, positive admission: ByteScheduler's).
	Base sched.Config
	// Warmup is how many iterations after a configuration takes effect are
	// not measured (default 1): the pipeline still carries the previous
	// configuration's effects.
	Warmup int
	// Measure is how many iterations are averaged before a decision and to
	// judge a trial (default 3). On a noisy host the tuner averages more,
	// up to MaxMeasure (default 8): as many as it takes for a Margin
	// difference to stand NoiseZ standard errors above the measured
	// iteration-to-iteration noise. A candidate clearly slower than the
	// best measured so far is judged after Measure iterations anyway.
	Measure    int
	MaxMeasure int
	// NoiseZ is how many standard errors of the measured noise a measured
	// gain must exceed before the tuner believes it (default 2): a trial
	// or a verified candidate replaces the configuration in force only if
	// it is faster by that much, and a periodic search tries a candidate
	// only if its predicted gain is at least that large. The noise is the
	// change detector's estimate of the iteration time's; a noiseless run
	// (the simulator) has none, and the rules reduce to the plain ones.
	NoiseZ float64
	// Every is how many iterations pass between searches while nothing
	// changes (default 10). A detected change searches at once.
	Every int
	// Margin is the predicted gain a candidate needs over the current
	// configuration to be tried by a periodic search (default 0.03 = 3%
	// shorter iterations).
	Margin float64
	// TopK is how many of the best-predicted candidates the search at the
	// start and after each detected change verifies by measurement, one
	// after another, whatever their predicted gain (default 3). The tuner
	// then keeps the configuration with the best measured time, the one in
	// force before the search included. TopK < 0 disables verification:
	// those searches then use Margin like the periodic ones.
	TopK int
	// KeepTolerance keeps a tried candidate if its measured time is at
	// most (1 + KeepTolerance) × the time it replaced (default 0: it must
	// not be slower).
	KeepTolerance float64
	// FineTuneSteps gradient steps on at most FineTuneBatch measured
	// examples run before each search (default 5 steps of 16 examples, rate
	// FineTuneRate, default 0.02); Buffer bounds the examples kept (default
	// 64, oldest dropped). FineTuneSteps < 0 disables fine-tuning.
	FineTuneSteps int
	FineTuneBatch int
	FineTuneRate  float64
	Buffer        int
	// Change configures the change detector.
	Change ChangeOptions
	// Seed draws the fine-tuning minibatches.
	Seed uint64
	// Compress is the 16-bit type the tuner may switch float32 gradients
	// to and back (the third knob); dtype.F32 (the default) leaves the
	// compression in force alone, as a user who pins it wants. The rule
	// is measured, not predicted: when no partition or credit is worth a
	// trial and the job is communication-bound (its iteration takes more
	// than CommBound, default 0.1, beyond its compute), the tuner tries
	// compression and keeps it only if it is CompressionGain (default
	// 0.05) faster; when the job is compute-bound under compression, it
	// tries without and keeps that unless it is CompressionGain slower.
	// Compression costs precision, so a tie goes to float32.
	Compress        dtype.DType
	CommBound       float64
	CompressionGain float64
	// Fuse is the fusion size (sched.Config.FusionBytes) the tuner may
	// switch to and back (the fifth knob); 0 (the default) leaves the
	// fusion in force alone. Like compression the rule is measured: when
	// neither partition, credit nor compression is worth a trial, the
	// tuner tries the other fusion setting, and keeps it only if it is
	// FusionGain (default 0.02) faster. Fewer, larger messages cost less
	// per byte where messages are many and small; a fused unit waits for
	// its last tensor, which can cost more than that. Each setting is tried
	// once per configuration and conditions (a reverted trial is not
	// repeated until they change).
	Fuse       int64
	FusionGain float64
	// FixedWeights leaves the parameter servers' weights in force alone
	// (the fourth knob). Otherwise, on a job of two or more servers, the
	// tuner moves load between them as it measures them. After every
	// measured window, if giving each server a share of the bytes
	// proportional to its measured rate (its goodput,
	// Stats.ServerGoodputBps, while it sets the pace) is predicted to
	// cut the iteration time by at least RebalanceGain (default 0.1: the
	// cut in the slowest server's time times the part of the iteration
	// beyond its compute), or would cut the slowest server's time by
	// Margin for a return to even weights or to give a relieved server
	// that recovered more, it tries those weights, and keeps them only if
	// the job is RebalanceKeep (default 0.01) faster (a give-back to a
	// recovered server: if it is not slower). Where response times
	// are measured (Stats.ServerResponseS), one iteration in which a
	// single server's response time doubles or halves against the window
	// is enough: the tuner rebalances from that iteration alone, even
	// while a trial, a verification or a proposal not yet in force is
	// under way (which is dropped). Rates within WeightsEven (default 0.5)
	// of one another give even weights, and a server within WeightsEven of
	// the fastest is weighed as the fastest: servers of one speed measure
	// up to 45% apart (which pieces each holds, in which order, and a
	// server relieved of load shows more goodput than at the pace), and
	// chasing that only delays the search of partition and credit or
	// swings the load between them; a server slower than that is what the
	// knob is for. After three rebalances reverted
	// in a row the tuner stops trying until conditions change (a server
	// whose response time changes is such a change).
	FixedWeights  bool
	RebalanceGain float64
	RebalanceKeep float64
	WeightsEven   float64
}

// AutoByteEvent is one thing the tuner did, for logs and tests.
type AutoByteEvent struct {
	Iteration int
	// Kind is "change" (conditions changed: re-search), "search" (the grid
	// was scored and nothing beat the margin), "try" (a candidate was
	// proposed), "keep" or "revert" (a trial was judged: kept, or the
	// previous configuration restored), "verify" (one of the top-k
	// candidates of a verification was proposed), "rebalance" (server
	// weights that follow the measured servers were proposed) and
	// "measured" (it was
	// measured). A verification ends with "keep" (Config, the best measured
	// candidate, is in force) or "revert" (the configuration in force before
	// it measured best and is restored). "recheck" restores the
	// configuration a kept candidate replaced, when the candidate's first
	// full window after the keep measures slower than that one did (see
	// AutoByte.recheck).
	Kind   string
	Config sched.Config
	// PredictedGain is 1 - predicted time of the best / predicted time of
	// the current configuration (search, try).
	PredictedGain float64
	// MeasuredS is the mean measured time of the configuration judged
	// (keep, revert, measured), and PreviousS what it replaced (for a
	// verification: the time of the configuration in force before it).
	MeasuredS, PreviousS float64
	// Detail names the changed channel (change), or the server whose
	// response time called for a rebalance at once (rebalance).
	Detail string
}

// String describes the event in one line, for logs: "after iteration 12:
// keep partition 256KiB credit 1MiB, measured 1.1s (before 1.3s)".
func (e AutoByteEvent) String() string {
	s := fmt.Sprintf("after iteration %d: %s", e.Iteration, e.Kind)
	switch e.Kind {
	case "change":
		s += " (" + e.Detail + ")"
	case "search", "try", "verify", "rebalance":
		s += " " + e.Config.Knobs()
		if e.PredictedGain != 0 {
			s += fmt.Sprintf(", predicted gain %.1f%%", 100*e.PredictedGain)
		}
		if e.Detail != "" {
			s += " (" + e.Detail + ")"
		}
	case "keep", "revert", "measured", "recheck":
		s += fmt.Sprintf(" %s, measured %s (before %s)", e.Config.Knobs(), units.FormatSeconds(e.MeasuredS), units.FormatSeconds(e.PreviousS))
	}
	return s
}

// AutoByte is the meta-network tuner (AutoByte's model; this project's
// design, docs/tuner.md). It measures the configuration in force for a few
// iterations, scores the candidate grid with the meta-network from the
// mean statistics, and tries the best candidate only when its predicted
// gain over the current configuration beats Margin. At the start and after
// each detected change it instead verifies the TopK best-predicted
// candidates by measuring each in turn and keeps the fastest measured
// configuration (the one in force before included), since the network's
// error is larger than the gains it must rank. A tried candidate is
// kept only if its measured time is no worse than the time it replaced;
// otherwise the tuner reverts and does not try it again until conditions
// change. Each measured configuration becomes training examples, and the
// network takes a few gradient steps on them before every search. A change
// detector on the bandwidth, the compute time and the iteration time
// starts a new search as soon as conditions change. It is deterministic
// for equal options and statistics.
type AutoByte struct {
	o       AutoByteOptions
	meta    *Meta
	cands   []sched.Config
	det     *ChangeDetector
	rng     *rand.Rand
	buf     []MetaExample
	events  []AutoByteEvent
	scores  []float64
	current sched.Config
	known   bool // current was read from the statistics
	// measureFrom is the first iteration to measure: the configuration in
	// force from then on is current.
	measureFrom int
	// pending is the iteration the last proposal applies from.
	pending int
	window  []Stats
	// nextSearch is the iteration from which a search is due.
	nextSearch int
	// trial: the configuration tried and what it replaced.
	trying    bool
	prev      sched.Config
	prevStats Stats
	prevS     float64
	// tabu are candidates tried and reverted under the current conditions.
	tabu map[sched.Config]bool
	// fusionTabu are fusion settings tried and reverted under the current
	// conditions. Unlike tabu, a server whose response time changes does
	// not clear it (only the change detector does): a fusion trial moves
	// the servers' response times itself, and on a noisy host that alone
	// had the tuner try the same fusion again.
	fusionTabu map[sched.Config]bool
	// verifyDue: the next search verifies the top-k (start, change).
	verifyDue bool
	// verifying: queue holds the candidates still to measure, measured
	// those measured so far (the configuration in force before first).
	verifying bool
	queue     []sched.Config
	measured  []measuredConfig
	// noise is the change detector's iteration-time noise as of the
	// latest Observe (one estimate per iteration serves every rule).
	noise float64
	// trialTolerance is the keep rule's tolerance for the trial on hand
	// (KeepTolerance, or the compression rule's). givingBack: the trial
	// gives a recovered server load back, and is kept unless slower
	// beyond the noise (see rebalance).
	trialTolerance float64
	givingBack     bool
	// rebalancing: the trial on hand is new server weights;
	// rebalanceReverts counts those reverted in a row under the current
	// conditions (at maxRebalanceReverts the tuner stops trying).
	rebalancing      bool
	rebalanceReverts int
	// servers is what the tuner remembers of each server: its rate as
	// measured while it set the pace, and its recoveries (serverRecord).
	servers []serverRecord
	// basis are the rates the weights in force were chosen from (nil:
	// none), and prevBasis those of the weights a rebalance on trial
	// replaced. A server's recovery is judged against the lower of its
	// basis and its remembered rate: a link that recovers while its
	// server is at the pace raises the remembered rate through windows
	// that mix the two rates, and then no later window is far enough
	// above it.
	basis, prevBasis []float64
	// lastWindow is the window of the configuration in force before the
	// last proposal, which followNow compares iterations with until the
	// proposal takes effect.
	lastWindow []Stats
	// recheck is the second look at the last kept candidate (nil: none due).
	recheck *recheck
}

// recheck is a kept candidate's second look. A candidate is judged on its
// first iterations, and queues that build up over several iterations (a
// larger credit under a slow server) can make those faster than the ones
// that follow: so the first full window after the keep, measured from
// iteration from on, must not be slower than what the candidate replaced
// (replacedS, under config replaced) beyond the noise and recheckTolerance,
// or replaced comes back.
type recheck struct {
	kept, replaced sched.Config
	replacedS      float64
	from           int
}

// recheckTolerance is how much slower than what it replaced a kept
// candidate may measure on its second look and stay: less would undo keeps
// for the wobble of one iteration in three.
const recheckTolerance = 0.01

// measuredConfig is one configuration measured during a verification.
type measuredConfig struct {
	cfg sched.Config
	st  Stats
}

// NewAutoByte returns the tuner; errors name the bad option.
func NewAutoByte(o AutoByteOptions) (*AutoByte, error) {
	if o.Meta == nil {
		m, err := DefaultMeta()
		if err != nil {
			return nil, err
		}
		o.Meta = m
	}
	if err := o.Meta.validate(); err != nil {
		return nil, err
	}
	if o.Partitions == nil {
		o.Partitions = DefaultMetaPartitions
	}
	if o.Credits == nil {
		o.Credits = DefaultMetaCredits
	}
	for _, p := range o.Partitions {
		if p <= 0 {
			return nil, fmt.Errorf("tune: autobyte partitions must be > 0 bytes, got %d", p)
		}
	}
	for _, c := range o.Credits {
		if c <= 0 {
			return nil, fmt.Errorf("tune: autobyte credits must be > 0 bytes, got %d", c)
		}
	}
	if len(o.Partitions) == 0 || len(o.Credits) == 0 {
		return nil, fmt.Errorf("tune: autobyte needs at least one partition and one credit, got %d and %d", len(o.Partitions), len(o.Credits))
	}
	if o.Base == (sched.Config{}) {
		o.Base = sched.Config{Order: sched.OrderPriority, Admission: sched.AdmitPositive}
	}
	ints := []struct {
		name string
		v    *int
		def  int
	}{{"warm-up", &o.Warmup, 1}, {"measured iterations", &o.Measure, 3}, {"most measured iterations", &o.MaxMeasure, 8}, {"search interval", &o.Every, 10}, {"top-k", &o.TopK, 3},
		{"fine-tune steps", &o.FineTuneSteps, 5}, {"fine-tune batch", &o.FineTuneBatch, 16}, {"buffer", &o.Buffer, 64}}
	for _, f := range ints {
		if *f.v < 0 && f.name != "fine-tune steps" && f.name != "top-k" {
			return nil, fmt.Errorf("tune: autobyte %s must be >= 0 (0 = default %d), got %d", f.name, f.def, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	floats := []struct {
		name string
		v    *float64
		def  float64
	}{{"margin", &o.Margin, 0.03}, {"keep tolerance", &o.KeepTolerance, 0}, {"fine-tune rate", &o.FineTuneRate, 0.02}, {"noise z", &o.NoiseZ, 2},
		{"communication-bound threshold", &o.CommBound, 0.1}, {"compression gain", &o.CompressionGain, 0.05}, {"fusion gain", &o.FusionGain, 0.02},
		{"rebalance gain", &o.RebalanceGain, 0.1}, {"rebalance keep", &o.RebalanceKeep, 0.01}, {"even weights", &o.WeightsEven, 0.5}}
	for _, f := range floats {
		if *f.v < 0 || math.IsNaN(*f.v) || math.IsInf(*f.v, 0) {
			return nil, fmt.Errorf("tune: autobyte %s must be a number >= 0 (0 = default %v), got %v", f.name, f.def, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if !o.Compress.Valid() {
		return nil, fmt.Errorf("tune: autobyte compression %v is not a wire type", o.Compress)
	}
	if o.Fuse < 0 {
		return nil, fmt.Errorf("tune: autobyte fusion size must be >= 0 bytes (0 = leave the fusion alone), got %d", o.Fuse)
	}
	if o.MaxMeasure < o.Measure {
		return nil, fmt.Errorf("tune: autobyte most measured iterations (%d) must be >= measured iterations (%d)", o.MaxMeasure, o.Measure)
	}
	for _, p := range o.Partitions {
		for _, c := range o.Credits {
			if err := (sched.Config{PartitionBytes: p, CreditBytes: c, Order: o.Base.Order, Admission: o.Base.Admission}).Validate(); err != nil {
				return nil, fmt.Errorf("tune: autobyte base configuration: %w", err)
			}
		}
	}
	det, err := NewChangeDetector(o.Change)
	if err != nil {
		return nil, err
	}
	a := &AutoByte{o: o, meta: o.Meta.Clone(), cands: Cross(o.Base, o.Partitions, o.Credits), det: det,
		rng: rand.New(rand.NewPCG(o.Seed, 0x6175746f)), measureFrom: o.Warmup, pending: -1, tabu: map[sched.Config]bool{}, fusionTabu: map[sched.Config]bool{},
		verifyDue: o.TopK > 0}
	return a, nil
}

// Name returns "autobyte".
func (*AutoByte) Name() string { return "autobyte" }

// Events returns a copy of what the tuner did so far.
func (a *AutoByte) Events() []AutoByteEvent { return a.EventsFrom(0) }

// EventsFrom returns a copy of the events from the i-th on (none if there
// are not more than i): a caller that logs events as they come passes the
// number it has seen.
func (a *AutoByte) EventsFrom(i int) []AutoByteEvent {
	return append([]AutoByteEvent(nil), a.events[min(max(i, 0), len(a.events)):]...)
}

// Candidates returns the candidate grid.
func (a *AutoByte) Candidates() []sched.Config { return append([]sched.Config(nil), a.cands...) }

// Meta returns the tuner's (fine-tuned) network.
func (a *AutoByte) Meta() *Meta { return a.meta }

// Observe implements Tuner.
func (a *AutoByte) Observe(s Stats) (Proposal, bool) {
	it := s.Iteration
	if !a.known {
		a.current, a.known = s.Config, true
	}
	if it >= a.pending && it <= a.pending+a.o.Warmup {
		a.det.ConfigChanged()
	}
	changed, what := a.det.Observe(s)
	a.noise = a.det.IterationNoise()
	if changed {
		a.events = append(a.events, AutoByteEvent{Iteration: it, Kind: "change", Config: a.current, Detail: what})
		clear(a.tabu)
		clear(a.fusionTabu)
		a.trying, a.rebalancing, a.rebalanceReverts = false, false, 0
		a.recheck = nil // judged under other conditions
		// The servers' rates are kept: a server that changed shows it when
		// it next sets the pace (or runs faster than remembered).
		a.verifying, a.queue, a.measured = false, a.queue[:0], a.measured[:0]
		a.verifyDue = a.o.TopK > 0
		// Measure afresh from this iteration (already under the new
		// conditions), unless a proposal is still to take effect.
		a.window = a.window[:0]
		a.measureFrom = max(it, a.measureFrom)
		a.nextSearch = it
	}
	// A server whose link changed in this one iteration is followed at
	// once, before a window of iterations is in, and even while a
	// proposal is still to take effect: each iteration at the old weights
	// with a link at a fraction of its rate costs several iterations'
	// worth (a mean over a window that mixes the two rates hides it for
	// as long as the window).
	if p, ok := a.followNow(it, s); ok {
		return p, true
	}
	if it < a.measureFrom {
		return Proposal{}, false
	}
	a.window = append(a.window, s)
	if len(a.window) > 2*a.o.MaxMeasure {
		a.window = a.window[1:]
	}
	if len(a.window) < a.o.Measure {
		return Proposal{}, false
	}
	n := a.measureCount()
	recent := a.window[max(0, len(a.window)-n):]
	st := MeanStats(recent)
	if (a.trying || a.verifying) && !a.rebalancing && len(st.ServerResponseS) == 0 {
		// A server link that changes during a trial or a verification is
		// followed at once: waiting for the end of a verification costs
		// several trials' worth of iterations at the wrong weights. Where
		// response times are measured, followNow does it for a server whose
		// response time changed; without them, any rebalance the window
		// calls for interrupts (a trial of another partition moves the
		// servers' goodputs too, so this is the coarser rule).
		if c, gain, rates, raised, ok := a.rebalanced(st, a.settled()); ok {
			return a.preempt(it, c, gain, rates, raised, st), true
		}
	}
	if a.trying || a.verifying {
		// Judge once n iterations are in, or earlier if already clearly
		// slower than what it must beat.
		if len(recent) < n && !a.clearlyWorse(st.IterationTimeS, len(recent)) {
			return Proposal{}, false
		}
		if a.trying {
			return a.judge(it, st)
		}
		return a.verifyStep(it, st)
	}
	// Load follows the servers at once, before partition and credit are
	// searched: a slow server link sets the pace whatever they are, and it
	// must not wait for the next search (nor for the change detector,
	// which takes a link that slows down as a configuration takes effect
	// for the configuration's doing).
	if c, gain, rates, raised, ok := a.rebalanced(st, a.current); ok {
		return a.rebalance(it, c, gain, rates, raised, st), true
	}
	if p, ok := a.secondLook(it, n); ok {
		return p, true
	}
	if it < a.nextSearch {
		return Proposal{}, false
	}
	if a.verifyDue {
		return a.verify(it, st)
	}
	return a.search(it, st)
}

// measureCount is how many iterations to average: Measure, or more on a
// noisy host (see AutoByteOptions.Measure).
func (a *AutoByte) measureCount() int {
	sd := a.noise
	if !(sd > 0) {
		return a.o.Measure
	}
	// The difference of two means of n has deviation sd·√(2/n); it must be
	// Margin at NoiseZ of them.
	n := 2 * math.Pow(a.o.NoiseZ*sd/a.o.Margin, 2)
	if n >= float64(a.o.MaxMeasure) {
		return a.o.MaxMeasure
	}
	return max(a.o.Measure, int(math.Ceil(n)))
}

// noiseGap is the log gap between two means of n iterations that NoiseZ
// standard errors of the measured noise reach (0 without noise).
func (a *AutoByte) noiseGap(n int) float64 {
	return a.o.NoiseZ * a.noise * math.Sqrt(2/float64(n))
}

// clearlyWorse says whether t, a mean of n iterations of the candidate in
// force, is already slower than what it must beat (the configuration a
// trial replaced, or the best measured so far in a verification) by more
// than the noise allows.
func (a *AutoByte) clearlyWorse(t float64, n int) bool {
	ref := a.prevS
	if a.verifying {
		ref = a.measured[0].st.IterationTimeS
		for _, m := range a.measured {
			ref = min(ref, m.st.IterationTimeS)
		}
	}
	return ref > 0 && math.Log(t/ref) > a.noiseGap(n)
}

// judge keeps or reverts the candidate on trial, now measured as st.
func (a *AutoByte) judge(it int, st Stats) (Proposal, bool) {
	a.trying = false
	defer func() { a.rebalancing = false }()
	a.learn(st, a.prevStats, a.prevS)
	a.learn(a.prevStats, st, st.IterationTimeS)
	a.learn(st, st, st.IterationTimeS)
	ev := AutoByteEvent{Iteration: it, Config: a.current, MeasuredS: st.IterationTimeS, PreviousS: a.prevS}
	// Faster beyond the noise (with no noise: not slower than the
	// tolerance allows).
	gap := a.noiseGap(a.measureCount())
	limit := a.prevS * (1 + a.trialTolerance) * math.Exp(-gap)
	if a.givingBack {
		limit = a.prevS * math.Exp(gap)
	}
	if st.IterationTimeS <= limit {
		if a.rebalancing {
			a.rebalanceReverts = 0
		} else if !a.givingBack {
			a.recheck = &recheck{kept: a.current, replaced: a.prev, replacedS: a.prevS, from: it + 1}
		}
		ev.Kind = "keep"
		a.events = append(a.events, ev)
		a.nextSearch = it + 1 // search again at once: the network learned
		return Proposal{}, false
	}
	ev.Kind = "revert"
	a.events = append(a.events, ev)
	a.tabu[a.current] = true
	if a.current.FusionBytes != a.prev.FusionBytes {
		a.fusionTabu[a.current] = true
	}
	if a.rebalancing {
		// The trial measured which server set the pace under its
		// weights: the next rebalance knows better.
		a.learnRates(st)
		a.rebalanceReverts++
		a.basis = a.prevBasis
	}
	a.rebalancing = false
	a.nextSearch = it + a.o.Every
	return a.propose(it, a.prev), true
}

// secondLook restores the configuration the last kept candidate replaced
// if the candidate's first n iterations since the keep (see recheck) are
// slower than it; it drops the recheck once it has looked, or once another
// configuration is in force.
func (a *AutoByte) secondLook(it, n int) (Proposal, bool) {
	r := a.recheck
	if r == nil {
		return Proposal{}, false
	}
	if a.current != r.kept {
		a.recheck = nil
		return Proposal{}, false
	}
	var since []Stats
	for _, w := range a.window {
		if w.Iteration >= r.from && w.Config == r.kept {
			since = append(since, w)
		}
	}
	if len(since) < n {
		return Proposal{}, false
	}
	a.recheck = nil
	t := MeanStats(since[len(since)-n:]).IterationTimeS
	if !(r.replacedS > 0) || math.Log(t/r.replacedS) <= a.noiseGap(n)+math.Log1p(recheckTolerance) {
		return Proposal{}, false
	}
	a.events = append(a.events, AutoByteEvent{Iteration: it, Kind: "recheck", Config: r.replaced, MeasuredS: t, PreviousS: r.replacedS})
	a.tabu[r.kept] = true
	a.nextSearch = it + a.o.Every
	return a.propose(it, r.replaced), true
}

// fastRebalanceGain is the predicted gain from one iteration's statistics
// at which the tuner rebalances without waiting for a window: a server
// this far off the pace is not the noise of one iteration (servers of one
// speed measure within WeightsEven of one another, which gives even
// weights and no gain).
const fastRebalanceGain = 0.3

// followNow rebalances from iteration it's statistics s alone when one
// server's response time changed (serverChanged) and s predicts
// fastRebalanceGain or more, or a recovered server's rate was raised; the
// servers' remembered rates are left as they were otherwise.
func (a *AutoByte) followNow(it int, s Stats) (Proposal, bool) {
	if a.rebalancing && s.Config != a.current {
		return Proposal{}, false // new weights are on their way already
	}
	what, srv, recovered, changed := a.serverChanged(s)
	if !changed {
		return Proposal{}, false
	}
	if recovered && srv < len(a.servers) {
		// Its link is faster than when a raise of it was not borne out:
		// the next raise needs no more than any other's.
		a.servers[srv].slack = 0
	}
	// That server's conditions changed: the rebalances reverted and the
	// candidates found slower before were judged under the old ones.
	a.rebalanceReverts = 0
	clear(a.tabu)
	busy := a.trying || a.verifying
	base := a.current
	if busy {
		base = a.settled()
	}
	saved := slices.Clone(a.servers)
	c, gain, rates, raised, ok := a.rebalanced(s, base)
	if !ok || (gain < fastRebalanceGain && !raised) {
		a.servers = saved // what this iteration taught is not acted on
		return Proposal{}, false
	}
	var p Proposal
	if busy {
		p = a.preempt(it, c, gain, rates, raised, s)
	} else {
		p = a.rebalance(it, c, gain, rates, raised, s)
	}
	a.events[len(a.events)-1].Detail = what
	return p, true
}

// serverChanged says whether s shows one server's response time (push to
// answer) at twice or more, or half or less, of its mean over the window
// (measured under the same configuration) while the other servers'
// median did not move the same way by more than 1.5x: that server's link changed, not
// the network or the compute. The response time tells it where goodput
// does not: a server that sets the pace holds every worker back, so every
// server's goodput falls with it, while only its own pushes queue at its
// link. Each server is compared with itself, since servers of one speed
// measure apart under some configurations (which pieces each holds), and
// that does not change from one iteration to the next.
//
// It also describes the change, for the log ("server 6's response time
// 6.8x"), and says which server changed and whether it recovered (its
// response time halved) rather than slowed.
func (a *AutoByte) serverChanged(s Stats) (what string, srv int, recovered, changed bool) {
	n := len(s.ServerResponseS)
	window := a.window
	if s.Config != a.current || len(window) == 0 {
		// A proposal is not in force yet, or this is the first iteration
		// under it (or of a fresh measurement): compare with the window
		// before it, so that a server that changes now is not charged to
		// new weights.
		window = a.lastWindow
	}
	if n < 2 || len(window) == 0 {
		return "", 0, false, false
	}
	before := make([]float64, n)
	for _, w := range window {
		if w.Config != window[0].Config || len(w.ServerResponseS) != n {
			return "", 0, false, false
		}
		for i, r := range w.ServerResponseS {
			before[i] += r / float64(len(window))
		}
	}
	comparable := comparableServers(window[0].Config, s.Config, n, shareShrinkTolerance)
	if len(comparable) < 2 {
		return "", 0, false, false
	}
	ratios := make([]float64, n)
	for _, i := range comparable {
		r := s.ServerResponseS[i]
		if !(before[i] > 0) || !(r > 0) {
			return "", 0, false, false
		}
		ratios[i] = r / before[i]
	}
	order := slices.Clone(comparable) // servers by ratio
	slices.SortFunc(order, func(i, j int) int { return cmp.Compare(ratios[i], ratios[j]) })
	n = len(order) // from here on, the servers compared
	sorted := make([]float64, n)
	for k, i := range order {
		sorted[k] = ratios[i]
	}
	// The others' responses may fall when one server slows (fewer of
	// their pushes arrive at once) and rise when one recovers: only a move
	// of theirs the same way says the change is not that server's.
	var i int
	switch {
	case sorted[n-1] >= 2 && sorted[:n-1][(n-1)/2] <= 1.5:
		i = order[n-1] // slowed
	case sorted[0] <= 0.5 && sorted[1:][(n-1)/2] >= 1/1.5:
		i, recovered = order[0], true
	default:
		return "", 0, false, false
	}
	if recovered && !slices.Contains(comparableServers(window[0].Config, s.Config, len(s.ServerResponseS), 0), i) {
		// A server given less load can answer at once for that alone,
		// when the pace moves to another server: autobyte demo's revert
		// of weights 1000:209 to 1000:250 halved server 0's response time
		// with its share 3% smaller. Its recovery is seen under one
		// configuration only.
		return "", 0, false, false
	}
	return fmt.Sprintf("server %d's response time %.3gx", i, ratios[i]), i, recovered, true
}

// comparableServers are the servers (of n) whose response times under
// configuration now can be compared with those under before: all of them
// when the two are equal; when only the server weights differ, those
// whose share did not shrink by more than the fraction shrink (a server
// given less load answers faster for that alone, which is no news about
// its link, while one given more or about as much that answers twice as
// slowly has slowed: serverChanged allows shareShrinkTolerance, and none
// for a recovery); none when anything else differs, since partition,
// credit and fusion move every server's response time.
func comparableServers(before, now sched.Config, n int, shrink float64) []int {
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	if before == now {
		return all
	}
	b, c := before, now
	b.ServerWeights, c.ServerWeights = sched.ServerWeights{}, sched.ServerWeights{}
	if b != c {
		return nil
	}
	was, err1 := before.ServerWeights.Shares(n)
	is, err2 := now.ServerWeights.Shares(n)
	if err1 != nil || err2 != nil {
		return nil
	}
	return slices.DeleteFunc(all, func(i int) bool { return is[i] < was[i]*(1-shrink) })
}

// shareShrinkTolerance is how much smaller a server's share may become
// and its response times still be compared across the change of weights.
const shareShrinkTolerance = 0.1

// bestMeasured is the index in a.measured of the verification's best
// configuration so far: the one in force before it (0) unless another
// beat it beyond the noise.
func (a *AutoByte) bestMeasured() int {
	best := 0
	for i, m := range a.measured {
		if a.cost(m) < a.cost(a.measured[best]) {
			best = i
		}
	}
	if best != 0 && a.cost(a.measured[best]) > a.cost(a.measured[0])*math.Exp(-a.noiseGap(a.measureCount())) {
		best = 0
	}
	return best
}

// settled is the configuration a trial or verification in progress is
// measured against: the one in force before a trial, the best measured so
// far in a verification (what it would keep if it ended now).
func (a *AutoByte) settled() sched.Config {
	switch {
	case a.verifying && len(a.measured) > 0:
		return a.measured[a.bestMeasured()].cfg
	case a.trying:
		return a.prev
	}
	return a.current
}

// preempt drops the trial or verification in progress (it was measured
// under other conditions, and what it tried was never judged) and puts c,
// the configuration it was measured against with new server weights, on
// trial instead.
func (a *AutoByte) preempt(it int, c sched.Config, gain float64, rates []float64, raised bool, st Stats) Proposal {
	before := a.settled()
	if a.rebalancing {
		a.basis, a.rebalancing = a.prevBasis, false // the weights on trial are dropped
	}
	a.trying, a.verifying, a.queue, a.measured = false, false, a.queue[:0], a.measured[:0]
	p := a.rebalance(it, c, gain, rates, raised, st)
	a.prev = before // a revert goes back to what the trial was measured against
	return p
}

// rebalance puts c, the configuration in force with new server weights
// chosen from rates (predicted gain gain), on trial against the one in
// force, measured as st: it must be RebalanceKeep faster to stay, unless
// it gives a recovered server load back (raised), which stays unless
// slower beyond the noise: the server's response time showed its slack,
// and each step gives it only a little more (a step reverted as not
// faster enough left a recovered server at a fraction of its load for
// the rest of the run; ResNet-50, 32 workers, a server back from 1/7).
// A step too far makes that server set the pace, which measures its rate.
func (a *AutoByte) rebalance(it int, c sched.Config, gain float64, rates []float64, raised bool, st Stats) Proposal {
	a.events = append(a.events, AutoByteEvent{Iteration: it, Kind: "rebalance", Config: c, PredictedGain: gain})
	a.trying, a.rebalancing, a.prev, a.prevStats, a.prevS = true, true, a.current, st, st.IterationTimeS
	a.trialTolerance, a.givingBack = -a.o.RebalanceKeep, raised
	a.prevBasis, a.basis = a.basis, rates
	return a.propose(it, c)
}

// rebalanced is the configuration in force with server weights that
// follow the servers' measured rates, if that is worth a trial (see
// AutoByteOptions.FixedWeights), and its predicted gain in the slowest
// server's time.
//
// Server i needs about share_i / rate_i for its bytes; shares proportional
// to the rates even those times out. A server's measured goodput is its
// rate only while it sets the pace (its time is within paceTolerance, 10%, of the
// slowest server's): one with slack to spare is held back by the others
// (its shards wait for the workers' pushes, which wait for the slowest
// server), so its goodput says only that it is at least that fast; where
// response times are measured, one whose pushes are answered in less than
// responsePace of the longest response has slack too. The tuner remembers
// each server's rate from the last time it set the pace under the current
// conditions, and takes a server it never saw at the pace to be as fast as
// the fastest seen: if it is not, it sets the pace after the trial and is
// measured then. One that now runs faster than it did at the pace (by
// recoverTolerance, or by anything if it has slack by its response time)
// recovered: it is presumed recoverTolerance faster still (raised), so that
// each rebalance gives it more. It also returns the rates the weights were
// chosen from.
func (a *AutoByte) rebalanced(st Stats, base sched.Config) (c sched.Config, gain float64, rates []float64, raised, ok bool) {
	n := st.Servers
	if a.o.FixedWeights || a.rebalanceReverts >= maxRebalanceReverts || n < 2 || n > sched.MaxWeightedServers {
		return sched.Config{}, 0, nil, false, false
	}
	shares, g, raised, ok := a.learnRates(st)
	if !ok {
		return sched.Config{}, 0, nil, false, false
	}
	var fastest float64
	for i := range g {
		fastest = max(fastest, a.servers[i].rate, g[i])
	}
	rates = make([]float64, n)
	var total, worst float64
	for i := range rates {
		rates[i] = a.servers[i].rate
		if rates[i] == 0 {
			rates[i] = fastest
		}
		rates[i] = max(rates[i], g[i])
		// Servers within WeightsEven of the fastest are of its speed (see
		// AutoByteOptions.WeightsEven): weighing them apart would follow
		// the slack of whichever is relieved, and the load would swing
		// between them.
		if rates[i]*(1+a.o.WeightsEven) >= fastest {
			rates[i] = fastest
		}
		total += rates[i]
		worst = max(worst, shares[i]/rates[i])
	}
	gain = 1 - (1/total)/worst
	w, err := sched.Weigh(rates)
	if err != nil {
		return sched.Config{}, 0, nil, false, false
	}
	// Moving load off a server pays only as far as communication is
	// exposed: judge that by the gain in the iteration time (exposed).
	least, judged := a.o.RebalanceGain, gain*exposed(st)
	if raised {
		// Giving a relieved server that recovered its load back needs only
		// the margin of any other trial: it shows little gain while its
		// share is small.
		least, judged = a.o.Margin, gain
	}
	if slices.Max(rates) <= slices.Min(rates)*(1+a.o.WeightsEven) {
		// Even weights: servers of one speed.
		w, least, judged = sched.ServerWeights{}, a.o.Margin, gain
	}
	if judged < least {
		return sched.Config{}, 0, nil, false, false
	}
	c = base
	c.ServerWeights = w
	if w == base.ServerWeights || c == a.current || a.nearTabu(c, n) {
		return sched.Config{}, 0, nil, false, false
	}
	return c, gain, rates, raised, true
}

// nearWeights is how close (relative, per server) the shares of two
// weightings must be for a trial of one to tell the other's result.
const nearWeights = 0.1

// nearTabu says whether c was reverted under the current conditions, or
// differs from a reverted configuration only by server shares within
// nearWeights of its shares. The rates a rebalance is computed from move a
// little with every window, so after weights were measured slower and
// reverted the next window proposes nearly the same again (seen in
// autobyte demo: 1000:209 reverted, then 1000:213 tried and reverted, each
// trial 13% slower for five iterations).
func (a *AutoByte) nearTabu(c sched.Config, n int) bool {
	if a.tabu[c] {
		return true
	}
	shares, err := c.ServerWeights.Shares(n)
	if err != nil {
		return false
	}
	for k := range a.tabu {
		other := k
		other.ServerWeights = c.ServerWeights
		if other != c {
			continue // another partition, credit, compression or fusion
		}
		ks, err := k.ServerWeights.Shares(n)
		if err != nil {
			continue
		}
		near := true
		for i := range shares {
			if math.Abs(math.Log(shares[i]/ks[i])) > math.Log1p(nearWeights) {
				near = false
				break
			}
		}
		if near {
			return true
		}
	}
	return false
}

// exposed is the fraction of st's iteration time that is not compute:
// the part that faster servers can shorten. A rebalance that cuts the
// slowest server's time by g is predicted to cut the iteration's by
// g × exposed(st): the communication left exposed shrinks with the servers'
// time, the compute does not. In a nearly compute-bound job servers of one
// speed measure up to 60% apart (ResNet-50, 8 workers, 8 servers, 12% above
// its compute: which pieces each holds, when each worker's backward reaches
// them), and moving load off the one that looks slowest gains nothing.
// Without a measured compute time (0) the whole iteration counts.
func exposed(st Stats) float64 {
	c := st.ForwardS + st.BackwardS
	if !(c > 0) || !(st.IterationTimeS > 0) {
		return 1
	}
	return max(0, 1-c/st.IterationTimeS)
}

// paceTolerance is how close to the slowest server's time (share over
// goodput) a server's must be for it to count as setting the pace.
const paceTolerance = 0.1

// responsePace is the least fraction of the longest response time (push
// to answer) among the servers that a server's must reach for it to count
// as setting the pace.
const responsePace = 0.5

// recoverTolerance is how much faster than remembered a server off the
// pace must run to count as recovered. A server with slack shows more
// goodput than at the pace with no change to its link (testbed: 15% more,
// its shards meeting less of the other workers' traffic), while one whose
// link recovered shows 4x on the testbed and only 1.37x in the simulator,
// where its shards wait behind the other servers' at the worker's one
// egress queue (ResNet-50, 3 workers, 3 servers, one link back from 1/4).
const recoverTolerance = 0.25

// maxRebalanceReverts is how many reverted rebalances in a row stop the
// tuner from trying more until conditions change.
const maxRebalanceReverts = 3

// learnRates records the rate of every server that set the pace in st
// (measured under st.Config's weights), forgets any that now runs faster
// than remembered, and returns st's shares and goodputs; ok is false if
// some server was not measured.
func (a *AutoByte) learnRates(st Stats) (shares, g []float64, raised, ok bool) {
	n := st.Servers
	if n < 2 || len(st.ServerGoodputBps) != n {
		return nil, nil, false, false
	}
	shares, err := st.Config.ServerWeights.Shares(n)
	if err != nil {
		return nil, nil, false, false
	}
	g = st.ServerGoodputBps
	var slowest float64 // the largest share per goodput: the pace
	for i := range g {
		if !(g[i] > 0) || math.IsInf(g[i], 0) {
			return nil, nil, false, false // a server not measured: nothing to go by
		}
		slowest = max(slowest, shares[i]/g[i])
	}
	// The response times, where measured, single out the server that
	// sets the pace: it holds every worker back, so the others' goodput
	// falls near its own, while only its pushes wait long for answers.
	resp := st.ServerResponseS
	var longest float64
	if len(resp) == n {
		longest = slices.Max(resp)
	}
	if len(a.servers) != n {
		a.servers = make([]serverRecord, n)
	}
	var top float64 // the fastest rate known
	for i := range g {
		top = max(top, a.servers[i].rate, g[i])
	}
	for i := range g {
		idle := longest > 0 && resp[i] < longest*responsePace
		tolerance := recoverTolerance
		if idle {
			// Its pushes are answered at once: the slack is its own, and
			// any goodput above its remembered rate is the link's.
			tolerance = 0
		}
		switch {
		case shares[i]/g[i] >= slowest*(1-paceTolerance) && !idle:
			a.paced(i, g[i]) // it sets the pace: its goodput is its rate
		case a.servers[i].rate > 0 && g[i] > a.recoveryFloor(i)*(1+tolerance) && g[i] > a.servers[i].slack*(1+recoverTolerance):
			// Faster than it was at the pace: its link recovered, by at
			// least that much. It is presumed recoverTolerance faster
			// again (up to the fastest server), so that each rebalance
			// gives it more until it sets the pace or runs at the others'
			// rate; presuming it back at full speed puts the whole slow
			// phase back on it when a server given less than its rate
			// shows the slack as a recovery.
			// (top >= g[i] > the floor: the rate was raised)
			r := &a.servers[i]
			if r.raisedFrom == 0 {
				r.raisedOver = a.recoveryFloor(i)
			}
			r.raisedFrom, r.rate = g[i], min(g[i]*(1+recoverTolerance), top)
			raised = true
		}
	}
	return shares, g, raised, true
}

// serverRecord is what the tuner remembers of a parameter server.
type serverRecord struct {
	// rate is its rate as measured while it set the pace (rebalanced); 0:
	// not seen at the pace under these conditions.
	rate float64
	// raisedFrom is the goodput that last raised rate as a recovery and
	// raisedOver the rate it recovered from (0: not raised since it last
	// set the pace); slack is the goodput of such a raise that the server
	// did not bear out when it next set the pace (0: none), which later
	// raises must beat by recoverTolerance.
	raisedFrom, raisedOver, slack float64
}

// paced records rate, server i's goodput while it set the pace. If a
// recovery raised its rate since it last set the pace and it now runs no
// faster than before it (by recoverTolerance), the goodput that raised it
// was the slack of a server relieved of load, not its link (on TCP hosts
// such a server shows 10-45% more goodput than its link gives at the pace,
// and answers at once): later raises must beat that goodput by
// recoverTolerance, or the tuner gives it load back and takes it off
// again every few iterations. A rate that moved by more than
// recoverTolerance either way is a changed link, which clears that.
func (a *AutoByte) paced(i int, rate float64) {
	r := &a.servers[i]
	switch {
	case r.raisedFrom > 0 && rate <= r.raisedOver*(1+recoverTolerance):
		r.slack = max(r.slack, r.raisedFrom)
	case r.raisedFrom > 0 || rate > r.rate*(1+recoverTolerance) || rate*(1+recoverTolerance) < r.rate:
		r.slack = 0
	}
	*r = serverRecord{rate: rate, slack: r.slack}
}

// recoveryFloor is the rate server i must beat by recoverTolerance to
// count as recovered: the lower of its remembered rate and its basis.
func (a *AutoByte) recoveryFloor(i int) float64 {
	r := a.servers[i].rate
	if i < len(a.basis) && a.basis[i] > 0 && a.basis[i] < r {
		r = a.basis[i]
	}
	return r
}

// search scores the grid from st and tries the best candidate if it beats
// the margin.
func (a *AutoByte) search(it int, st Stats) (Proposal, bool) {
	a.learn(st, st, st.IterationTimeS)
	a.fineTune()
	ns := netStats(st)
	a.scores = a.meta.Score(a.scores, ns, a.cands)
	cur := a.meta.PredictLog(ns, a.current)
	best := -1
	for i, c := range a.cands {
		if c = a.follow(c); a.tabu[c] || c == a.current {
			continue
		}
		if best < 0 || a.scores[i] < a.scores[best] {
			best = i
		}
	}
	a.nextSearch = it + a.o.Every
	gain := 0.0
	if best >= 0 {
		gain = 1 - math.Exp(a.scores[best]-cur)
	}
	// A gain the noise would hide cannot be confirmed by a trial.
	if best < 0 || gain <= max(a.o.Margin, 1-math.Exp(-a.noiseGap(a.measureCount()))) {
		if best >= 0 {
			a.events = append(a.events, AutoByteEvent{Iteration: it, Kind: "search", Config: a.follow(a.cands[best]), PredictedGain: gain})
		}
		if p, ok := a.compressionTrial(it, st); ok {
			return p, true
		}
		return a.fusionTrial(it, st)
	}
	c := a.follow(a.cands[best])
	a.events = append(a.events, AutoByteEvent{Iteration: it, Kind: "try", Config: c, PredictedGain: gain})
	a.trying, a.prev, a.prevStats, a.prevS = true, a.current, st, st.IterationTimeS
	a.trialTolerance, a.givingBack = a.o.KeepTolerance, false
	return a.propose(it, c), true
}

// compressionTrial tries switching the compression when the measured
// balance of compute and communication calls for it (see
// AutoByteOptions.Compress).
func (a *AutoByte) compressionTrial(it int, st Stats) (Proposal, bool) {
	c, ok := a.toggled(st)
	if !ok {
		return Proposal{}, false
	}
	a.trialTolerance, a.givingBack = -a.o.CompressionGain, false
	if c.Compression == dtype.F32 {
		a.trialTolerance = a.o.CompressionGain
	}
	a.events = append(a.events, AutoByteEvent{Iteration: it, Kind: "try", Config: c})
	a.trying, a.prev, a.prevStats, a.prevS = true, a.current, st, st.IterationTimeS
	return a.propose(it, c), true
}

// fusionTrial tries the other fusion setting, if the tuner chooses the
// fusion and it was not tried under these conditions (see
// AutoByteOptions.Fuse).
func (a *AutoByte) fusionTrial(it int, st Stats) (Proposal, bool) {
	if a.o.Fuse == 0 {
		return Proposal{}, false
	}
	c := a.current
	if c.FusionBytes == 0 {
		c.FusionBytes = a.o.Fuse
	} else {
		c.FusionBytes = 0
	}
	if a.tabu[c] || a.fusionTabu[c] {
		return Proposal{}, false
	}
	a.events = append(a.events, AutoByteEvent{Iteration: it, Kind: "try", Config: c})
	a.trying, a.prev, a.prevStats, a.prevS = true, a.current, st, st.IterationTimeS
	a.trialTolerance, a.givingBack = -a.o.FusionGain, false
	return a.propose(it, c), true
}

// toggled is the configuration in force with the compression switched,
// if st calls for it: on while the job is communication-bound, off while
// it is not; and if it was not tried and reverted under these conditions.
func (a *AutoByte) toggled(st Stats) (sched.Config, bool) {
	if a.o.Compress == dtype.F32 {
		return sched.Config{}, false
	}
	compute := st.ForwardS + st.BackwardS
	commBound := compute > 0 && st.IterationTimeS > (1+a.o.CommBound)*compute
	c := a.current
	switch {
	case c.Compression == dtype.F32 && commBound:
		c.Compression = a.o.Compress
	case c.Compression != dtype.F32 && !commBound:
		c.Compression = dtype.F32
	default:
		return sched.Config{}, false
	}
	return c, !a.tabu[c]
}

// cost is the time by which measured configurations compete: the
// measured time, CompressionGain more for a compressed one while the
// tuner chooses the compression (precision breaks ties).
func (a *AutoByte) cost(m measuredConfig) float64 {
	if a.o.Compress != dtype.F32 && m.cfg.Compression != dtype.F32 {
		return m.st.IterationTimeS * (1 + a.o.CompressionGain)
	}
	return m.st.IterationTimeS
}

// follow is grid candidate c with the compression, server weights and
// fusion in force: partition and credit are searched under them, and only
// compressionTrial, rebalanced and fusionTrial change them.
func (a *AutoByte) follow(c sched.Config) sched.Config {
	c.Compression = a.current.Compression
	c.ServerWeights = a.current.ServerWeights
	c.FusionBytes = a.current.FusionBytes
	return c
}

// netStats is st as the meta-network reads it: the model's bytes as they
// travel (halved under a 16-bit compression), since partition, credit and
// goodput are all in wire bytes.
func netStats(st Stats) Stats {
	if d := st.Config.Compression; d != dtype.F32 {
		st.ModelBytes = st.ModelBytes / 4 * int64(d.Size())
	}
	return st
}

// verify scores the grid from st (measured under the configuration in
// force) and starts measuring the TopK best-predicted candidates in turn.
func (a *AutoByte) verify(it int, st Stats) (Proposal, bool) {
	a.verifyDue = false
	a.learn(st, st, st.IterationTimeS)
	a.fineTune()
	ns := netStats(st)
	a.scores = a.meta.Score(a.scores, ns, a.cands)
	cur := a.meta.PredictLog(ns, a.current)
	idx := make([]int, 0, len(a.cands))
	for i, c := range a.cands {
		if c = a.follow(c); !a.tabu[c] && c != a.current {
			idx = append(idx, i)
		}
	}
	// Best predicted first; equal scores keep the grid's order.
	slices.SortStableFunc(idx, func(i, j int) int { return cmp.Compare(a.scores[i], a.scores[j]) })
	idx = idx[:min(len(idx), a.o.TopK)]
	a.nextSearch = it + a.o.Every
	a.queue = a.queue[:0]
	for _, i := range idx {
		a.queue = append(a.queue, a.follow(a.cands[i]))
	}
	// The compression, if st calls for switching it, is verified as well,
	// under the partition and credit in force.
	if c, ok := a.toggled(st); ok {
		a.queue = append(a.queue, c)
	}
	if len(a.queue) == 0 {
		return Proposal{}, false
	}
	a.measured = append(a.measured[:0], measuredConfig{a.current, st})
	a.verifying = true
	gain := 0.0
	if len(idx) > 0 {
		gain = 1 - math.Exp(a.scores[idx[0]]-cur)
	}
	return a.verifyNext(it, gain), true
}

// verifyNext proposes the next queued candidate with its predicted gain.
func (a *AutoByte) verifyNext(it int, gain float64) Proposal {
	c := a.queue[0]
	a.queue = a.queue[1:]
	a.events = append(a.events, AutoByteEvent{Iteration: it, Kind: "verify", Config: c, PredictedGain: gain})
	return a.propose(it, c)
}

// verifyStep records the candidate in force, now measured as st, and
// proposes the next one, or ends the verification on the best measured.
func (a *AutoByte) verifyStep(it int, st Stats) (Proposal, bool) {
	base := a.measured[0]
	// Every pair of measured configurations is an example both ways.
	a.learn(st, st, st.IterationTimeS)
	for _, m := range a.measured {
		a.learn(m.st, st, st.IterationTimeS)
		a.learn(st, m.st, m.st.IterationTimeS)
	}
	a.measured = append(a.measured, measuredConfig{a.current, st})
	a.events = append(a.events, AutoByteEvent{Iteration: it, Kind: "measured", Config: a.current,
		MeasuredS: st.IterationTimeS, PreviousS: base.st.IterationTimeS})
	a.fineTune()
	if len(a.queue) > 0 {
		// Predicted gain from the statistics of the configuration in
		// force before the verification, for the log.
		gain := 0.0 // the network does not predict a compression's
		if a.queue[0].Compression == base.cfg.Compression {
			gain = 1 - math.Exp(a.meta.PredictLog(netStats(base.st), a.queue[0])-a.meta.PredictLog(netStats(base.st), base.cfg))
		}
		return a.verifyNext(it, gain), true
	}
	a.verifying = false
	best := a.bestMeasured()
	for i, m := range a.measured {
		if i != best {
			a.tabu[m.cfg] = true
		}
	}
	b := a.measured[best]
	ev := AutoByteEvent{Iteration: it, Kind: "keep", Config: b.cfg, MeasuredS: b.st.IterationTimeS, PreviousS: base.st.IterationTimeS}
	if best == 0 {
		ev.Kind = "revert"
	}
	a.events = append(a.events, ev)
	a.nextSearch = it + a.o.Every
	var p Proposal
	proposed, from := b.cfg != a.current, it+1
	if proposed {
		p, from = a.propose(it, b.cfg), a.measureFrom
	}
	if best != 0 {
		a.recheck = &recheck{kept: b.cfg, replaced: base.cfg, replacedS: base.st.IterationTimeS, from: from}
	}
	return p, proposed
}

// propose puts c in force from the earliest allowed iteration and starts
// measuring it after the warm-up.
func (a *AutoByte) propose(it int, c sched.Config) Proposal {
	from := it + Lead
	a.current, a.pending = c, from
	a.measureFrom = from + a.o.Warmup
	if len(a.window) > 0 {
		a.lastWindow = append(a.lastWindow[:0], a.window...)
	}
	a.window = a.window[:0]
	return Proposal{Config: c, FromIteration: from}
}

// learn records that, from statistics state, the configuration of
// measured (measured.Config) ran at t seconds per iteration.
func (a *AutoByte) learn(state, measured Stats, t float64) {
	kind := a.meta.Header.Target
	if a.o.FineTuneSteps < 0 || !(t > 0) || !MetaTargetOK(kind, state) {
		return
	}
	if state.Config.Compression != measured.Config.Compression || state.Config.ServerWeights != measured.Config.ServerWeights {
		return // the network knows partition and credit only
	}
	state = netStats(state)
	a.buf = append(a.buf, MetaExample{X: MetaFeatures(nil, state, measured.Config), Y: MetaTarget(kind, state, t)})
	if len(a.buf) > a.o.Buffer {
		a.buf = a.buf[len(a.buf)-a.o.Buffer:]
	}
}

// fineTune takes the configured gradient steps on a minibatch of the
// buffer (all of it when small).
func (a *AutoByte) fineTune() {
	if a.o.FineTuneSteps < 0 || len(a.buf) == 0 {
		return
	}
	batch := a.buf
	if len(batch) > a.o.FineTuneBatch {
		batch = make([]MetaExample, a.o.FineTuneBatch)
		// The newest example always, the rest drawn from the buffer.
		batch[0] = a.buf[len(a.buf)-1]
		for i := 1; i < len(batch); i++ {
			batch[i] = a.buf[a.rng.IntN(len(a.buf))]
		}
	}
	a.meta.FineTune(batch, a.o.FineTuneSteps, a.o.FineTuneRate)
}
