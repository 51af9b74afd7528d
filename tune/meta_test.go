package tune_test

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/autobyte/autobyte/model"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/sim"
	"github.com/autobyte/autobyte/tune"
)

// metaSimulate runs one scenario under cfg as 'autobyte tune train' does
// (cmd/autobyte/tune_cmd.go): mean statistics after the first fifth,
// steady-state time, 4 MB shards on parameter servers.
func metaSimulate(t testing.TB, sc tune.MetaScenario, cfg sched.Config, iterations int) tune.MetaRun {
	p, err := model.Get(sc.Model)
	if err != nil {
		t.Fatal(err)
	}
	arch, err := sim.ParseArch(sc.Arch)
	if err != nil {
		t.Fatal(err)
	}
	o := sim.Options{Profile: p.Scaled(sc.ComputeScale), Arch: arch, Workers: sc.Workers, Servers: sc.Servers,
		BandwidthBps: sc.BandwidthBps, LatencyS: sc.LatencyS, Sched: cfg, Iterations: iterations}
	if arch == sim.PS {
		o.ShardBytes = 4_000_000
	}
	r, err := sim.Run(o)
	if err != nil {
		t.Fatalf("%s %+v: %v", sc, cfg, err)
	}
	skip := max(1, len(r.Stats)/5)
	return tune.MetaRun{Config: cfg, Stats: tune.MeanStats(r.Stats[skip:]), IterationTimeS: r.IterationTimeS}
}

// metaHeldOut are evaluation scenarios of the models the shipped weights
// were not trained on, chosen by hand to cover both architectures, slow and
// fast networks and compute scales at test-friendly sizes.
var metaHeldOut = []tune.MetaScenario{
	{Model: "resnet101", Arch: "ps", Workers: 8, Servers: 8, BandwidthBps: 10e9 / 8, LatencyS: 50e-6, ComputeScale: 1},
	{Model: "resnet101", Arch: "ps", Workers: 16, Servers: 4, BandwidthBps: 40e9 / 8, LatencyS: 20e-6, ComputeScale: 2},
	{Model: "resnet101", Arch: "allreduce", Workers: 16, BandwidthBps: 5e9 / 8, LatencyS: 50e-6, ComputeScale: 1},
	{Model: "gpt2", Arch: "ps", Workers: 8, Servers: 4, BandwidthBps: 25e9 / 8, LatencyS: 30e-6, ComputeScale: 1},
	{Model: "gpt2", Arch: "ps", Workers: 12, Servers: 12, BandwidthBps: 3e9 / 8, LatencyS: 80e-6, ComputeScale: 0.7},
	{Model: "gpt2", Arch: "allreduce", Workers: 8, BandwidthBps: 2e9 / 8, LatencyS: 50e-6, ComputeScale: 1.5},
}

// TestMetaHeldOut checks the shipped network's predictions on held-out
// models over the whole candidate grid: the rank correlation between
// predicted and simulated times (every run in turn as the current state)
// and the simulated time of the predicted best against the true best.
func TestMetaHeldOut(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates the whole grid for 6 scenarios")
	}
	m, err := tune.DefaultMeta()
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range metaHeldOut {
		if slices.Contains(m.Header.TrainModels, sc.Model) {
			t.Fatalf("%s was used in training (%v)", sc.Model, m.Header.TrainModels)
		}
	}
	grid := tune.Cross(sched.Config{Order: sched.OrderPriority}, tune.DefaultMetaPartitions, tune.DefaultMetaCredits)
	data := make([]tune.MetaScenarioRuns, len(metaHeldOut))
	type job struct{ s, c int }
	jobs := make(chan job)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for j := range jobs {
				data[j.s].Runs[j.c] = metaSimulate(t, metaHeldOut[j.s], grid[j.c], 6)
			}
		})
	}
	for s, sc := range metaHeldOut {
		data[s] = tune.MetaScenarioRuns{Scenario: sc, Runs: make([]tune.MetaRun, len(grid))}
	}
	for s := range metaHeldOut {
		for c := range grid {
			jobs <- job{s, c}
		}
	}
	close(jobs)
	wg.Wait()
	ev := tune.EvaluateMeta(m, data)
	for _, s := range ev.Scenarios {
		t.Logf("%-45s spread %6.1f%% spearman %5.2f best gap %4.1f%%", s.Scenario, 100*s.Spread, s.Spearman, 100*s.BestGap)
	}
	t.Logf("mean spearman %.3f over %d ranked scenarios, mean best gap %.2f%%, worst %.2f%%, mse %.4f",
		ev.MeanSpearman, ev.Ranked, 100*ev.MeanBestGap, 100*ev.WorstBestGap, ev.MSE)
	// The design target is a mean rank correlation >= 0.8. The shipped
	// ensemble meets it on parameter servers (0.88 here). On the ring it
	// does not (about 0.5): since the ring honours priority, most of an
	// all-reduce grid reaches one plateau and the network orders the few
	// slow corners only in part (docs/tuner.md). There it must still
	// choose well: every scenario's best gap is bounded below.
	var psSp float64
	var psN int
	for _, s := range ev.Scenarios {
		if strings.Contains(s.Scenario.String(), " ps ") && s.Spread >= tune.MetaMinSpread {
			psSp += s.Spearman
			psN++
		}
		if s.BestGap > 0.05 {
			t.Errorf("%s: best gap %.1f%%, want <= 5%%", s.Scenario, 100*s.BestGap)
		}
	}
	if psN == 0 || psSp/float64(psN) < 0.8 {
		t.Errorf("mean rank correlation %.3f over %d parameter-server scenarios, want >= 0.8", psSp/float64(max(psN, 1)), psN)
	}
	if ev.MeanBestGap > 0.02 {
		t.Errorf("mean best gap %.1f%%, want <= 2%%", 100*ev.MeanBestGap)
	}
}

// TestMetaShipped checks the shipped weights load, carry their header and
// predict finite values.
func TestMetaShipped(t *testing.T) {
	m, err := tune.DefaultMeta()
	if err != nil {
		t.Fatal(err)
	}
	h := m.Header
	if h.Seed != 1 || h.TrainScenarios < 50 || len(h.HeldOutModels) == 0 || h.Examples == 0 || !strings.Contains(h.Command, "tune train") {
		t.Errorf("header %+v", h)
	}
	for _, mdl := range h.HeldOutModels {
		if slices.Contains(h.TrainModels, mdl) {
			t.Errorf("held-out model %s is also a training model", mdl)
		}
	}
	s := metaState()
	for _, c := range tune.Cross(sched.Config{Order: sched.OrderPriority}, tune.DefaultMetaPartitions, tune.DefaultMetaCredits) {
		if y := m.PredictLog(s, c); math.IsNaN(y) || math.IsInf(y, 0) {
			t.Fatalf("prediction %v for %+v", y, c)
		}
	}
	// The copy is independent.
	c := m.Clone()
	c.Layers[0].W[0] += 1
	if m.Layers[0].W[0] == c.Layers[0].W[0] {
		t.Error("Clone shares weights")
	}
}

// metaState is a plausible window of statistics (resnet50-like, 8 workers).
func metaState() tune.Stats {
	return tune.Stats{Iteration: 10, IterationTimeS: 0.25, ForwardS: 0.035, BackwardS: 0.07, BandwidthBps: 1.25e9,
		GoodputBps: 0.4e9, QueueDelayS: 0.01, Overlap: 0.4, InFlightBytes: 8e6,
		Config:     sched.Config{PartitionBytes: 4e6, CreditBytes: 16e6, Order: sched.OrderPriority},
		ModelBytes: 102e6, Tensors: 161, SizeSkew: 14, Workers: 8, Servers: 8, Arch: "ps"}
}

func TestParseMetaErrors(t *testing.T) {
	m, _ := tune.DefaultMeta()
	bad := m.Clone()
	bad.InStd[3] = 0
	b, _ := json.Marshal(bad)
	if _, err := tune.ParseMeta(b); err == nil || !strings.Contains(err.Error(), "deviation 0") {
		t.Errorf("zero deviation: %v", err)
	}
	bad = m.Clone()
	bad.Features[2] = "nonsense"
	b, _ = json.Marshal(bad)
	if _, err := tune.ParseMeta(b); err == nil || !strings.Contains(err.Error(), `"nonsense"`) {
		t.Errorf("renamed feature: %v", err)
	}
	bad = m.Clone()
	bad.Layers[1].W = bad.Layers[1].W[:5]
	b, _ = json.Marshal(bad)
	if _, err := tune.ParseMeta(b); err == nil || !strings.Contains(err.Error(), "layer 1") {
		t.Errorf("short layer: %v", err)
	}
	if _, err := tune.ParseMeta([]byte("{")); err == nil {
		t.Error("truncated JSON accepted")
	}
}

// TestTrainMetaDeterministic trains twice on the same synthetic data and
// checks the weights are equal and the fit is good.
func TestTrainMetaDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var ex []tune.MetaExample
	for range 400 {
		s := metaState()
		s.BandwidthBps *= math.Exp(rng.Float64()*4 - 2)
		c := sched.Config{PartitionBytes: int64(1e5 * math.Exp(rng.Float64()*6)), CreditBytes: int64(1e6 * math.Exp(rng.Float64()*6)), Order: sched.OrderPriority}
		x := tune.MetaFeatures(nil, s, c)
		// A smooth made-up target: best partition near 1 MB.
		y := 0.1*math.Pow(math.Log(float64(c.PartitionBytes)/1e6), 2) + 0.05*math.Log(s.BandwidthBps)
		ex = append(ex, tune.MetaExample{X: x, Y: y})
	}
	o := tune.MetaTrainOptions{Hidden: []int{8, 8}, Epochs: 60, Batch: 16, LR: 3e-3, Seed: 9}
	a, la, err := tune.TrainMeta(ex, o)
	if err != nil {
		t.Fatal(err)
	}
	b, lb, _ := tune.TrainMeta(ex, o)
	if la != lb || !slices.Equal(a.Layers[0].W, b.Layers[0].W) || !slices.Equal(a.Layers[2].W, b.Layers[2].W) {
		t.Errorf("two trainings differ: loss %v vs %v", la, lb)
	}
	var variance, mean float64
	for _, e := range ex {
		mean += e.Y / float64(len(ex))
	}
	for _, e := range ex {
		variance += (e.Y - mean) * (e.Y - mean) / float64(len(ex))
	}
	if la > 0.1*variance {
		t.Errorf("training loss %v, want well below the target variance %v", la, variance)
	}
	if _, _, err := tune.TrainMeta(nil, o); err == nil {
		t.Error("no examples accepted")
	}
	ex[5].Y = math.NaN()
	if _, _, err := tune.TrainMeta(ex, o); err == nil || !strings.Contains(err.Error(), "example 5") {
		t.Errorf("NaN target: %v", err)
	}
}

// metaExamples are made-up examples with a smooth target (best partition
// near 1 MB).
func metaExamples(n int) []tune.MetaExample {
	rng := rand.New(rand.NewPCG(3, 4))
	var ex []tune.MetaExample
	for range n {
		s := metaState()
		s.BandwidthBps *= math.Exp(rng.Float64()*4 - 2)
		c := sched.Config{PartitionBytes: int64(1e5 * math.Exp(rng.Float64()*6)), CreditBytes: int64(1e6 * math.Exp(rng.Float64()*6)), Order: sched.OrderPriority}
		y := 0.1*math.Pow(math.Log(float64(c.PartitionBytes)/1e6), 2) + 0.05*math.Log(s.BandwidthBps)
		ex = append(ex, tune.MetaExample{X: tune.MetaFeatures(nil, s, c), Y: y})
	}
	return ex
}

// checkScore: Score, which runs several candidates at once, gives exactly
// PredictLog's answers (42 candidates: 10 groups of 4 and 2 alone).
func checkScore(t *testing.T, m *tune.Meta) {
	t.Helper()
	grid := tune.Cross(sched.Config{Order: sched.OrderPriority}, tune.DefaultMetaPartitions, tune.DefaultMetaCredits)
	for _, bw := range []float64{0.1, 1, 10} {
		s := metaState()
		s.BandwidthBps *= bw
		got := m.Score(nil, s, grid)
		for i, c := range grid {
			if want := m.PredictLog(s, c); got[i] != want {
				t.Errorf("bandwidth x%v, %+v: Score %v, PredictLog %v", bw, c, got[i], want)
			}
		}
	}
}

// TestMetaScoreExact: Score equals PredictLog bit for bit for the shipped
// network.
func TestMetaScoreExact(t *testing.T) {
	m, err := tune.DefaultMeta()
	if err != nil {
		t.Fatal(err)
	}
	checkScore(t, m)
	one := m.Clone()
	one.Ensemble = nil
	checkScore(t, one)
}

// TestMetaEnsemble: an ensemble's first member is the network a single
// training gives, its prediction is the mean of its members', training is
// deterministic, fine-tuning moves every member and lowers the error, Clone
// copies every member, and ParseMeta rejects a member of the wrong shape.
func TestMetaEnsemble(t *testing.T) {
	ex := metaExamples(300)
	o := tune.MetaTrainOptions{Hidden: []int{8, 8}, Epochs: 20, Batch: 16, LR: 3e-3, Seed: 9}
	one, _, err := tune.TrainMeta(ex, o)
	if err != nil {
		t.Fatal(err)
	}
	o.Members = 3
	m, _, err := tune.TrainMeta(ex, o)
	if err != nil {
		t.Fatal(err)
	}
	again, _, _ := tune.TrainMeta(ex, o)
	if len(m.Ensemble) != 2 || m.Header.Members != 3 {
		t.Fatalf("%d further members, header says %d; want 2 and 3", len(m.Ensemble), m.Header.Members)
	}
	if !slices.Equal(one.Layers[0].W, m.Layers[0].W) {
		t.Error("member 0 differs from the single network of the same seed")
	}
	if slices.Equal(m.Layers[0].W, m.Ensemble[0][0].W) {
		t.Error("members 0 and 1 are equal")
	}
	for k := range m.Ensemble {
		if !slices.Equal(m.Ensemble[k][1].W, again.Ensemble[k][1].W) {
			t.Errorf("member %d differs between two trainings", k+1)
		}
	}
	single := func(layers []tune.MetaLayer) *tune.Meta {
		c := m.Clone()
		c.Layers, c.Ensemble = layers, nil
		return c
	}
	s := metaState()
	for _, c := range tune.Cross(sched.Config{Order: sched.OrderPriority}, tune.DefaultMetaPartitions, tune.DefaultMetaCredits)[:10] {
		want := single(m.Layers).PredictLog(s, c)
		for _, e := range m.Ensemble {
			want += single(e).PredictLog(s, c)
		}
		want /= 3
		if got := m.PredictLog(s, c); math.Abs(got-want) > 1e-12 {
			t.Errorf("%+v: ensemble predicts %v, mean of members %v", c, got, want)
		}
	}
	checkScore(t, m)
	c := m.Clone()
	c.Ensemble[1][0].W[0] += 1
	if c.Ensemble[1][0].W[0] == m.Ensemble[1][0].W[0] {
		t.Error("Clone shares an ensemble member's weights")
	}
	ft := m.Clone()
	before := ft.FineTune(ex[:16], 1, 0.05)
	after := ft.FineTune(ex[:16], 1, 0)
	if !(after < before) {
		t.Errorf("fine-tuning: loss %v, then %v; want lower", before, after)
	}
	for k := range ft.Ensemble {
		if slices.Equal(ft.Ensemble[k][0].W, m.Ensemble[k][0].W) {
			t.Errorf("fine-tuning left member %d unchanged", k+1)
		}
	}
	bad := m.Clone()
	bad.Ensemble[1] = bad.Ensemble[1][:2]
	b, _ := json.Marshal(bad)
	if _, err := tune.ParseMeta(b); err == nil || !strings.Contains(err.Error(), "ensemble member 2") {
		t.Errorf("short member: %v", err)
	}
	o.Members = -1
	if _, _, err := tune.TrainMeta(ex, o); err == nil || !strings.Contains(err.Error(), "-1") {
		t.Errorf("members -1: %v", err)
	}
}

func TestSpearman(t *testing.T) {
	for _, c := range []struct {
		x, y []float64
		want float64
	}{
		{[]float64{1, 2, 3, 4}, []float64{10, 20, 30, 40}, 1},
		{[]float64{1, 2, 3, 4}, []float64{4, 3, 2, 1}, -1},
		{[]float64{1, 2, 3}, []float64{1, 9, 4}, 0.5},
		{[]float64{1, 1, 2}, []float64{1, 2, 3}, math.Sqrt(0.75)},
	} {
		if got := tune.Spearman(c.x, c.y); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("Spearman(%v, %v) = %v, want %v", c.x, c.y, got, c.want)
		}
	}
	if got := tune.Spearman([]float64{1, 2}, []float64{3, 3}); !math.IsNaN(got) {
		t.Errorf("constant: %v, want NaN", got)
	}
}

func TestMetaLogSpace(t *testing.T) {
	p := tune.DefaultMetaPartitions
	c := tune.DefaultMetaCredits
	if len(p) != 6 || p[0] != 256<<10 || p[5] != 64<<20 || len(c) != 7 || c[0] != 1<<20 || c[6] != 1<<30 {
		t.Errorf("grid %v × %v", p, c)
	}
	for i := 1; i < len(p); i++ {
		if r := float64(p[i]) / float64(p[i-1]); math.Abs(r-math.Pow(256, 0.2)) > 0.01 {
			t.Errorf("partition ratio %v", r)
		}
	}
}

// BenchmarkDecide is one decision: scoring the whole 6 × 7 grid.
func BenchmarkDecide(b *testing.B) {
	m, err := tune.DefaultMeta()
	if err != nil {
		b.Fatal(err)
	}
	grid := tune.Cross(sched.Config{Order: sched.OrderPriority}, tune.DefaultMetaPartitions, tune.DefaultMetaCredits)
	s := metaState()
	var scores []float64
	for b.Loop() {
		scores = m.Score(scores, s, grid)
	}
}

// BenchmarkFineTune is one online fine-tuning step on a full minibatch (16
// examples, the tuner's default).
func BenchmarkFineTune(b *testing.B) {
	m, err := tune.DefaultMeta()
	if err != nil {
		b.Fatal(err)
	}
	s := metaState()
	var ex []tune.MetaExample
	for i, c := range tune.Cross(sched.Config{Order: sched.OrderPriority}, tune.DefaultMetaPartitions, tune.DefaultMetaCredits)[:16] {
		ex = append(ex, tune.MetaExample{X: tune.MetaFeatures(nil, s, c), Y: 0.1 * float64(i)})
	}
	for b.Loop() {
		m.FineTune(ex, 1, 0.001)
	}
}

// TestMetaFeaturesRoundTripRange: round trips outside the training range
// (20-200 µs) are seen as its nearest end, none as the 100 µs default, and
// within the range the round trip changes the features.
func TestMetaFeaturesRoundTripRange(t *testing.T) {
	s := metaState()
	cand := sched.Config{PartitionBytes: 1 << 20, CreditBytes: 8 << 20}
	at := func(rtt float64) []float64 {
		st := s
		st.RoundTripS = rtt
		return tune.MetaFeatures(nil, st, cand)
	}
	for _, c := range []struct{ rtt, as float64 }{{5e-6, 20e-6}, {1e-9, 20e-6}, {1e-3, 200e-6}, {0, 100e-6}, {math.NaN(), 100e-6}} {
		if got, want := at(c.rtt), at(c.as); !slices.Equal(got, want) {
			t.Errorf("round trip %v s: features %v, want those of %v s: %v", c.rtt, got, c.as, want)
		}
	}
	if slices.Equal(at(30e-6), at(150e-6)) {
		t.Error("round trips of 30 and 150 µs give the same features")
	}
}
