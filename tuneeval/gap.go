package tuneeval

// The oracle gap: how much the per-phase oracle gains over the best static
// configuration in hindsight, without running any tuner. It answers whether
// a scenario leaves room for a tuner that follows changes, for instance
// under a per-message cost (Scenario.MessageCost), at 43 simulations per
// scenario (the grid and the oracle) instead of tune eval's 47 and BO's
// and autobyte's tuning.

import (
	"fmt"

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
	cands := Candidates()
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
