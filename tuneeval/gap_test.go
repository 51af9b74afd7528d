package tuneeval

import (
	"strings"
	"testing"
)

// TestGapMatchesEvaluate: Gap picks the same best static configuration and
// oracle, with the same means, as Evaluate on the quick suite's changing
// scenario.
func TestGapMatchesEvaluate(t *testing.T) {
	rep := quick(t, 2)
	sr := rep.Scenarios[0]
	g, err := Gap(QuickSuite()[0], 2)
	if err != nil {
		t.Fatal(err)
	}
	if g.BestStaticConfig != sr.BestStaticConfig || g.BestStaticMeanS != sr.Run(BestStatic).MeanIterationTimeS {
		t.Errorf("best static %s %v s, Evaluate's %s %v s", ConfigString(g.BestStaticConfig), g.BestStaticMeanS,
			ConfigString(sr.BestStaticConfig), sr.Run(BestStatic).MeanIterationTimeS)
	}
	if len(g.OracleConfigs) != len(sr.OracleConfigs) || g.OracleMeanS != sr.Run(OracleName).MeanIterationTimeS || g.OracleVsBestStaticPct != sr.OracleVsBestStaticPct {
		t.Errorf("oracle %v: %v s (%+.2f%%), Evaluate's %v: %v s (%+.2f%%)", g.OracleConfigs, g.OracleMeanS, g.OracleVsBestStaticPct,
			sr.OracleConfigs, sr.Run(OracleName).MeanIterationTimeS, sr.OracleVsBestStaticPct)
	}
	for i := range g.OracleConfigs {
		if i < len(sr.OracleConfigs) && g.OracleConfigs[i] != sr.OracleConfigs[i] {
			t.Errorf("phase %d: oracle %s, Evaluate's %s", i, ConfigString(g.OracleConfigs[i]), ConfigString(sr.OracleConfigs[i]))
		}
	}
	if g.ByteSchedulerMeanS != sr.Run(ByteScheduler).MeanIterationTimeS {
		t.Errorf("bytescheduler %v s, Evaluate's %v s", g.ByteSchedulerMeanS, sr.Run(ByteScheduler).MeanIterationTimeS)
	}
}

// TestScenarioMessageCost: a scenario's message cost reaches the simulator
// ("" is none), slows the run, and a bad one is refused naming the
// scenario and the value.
func TestScenarioMessageCost(t *testing.T) {
	s := QuickSuite()[1]
	o, err := s.Options()
	if err != nil || o.MessageCostS != 0 {
		t.Fatalf("no message cost: %v s, error %v", o.MessageCostS, err)
	}
	s.MessageCost = "15us"
	if o, err = s.Options(); err != nil || o.MessageCostS != 15e-6 {
		t.Fatalf("message cost 15us: %v s, error %v", o.MessageCostS, err)
	}
	for _, bad := range []string{"-1us", "15", "fast"} {
		s.MessageCost = bad
		_, err := s.Options()
		if err == nil || !strings.Contains(err.Error(), s.Name) || !strings.Contains(err.Error(), "message cost") || !strings.Contains(err.Error(), bad) {
			t.Errorf("message cost %q: error %v, want one naming the scenario, the message cost and the value", bad, err)
		}
	}
}

// TestGapSuite: the changing scenarios of the default suite, then the
// three extra ones, all changing and uniquely named.
func TestGapSuite(t *testing.T) {
	names := map[string]bool{}
	n := 0
	for _, s := range DefaultSuite() {
		if s.Changing() {
			n++
		}
	}
	suite := GapSuite()
	if len(suite) != n+3 {
		t.Fatalf("%d scenarios, want the default suite's %d changing ones and 3 more", len(suite), n)
	}
	for _, s := range suite {
		if !s.Changing() || names[s.Name] || s.MessageCost != "" {
			t.Errorf("scenario %s: changing %v, duplicate %v, message cost %q", s.Name, s.Changing(), names[s.Name], s.MessageCost)
		}
		names[s.Name] = true
	}
}
