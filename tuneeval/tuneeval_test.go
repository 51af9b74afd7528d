package tuneeval

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/sim"
	"github.com/autobyte/autobyte/tune"
)

// TestOracleBeatsEveryStaticPerPhase: on a small changing scenario, the
// oracle's mean over each phase (after its first Lead iterations) is no
// worse than any static candidate's.
func TestOracleBeatsEveryStaticPerPhase(t *testing.T) {
	s := QuickSuite()[0]
	if !s.Changing() {
		t.Fatalf("quick scenario %s should change", s.Name)
	}
	o, err := s.Options()
	if err != nil {
		t.Fatal(err)
	}
	cands := Candidates()
	_, statics, err := sim.BestStatic(o, cands)
	if err != nil {
		t.Fatal(err)
	}
	phases := s.Phases()
	if len(phases) != 3 {
		t.Fatalf("phases %v, want 3", phases)
	}
	cfgs := OracleConfigs(statics, cands, phases)
	o.Sched = cfgs[0]
	o.Tuner = NewOracle(phases, cfgs)
	r, err := sim.Run(o)
	if err != nil {
		t.Fatal(err)
	}
	for p, ph := range phases {
		from := ph.From + tune.Lead
		got := mean(r.IterationTimesS[from:ph.To])
		for c, st := range statics {
			if want := mean(st.IterationTimesS[from:ph.To]); got > want*(1+1e-9) {
				t.Errorf("phase %d %v: oracle %.6f s > static candidate %d (%s) %.6f s", p, ph, got, c, ConfigString(cands[c]), want)
			}
		}
	}
	// The oracle switched where the best configuration changed.
	for p := 1; p < len(phases); p++ {
		if cfgs[p] != cfgs[p-1] && tune.ConfigAt(r.Configs, phases[p].From) != cfgs[p] {
			t.Errorf("phase %d: configuration %+v in force, want %+v", p, tune.ConfigAt(r.Configs, phases[p].From), cfgs[p])
		}
	}
}

func quick(t *testing.T, par int) *Report {
	t.Helper()
	rep, err := Evaluate(Options{Out: t.TempDir(), Quick: true, Parallel: par})
	if err != nil {
		t.Fatal(err)
	}
	rep.ElapsedS = 0
	rep.Parallel = 0
	return rep
}

// TestEvaluateDeterministic: equal options give equal reports, whatever the
// parallelism.
func TestEvaluateDeterministic(t *testing.T) {
	a, err := json.Marshal(quick(t, 1))
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(quick(t, 4))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("two runs of the quick suite differ")
	}
}

// TestQuickEndToEnd runs the quick suite and checks the table, the JSON and
// the plots.
func TestQuickEndToEnd(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	rep, err := Evaluate(Options{Out: dir, Quick: true, Parallel: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := Write(rep, dir); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range QuickSuite() {
		if !strings.Contains(string(md), "| "+s.Name+" |") {
			t.Errorf("results.md has no row for %s:\n%s", s.Name, md)
		}
		for _, kind := range []string{"time", "config"} {
			path := filepath.Join(dir, s.Name+"-"+kind+".png")
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			img, err := png.Decode(f)
			f.Close()
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			if b := img.Bounds(); b.Dx() < 100 || b.Dy() < 100 {
				t.Errorf("%s is %v", path, b)
			}
		}
	}
	var back Report
	js, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Scenarios) != len(QuickSuite()) {
		t.Fatalf("results.json has %d scenarios", len(back.Scenarios))
	}
	for _, s := range back.Scenarios {
		if len(s.Runs) != len(Tuners) {
			t.Errorf("%s: %d runs, want %d", s.Scenario.Name, len(s.Runs), len(Tuners))
		}
		for _, r := range s.Runs {
			if len(r.IterationTimesS) != s.Scenario.Iterations || !(r.MeanIterationTimeS > 0) {
				t.Errorf("%s/%s: %d times, mean %v", s.Scenario.Name, r.Tuner, len(r.IterationTimesS), r.MeanIterationTimeS)
			}
		}
		// The best static configuration is no worse than ByteScheduler's
		// default nor the oracle's per-phase choices over the whole run
		// by much; fifo is the slowest scheduled baseline here.
		if bs, d := s.Run(BestStatic).MeanIterationTimeS, s.Run(ByteScheduler).MeanIterationTimeS; bs > d*1.01 {
			t.Errorf("%s: best static %.4f s slower than bytescheduler %.4f s", s.Scenario.Name, bs, d)
		}
	}
}

// TestBadOptions: each bad option errors and names its value.
func TestBadOptions(t *testing.T) {
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{Out: "", Parallel: 1}, `--out must name a directory, got ""`},
		{Options{Out: "x", Parallel: 0}, "--parallel must be >= 1, got 0"},
		{Options{Out: "x", Parallel: -3}, "got -3"},
		{Options{Out: "x", Parallel: 1, BOTrial: 3}, "--bo-trial must be >= 6 iterations (BO drops 5 per trial), got 3"},
		{Options{Out: "x", Parallel: 1, Only: "resnet50-ps-8w-steady,nope"}, `--only: unknown scenario "nope"`},
		{Options{Out: "x", Parallel: 1, Quick: true, Long: true}, "--quick, --long and --links"},
		{Options{Out: "x", Parallel: 1, Links: true, Long: true}, "give at most one"},
		{Options{Out: "x", Parallel: 1, Long: true, Only: "resnet50-ps-8w-change"}, `unknown scenario "resnet50-ps-8w-change"`},
		{Options{Out: "x", Parallel: 1, Links: true, Only: "nope"}, "(the suite's: resnet50-ps-16w-server1-10x, "},
		{Options{Out: "x", Parallel: 1, Random: -1, Links: true}, "--random must be >= 0, got -1"},
		{Options{Out: "x", Parallel: 1, Random: 3}, "--random 3 draws link scenarios; give it with --links"},
		{Options{Out: "x", Parallel: 1, Random: 2, Seed: 5, Links: true, Only: "resnet50-ps-16w-server1-10x"}, `unknown scenario "resnet50-ps-16w-server1-10x" (the suite's: l00-`},
	} {
		err := c.o.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.o, err, c.want)
		}
		if _, err := Evaluate(c.o); err == nil {
			t.Errorf("%+v: Evaluate did not fail", c.o)
		}
	}
}

// TestLongSuite: the long suite's scenarios are valid, changing, long
// enough for BO's released timing to freeze (15 trials of 100 + 10
// iterations) in the second of their three phases, and --long gives BO
// that timing.
func TestLongSuite(t *testing.T) {
	const frozen = 15 * (100 + 10)
	for _, s := range LongSuite() {
		if _, err := s.Options(); err != nil {
			t.Fatal(err)
		}
		ph := s.Phases()
		if !s.Changing() || len(ph) != 3 || ph[1].From >= frozen || ph[1].To <= frozen {
			t.Errorf("%s: changing %v, phases %v; want three, BO freezing (iteration %d) in the second", s.Name, s.Changing(), ph, frozen)
		}
		if !strings.HasSuffix(s.Name, "-long") {
			t.Errorf("%s: the name does not say it is long", s.Name)
		}
	}
	if trial, delay := (Options{Long: true}).boTrial(); trial != 100 || delay != 10 {
		t.Errorf("--long: BO trials of %d iterations + %d of delay, want the released 100 + 10", trial, delay)
	}
}

// TestSuite: the default suite has at least 12 valid scenarios with unique
// names covering both architectures, steady and changing bandwidth and a
// straggler.
func TestSuite(t *testing.T) {
	suite := DefaultSuite()
	if len(suite) < 12 {
		t.Fatalf("%d scenarios", len(suite))
	}
	seen := map[string]bool{}
	var ps, ar, ch, st, strag int
	for _, s := range suite {
		if seen[s.Name] {
			t.Errorf("duplicate %s", s.Name)
		}
		seen[s.Name] = true
		if _, err := s.Options(); err != nil {
			t.Error(err)
		}
		switch {
		case s.Arch == "ps":
			ps++
		default:
			ar++
		}
		if s.Changing() {
			ch++
			if len(s.Phases()) != 3 {
				t.Errorf("%s: phases %v", s.Name, s.Phases())
			}
		} else {
			st++
		}
		if len(s.Stragglers) > 0 {
			strag++
		}
	}
	if ps == 0 || ar == 0 || ch == 0 || st == 0 || strag == 0 {
		t.Errorf("ps %d allreduce %d changing %d steady %d straggler %d", ps, ar, ch, st, strag)
	}
}

// TestLinkSuite: the link suite's 8 scenarios are valid parameter-server
// jobs of the models, sizes and slowdowns it promises, each server link
// change starts a phase, and the static baselines search server weights:
// even ones, each phase's ideal ones (the slow server at its rate's
// share) and compromises between them, while a suite without link traces
// searches even weights only.
func TestLinkSuite(t *testing.T) {
	suite := LinkSuite()
	if len(suite) != 8 {
		t.Fatalf("%d scenarios, want 8", len(suite))
	}
	models := checkLinkSuite(t, suite)
	for _, m := range []string{"resnet50", "vgg16", "bert-base", "gpt2"} {
		if !models[m] {
			t.Errorf("no %s scenario", m)
		}
	}
	for _, s := range DefaultSuite() {
		if ws := s.WeightCandidates(); len(ws) != 1 || ws[0].Weighted() {
			t.Errorf("%s: weight candidates %v, want even weights only", s.Name, ws)
		}
	}
	c := sched.Config{PartitionBytes: 1 << 20, CreditBytes: 4 << 20, Order: sched.OrderPriority, ServerWeights: sched.ServerWeights{1000, 250}}
	if got := ConfigString(c); !strings.HasSuffix(got, " w1000:250") {
		t.Errorf("ConfigString(%+v) = %q, want the weights", c, got)
	}
}

// checkLinkSuite checks that suite's names are unique and that each of
// its scenarios is in the link suite's space (checkLinkScenario); it
// returns the models the suite uses.
func checkLinkSuite(t *testing.T, suite []Scenario) map[string]bool {
	t.Helper()
	models := map[string]bool{}
	seen := map[string]bool{}
	for _, s := range suite {
		if seen[s.Name] {
			t.Errorf("two scenarios named %s", s.Name)
		}
		seen[s.Name] = true
		models[s.Model] = true
		checkLinkScenario(t, s)
	}
	return models
}

// checkLinkScenario checks that s is in the link suite's space: a
// parameter-server job of 8-32 workers and 4-8 servers where one or two
// server links run 4-10x slower, each step starting a phase, and that its
// static baselines search the weights of every phase.
func checkLinkScenario(t *testing.T, s Scenario) {
	t.Helper()
	o, err := s.Options()
	if err != nil {
		t.Fatal(err)
	}
	if s.Arch != "ps" || s.Workers < 8 || s.Workers > 32 || s.Servers < 4 || s.Servers > 8 || !s.Changing() {
		t.Errorf("%s: %+v", s.Name, s)
	}
	if len(o.ServerLinkTraces) < 1 || len(o.ServerLinkTraces) > 2 {
		t.Errorf("%s: %d slow servers", s.Name, len(o.ServerLinkTraces))
	}
	var slowest float64
	for srv := range o.ServerLinkTraces {
		for k := range s.Iterations {
			slowest = max(slowest, o.BandwidthBps/o.ServerRateAt(srv, k))
		}
	}
	if slowest < 4 || slowest > 10.01 {
		t.Errorf("%s: the slowest link is 1/%.3g of the others, want 1/4 to 1/10", s.Name, slowest)
	}
	ph := s.Phases()
	for srv, steps := range o.ServerLinkTraces {
		for _, st := range steps {
			if !slices.ContainsFunc(ph, func(p Phase) bool { return p.From == st.Iteration }) {
				t.Errorf("%s: server %d's step at %d starts no phase (%v)", s.Name, srv, st.Iteration, ph)
			}
		}
	}
	ws := s.WeightCandidates()
	if ws[0].Weighted() || len(ws) < 4 {
		t.Fatalf("%s: weight candidates %v: want even weights first and at least 3 others", s.Name, ws)
	}
	// The ideal weights of the slowest phase are among them.
	for _, p := range ph {
		rates := make([]float64, o.Servers)
		for i := range rates {
			rates[i] = o.ServerRateAt(i, p.From)
		}
		w, err := sched.Weigh(rates)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(ws, w) {
			t.Errorf("%s: phase %v's ideal weights %v are not among %v", s.Name, p, w, ws)
		}
	}
	if n := len(s.StaticCandidates()); n != len(ws)*len(Candidates()) {
		t.Errorf("%s: %d static candidates, want the grid under each of %d weights", s.Name, n, len(ws))
	}
}

// TestRandomLinkSuite: the held-out link scenarios are in the link suite's
// space, uniquely named, drawn again alike from one seed and otherwise
// from another; the space's options (two slow servers, no recovery, every
// model) all come up.
func TestRandomLinkSuite(t *testing.T) {
	a, b, c := RandomLinkSuite(40, 1), RandomLinkSuite(40, 1), RandomLinkSuite(40, 2)
	if len(a) != 40 || !reflect.DeepEqual(a, b) {
		t.Fatalf("RandomLinkSuite(40, 1) is not reproducible")
	}
	if reflect.DeepEqual(a, c) {
		t.Fatalf("seeds 1 and 2 drew the same suite")
	}
	models := checkLinkSuite(t, a)
	var two, stays int
	for _, s := range a {
		if len(s.LinkTraces) == 2 {
			two++
		}
		for _, tr := range s.LinkTraces {
			if !strings.Contains(tr, ",") {
				stays++
			}
		}
	}
	if len(models) != 4 || two == 0 || stays == 0 {
		t.Errorf("40 draws cover %d models, %d with two slow servers, %d slow links that stay slow: want 4 and some of each", len(models), two, stays)
	}
}

// TestSettle checks the settle and steady-state rules on a hand-made series.
func TestSettle(t *testing.T) {
	times := []float64{5, 5, 3, 1.2, 1.04, 1, 1, 0.97, 1, 1, 1, 1}
	ph := Phase{From: 2, To: 12}
	st := SteadyMean(times, ph) // last 2 of 10
	if st != 1 {
		t.Fatalf("steady %v", st)
	}
	if got := Settle(times, ph, st); got != 2 { // iteration 4 onwards
		t.Fatalf("settle %d, want 2", got)
	}
}

// TestPhasesComputeTrace: a compute step at iteration c starts a phase at
// c-1 (the iteration whose forward pass c runs at the new speed), a
// bandwidth step at c itself; the simulator agrees: iteration c-1 is the
// first whose time changes.
// simulate runs scenario s with its default configuration.
func simulate(t *testing.T, s Scenario) *sim.Result {
	t.Helper()
	o, err := s.Options()
	if err != nil {
		t.Fatal(err)
	}
	r, err := sim.Run(o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestStragglerTraceScenario: a straggler that comes and goes cuts phases
// as a compute step does (one iteration early), makes the scenario
// changing, slows the iterations from the cut on, and a bad trace is
// refused naming the scenario, the rank and the value.
func TestStragglerTraceScenario(t *testing.T) {
	s := Scenario{Name: "x", Model: "resnet50", Arch: "ps", Workers: 4, Servers: 4, Bandwidth: "10Gbps",
		StragglerTraces: map[int]string{2: "10:3,20:1"}, Iterations: 30}
	if got := s.Phases(); !s.Changing() || len(got) != 3 || got[1] != (Phase{9, 19}) {
		t.Fatalf("straggler from 10 to 20: changing %v, phases %v; want cuts at 9 and 19", s.Changing(), got)
	}
	r := simulate(t, s)
	if before, during := r.IterationTimesS[7], r.IterationTimesS[12]; !(during > 1.5*before) {
		t.Errorf("iteration 7 took %v s, 12 (rank 2 three times slower) %v s", before, during)
	}
	s.StragglerTraces = map[int]string{2: "10:3,5:1"}
	if _, err := s.Options(); err == nil || !strings.Contains(err.Error(), "scenario x") || !strings.Contains(err.Error(), "rank 2") {
		t.Errorf("steps out of order: error %v, want one naming the scenario and rank 2", err)
	}
	s.StragglerTraces = map[int]string{2: "10:0.5"}
	if _, err := s.Options(); err == nil || !strings.Contains(err.Error(), "0.5") {
		t.Errorf("a straggler faster than normal: error %v, want one naming 0.5", err)
	}
}

func TestPhasesComputeTrace(t *testing.T) {
	s := Scenario{Name: "x", Model: "resnet50", Arch: "allreduce", Workers: 4, Bandwidth: "10Gbps", ComputeTrace: "0:1,20:4", Iterations: 40}
	if got := s.Phases(); len(got) != 2 || got[1].From != 19 {
		t.Fatalf("compute step at 20: phases %v, want a cut at 19", got)
	}
	r := simulate(t, s)
	if r.IterationTimesS[18] != r.IterationTimesS[17] || r.IterationTimesS[19] == r.IterationTimesS[18] {
		t.Errorf("iteration times 17-19: %v; want 17 = 18 != 19", r.IterationTimesS[17:20])
	}
	s.ComputeTrace, s.Trace = "", "0:10Gbps,20:2Gbps"
	if got := s.Phases(); len(got) != 2 || got[1].From != 20 {
		t.Errorf("bandwidth step at 20: phases %v, want a cut at 20", got)
	}
}

// TestAutoByteFollowsAfterRevertedRebalances: ResNet-50 on 8 workers and 8
// servers is compute-bound at 17.5 Gbit/s, and under the default
// partition its servers measure apart, so a tuner that asks little of a
// rebalance (RebalanceGain 3% of the exposed communication; the default
// 10% leaves such servers alone, tune's
// TestAutoByteComputeBoundServersStay) and takes servers 30% apart for
// servers of two speeds (WeightsEven 0.3; at the default 0.5 they are one
// speed) tries rebalances and reverts them (enough of them to stop
// trying). A server link that then
// slows to 1/4 is a change of that server's conditions: the tuner must
// move load off it at once all the same, and a second server slowing
// later likewise. The run with fixed weights is the negative control:
// the same check fails there.
func TestAutoByteFollowsAfterRevertedRebalances(t *testing.T) {
	s := Scenario{Name: "resnet50-8w-8s-compute-bound", Model: "resnet50", Arch: "ps", Iterations: 110, Workers: 8, Servers: 8,
		Bandwidth: "17.5Gbps", LinkTraces: map[string]string{"server6": "52:4.17Gbps", "server7": "80:1.83Gbps"}}
	run := func(fixed bool) (*sim.Result, *tune.AutoByte) {
		o, err := s.Options()
		if err != nil {
			t.Fatal(err)
		}
		a, err := tune.NewAutoByte(tune.AutoByteOptions{Base: sched.Config{Order: sched.OrderPriority}, Seed: 1, FixedWeights: fixed, RebalanceGain: 0.03, WeightsEven: 0.3})
		if err != nil {
			t.Fatal(err)
		}
		o.Tuner = a
		r, err := sim.Run(o)
		if err != nil {
			t.Fatal(err)
		}
		return r, a
	}
	r, a := run(false)
	reverted := 0
	evs := a.Events()
	for i, e := range evs {
		if e.Iteration < 52 && e.Kind == "revert" && i > 0 && evs[i-1].Kind == "rebalance" {
			reverted++
		}
	}
	if reverted < 3 {
		t.Fatalf("%d rebalances reverted before the slowdown, want 3 or more for this test to test anything (events %v)", reverted, evs)
	}
	// Once the new weights are in force (the first slow iteration is
	// observed, they apply Lead later), the job is compute-bound again.
	before := mean(r.IterationTimesS[45:52])
	recovered := func(r *sim.Result) error {
		for _, from := range []int{52, 80} {
			for k := from + tune.Lead + 1; k < from+10; k++ {
				if got := r.IterationTimesS[k]; got > before*1.05 {
					return fmt.Errorf("iteration %d, a server slow since %d: %.4f s, want within 5%% of %.4f s before the slowdowns", k, from, got, before)
				}
			}
		}
		return nil
	}
	if err := recovered(r); err != nil {
		t.Errorf("%v (events %v)", err, evs)
	}
	if fixedRun, _ := run(true); recovered(fixedRun) == nil {
		t.Errorf("with fixed weights the check passes too: it cannot tell a tuner that follows the servers")
	}
}
