package tuneeval

// The oracle gap: how much the per-phase oracle gains over the best static
// configuration in hindsight, without running any tuner. It answers whether
// a scenario leaves room for a tuner that follows changes, for instance
// under a per-message cost (Scenario.MessageCost), at 43 simulations per
// scenario (the grid and the oracle) instead of tune eval's 47 and BO's
// and autobyte's tuning.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"

	"github.com/autobyte/autobyte/model"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/sim"
)

// GapResult is the best static configuration and the per-phase oracle of
// one scenario, chosen and run exactly as Evaluate does.
type GapResult struct {
	Scenario         Scenario     `json:"scenario"`
	MessageCostS     float64      `json:"message_cost_s"`
	Phases           []Phase      `json:"phases"`
	BestStaticConfig sched.Config `json:"best_static_config"`
	BestStaticMeanS  float64      `json:"best_static_mean_s"`
	// BestStaticPhaseMeanS[i] and OraclePhaseMeanS[i] are the mean
	// iteration times over phase i.
	BestStaticPhaseMeanS []float64      `json:"best_static_phase_mean_s"`
	OracleConfigs        []sched.Config `json:"oracle_configs"`
	OracleMeanS          float64        `json:"oracle_mean_s"`
	OraclePhaseMeanS     []float64      `json:"oracle_phase_mean_s"`
	// OracleVsBestStaticPct is the oracle's mean relative to the best
	// static configuration's (negative: the oracle is faster), as in
	// ScenarioResult.
	OracleVsBestStaticPct float64 `json:"oracle_vs_best_static_pct"`
	// ByteSchedulerMeanS is ByteScheduler's default configuration's mean,
	// for scale.
	ByteSchedulerMeanS float64 `json:"bytescheduler_mean_s"`
}

// Gap simulates every candidate of Candidates() on s for the whole run
// (par at once), picks the best static configuration and the per-phase
// oracle's configurations from those runs and runs the oracle.
func Gap(s Scenario, par int) (*GapResult, error) {
	o, err := s.Options()
	if err != nil {
		return nil, err
	}
	cands := s.StaticCandidates()
	runs := make([]*sim.Result, len(cands)+1) // the candidates, then ByteScheduler's default
	err = sim.Parallel(len(runs), par, func(i int) error {
		so := o
		if i < len(cands) {
			so.Sched = cands[i]
		}
		r, err := sim.Run(so)
		if err != nil {
			return fmt.Errorf("scenario %s, static %s: %w", s.Name, ConfigString(so.Sched), err)
		}
		r.Stats = nil
		runs[i] = r
		return nil
	})
	if err != nil {
		return nil, err
	}
	statics := runs[:len(cands)]
	phases := s.Phases()
	best := BestIndex(statics)
	g := &GapResult{Scenario: s, MessageCostS: o.MessageCostS, Phases: phases, BestStaticConfig: cands[best],
		BestStaticMeanS: statics[best].MeanIterationTimeS, OracleConfigs: OracleConfigs(statics, cands, phases),
		ByteSchedulerMeanS: runs[len(cands)].MeanIterationTimeS}
	or, err := RunOracle(o, phases, g.OracleConfigs)
	if err != nil {
		return nil, fmt.Errorf("scenario %s, oracle: %w", s.Name, err)
	}
	g.OracleMeanS = or.MeanIterationTimeS
	g.OracleVsBestStaticPct = pct(g.OracleMeanS, g.BestStaticMeanS)
	for _, ph := range phases {
		g.BestStaticPhaseMeanS = append(g.BestStaticPhaseMeanS, mean(statics[best].IterationTimesS[ph.From:ph.To]))
		g.OraclePhaseMeanS = append(g.OraclePhaseMeanS, mean(or.IterationTimesS[ph.From:ph.To]))
	}
	return g, nil
}

// GapSuite is the changing scenarios of DefaultSuite and three more with
// a 10x bandwidth swing from a fast network (100 -> 10 -> 100 Gbps, as
// vgg16-ps-8w-bw10x): resnet50 and bert-base on 8 parameter servers, and
// transformer on 16-worker all-reduce. The extra ones are not in
// DefaultSuite; they were chosen before any gap under a message cost was
// computed.
func GapSuite() []Scenario {
	var out []Scenario
	for _, s := range DefaultSuite() {
		if s.Changing() {
			out = append(out, s)
		}
	}
	return append(out, named([]Scenario{
		{Model: "resnet50", Arch: "ps", Workers: 8, Servers: 8, Bandwidth: "100Gbps", Trace: bw10x, Kind: "bw10x", Iterations: iterations},
		{Model: "bert-base", Arch: "ps", Workers: 8, Servers: 8, Bandwidth: "100Gbps", Trace: bw10x, Kind: "bw10x", Iterations: iterations},
		{Model: "transformer", Arch: "allreduce", Workers: 16, Bandwidth: "100Gbps", Trace: bw10x, Kind: "bw10x", Iterations: iterations},
	})...)
}

// RandomGapSuite draws n changing scenarios from seed, to search for room
// for a tuner beyond the hand-picked GapSuite. Each has three phases of
// randomPhase iterations, the middle one under changed conditions:
//
//   - a zoo model (toy3 excepted), parameter servers or ring all-reduce
//     (even odds);
//   - 2, 4, 8 or 16 workers (even odds); for parameter servers N, N/2 or
//     N/4 servers (at least 1);
//   - a link rate of 1-100 Gbps and a compute speed of 1/4-4x the
//     profile's (both log-uniform), in force for the whole run;
//   - the change (even odds): the bandwidth drops 2-20x, or compute
//     slows down 2-8x (log-uniform), and comes back for the third phase.
//
// The space was fixed before any of these scenarios was run. Names are
// rNN-MODEL-ARCH-Nw-bwFx or -computeFx, so they are unique and say what
// changes.
func RandomGapSuite(n int, seed uint64) []Scenario {
	rng := rand.New(rand.NewPCG(seed, 0x676170)) // "gap"
	logU := func(lo, hi float64) float64 { return logUniform(rng, lo, hi) }
	models := slices.DeleteFunc(model.Zoo(), func(m string) bool { return m == "toy3" })
	g := threeDigits
	out := make([]Scenario, 0, n)
	for i := range n {
		s := Scenario{Model: models[rng.IntN(len(models))], Arch: "ps", Iterations: 3 * randomPhase}
		if rng.IntN(2) == 1 {
			s.Arch = "allreduce"
		}
		s.Workers = []int{2, 4, 8, 16}[rng.IntN(4)]
		if s.Arch == "ps" {
			s.Servers = max(1, s.Workers/[]int{1, 2, 4}[rng.IntN(3)])
		}
		rate := logU(1, 100) // Gbps
		speed := logU(0.25, 4)
		s.Bandwidth = g(rate) + "Gbps"
		var kind string
		if rng.IntN(2) == 0 {
			f := logU(2, 20)
			kind = "bw" + g(f) + "x"
			s.Trace = fmt.Sprintf("0:%sGbps,%d:%sGbps,%d:%sGbps", g(rate), randomPhase, g(rate/f), 2*randomPhase, g(rate))
			s.ComputeTrace = "0:" + g(1/speed)
		} else {
			f := logU(2, 8)
			kind = "compute" + g(f) + "x"
			s.ComputeTrace = fmt.Sprintf("0:%s,%d:%s,%d:%s", g(1/speed), randomPhase, g(f/speed), 2*randomPhase, g(1/speed))
		}
		s.Kind = kind
		s.Name = fmt.Sprintf("r%02d-%s-%s-%dw-%s", i, s.Model, s.Arch, s.Workers, kind)
		out = append(out, s)
	}
	return out
}

// logUniform draws from [lo, hi) with a uniform logarithm.
func logUniform(rng *rand.Rand, lo, hi float64) float64 {
	return lo * math.Exp(rng.Float64()*math.Log(hi/lo))
}

// threeDigits formats x with 3 significant digits, for drawn scenarios'
// rates and factors.
func threeDigits(x float64) string { return strconv.FormatFloat(x, 'g', 3, 64) }

// randomPhase is the length of each of a RandomGapSuite scenario's three
// phases, in iterations.
const randomPhase = 100

// GapSummary sums up Gap's results over scenarios.
type GapSummary struct {
	N int
	// MedianPct and BestPct are the median and the lowest (the oracle's
	// largest gain) of OracleVsBestStaticPct; BestName is that scenario.
	MedianPct, BestPct float64
	BestName           string
	// AtLeast15 counts the scenarios where the oracle is at least 15%
	// faster than the best static configuration.
	AtLeast15 int
}

// SummarizeGaps sums up gs (the zero summary for none).
func SummarizeGaps(gs []*GapResult) GapSummary {
	if len(gs) == 0 {
		return GapSummary{}
	}
	s := GapSummary{N: len(gs), BestPct: math.Inf(1)}
	pcts := make([]float64, 0, len(gs))
	for _, g := range gs {
		pcts = append(pcts, g.OracleVsBestStaticPct)
		if g.OracleVsBestStaticPct < s.BestPct {
			s.BestPct, s.BestName = g.OracleVsBestStaticPct, g.Scenario.Name
		}
		if g.OracleVsBestStaticPct <= -15 {
			s.AtLeast15++
		}
	}
	slices.Sort(pcts)
	if n := len(pcts); n%2 == 1 {
		s.MedianPct = pcts[n/2]
	} else {
		s.MedianPct = (pcts[n/2-1] + pcts[n/2]) / 2
	}
	return s
}
