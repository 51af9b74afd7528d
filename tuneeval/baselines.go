package tuneeval

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"

	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/sim"
)

// Reusing baselines. The static candidates are about 95% of an
// evaluation's simulations (the link suite's: 170-340 per scenario against
// 5 tuner runs) and do not depend on the tuners, so after a change to a
// tuner only the tuners need to run again. Options.Baselines names the
// results.json of an earlier evaluation; its best static and oracle runs
// stand for every scenario it holds with the same definition and the same
// number of static candidates. The simulator must not have changed since:
// the fifo and ByteScheduler runs, static configurations that run again
// anyway, must come out exactly as recorded, or the baselines are refused.

// loadBaselines returns, for each scenario of suite, the earlier result
// that the report in path holds for it. It fails, naming the file and the
// scenario, if the file cannot be read, lacks a scenario, defines it
// otherwise, or searched another number of static candidates.
func loadBaselines(path string, suite []Scenario, cands [][]sched.Config) ([]*ScenarioResult, error) {
	js, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--baselines: %w", err)
	}
	var old Report
	if err := json.Unmarshal(js, &old); err != nil {
		return nil, fmt.Errorf("--baselines %s: not a tune eval results.json: %w", path, err)
	}
	out := make([]*ScenarioResult, len(suite))
	for i, s := range suite {
		k := slices.IndexFunc(old.Scenarios, func(r ScenarioResult) bool { return r.Scenario.Name == s.Name })
		if k < 0 {
			return nil, fmt.Errorf("--baselines %s holds no scenario %s (run it without --baselines, or leave it out with --only)", path, s.Name)
		}
		r := &old.Scenarios[k]
		a, errA := json.Marshal(r.Scenario)
		b, errB := json.Marshal(s)
		if errA != nil || errB != nil || !bytes.Equal(a, b) {
			return nil, fmt.Errorf("--baselines %s: scenario %s is defined otherwise there (%s, now %s)", path, s.Name, a, b)
		}
		if r.StaticCandidates != len(cands[i]) {
			return nil, fmt.Errorf("--baselines %s: scenario %s searched %d static candidates there, %d now", path, s.Name, r.StaticCandidates, len(cands[i]))
		}
		for _, name := range []string{Fifo, ByteScheduler, BestStatic, OracleName} {
			if run := r.Run(name); run == nil || len(run.IterationTimesS) != s.Iterations {
				return nil, fmt.Errorf("--baselines %s: scenario %s has no complete %s run", path, s.Name, name)
			}
		}
		out[i] = r
	}
	return out, nil
}

// checkBaselines fails if a static run of this evaluation (fifo or
// ByteScheduler's defaults) differs from the one recorded with the
// baselines: the simulator changed, and so would the baselines.
func checkBaselines(path string, s Scenario, old *ScenarioResult, tuned map[string]*sim.Result) error {
	for _, name := range []string{Fifo, ByteScheduler} {
		now, then := tuned[name], old.Run(name)
		if !slices.Equal(now.IterationTimesS, then.IterationTimesS) {
			return fmt.Errorf("--baselines %s: scenario %s: %s's run now takes %.6g s per iteration on average, %.6g s there: the simulator has changed since, so its static baselines would too; run without --baselines",
				path, s.Name, name, now.MeanIterationTimeS, then.MeanIterationTimeS)
		}
	}
	return nil
}
