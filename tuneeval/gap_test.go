package tuneeval

import (
	"math"
	"reflect"
	"slices"
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

// TestRandomGapSuite: the drawn scenarios are valid, changing, uniquely
// named, inside the documented space, the same for the same seed and
// different for another.
func TestRandomGapSuite(t *testing.T) {
	a, b, c := RandomGapSuite(60, 1), RandomGapSuite(60, 1), RandomGapSuite(60, 2)
	if len(a) != 60 {
		t.Fatalf("%d scenarios, want 60", len(a))
	}
	names := map[string]bool{}
	kinds := map[string]int{}
	same := 0
	for i, s := range a {
		if !reflect.DeepEqual(s, b[i]) {
			t.Errorf("scenario %d differs between two draws with seed 1: %+v vs %+v", i, s, b[i])
		}
		if reflect.DeepEqual(s, c[i]) {
			same++
		}
		if names[s.Name] || !s.Changing() || s.Model == "toy3" {
			t.Errorf("scenario %s: duplicate %v, changing %v", s.Name, names[s.Name], s.Changing())
		}
		names[s.Name] = true
		o, err := s.Options()
		if err != nil {
			t.Fatalf("scenario %s: %v", s.Name, err)
		}
		if !slices.Contains([]int{2, 4, 8, 16}, s.Workers) || (s.Arch == "ps") != (s.Servers >= 1) || s.Servers > s.Workers {
			t.Errorf("scenario %s: %d workers, %d servers", s.Name, s.Workers, s.Servers)
		}
		if bw := o.BandwidthBps * 8; bw < 0.99e9 || bw > 100.1e9 {
			t.Errorf("scenario %s: link rate %v bit/s outside 1-100 Gbps", s.Name, bw)
		}
		if sc := o.ComputeScaleAt(0); sc < 0.249 || sc > 4.01 {
			t.Errorf("scenario %s: compute scale %v outside 1/4-4", s.Name, sc)
		}
		mid := o.BandwidthBps * 8
		if len(o.BandwidthTrace) > 0 {
			mid = o.BandwidthTrace[1].Value * 8
		}
		bwDrop, slow := o.BandwidthBps*8/mid, o.ComputeScaleAt(randomPhase)/o.ComputeScaleAt(0)
		switch {
		case strings.Contains(s.Name, "-bw"):
			kinds["bw"]++
			if bwDrop < 1.99 || bwDrop > 20.1 || math.Abs(slow-1) > 1e-9 {
				t.Errorf("scenario %s: bandwidth drops %vx, compute %vx; want a 2-20x drop and steady compute", s.Name, bwDrop, slow)
			}
		case strings.Contains(s.Name, "-compute"):
			kinds["compute"]++
			if slow < 1.98 || slow > 8.1 || bwDrop != 1 {
				t.Errorf("scenario %s: compute slows %vx, bandwidth drops %vx; want a 2-8x slowdown and steady bandwidth", s.Name, slow, bwDrop)
			}
		default:
			t.Errorf("scenario %s: the name does not say what changes", s.Name)
		}
		if ph := s.Phases(); len(ph) != 3 || ph[2].To != 3*randomPhase || ph[1].To-ph[1].From != randomPhase {
			t.Errorf("scenario %s: phases %v, want three of %d iterations", s.Name, ph, randomPhase)
		}
	}
	if same == len(a) {
		t.Error("seeds 1 and 2 drew the same scenarios")
	}
	if kinds["bw"] < 10 || kinds["compute"] < 10 {
		t.Errorf("60 draws: %v; want both kinds of change", kinds)
	}
}

// TestSummarizeGaps: median, best and the count at 15% or better, by hand.
func TestSummarizeGaps(t *testing.T) {
	g := func(name string, p float64) *GapResult {
		return &GapResult{Scenario: Scenario{Name: name}, OracleVsBestStaticPct: p}
	}
	s := SummarizeGaps([]*GapResult{g("a", -1), g("b", -20), g("c", 0), g("d", -15)})
	if s.N != 4 || s.MedianPct != -8 || s.BestPct != -20 || s.BestName != "b" || s.AtLeast15 != 2 {
		t.Errorf("summary %+v, want 4 scenarios, median -8%%, best -20%% (b), 2 at 15%% or better", s)
	}
	if s := SummarizeGaps([]*GapResult{g("x", 0.5)}); s.MedianPct != 0.5 || s.BestName != "x" || s.AtLeast15 != 0 {
		t.Errorf("one scenario: %+v", s)
	}
	if s := SummarizeGaps(nil); s != (GapSummary{}) {
		t.Errorf("no scenarios: %+v, want the zero summary", s)
	}
}
