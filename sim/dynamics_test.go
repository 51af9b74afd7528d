package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/autobyte/autobyte/model"
	"github.com/autobyte/autobyte/proto"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/tune"
	"github.com/autobyte/autobyte/units"
)

// bsPS is the bytescheduler preset for parameter servers.
var bsPS = sched.Config{PartitionBytes: 4e6, CreditBytes: 16e6, Order: sched.OrderPriority}

// checkIterationBounds asserts every iteration time is at least the fluid
// bound of the conditions of that iteration.
func checkIterationBounds(t *testing.T, o Options, r *Result) {
	t.Helper()
	if len(r.LowerBoundsAt) != o.Iterations || len(r.IterationTimesS) != o.Iterations {
		t.Fatalf("%s: %d per-iteration bounds and %d times, want %d", describe(o), len(r.LowerBoundsAt), len(r.IterationTimesS), o.Iterations)
	}
	for k, it := range r.IterationTimesS {
		if b := r.LowerBoundsAt[k]; it < b.FluidS*(1-rel) {
			t.Errorf("%s: iteration %d took %.9g s, below its fluid bound %.9g s (%+v)", describe(o), k, it, b.FluidS, b)
		}
		if b := LowerBoundsAt(o, k); b != r.LowerBoundsAt[k] {
			t.Errorf("%s: LowerBoundsAt(%d) = %+v, result has %+v", describe(o), k, b, r.LowerBoundsAt[k])
		}
	}
}

func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func TestParseSteps(t *testing.T) {
	got, err := ParseSteps(" 0:10Gbps, 300:2Gbps ,600:10Gbps", units.ParseRate)
	if err != nil {
		t.Fatal(err)
	}
	want := []Step{{0, 1.25e9}, {300, 2.5e8}, {600, 1.25e9}}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if got, err := ParseSteps("", units.ParseRate); got != nil || err != nil {
		t.Errorf(`ParseSteps("") = %v, %v; want nil, nil`, got, err)
	}
	num := func(s string) (float64, error) { return strconv.ParseFloat(s, 64) }
	if got, err := ParseSteps("5:1.5", num); err != nil || !slices.Equal(got, []Step{{5, 1.5}}) {
		t.Errorf(`ParseSteps("5:1.5") = %v, %v`, got, err)
	}
	bad := []struct{ in, want string }{
		{"0:1Gbps,300", `item 2 "300"`},
		{"x:1Gbps", `item 1 "x:1Gbps": iteration "x"`},
		{"-1:1Gbps", `item 1 "-1:1Gbps": iteration "-1"`},
		{"0:1Gbps,10:fast", `item 2 "10:fast"`},
		{"0:1Gbps,0:2Gbps", `item 2 "0:2Gbps": iteration 0 must come after`},
		{"5:1Gbps,3:2Gbps", `item 2 "3:2Gbps"`},
		{"0:0Gbps", `item 1 "0:0Gbps"`},
		{"0:1Gbps,", `item 2 ""`},
	}
	for _, c := range bad {
		_, err := ParseSteps(c.in, units.ParseRate)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseSteps(%q) = %v, want an error containing %q", c.in, err, c.want)
		}
	}
	if _, err := ParseSteps("0:-2", num); err == nil || !strings.Contains(err.Error(), "positive") {
		t.Errorf("negative value: %v", err)
	}
}

func TestDynamicsValidation(t *testing.T) {
	nan := math.NaN()
	cases := []invalidCase{
		{"bandwidth step negative iteration", func(o *Options) { o.BandwidthTrace = []Step{{-1, 1e6}} }, []string{"bandwidth trace step 0", "iteration -1"}},
		{"bandwidth steps unsorted", func(o *Options) { o.BandwidthTrace = []Step{{0, 1e6}, {5, 1e6}, {5, 2e6}} }, []string{"bandwidth trace step 2", "iteration 5", "step 1"}},
		{"bandwidth step zero", func(o *Options) { o.BandwidthTrace = []Step{{0, 1e6}, {3, 0}} }, []string{"bandwidth trace step 1", "iteration 3", "got 0"}},
		{"bandwidth step NaN", func(o *Options) { o.BandwidthTrace = []Step{{2, nan}} }, []string{"bandwidth trace step 0", "NaN"}},
		{"compute step negative", func(o *Options) { o.ComputeTrace = []Step{{1, -2}} }, []string{"compute trace step 0", "iteration 1", "-2"}},
		{"compute step Inf", func(o *Options) { o.ComputeTrace = []Step{{0, 1}, {4, math.Inf(1)}} }, []string{"compute trace step 1", "+Inf"}},
		{"straggler rank", func(o *Options) { o.Stragglers = map[int]float64{0: 2, 9: 2} }, []string{"straggler rank 9", "0..1"}},
		{"straggler negative rank", func(o *Options) { o.Stragglers = map[int]float64{-1: 2} }, []string{"straggler rank -1"}},
		{"straggler speedup", func(o *Options) { o.Stragglers = map[int]float64{1: 0.5} }, []string{"straggler rank 1", "0.5"}},
		{"straggler NaN", func(o *Options) { o.Stragglers = map[int]float64{1: nan} }, []string{"straggler rank 1", "NaN"}},
		{"link trace of a missing server", func(o *Options) { o.ServerLinkTraces = map[int][]Step{1: {{0, 1e6}}} }, []string{"link trace of server1", "the job has 1"}},
		{"link trace of a negative worker", func(o *Options) { o.WorkerLinkTraces = map[int][]Step{-1: {{0, 1e6}}} }, []string{"link trace of worker-1"}},
		{"link trace zero", func(o *Options) { o.ServerLinkTraces = map[int][]Step{0: {{0, 1e6}, {4, 0}}} }, []string{"link trace of server0 step 1", "iteration 4", "got 0"}},
		{"straggler trace rank", func(o *Options) { o.StragglerTraces = map[int][]Step{5: {{2, 2}}} }, []string{"straggler trace of rank 5", "0..1"}},
		{"straggler trace speedup", func(o *Options) { o.StragglerTraces = map[int][]Step{1: {{2, 2}, {4, 0.5}}} }, []string{"straggler trace of rank 1 step 1", "iteration 4", "0.5"}},
		{"straggler trace unsorted", func(o *Options) { o.StragglerTraces = map[int][]Step{0: {{4, 2}, {2, 1}}} }, []string{"straggler trace of rank 0 step 1", "iteration 2"}},
		{"straggler trace NaN", func(o *Options) { o.StragglerTraces = map[int][]Step{0: {{1, nan}}} }, []string{"straggler trace of rank 0 step 0", "NaN"}},
	}
	checkRefused(t, cases)
}

// TestNeutralDynamicsChangeNothing checks that traces and stragglers that
// change nothing give bit-identical runs, and that the toy example is
// still exact with them.
func TestNeutralDynamicsChangeNothing(t *testing.T) {
	for _, tp := range []topology{{PS, 4, 2}, {AllReduce, 4, 0}} {
		o := job(profile(t, "resnet50"), tp.arch, tp.workers, tp.servers, gbps10)
		o.Sched = presets(tp.arch)[2].cfg
		base := run(t, o)
		o.BandwidthTrace = []Step{{0, gbps10}, {3, gbps10}}
		o.ComputeTrace = []Step{{2, 1}}
		o.Stragglers = map[int]float64{1: 1}
		same := run(t, o)
		if !slices.Equal(base.IterationTimesS, same.IterationTimesS) || base.Events != same.Events || base.Bounds != same.Bounds {
			t.Errorf("%v: neutral dynamics changed the run: %v vs %v", tp, base.IterationTimesS, same.IterationTimesS)
		}
		for k, b := range same.LowerBoundsAt {
			if b != base.Bounds {
				t.Errorf("%v: iteration %d bounds %+v differ from the run's %+v", tp, k, b, base.Bounds)
			}
		}
	}
	o := toyOptions(t, sched.Config{PartitionBytes: 500_000, CreditBytes: 1_000_000, Order: sched.OrderPriority})
	o.BandwidthTrace = []Step{{0, 1e6}}
	for k, it := range run(t, o).IterationTimesS {
		if math.Abs(it-9) > 1e-9 {
			t.Errorf("toy3 with a flat trace: iteration %d took %v s, want 9", k, it)
		}
	}
}

// TestBandwidthDrop drops the bandwidth mid-run and restores it: the
// iterations in the slow phase take longer, the bounds follow the trace,
// every iteration stays above its own bound and bytes are conserved.
func TestBandwidthDrop(t *testing.T) {
	for _, tp := range []topology{{PS, 4, 4}, {PS, 4, 1}, {AllReduce, 4, 0}} {
		for _, ps := range presets(tp.arch) {
			o := job(profile(t, "vgg16"), tp.arch, tp.workers, tp.servers, gbps10)
			o.Sched, o.Iterations = ps.cfg, 15
			o.BandwidthTrace = []Step{{5, gbps1}, {10, gbps10}}
			r := run(t, o)
			checkIterationBounds(t, o, r)
			if tp.arch == PS {
				checkPSBytes(t, o, r)
			} else {
				checkRingBytes(t, o, r)
			}
			fast, slow, after := mean(r.IterationTimesS[1:5]), mean(r.IterationTimesS[6:10]), mean(r.IterationTimesS[11:])
			if !(slow > 2*fast) || !(slow > 2*after) {
				t.Errorf("%v %s: 10 Gbps %.4g s, 1 Gbps %.4g s, 10 Gbps again %.4g s per iteration: want the drop to show", tp, ps.name, fast, slow, after)
			}
			if b0, b5 := r.LowerBoundsAt[0], r.LowerBoundsAt[5]; !(b5.FluidS > b0.FluidS) || r.Bounds != b0 || r.LowerBoundsAt[10] != b0 {
				t.Errorf("%v %s: bounds %+v at 10 Gbps, %+v at 1 Gbps, initial %+v", tp, ps.name, b0, b5, r.Bounds)
			}
			for k, st := range r.Stats {
				if want := o.BandwidthAt(k); st.BandwidthBps != want {
					t.Errorf("%v %s: iteration %d stats bandwidth %g, want %g", tp, ps.name, k, st.BandwidthBps, want)
				}
			}
		}
	}
}

// TestSlowServerLink slows one server's link for the middle of a run: the
// slow phase is slower, every iteration stays above its own bounds, bytes
// are conserved, and weights that give the slow server its share of the
// bytes recover most of the loss (negative control: weights the other way
// round make it worse).
func TestSlowServerLink(t *testing.T) {
	o := job(profile(t, "vgg16"), PS, 8, 4, gbps10)
	o.Sched, o.Iterations = bsPS, 24
	o.ServerLinkTraces = map[int][]Step{1: {{8, gbps10 / 8}, {16, gbps10}}}
	r := run(t, o)
	checkIterationBounds(t, o, r)
	checkPSBytes(t, o, r)
	fast, slow := mean(r.IterationTimesS[2:7]), mean(r.IterationTimesS[10:15])
	if !(slow > 1.5*fast) {
		t.Fatalf("server 1 at 1/8: %.4g s per iteration, %.4g s before: want the slow link to show", slow, fast)
	}
	if b := r.LowerBoundsAt[10]; !(b.ServerLinkS > r.LowerBoundsAt[2].ServerLinkS) {
		t.Errorf("server bound %.4g s in the slow phase, %.4g s before", b.ServerLinkS, r.LowerBoundsAt[2].ServerLinkS)
	}
	weighed := func(w sched.ServerWeights) float64 {
		o := o
		o.Sched.ServerWeights = w
		o.ServerLinkTraces = map[int][]Step{1: {{0, gbps10 / 8}}}
		o.Iterations = 8
		return run(t, o).IterationTimeS
	}
	uniform := weighed(sched.ServerWeights{})
	follow := weighed(sched.ServerWeights{8, 1, 8, 8})
	wrong := weighed(sched.ServerWeights{1, 8, 1, 1})
	if !(follow < 0.75*uniform) || !(wrong > uniform) {
		t.Errorf("server 1 at 1/8: %.4g s per iteration uniform, %.4g s weighed 8:1:8:8, %.4g s weighed 1:8:1:1: want weights that follow the link to pay and the opposite to cost", uniform, follow, wrong)
	}
}

// TestStraggler checks that one slow worker slows the whole job to its
// pace, and that the bounds account for stragglers only when every worker
// is one.
func TestStraggler(t *testing.T) {
	for _, tp := range []topology{{PS, 4, 4}, {AllReduce, 4, 0}} {
		p := profile(t, "resnet50")
		o := job(p, tp.arch, tp.workers, tp.servers, gbps100)
		o.Sched = presets(tp.arch)[2].cfg
		base := run(t, o)
		o.Stragglers = map[int]float64{2: 2}
		r := run(t, o)
		checkIterationBounds(t, o, r)
		compute := p.ForwardS() + p.BackwardS()
		if !(r.IterationTimeS > 1.5*base.IterationTimeS) || r.IterationTimeS < 2*compute*(1-rel) {
			t.Errorf("%v: with rank 2 twice as slow %.4g s per iteration, without %.4g s, compute %.4g s", tp, r.IterationTimeS, base.IterationTimeS, compute)
		}
		if r.Bounds != base.Bounds {
			t.Errorf("%v: one straggler changed the bounds: %+v vs %+v", tp, r.Bounds, base.Bounds)
		}
		o.Stragglers = map[int]float64{0: 3, 1: 2, 2: 2.5, 3: 2}
		r = run(t, o)
		checkIterationBounds(t, o, r)
		if got := r.Bounds.ComputeS; math.Abs(got-2*compute) > rel*compute {
			t.Errorf("%v: every worker at least twice as slow: compute bound %.9g s, want %.9g", tp, got, 2*compute)
		}
	}
}

// TestStragglerTrace: a straggler that comes and goes. On one worker it is
// exactly a compute trace; on four, the iterations before it are those of
// the run without it, the iterations inside it are as slow as with a
// straggler for the whole run, and after it recovers the job is back to
// its old speed.
func TestStragglerTrace(t *testing.T) {
	p := profile(t, "resnet50")
	o := job(p, AllReduce, 1, 0, gbps10)
	o.Iterations = 8
	o.ComputeTrace = []Step{{3, 3}, {6, 1}}
	want := run(t, o)
	o.ComputeTrace, o.StragglerTraces = nil, map[int][]Step{0: {{3, 3}, {6, 1}}}
	if got := run(t, o); !slices.Equal(got.IterationTimesS, want.IterationTimesS) || got.Bounds != want.Bounds {
		t.Errorf("one worker: straggler trace %v, compute trace %v", got.IterationTimesS, want.IterationTimesS)
	}
	for _, tp := range []topology{{PS, 4, 4}, {AllReduce, 4, 0}} {
		o := job(p, tp.arch, tp.workers, tp.servers, gbps100)
		o.Sched, o.Iterations = presets(tp.arch)[2].cfg, 16
		base := run(t, o)
		o.Stragglers = map[int]float64{2: 2}
		whole := run(t, o)
		o.Stragglers, o.StragglerTraces = nil, map[int][]Step{2: {{5, 2}, {10, 1}}}
		r := run(t, o)
		checkIterationBounds(t, o, r)
		// Iteration 3's span ends with forward 4: untouched.
		if !slices.Equal(r.IterationTimesS[:4], base.IterationTimesS[:4]) {
			t.Errorf("%v: before the straggler: %v, without it %v", tp, r.IterationTimesS[:4], base.IterationTimesS[:4])
		}
		inside, slow := mean(r.IterationTimesS[6:9]), mean(whole.IterationTimesS[6:9])
		after, fast := mean(r.IterationTimesS[12:]), mean(base.IterationTimesS[12:])
		if math.Abs(inside/slow-1) > 0.02 || math.Abs(after/fast-1) > 0.02 {
			t.Errorf("%v: inside the window %.4g s (straggler all along: %.4g s), after it %.4g s (none: %.4g s)", tp, inside, slow, after, fast)
		}
		if r.Bounds != base.Bounds {
			t.Errorf("%v: one straggler changed the bounds: %+v vs %+v", tp, r.Bounds, base.Bounds)
		}
	}
}

// TestComputeTrace checks the compute multiplier on a job without
// communication, where iteration k is exactly backward k and forward k+1,
// and its effect on the statistics and bounds of a communicating job.
func TestComputeTrace(t *testing.T) {
	p := profile(t, "resnet50")
	fwd, bwd := p.ForwardS(), p.BackwardS()
	o := job(p, AllReduce, 1, 0, gbps10)
	o.Iterations = 8
	o.ComputeTrace = []Step{{3, 3}, {6, 0.5}}
	r := run(t, o)
	for k, it := range r.IterationTimesS {
		want := bwd*o.ComputeScaleAt(k) + fwd*o.ComputeScaleAt(k+1)
		if math.Abs(it-want) > rel*want {
			t.Errorf("iteration %d took %.9g s, want %.9g", k, it, want)
		}
		if st := r.Stats[k]; math.Abs(st.BackwardS-bwd*o.ComputeScaleAt(k)) > rel || math.Abs(st.ForwardS-fwd*o.ComputeScaleAt(k+1)) > rel {
			t.Errorf("iteration %d: stats forward %.9g s backward %.9g s", k, st.ForwardS, st.BackwardS)
		}
		if b := r.LowerBoundsAt[k]; math.Abs(b.ComputeS-want) > rel*want {
			t.Errorf("iteration %d: compute bound %.9g s, want %.9g", k, b.ComputeS, want)
		}
	}
	for _, tp := range []topology{{PS, 4, 2}, {AllReduce, 4, 0}} {
		o := job(p, tp.arch, tp.workers, tp.servers, gbps10)
		o.Sched, o.Iterations = presets(tp.arch)[2].cfg, 10
		o.ComputeTrace = []Step{{4, 2.5}}
		o.Jitter, o.Seed = 0.1, 7
		r := run(t, o)
		checkIterationBounds(t, o, r)
		if !(mean(r.IterationTimesS[5:]) > 1.3*mean(r.IterationTimesS[1:3])) {
			t.Errorf("%v: compute 2.5x slower from iteration 4: times %v", tp, r.IterationTimesS)
		}
	}
}

// scripted is a tuner that makes given proposals after given iterations.
type scripted struct {
	plan map[int]tune.Proposal // by observed iteration
	seen []int
}

func (*scripted) Name() string { return "scripted" }

func (s *scripted) Observe(st tune.Stats) (tune.Proposal, bool) {
	s.seen = append(s.seen, st.Iteration)
	p, ok := s.plan[st.Iteration]
	return p, ok
}

// runWithServers runs o and counts, per server key, the pushes that reach
// the servers; it checks that pieces of different epochs never share a key
// (iteration, tensor, piece, shard) and that each (epoch, key) receives
// exactly one push from every worker, all of one size.
func runWithServers(t *testing.T, o Options) *Result {
	t.Helper()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := newSimulation(o)
	if err != nil {
		t.Fatal(err)
	}
	type count struct {
		n      int
		bytes  int64
		server int32
	}
	byKey := map[pieceKey]*count{}
	epochOf := map[pieceKey]int32{}
	taskBytes := map[[3]int32]int64{} // by iteration, unit, epoch
	s.pushed = func(server int32, k pieceKey, bytes int64) {
		c := byKey[k]
		if c == nil {
			c = &count{bytes: bytes, server: server}
			byKey[k] = c
		}
		c.n++
		if c.bytes != bytes || c.server != server {
			t.Errorf("%s: push of %+v: %d bytes to server %d, an earlier one %d bytes to server %d", describe(o), k, bytes, server, c.bytes, c.server)
		}
		noEpoch := k
		noEpoch.epoch = 0
		if e, ok := epochOf[noEpoch]; ok && e != k.epoch {
			t.Errorf("%s: pieces of epochs %d and %d share key %+v", describe(o), e, k.epoch, noEpoch)
		}
		epochOf[noEpoch] = k.epoch
		taskBytes[[3]int32{k.iter, k.tensor, k.epoch}] += bytes
	}
	r, err := s.run()
	if err != nil {
		t.Fatalf("%s: %v", describe(o), err)
	}
	for k, c := range byKey {
		if c.n != o.Workers {
			t.Errorf("%s: server %d received %d pushes of %+v, want %d", describe(o), c.server, c.n, k, o.Workers)
		}
		if want := epochAt(r, int(k.iter)); int(k.epoch) != want {
			t.Errorf("%s: piece %+v of epoch %d, want %d", describe(o), k, k.epoch, want)
		}
	}
	// Tasks are units of the epoch's fusion (one tensor each without).
	units := s.workers[0].m.Units
	tasks := 0
	for k := range o.Iterations {
		tasks += len(units(epochAt(r, k)))
	}
	for k, b := range taskBytes {
		if want := units(int(k[2]))[k[1]].Bytes * int64(o.Workers); b != want {
			t.Errorf("%s: iteration %d unit %d of epoch %d: %d bytes pushed, want %d", describe(o), k[0], k[1], k[2], b, want)
		}
	}
	if len(taskBytes) != tasks && o.Arch == PS {
		t.Errorf("%s: %d tasks pushed, want %d", describe(o), len(taskBytes), tasks)
	}
	return r
}

// piecesPerWorker is how many pieces a worker schedules per iteration
// under a partition size.
// epochAt is the epoch of iteration k: the number of changes in force
// for it.
func epochAt(r *Result, k int) int {
	e := 0
	for _, ch := range r.Configs[1:] {
		if ch.FromIteration <= k {
			e++
		}
	}
	return e
}

func piecesPerWorker(o Options, part int64) int {
	return piecesUnder(o, sched.Config{PartitionBytes: part, FusionBytes: o.Sched.FusionBytes})
}

// piecesUnder is how many pieces one iteration of o's model is cut into
// under cfg's partition and fusion.
func piecesUnder(o Options, cfg sched.Config) int {
	var tensors []proto.Tensor
	elem := o.Profile.BytesPerParam
	for l, layer := range o.Profile.Layers {
		for _, t := range layer.Tensors {
			tensors = append(tensors, proto.Tensor{Layer: l, Bytes: t.Params * int64(elem), ElemBytes: elem})
		}
	}
	cfg = sched.Config{PartitionBytes: cfg.PartitionBytes, FusionBytes: cfg.FusionBytes} // all that cuts pieces
	m, err := proto.New(proto.Config{Workers: 1, Arch: proto.AllReduce, Tensors: tensors, Sched: cfg})
	if err != nil {
		panic(err)
	}
	n := 0
	for _, u := range m.Units(0) {
		n += int(sched.PieceCount(u.Bytes, int64(elem), cfg.PartitionBytes))
	}
	return n
}

// TestReconfigure changes partition and credit twice during a run and
// checks the changes apply exactly from the stated iterations, on every
// worker, with every byte conserved and no mixing of epochs at servers.
func TestReconfigure(t *testing.T) {
	a := sched.Config{PartitionBytes: 1e6, CreditBytes: 4e6, Order: sched.OrderPriority}
	b := sched.Config{PartitionBytes: 999_999, CreditBytes: 3e6, Order: sched.OrderPriority, Admission: sched.AdmitStrict}
	for _, tp := range []topology{{PS, 4, 3}, {PS, 5, 1}, {AllReduce, 4, 0}} {
		for _, initial := range []sched.Config{{}, bsPS} {
			o := job(profile(t, "vgg16"), tp.arch, tp.workers, tp.servers, gbps10)
			o.Sched, o.Iterations = initial, 10
			tu := &scripted{plan: map[int]tune.Proposal{
				1: {Config: a, FromIteration: 3},
				4: {Config: b, FromIteration: 7},
				8: {Config: a, FromIteration: 12}, // after the run: never applies
			}}
			o.Tuner = tu
			r := runWithServers(t, o)
			if !slices.Equal(tu.seen, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}) {
				t.Errorf("%v: tuner saw iterations %v", tp, tu.seen)
			}
			want := []ConfigChange{{FromIteration: 0, Config: initial}, {FromIteration: 3, Config: a}, {FromIteration: 7, Config: b}}
			if !slices.Equal(r.Configs, want) {
				t.Errorf("%v: configs %+v, want %+v", tp, r.Configs, want)
			}
			for k, n := range r.PiecesPerIteration {
				cfg := initial
				for _, ch := range want {
					if ch.FromIteration <= k {
						cfg = ch.Config
					}
				}
				if w := piecesPerWorker(o, cfg.PartitionBytes); n != w {
					t.Errorf("%v: iteration %d: %d pieces, want %d (partition %d)", tp, k, n, w, cfg.PartitionBytes)
				}
				if r.Stats[k].Config != cfg {
					t.Errorf("%v: iteration %d stats config %+v, want %+v", tp, k, r.Stats[k].Config, cfg)
				}
			}
			if r.Pieces != piecesPerWorker(o, b.PartitionBytes) {
				t.Errorf("%v: %d pieces in the last iteration, want %d", tp, r.Pieces, piecesPerWorker(o, b.PartitionBytes))
			}
			if tp.arch == PS {
				checkPSBytes(t, o, r)
			} else {
				checkRingBytes(t, o, r)
			}
			checkIterationBounds(t, o, r)
		}
	}
}

// TestReconfigureEffect checks that a change takes effect: switching from
// the unscheduled configuration to bytescheduler's mid-run gives the same
// steady iteration time as running bytescheduler throughout.
func TestReconfigureEffect(t *testing.T) {
	o := job(profile(t, "vgg16"), PS, 4, 4, gbps10)
	o.Iterations = 12
	o.Sched = bsPS
	static := run(t, o)
	o.Sched = sched.Config{}
	fifo := run(t, o)
	o.Tuner = &scripted{plan: map[int]tune.Proposal{0: {Config: bsPS, FromIteration: 2}}}
	r := run(t, o)
	if got, want := mean(r.IterationTimesS[4:]), mean(static.IterationTimesS[4:]); math.Abs(got-want) > 1e-6*want {
		t.Errorf("after switching to bytescheduler %.6g s per iteration, bytescheduler throughout %.6g s", got, want)
	}
	if got, want := r.IterationTimesS[0], fifo.IterationTimesS[0]; got != want {
		t.Errorf("iteration 0 before the change took %.6g s, unscheduled %.6g s", got, want)
	}
	if !(r.MeanIterationTimeS > static.MeanIterationTimeS) || !(r.MeanIterationTimeS < fifo.MeanIterationTimeS) {
		t.Errorf("mean %.6g s, want between bytescheduler %.6g s and unscheduled %.6g s", r.MeanIterationTimeS, static.MeanIterationTimeS, fifo.MeanIterationTimeS)
	}
}

// TestTunerProposalRejected checks that proposals the workers can no longer
// honour are refused with an error naming the tuner and the iterations.
func TestTunerProposalRejected(t *testing.T) {
	cases := []struct {
		name string
		plan map[int]tune.Proposal
		want []string
	}{
		{"next iteration", map[int]tune.Proposal{3: {Config: bsPS, FromIteration: 4}}, []string{"scripted", "iteration 4", "after iteration 3", "too late", "iteration 5 or later"}},
		{"same iteration", map[int]tune.Proposal{3: {Config: bsPS, FromIteration: 3}}, []string{"iteration 3", "too late"}},
		{"past", map[int]tune.Proposal{2: {Config: bsPS, FromIteration: 0}}, []string{"iteration 0", "too late"}},
		{"before a pending change", map[int]tune.Proposal{0: {Config: bsPS, FromIteration: 6}, 1: {Config: bsPS, FromIteration: 5}},
			[]string{"iteration 5", "after the change from iteration 6"}},
		{"invalid", map[int]tune.Proposal{0: {Config: sched.Config{CreditBytes: -3}, FromIteration: 4}}, []string{"invalid", "credit", "-3"}},
	}
	for _, tp := range []topology{{PS, 3, 2}, {AllReduce, 3, 0}} {
		for _, c := range cases {
			o := job(profile(t, "resnet50"), tp.arch, tp.workers, tp.servers, gbps10)
			o.Tuner = &scripted{plan: c.plan}
			r, err := runNoPanic(o)
			if err == nil {
				t.Fatalf("%v %s: accepted: %+v", tp, c.name, r.Configs)
			}
			if r != nil {
				t.Errorf("%v %s: result with error %v", tp, c.name, err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v %s: error %q does not mention %q", tp, c.name, err, w)
				}
			}
		}
	}
}

// TestStatsToy checks the statistics on ByteScheduler's unscheduled toy
// example (1 MB/s, no latency), worked out by hand: backward posts 1.5 MB
// at 1 s, 3 MB at 2 s and 1.5 MB at 3 s; they are in flight over [1, 4],
// [2, 8.5] and [3, 10]; the forward runs from 10 to 13.
func TestStatsToy(t *testing.T) {
	o := toyOptions(t, sched.Config{})
	r := run(t, o)
	if len(r.Stats) != o.Iterations {
		t.Fatalf("%d stats, want %d", len(r.Stats), o.Iterations)
	}
	for k, st := range r.Stats {
		want := tune.Stats{Iteration: k, IterationTimeS: 13, ForwardS: 3, BackwardS: 3, BandwidthBps: 1e6,
			GoodputBps: 6e6 / 13.0, QueueDelayS: 0, Overlap: 2.0 / 9, InFlightBytes: (1.5*3 + 3*6.5 + 1.5*7) * 1e6 / 13,
			ModelBytes: 6e6, Tensors: 3, SizeSkew: 1.5, Workers: 1, Servers: 1, Arch: "ps"}
		if !statsClose(st, want) {
			t.Errorf("iteration %d: stats\n%+v, want\n%+v", k, st, want)
		}
	}
	if r.MeanIterationTimeS != 13 {
		t.Errorf("mean iteration %v s, want 13", r.MeanIterationTimeS)
	}
}

func statsClose(a, b tune.Stats) bool {
	near := func(x, y float64) bool { return math.Abs(x-y) <= 1e-9*max(1, math.Abs(y)) }
	return a.Iteration == b.Iteration && near(a.IterationTimeS, b.IterationTimeS) && near(a.ForwardS, b.ForwardS) &&
		near(a.BackwardS, b.BackwardS) && near(a.BandwidthBps, b.BandwidthBps) && near(a.GoodputBps, b.GoodputBps) &&
		near(a.QueueDelayS, b.QueueDelayS) && near(a.Overlap, b.Overlap) && near(a.InFlightBytes, b.InFlightBytes) &&
		a.Config == b.Config && a.ModelBytes == b.ModelBytes && a.Tensors == b.Tensors && near(a.SizeSkew, b.SizeSkew) &&
		a.Workers == b.Workers && a.Servers == b.Servers && a.Arch == b.Arch
}

// TestStatsSane checks ranges and identities of the statistics on zoo jobs.
func TestStatsSane(t *testing.T) {
	for _, tp := range []topology{{PS, 8, 4}, {AllReduce, 8, 0}} {
		for _, ps := range presets(tp.arch) {
			o := job(profile(t, "resnet50"), tp.arch, tp.workers, tp.servers, gbps10)
			o.Sched = ps.cfg
			r := run(t, o)
			n := float64(o.Workers)
			for k, st := range r.Stats {
				sent := float64(o.Profile.TotalBytes()) // by rank 0
				if tp.arch == AllReduce {
					sent *= 2 * (n - 1) / n
				}
				// The leader's span is at most the slowest worker's.
				if !(st.IterationTimeS > 0) || st.IterationTimeS > r.IterationTimesS[k]*(1+rel) || math.Abs(st.GoodputBps*st.IterationTimeS-sent) > 1e-6*sent ||
					st.Overlap < 0 || st.Overlap > 1 || st.QueueDelayS < 0 || st.InFlightBytes <= 0 ||
					math.Abs(st.ForwardS-o.Profile.ForwardS()) > rel || math.Abs(st.BackwardS-o.Profile.BackwardS()) > rel {
					t.Errorf("%v %s: iteration %d: implausible stats %+v (iteration %v s)", tp, ps.name, k, st, r.IterationTimesS[k])
				}
				if c := ps.cfg.CreditBytes; c > 0 && ps.cfg.Admission == sched.AdmitPositive && st.InFlightBytes > float64(c+ps.cfg.PartitionBytes) {
					t.Errorf("%v %s: iteration %d: %g bytes in flight on average, credit %d", tp, ps.name, k, st.InFlightBytes, c)
				}
			}
		}
	}
}

// TestGridTuner runs the grid tuner in the simulator: it tries each
// candidate for K iterations at the stated iterations, then fixes the best,
// which matches the best static configuration of the same conditions; and
// the whole run is deterministic.
func TestGridTuner(t *testing.T) {
	o := job(profile(t, "vgg16"), PS, 4, 4, gbps10)
	o.Iterations = 20
	cands := []sched.Config{{}, bsPS, {PartitionBytes: 64e6, CreditBytes: 64e6, Order: sched.OrderPriority}}
	newGrid := func() *tune.Grid {
		g, err := tune.NewGrid(cands, 3)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	g := newGrid()
	o.Tuner = g
	r := run(t, o)
	best, ok := g.Best()
	if !ok {
		t.Fatalf("grid chose nothing in %d iterations: %+v", o.Iterations, g.Trials())
	}
	want := []ConfigChange{{FromIteration: 0, Config: sched.Config{}}, {FromIteration: 2, Config: cands[0]}, {FromIteration: 5, Config: cands[1]}, {FromIteration: 8, Config: cands[2]}}
	if best != cands[2] {
		want = append(want, ConfigChange{FromIteration: 12, Config: best})
	}
	if !slices.Equal(r.Configs, want) {
		t.Errorf("configs %+v, want %+v", r.Configs, want)
	}
	static := o
	static.Tuner = nil
	bi, results, err := BestStatic(static, cands)
	if err != nil {
		t.Fatal(err)
	}
	if cands[bi] != best {
		t.Errorf("grid chose %+v, best static in hindsight is %+v (means %v; grid trials %+v)", best, cands[bi],
			[]float64{results[0].MeanIterationTimeS, results[1].MeanIterationTimeS, results[2].MeanIterationTimeS}, g.Trials())
	}
	o.Tuner = newGrid()
	again := run(t, o)
	if !slices.Equal(r.IterationTimesS, again.IterationTimesS) || !slices.Equal(r.Configs, again.Configs) || r.Events != again.Events {
		t.Errorf("two grid runs differ: %v %+v vs %v %+v", r.IterationTimesS, r.Configs, again.IterationTimesS, again.Configs)
	}
	o.Tuner = tune.NewStatic(sched.Config{})
	if s := run(t, o); len(s.Configs) != 1 || !slices.Equal(s.IterationTimesS, results[0].IterationTimesS) {
		t.Errorf("static tuner changed the run: configs %+v", s.Configs)
	}
}

// TestBestStaticErrors checks BestStatic refuses an empty candidate list
// and names a bad candidate.
func TestBestStaticErrors(t *testing.T) {
	o := job(profile(t, "toy3"), PS, 2, 1, 1e6)
	if _, _, err := BestStatic(o, nil); err == nil {
		t.Error("BestStatic accepted no candidates")
	}
	_, _, err := BestStatic(o, []sched.Config{{}, {PartitionBytes: -1}})
	if err == nil || !strings.Contains(err.Error(), "candidate 1") {
		t.Errorf("bad candidate: %v", err)
	}
}

// randomTuner proposes a random configuration now and then, always in
// time.
type randomTuner struct {
	rng  *rand.Rand
	next int // earliest iteration of the next proposal
	// tiny allows partitions of a few bytes (for small tensors only: a
	// piece per element of a large tensor makes a very long run).
	tiny bool
}

func (*randomTuner) Name() string { return "random" }

func (r *randomTuner) Observe(st tune.Stats) (tune.Proposal, bool) {
	if r.rng.IntN(3) != 0 {
		return tune.Proposal{}, false
	}
	from := max(st.Iteration+tune.Lead+r.rng.IntN(3), r.next)
	r.next = from + 1
	pick := func(xs ...int64) int64 { return xs[r.rng.IntN(len(xs))] }
	part := pick(0, 100_000, 999_999)
	if r.tiny && r.rng.IntN(2) == 0 {
		part = 7
	}
	return tune.Proposal{FromIteration: from, Config: sched.Config{PartitionBytes: part,
		CreditBytes: pick(0, 1, 100_000, 4_000_000), Order: sched.Order(r.rng.IntN(2)), Admission: sched.Admission(r.rng.IntN(2)),
		FusionBytes: pick(0, 0, 1000, 5_000_000)}}, true
}

// TestRandomDynamics runs random jobs under random traces, stragglers and
// reconfigurations, and checks per-iteration bounds, byte conservation and
// that epochs never mix at servers.
func TestRandomDynamics(t *testing.T) {
	seeds := uint64(300)
	if testing.Short() {
		seeds = 60
	}
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(seed, 2))
		o := randomJob(rng)
		o.Iterations = 2 + rng.IntN(8)
		steps := func(scale float64) []Step {
			var s []Step
			for k := rng.IntN(3); k < o.Iterations; k += 1 + rng.IntN(3) {
				s = append(s, Step{Iteration: k, Value: scale * (0.2 + 2*rng.Float64())})
			}
			return s
		}
		o.BandwidthTrace = steps(o.BandwidthBps)
		o.ComputeTrace = steps(1)
		if rng.IntN(2) == 0 {
			o.Stragglers = map[int]float64{rng.IntN(o.Workers): 1 + 2*rng.Float64()}
		}
		if rng.IntN(2) == 0 {
			// Stragglers that come and go, sometimes on every worker (then
			// they raise the compute bound).
			o.StragglerTraces = map[int][]Step{}
			for r := range o.Workers {
				if rng.IntN(2) == 0 || o.Workers <= 2 {
					o.StragglerTraces[r] = steps(1)
					for i := range o.StragglerTraces[r] {
						o.StragglerTraces[r][i].Value += 0.8
					}
				}
			}
		}
		o.Tuner = &randomTuner{rng: rand.New(rand.NewPCG(seed, 3)), tiny: o.Profile.TotalBytes() < 20_000}
		name := fmt.Sprintf("seed %d: %s traces %v %v stragglers %v %v", seed, describe(o), o.BandwidthTrace, o.ComputeTrace, o.Stragglers, o.StragglerTraces)
		var r *Result
		if o.Arch == PS {
			r = runWithServers(t, o)
			checkPSBytes(t, o, r)
		} else {
			var err error
			if r, err = runNoPanic(o); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			checkRingBytes(t, o, r)
		}
		checkIterationBounds(t, o, r)
		for k, n := range r.PiecesPerIteration {
			if w := piecesUnder(o, r.Stats[k].Config); n != w {
				t.Errorf("%s: iteration %d: %d pieces, want %d", name, k, n, w)
			}
		}
		if t.Failed() {
			t.Fatalf("%s failed", name)
		}
	}
}

// TestDynamicsDeterministic checks that traces, stragglers, jitter and a
// tuner together still make a run a pure function of its options.
func TestDynamicsDeterministic(t *testing.T) {
	for _, tp := range []topology{{PS, 6, 3}, {AllReduce, 6, 0}} {
		mk := func() Options {
			o := job(profile(t, "resnet50"), tp.arch, tp.workers, tp.servers, gbps10)
			o.Iterations = 10
			o.BandwidthTrace = []Step{{3, gbps1}, {7, gbps10}}
			o.ComputeTrace = []Step{{5, 1.5}}
			o.Stragglers = map[int]float64{1: 1.3, 4: 1.1}
			o.Jitter, o.Seed = 0.2, 9
			o.Tuner = &randomTuner{rng: rand.New(rand.NewPCG(5, 5))}
			return o
		}
		a, b := run(t, mk()), run(t, mk())
		if !slices.Equal(a.IterationTimesS, b.IterationTimesS) || a.Events != b.Events || !slices.Equal(a.Configs, b.Configs) ||
			!reflect.DeepEqual(a.Stats, b.Stats) {
			t.Errorf("%v: equal options, different runs: %v vs %v", tp, a.IterationTimesS, b.IterationTimesS)
		}
	}
}

// TestStatsRoundTrip: every iteration's statistics carry the round trip
// between two hosts, twice the configured one-way latency.
func TestStatsRoundTrip(t *testing.T) {
	for _, lat := range []float64{0, 30e-6} {
		o := toyOptions(t, sched.Config{})
		o.LatencyS = lat
		r := run(t, o)
		for k, st := range r.Stats {
			if st.RoundTripS != 2*lat {
				t.Errorf("latency %v s, iteration %d: round trip %v s, want %v", lat, k, st.RoundTripS, 2*lat)
			}
		}
	}
}

// TestComputeBound: conditions that would make one iteration compute for
// more than a day are refused, and the largest factor of each kind counts
// (a straggler window and a trace step late in the run included); a run
// just under the bound is accepted (the check is not vacuous either way).
func TestComputeBound(t *testing.T) {
	p := profile(t, "toy3")
	base := func() Options { return job(p, PS, 2, 1, 1e6) }
	compute := p.ForwardS() + p.BackwardS()
	under := model.MaxIterationComputeS / compute * 0.99
	cases := []struct {
		name   string
		set    func(o *Options)
		refuse bool
	}{
		{"nothing", func(o *Options) {}, false},
		{"trace just under", func(o *Options) { o.ComputeTrace = []Step{{0, 1}, {2, under}} }, false},
		{"trace over", func(o *Options) { o.ComputeTrace = []Step{{0, 1}, {2, under * 2}} }, true},
		{"straggler over", func(o *Options) { o.Stragglers = map[int]float64{1: under * 2} }, true},
		{"straggler window over", func(o *Options) { o.StragglerTraces = map[int][]Step{1: {{1, under * 2}, {2, 1}}} }, true},
		{"factors multiply", func(o *Options) {
			o.ComputeTrace = []Step{{0, under / 2}}
			o.Stragglers = map[int]float64{0: 3}
		}, true},
		{"jitter", func(o *Options) { o.Jitter = under * 2 }, true},
	}
	for _, c := range cases {
		o := base()
		c.set(&o)
		err := o.Validate()
		switch {
		case c.refuse && (err == nil || !strings.Contains(err.Error(), "an iteration could compute for")):
			t.Errorf("%s: Validate = %v, want the compute bound's error", c.name, err)
		case !c.refuse && err != nil:
			t.Errorf("%s: Validate = %v, want nil", c.name, err)
		}
	}
}
