package tune

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/autobyte/autobyte/sched"
)

func TestStatic(t *testing.T) {
	cfg := sched.Config{PartitionBytes: 4e6, CreditBytes: 16e6, Order: sched.OrderPriority}
	s := NewStatic(cfg)
	if s.Name() != "static" || s.Config != cfg {
		t.Errorf("NewStatic: %q %+v", s.Name(), s.Config)
	}
	var tu Tuner = s
	for k := range 100 {
		if p, ok := tu.Observe(Stats{Iteration: k, IterationTimeS: float64(k % 7)}); ok {
			t.Fatalf("static tuner proposed %+v after iteration %d", p, k)
		}
	}
}

func cfgs(parts ...int64) []sched.Config {
	var out []sched.Config
	for _, p := range parts {
		out = append(out, sched.Config{PartitionBytes: p, CreditBytes: 4 * p, Order: sched.OrderPriority})
	}
	return out
}

// drive feeds a tuner iterations 0..n-1 whose time is timeOf(config in
// force, iteration), applying its proposals as a caller would, and returns
// the proposals by observed iteration and the configuration per iteration.
func drive(t *testing.T, tu Tuner, initial sched.Config, n int, timeOf func(sched.Config, int) float64) (map[int]Proposal, []sched.Config) {
	t.Helper()
	props := map[int]Proposal{}
	var changes []Proposal
	inForce := func(k int) sched.Config {
		c := initial
		for _, p := range changes {
			if p.FromIteration <= k {
				c = p.Config
			}
		}
		return c
	}
	var used []sched.Config
	for k := range n {
		c := inForce(k)
		used = append(used, c)
		p, ok := tu.Observe(Stats{Iteration: k, IterationTimeS: timeOf(c, k), Config: c})
		if !ok {
			continue
		}
		if p.FromIteration < k+Lead {
			t.Fatalf("%s proposed from iteration %d after iteration %d", tu.Name(), p.FromIteration, k)
		}
		if m := len(changes); m > 0 && p.FromIteration <= changes[m-1].FromIteration {
			t.Fatalf("%s proposed from iteration %d after a change from %d", tu.Name(), p.FromIteration, changes[m-1].FromIteration)
		}
		props[k] = p
		changes = append(changes, p)
	}
	return props, used
}

// TestGridSchedule checks the trials' timing, that warm-up iterations are
// not measured, and that the best is fixed.
func TestGridSchedule(t *testing.T) {
	cands := cfgs(1e6, 2e6, 4e6)
	g, err := NewGrid(cands, 3)
	if err != nil {
		t.Fatal(err)
	}
	if g.Name() != "grid" {
		t.Errorf("name %q", g.Name())
	}
	// Trial iterations cost the partition in MB, except warm-ups (the
	// first of each trial), which cost 100 and must not count.
	var from []int
	timeOf := func(c sched.Config, k int) float64 {
		if slices.Contains(from, k) {
			return 100
		}
		return map[int64]float64{0: 50, 1e6: 3, 2e6: 1, 4e6: 2}[c.PartitionBytes]
	}
	props, used := drive(t, &recorder{g, &from}, sched.Config{}, 30, timeOf)
	want := map[int]Proposal{
		0:  {cands[0], 2}, // first trial Lead after the first observation
		3:  {cands[1], 5}, // proposed while trial 0 runs (2,3,4)
		6:  {cands[2], 8},
		10: {cands[1], 12}, // trial 2 measured at 9 and 10, then the best
	}
	if len(props) != len(want) {
		t.Errorf("proposals %v, want %v", props, want)
	}
	for k, p := range want {
		if props[k] != p {
			t.Errorf("after iteration %d: proposal %+v, want %+v", k, props[k], p)
		}
	}
	if best, ok := g.Best(); !ok || best != cands[1] {
		t.Errorf("best %+v %v, want %+v", best, ok, cands[1])
	}
	for i, tr := range g.Trials() {
		wantMean := []float64{3, 1, 2}[i]
		if tr.Measured != 2 || tr.MeanS != wantMean || tr.FromIteration != []int{2, 5, 8}[i] {
			t.Errorf("trial %d: %+v, want 2 measured, mean %v", i, tr, wantMean)
		}
	}
	for k := 12; k < 30; k++ {
		if used[k] != cands[1] {
			t.Errorf("iteration %d ran %+v after the choice", k, used[k])
		}
	}
}

// recorder notes the trial starts of a grid, to make them expensive.
type recorder struct {
	*Grid
	from *[]int
}

func (r *recorder) Observe(s Stats) (Proposal, bool) {
	p, ok := r.Grid.Observe(s)
	if ok && r.Grid.best < 0 {
		*r.from = append(*r.from, p.FromIteration)
	}
	return p, ok
}

// TestGridLastIsBest checks nothing is proposed when the last trial wins,
// and that ties go to the earlier candidate.
func TestGridLastIsBest(t *testing.T) {
	cands := cfgs(1e6, 2e6)
	g, _ := NewGrid(cands, 2)
	props, _ := drive(t, g, sched.Config{}, 20, func(c sched.Config, _ int) float64 { return 10 - float64(c.PartitionBytes)/1e6 })
	if len(props) != 2 {
		t.Errorf("proposals %v, want the two trials only", props)
	}
	if best, _ := g.Best(); best != cands[1] {
		t.Errorf("best %+v", best)
	}
	g, _ = NewGrid(cfgs(1e6, 2e6, 4e6), 2)
	drive(t, g, sched.Config{}, 20, func(sched.Config, int) float64 { return 1 })
	if best, _ := g.Best(); best != cfgs(1e6)[0] {
		t.Errorf("tie: best %+v, want the first candidate", best)
	}
}

// TestGridDeterministic checks two grids fed the same statistics propose
// the same things.
func TestGridDeterministic(t *testing.T) {
	timeOf := func(c sched.Config, k int) float64 {
		return math.Abs(math.Sin(float64(k)*0.7+float64(c.PartitionBytes)/1e6)) + 1
	}
	a, _ := NewGrid(Cross(sched.Config{Order: sched.OrderPriority}, []int64{1e6, 4e6, 16e6}, []int64{4e6, 16e6}), 4)
	b, _ := NewGrid(Cross(sched.Config{Order: sched.OrderPriority}, []int64{1e6, 4e6, 16e6}, []int64{4e6, 16e6}), 4)
	pa, ua := drive(t, a, sched.Config{}, 60, timeOf)
	pb, ub := drive(t, b, sched.Config{}, 60, timeOf)
	if len(pa) != 7 || len(pa) != len(pb) || !slices.Equal(ua, ub) {
		t.Fatalf("runs differ: %v vs %v", pa, pb)
	}
	for k, p := range pa {
		if pb[k] != p {
			t.Errorf("after iteration %d: %+v vs %+v", k, p, pb[k])
		}
	}
	if !slices.EqualFunc(a.Trials(), b.Trials(), func(x, y Trial) bool { return x.Config == y.Config && x.MeanS == y.MeanS }) {
		t.Errorf("trials differ: %+v vs %+v", a.Trials(), b.Trials())
	}
}

func TestGridErrors(t *testing.T) {
	if _, err := NewGrid(nil, 3); err == nil || !strings.Contains(err.Error(), "candidate") {
		t.Errorf("no candidates: %v", err)
	}
	if _, err := NewGrid(cfgs(1e6), 1); err == nil || !strings.Contains(err.Error(), "got 1") {
		t.Errorf("k = 1: %v", err)
	}
	bad := append(cfgs(1e6, 2e6), sched.Config{CreditBytes: -5})
	if _, err := NewGrid(bad, 3); err == nil || !strings.Contains(err.Error(), "candidate 2") || !strings.Contains(err.Error(), "-5") {
		t.Errorf("bad candidate: %v", err)
	}
}

func TestCross(t *testing.T) {
	base := sched.Config{Order: sched.OrderPriority, Admission: sched.AdmitStrict}
	got := Cross(base, []int64{1, 2}, []int64{10, 20, 30})
	if len(got) != 6 || got[0].PartitionBytes != 1 || got[0].CreditBytes != 10 || got[2].CreditBytes != 30 ||
		got[3].PartitionBytes != 2 || got[5].Order != sched.OrderPriority || got[5].Admission != sched.AdmitStrict {
		t.Errorf("Cross = %+v", got)
	}
}
