package tuneeval

import (
	"fmt"
	"io"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/sim"
	"github.com/autobyte/autobyte/tune"
)

// Options configure Run.
type Options struct {
	// Out is the directory the table, JSON and plots are written to.
	Out string
	// Quick runs QuickSuite instead of DefaultSuite, Long LongSuite and
	// Links LinkSuite (at most one of them).
	Quick, Long, Links bool
	// Random, with Links, runs RandomLinkSuite(Random, Seed) instead of
	// LinkSuite: scenarios drawn from the link suite's space that no one
	// has looked at, the held-out check of the tuner's rule.
	Random int
	Seed   uint64
	// Parallel is how many simulations run at once (>= 1).
	Parallel int
	// BOTrial is BO's TrialIterations (0: 20, a fifth of ByteScheduler's
	// 100, or 6 with Quick, or the released 100 with Long). BO's
	// ApplyDelay scales with it: max(Lead, BOTrial/10), so 100 gives the
	// released 100 + 10 per trial.
	BOTrial int
	// Only keeps the named scenarios (comma-separated; "" for all).
	Only string
	// Baselines, if set, is the results.json of an earlier evaluation whose
	// best static and oracle runs are reused instead of simulating every
	// static candidate again (see baselines.go); only the tuners run.
	Baselines string
	// Log receives progress (nil: none).
	Log io.Writer
}

// Validate reports the first bad option, naming its flag and value.
func (o Options) Validate() error {
	switch {
	case o.Out == "":
		return fmt.Errorf("--out must name a directory, got %q", o.Out)
	case o.Parallel < 1:
		return fmt.Errorf("--parallel must be >= 1, got %d", o.Parallel)
	case btoi(o.Quick)+btoi(o.Long)+btoi(o.Links) > 1:
		return fmt.Errorf("--quick, --long and --links choose different suites; give at most one")
	case o.Random < 0:
		return fmt.Errorf("--random must be >= 0, got %d", o.Random)
	case o.Random > 0 && !o.Links:
		return fmt.Errorf("--random %d draws link scenarios; give it with --links", o.Random)
	case o.BOTrial != 0 && o.BOTrial < 6:
		return fmt.Errorf("--bo-trial must be >= 6 iterations (BO drops 5 per trial), got %d", o.BOTrial)
	}
	_, err := Select(o.suite(), o.Only)
	return err
}

func (o Options) suite() []Scenario {
	switch {
	case o.Quick:
		return QuickSuite()
	case o.Long:
		return LongSuite()
	case o.Links && o.Random > 0:
		return RandomLinkSuite(o.Random, o.Seed)
	case o.Links:
		return LinkSuite()
	}
	return DefaultSuite()
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (o Options) boTrial() (trial, delay int) {
	trial = o.BOTrial
	if trial == 0 {
		switch {
		case o.Quick:
			trial = 6
		case o.Long:
			trial = 100
		default:
			trial = 20
		}
	}
	return trial, max(tune.Lead, trial/10)
}

// The tuners of every scenario, in table order.
const (
	Fifo          = "fifo"
	ByteScheduler = "bytescheduler"
	BO            = "bo"
	AutoByte      = "autobyte"
	// AutoByteCompress is autobyte allowed to turn bfloat16 compression
	// on (--compression auto); the static baselines stay float32.
	AutoByteCompress = "autobyte+compression"
	BestStatic       = "best-static"
	OracleName       = "oracle"
)

// Tuners lists the tuners in table order.
var Tuners = []string{Fifo, ByteScheduler, BO, AutoByte, AutoByteCompress, BestStatic, OracleName}

// TunerRun is one tuner's run of a scenario.
type TunerRun struct {
	Tuner              string  `json:"tuner"`
	MeanIterationTimeS float64 `json:"mean_iteration_time_s"`
	// PhaseSteadyS[i] is the steady-state mean of phase i: the mean of its
	// last quarter (at least one iteration).
	PhaseSteadyS []float64 `json:"phase_steady_s"`
	// SettleIterations[i] counts the iterations from phase i's start to
	// the first one from which every iteration time of the phase stays
	// within 5% of PhaseSteadyS[i].
	SettleIterations []int              `json:"settle_iterations"`
	IterationTimesS  []float64          `json:"iteration_times_s"`
	Configs          []sim.ConfigChange `json:"configs"`
}

// ScenarioResult is every tuner's run of one scenario.
type ScenarioResult struct {
	Scenario Scenario   `json:"scenario"`
	Phases   []Phase    `json:"phases"`
	Runs     []TunerRun `json:"runs"` // in Tuners order
	// StaticCandidates is how many configurations the best static one and
	// the oracle's are chosen from (Scenario.StaticCandidates: the grid
	// under each candidate server weights).
	StaticCandidates int `json:"static_candidates"`
	// BestStaticConfig is the best of the candidates over the whole run,
	// and OracleConfigs the best per phase.
	BestStaticConfig sched.Config   `json:"best_static_config"`
	OracleConfigs    []sched.Config `json:"oracle_configs"`
	// AutoVsBestStaticPct is autobyte's mean over the run relative to the
	// best static configuration's (negative: autobyte is faster).
	AutoVsBestStaticPct float64 `json:"autobyte_vs_best_static_pct"`
	// OracleVsBestStaticPct is the oracle's mean over the run relative to
	// the best static configuration's: how much any tuner could gain by
	// following the changes (negative: the oracle is faster).
	OracleVsBestStaticPct float64 `json:"oracle_vs_best_static_pct"`
	// AutoVsOraclePct is the worst phase's steady-state autobyte time
	// relative to the oracle's.
	AutoVsOraclePct float64 `json:"autobyte_vs_oracle_pct"`
	// AutoSettleMax is autobyte's largest settle count after a change (-1
	// for a steady scenario).
	AutoSettleMax int `json:"autobyte_settle_max"`
}

// Run returns the tuner named name's run.
func (r *ScenarioResult) Run(name string) *TunerRun {
	for i := range r.Runs {
		if r.Runs[i].Tuner == name {
			return &r.Runs[i]
		}
	}
	return nil
}

// Report is a whole evaluation.
type Report struct {
	Suite          string           `json:"suite"`
	BOTrial        int              `json:"bo_trial_iterations"`
	BOApplyDelay   int              `json:"bo_apply_delay"`
	Candidates     int              `json:"static_candidates"`
	Scenarios      []ScenarioResult `json:"scenarios"`
	ElapsedS       float64          `json:"elapsed_s"`
	Parallel       int              `json:"parallel"`
	StaticRunsEach int              `json:"-"`
	// Baselines is Options.Baselines: where the best static and oracle
	// runs came from ("": simulated by this evaluation).
	Baselines string `json:"baselines,omitempty"`
}

// Candidates is the grid the best static configuration and the oracle are
// chosen from: the autobyte tuner's own candidates.
func Candidates() []sched.Config {
	return tune.Cross(sched.Config{Order: sched.OrderPriority}, tune.DefaultMetaPartitions, tune.DefaultMetaCredits)
}

// run is one simulation to do.
type job struct {
	scenario int
	tuner    string // a name of Tuners, or "" for static candidate cand
	cand     int
}

// Evaluate runs every tuner on every scenario of the suite and returns the
// report; equal options give equal reports (but for ElapsedS).
func Evaluate(o Options) (*Report, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	start := time.Now()
	suite, _ := Select(o.suite(), o.Only)
	par := o.Parallel
	trial, delay := o.boTrial()
	name := "default"
	switch {
	case o.Quick:
		name = "quick"
	case o.Long:
		name = "long"
	case o.Links && o.Random > 0:
		name = fmt.Sprintf("links-random-%d-seed-%d", o.Random, o.Seed)
	case o.Links:
		name = "links"
	}
	rep := &Report{Suite: name, BOTrial: trial, BOApplyDelay: delay, Candidates: len(Candidates()), Parallel: par, Baselines: o.Baselines}
	opts := make([]sim.Options, len(suite))
	cands := make([][]sched.Config, len(suite))
	for i, s := range suite {
		cands[i] = s.StaticCandidates()
		var err error
		if opts[i], err = s.Options(); err != nil {
			return nil, err
		}
	}
	logf := func(format string, a ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, format, a...)
		}
	}
	reused := make([]*ScenarioResult, len(suite))
	if o.Baselines != "" {
		var err error
		if reused, err = loadBaselines(o.Baselines, suite, cands); err != nil {
			return nil, err
		}
		logf("tune eval: best static and oracle runs from %s; only the tuners run\n", o.Baselines)
	}

	// Stage 1: every tuner but the oracle, and every static candidate.
	var jobs []job
	for i := range suite {
		for _, t := range []string{Fifo, ByteScheduler, BO, AutoByte, AutoByteCompress} {
			jobs = append(jobs, job{scenario: i, tuner: t})
		}
		if reused[i] != nil {
			continue
		}
		for c := range cands[i] {
			jobs = append(jobs, job{scenario: i, cand: c})
		}
	}
	// Parameter servers cost most: start them first.
	slices.SortStableFunc(jobs, func(a, b job) int {
		return cost(suite[b.scenario]) - cost(suite[a.scenario])
	})
	oracleRuns := 0
	for i := range suite {
		if reused[i] == nil {
			oracleRuns++
		}
	}
	logf("tune eval: %d scenarios, %d simulations (then %d oracle runs) on %d goroutines (bo trials of %d+%d iterations)\n",
		len(suite), len(jobs), oracleRuns, par, trial, delay)
	tuned := make([]map[string]*sim.Result, len(suite))
	statics := make([][]*sim.Result, len(suite))
	for i := range suite {
		tuned[i] = map[string]*sim.Result{}
		statics[i] = make([]*sim.Result, len(cands[i]))
	}
	var mu sync.Mutex
	done := 0
	err := sim.Parallel(len(jobs), par, func(k int) error {
		j := jobs[k]
		so := opts[j.scenario]
		var err error
		var r *sim.Result
		if j.tuner == "" {
			so.Sched = cands[j.scenario][j.cand]
			r, err = sim.Run(so)
		} else {
			r, err = runTuner(j.tuner, so, trial, delay)
		}
		if err != nil {
			return fmt.Errorf("scenario %s, %s: %w", suite[j.scenario].Name, jobName(j, cands[j.scenario]), err)
		}
		r.Stats = nil
		mu.Lock()
		defer mu.Unlock()
		if j.tuner == "" {
			statics[j.scenario][j.cand] = r
		} else {
			tuned[j.scenario][j.tuner] = r
		}
		done++
		if done%50 == 0 || done == len(jobs) {
			logf("tune eval: %d/%d simulations (%.0f s)\n", done, len(jobs), time.Since(start).Seconds())
		}
		return nil
	})
	if err != nil {
		return nil, err
	}

	for i, s := range suite {
		if reused[i] != nil {
			if err := checkBaselines(o.Baselines, s, reused[i], tuned[i]); err != nil {
				return nil, err
			}
		}
	}

	// Stage 2: the best static configuration and the per-phase oracle.
	oracles := make([][]sched.Config, len(suite))
	best := make([]int, len(suite))
	for i, s := range suite {
		if reused[i] != nil {
			continue
		}
		best[i] = BestIndex(statics[i])
		oracles[i] = OracleConfigs(statics[i], cands[i], s.Phases())
	}
	oracleRun := make([]*sim.Result, len(suite))
	err = sim.Parallel(len(suite), par, func(i int) error {
		if reused[i] != nil {
			return nil
		}
		r, err := RunOracle(opts[i], suite[i].Phases(), oracles[i])
		if err != nil {
			return fmt.Errorf("scenario %s, oracle: %w", suite[i].Name, err)
		}
		oracleRun[i] = r
		return nil
	})
	if err != nil {
		return nil, err
	}

	for i, s := range suite {
		phases := s.Phases()
		sr := ScenarioResult{Scenario: s, Phases: phases, StaticCandidates: len(cands[i])}
		if old := reused[i]; old != nil {
			sr.BestStaticConfig, sr.OracleConfigs = old.BestStaticConfig, old.OracleConfigs
		} else {
			sr.BestStaticConfig, sr.OracleConfigs = cands[i][best[i]], oracles[i]
		}
		for _, t := range Tuners {
			switch {
			case reused[i] != nil && (t == BestStatic || t == OracleName):
				sr.Runs = append(sr.Runs, *reused[i].Run(t))
			case t == BestStatic:
				sr.Runs = append(sr.Runs, measure(t, statics[i][best[i]], phases))
			case t == OracleName:
				sr.Runs = append(sr.Runs, measure(t, oracleRun[i], phases))
			default:
				sr.Runs = append(sr.Runs, measure(t, tuned[i][t], phases))
			}
		}
		ab, bs, or := sr.Run(AutoByte), sr.Run(BestStatic), sr.Run(OracleName)
		sr.AutoVsBestStaticPct = pct(ab.MeanIterationTimeS, bs.MeanIterationTimeS)
		sr.OracleVsBestStaticPct = pct(or.MeanIterationTimeS, bs.MeanIterationTimeS)
		sr.AutoVsOraclePct = math.Inf(-1)
		for p := range phases {
			sr.AutoVsOraclePct = max(sr.AutoVsOraclePct, pct(ab.PhaseSteadyS[p], or.PhaseSteadyS[p]))
		}
		sr.AutoSettleMax = -1
		for p := 1; p < len(phases); p++ {
			sr.AutoSettleMax = max(sr.AutoSettleMax, ab.SettleIterations[p])
		}
		rep.Scenarios = append(rep.Scenarios, sr)
	}
	rep.ElapsedS = time.Since(start).Seconds()
	return rep, nil
}

func jobName(j job, cands []sched.Config) string {
	if j.tuner != "" {
		return j.tuner
	}
	return fmt.Sprintf("static candidate %d (%+v)", j.cand, cands[j.cand])
}

// cost ranks scenarios by expected simulation cost.
func cost(s Scenario) int {
	c := s.Workers * s.Iterations
	if s.Arch == "ps" {
		c *= 10
	}
	return c
}

// runTuner simulates so under the named tuner.
func runTuner(name string, so sim.Options, boTrial, boDelay int) (*sim.Result, error) {
	switch name {
	case Fifo:
		so.Sched = sched.Config{} // fifo: production order and a global barrier
	case ByteScheduler:
	case BO:
		bo, err := tune.NewBO(tune.BOOptions{Arch: so.Arch.String(), Base: so.Sched, TrialIterations: boTrial, ApplyDelay: boDelay, Seed: 1})
		if err != nil {
			return nil, err
		}
		so.Tuner = bo
	case AutoByte, AutoByteCompress:
		o := tune.AutoByteOptions{Base: sched.Config{Order: sched.OrderPriority}, Seed: 1}
		if name == AutoByteCompress {
			o.Compress = dtype.BF16
		}
		ab, err := tune.NewAutoByte(o)
		if err != nil {
			return nil, err
		}
		so.Tuner = ab
	default:
		return nil, fmt.Errorf("unknown tuner %q", name)
	}
	return sim.Run(so)
}

// measure computes a run's metrics.
func measure(name string, r *sim.Result, phases []Phase) TunerRun {
	tr := TunerRun{Tuner: name, MeanIterationTimeS: r.MeanIterationTimeS, IterationTimesS: r.IterationTimesS, Configs: r.Configs}
	for _, ph := range phases {
		st := SteadyMean(r.IterationTimesS, ph)
		tr.PhaseSteadyS = append(tr.PhaseSteadyS, st)
		tr.SettleIterations = append(tr.SettleIterations, Settle(r.IterationTimesS, ph, st))
	}
	return tr
}

// SteadyMean is the mean of the last quarter of the phase's iteration
// times (at least one).
func SteadyMean(times []float64, ph Phase) float64 {
	n := max(1, (ph.To-ph.From)/4)
	return mean(times[ph.To-n : ph.To])
}

// Settle counts the iterations from ph.From to the first iteration from
// which every time up to ph.To stays within 5% of steady.
func Settle(times []float64, ph Phase, steady float64) int {
	for k := ph.To - 1; k >= ph.From; k-- {
		if math.Abs(times[k]/steady-1) > 0.05 {
			return k + 1 - ph.From
		}
	}
	return 0
}

func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func pct(a, b float64) float64 { return 100 * (a/b - 1) }

// BestIndex is the index of the static run with the lowest mean iteration
// time over the whole run (the earlier one on ties): the best static
// configuration in hindsight.
func BestIndex(statics []*sim.Result) int {
	best := 0
	for c, r := range statics {
		if r.MeanIterationTimeS < statics[best].MeanIterationTimeS {
			best = c
		}
	}
	return best
}

// RunOracle simulates o (without its tuner) under the per-phase oracle:
// configs[0] from the start, then each phase's configuration (see
// NewOracle).
func RunOracle(o sim.Options, phases []Phase, configs []sched.Config) (*sim.Result, error) {
	o.Sched = configs[0]
	o.Tuner = NewOracle(phases, configs)
	return sim.Run(o)
}

// OracleConfigs picks, for each phase, the candidate whose static run had
// the lowest mean iteration time over the phase, not counting its first Lead
// iterations (the ones the oracle cannot influence after a change); ties go
// to the earlier candidate. statics[c] is candidate c's run.
func OracleConfigs(statics []*sim.Result, cands []sched.Config, phases []Phase) []sched.Config {
	var out []sched.Config
	for _, ph := range phases {
		b := 0
		skip := min(tune.Lead, ph.To-ph.From-1)
		for c, r := range statics {
			if mean(r.IterationTimesS[ph.From+skip:ph.To]) < mean(statics[b].IterationTimesS[ph.From+skip:ph.To]) {
				b = c
			}
		}
		out = append(out, cands[b])
	}
	return out
}

// Oracle is the per-phase oracle: it knows each phase's best static
// configuration in advance and proposes it at the phase boundary, Lead
// iterations ahead. The caller starts the job with the first phase's
// configuration.
type Oracle struct {
	switches []tune.Proposal
	next     int
}

// NewOracle returns an oracle switching to configs[i] at phases[i].From;
// a phase whose configuration is already in force proposes nothing.
func NewOracle(phases []Phase, configs []sched.Config) *Oracle {
	o := &Oracle{}
	for i := 1; i < len(phases) && i < len(configs); i++ {
		if configs[i] != configs[i-1] && phases[i].From >= tune.Lead {
			o.switches = append(o.switches, tune.Proposal{Config: configs[i], FromIteration: phases[i].From})
		}
	}
	return o
}

// Name returns "oracle".
func (*Oracle) Name() string { return OracleName }

// Observe proposes the next phase's configuration Lead iterations before
// the phase starts.
func (o *Oracle) Observe(s tune.Stats) (tune.Proposal, bool) {
	for o.next < len(o.switches) && o.switches[o.next].FromIteration < s.Iteration+tune.Lead {
		o.next++ // too late (cannot happen when every iteration is observed)
	}
	if o.next < len(o.switches) && o.switches[o.next].FromIteration == s.Iteration+tune.Lead {
		o.next++
		return o.switches[o.next-1], true
	}
	return tune.Proposal{}, false
}
