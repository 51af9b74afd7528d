package tune

// Offline training of the meta-network. The data come from simulated runs
// (the caller runs them: this package does not know the simulator), one
// run per (scenario, configuration); every ordered pair of runs of a
// scenario is one example: the statistics measured under the first run's
// configuration, the second's configuration as the candidate, and the
// second's measured iteration time as the target.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/autobyte/autobyte/sched"
)

// MetaScenario is one job to simulate for training or evaluation data.
type MetaScenario struct {
	Model   string `json:"model"`
	Arch    string `json:"arch"` // "ps" or "allreduce"
	Workers int    `json:"workers"`
	// Servers is the number of parameter servers (0 for all-reduce).
	Servers      int     `json:"servers"`
	BandwidthBps float64 `json:"bandwidth_bps"`
	LatencyS     float64 `json:"latency_s"`
	// ComputeScale multiplies the model's compute times (2 = half as fast).
	ComputeScale float64 `json:"compute_scale"`
}

func (s MetaScenario) String() string {
	return fmt.Sprintf("%s %s %dw/%ds %.3gGbps %.0fus x%.2g", s.Model, s.Arch, s.Workers, s.Servers, s.BandwidthBps*8/1e9, s.LatencyS*1e6, s.ComputeScale)
}

// MetaRun is one configuration's run of a scenario: the statistics averaged
// over its steady-state iterations (MeanStats) and its steady-state
// iteration time.
type MetaRun struct {
	Config         sched.Config
	Stats          Stats
	IterationTimeS float64
}

// MetaScenarioRuns are the runs of one scenario.
type MetaScenarioRuns struct {
	Scenario MetaScenario
	Runs     []MetaRun
}

// MetaLogSpace returns n sizes spaced evenly in log between lo and hi
// (both included), each rounded to a multiple of 1 KB (1024 bytes).
func MetaLogSpace(lo, hi int64, n int) []int64 {
	if n == 1 {
		return []int64{lo}
	}
	out := make([]int64, n)
	r := math.Log(float64(hi) / float64(lo))
	for i := range out {
		v := float64(lo) * math.Exp(r*float64(i)/float64(n-1))
		out[i] = max(1, int64(math.Round(v/1024))) * 1024
	}
	return out
}

// DefaultMetaPartitions and DefaultMetaCredits span the candidate grid of
// the meta-tuner: 6 partitions from 256 KB to 64 MB and 7 credits from 1 MB
// to 1 GB, log-spaced.
var (
	DefaultMetaPartitions = MetaLogSpace(256<<10, 64<<20, 6)
	DefaultMetaCredits    = MetaLogSpace(1<<20, 1<<30, 7)
)

// SampleMetaScenarios draws n scenarios: a model of models, an
// architecture, 4–64 workers (log-uniform), for parameter servers N/4, N/2
// or N servers, a bandwidth of 1–100 Gbps (log-uniform), a latency of
// 10–100 µs (log-uniform) and a compute scale of 0.5–4 (log-uniform).
func SampleMetaScenarios(rng *rand.Rand, models []string, n int) []MetaScenario {
	logU := func(lo, hi float64) float64 { return lo * math.Exp(rng.Float64()*math.Log(hi/lo)) }
	var out []MetaScenario
	for range n {
		s := MetaScenario{Model: models[rng.IntN(len(models))], Arch: "ps"}
		if rng.IntN(2) == 1 {
			s.Arch = "allreduce"
		}
		s.Workers = int(math.Round(logU(4, 64)))
		if s.Arch == "ps" {
			s.Servers = max(1, s.Workers/[]int{1, 2, 4}[rng.IntN(3)])
		}
		s.BandwidthBps = logU(1e9, 100e9) / 8
		s.LatencyS = logU(10e-6, 100e-6)
		s.ComputeScale = logU(0.5, 4)
		out = append(out, s)
	}
	return out
}

// MeanStats averages the measured fields of ss (the iteration, context and
// configuration are the last one's). It is what the meta-network sees of a
// window of iterations.
func MeanStats(ss []Stats) Stats {
	if len(ss) == 0 {
		return Stats{}
	}
	m := ss[len(ss)-1]
	n := float64(len(ss))
	m.IterationTimeS, m.ForwardS, m.BackwardS, m.BandwidthBps = 0, 0, 0, 0
	m.GoodputBps, m.QueueDelayS, m.Overlap, m.InFlightBytes = 0, 0, 0, 0
	for _, s := range ss {
		m.IterationTimeS += s.IterationTimeS / n
		m.ForwardS += s.ForwardS / n
		m.BackwardS += s.BackwardS / n
		m.BandwidthBps += s.BandwidthBps / n
		m.GoodputBps += s.GoodputBps / n
		m.QueueDelayS += s.QueueDelayS / n
		m.Overlap += s.Overlap / n
		m.InFlightBytes += s.InFlightBytes / n
	}
	m.ServerGoodputBps = meanOf(ss, func(s Stats) []float64 { return s.ServerGoodputBps })
	m.ServerResponseS = meanOf(ss, func(s Stats) []float64 { return s.ServerResponseS })
	return m
}

// meanOf is the element-wise mean of a per-server field over ss (nil if
// the last of them has none; a shorter entry counts as zeros).
func meanOf(ss []Stats, field func(Stats) []float64) []float64 {
	n := len(field(ss[len(ss)-1]))
	if n == 0 {
		return nil
	}
	out := make([]float64, n)
	for _, s := range ss {
		for i, v := range field(s) {
			if i < n {
				out[i] += v / float64(len(ss))
			}
		}
	}
	return out
}

// What a network predicts (MetaHeader.Target): the log of the candidate's
// iteration time relative to ReferenceTimeS of the state
// (MetaTargetReference, also what a header without a target means) or to
// the iteration time measured in the state (MetaTargetCurrent).
const (
	MetaTargetReference = "reference"
	MetaTargetCurrent   = "current"
)

// validMetaTarget reports whether kind names a target ("" is
// MetaTargetReference).
func validMetaTarget(kind string) bool {
	return kind == "" || kind == MetaTargetReference || kind == MetaTargetCurrent
}

// MetaTarget is the training target of kind for a run measured at
// iteration time t from state s: log(t / ReferenceTimeS(s)) or log(t /
// s.IterationTimeS). It is only meaningful when that denominator is
// positive (MetaTargetOK).
func MetaTarget(kind string, s Stats, t float64) float64 {
	if kind == MetaTargetCurrent {
		return metaLog(t / s.IterationTimeS)
	}
	return metaLog(t / ReferenceTimeS(s))
}

// MetaTargetOK reports whether state s has the denominator target kind
// needs.
func MetaTargetOK(kind string, s Stats) bool {
	if kind == MetaTargetCurrent {
		return s.IterationTimeS > 0
	}
	return ReferenceTimeS(s) > 0
}

// MetaExamples turns the runs into examples of target kind: every ordered
// pair (a, b) of runs of a scenario, a's statistics as the state and b's
// configuration and time as candidate and target.
func MetaExamples(data []MetaScenarioRuns, kind string) []MetaExample {
	var out []MetaExample
	for _, d := range data {
		for _, a := range d.Runs {
			for _, b := range d.Runs {
				out = append(out, MetaExample{X: MetaFeatures(nil, a.Stats, b.Config), Y: MetaTarget(kind, a.Stats, b.IterationTimeS)})
			}
		}
	}
	return out
}

// MetaTrainOptions configure TrainMeta.
type MetaTrainOptions struct {
	// Hidden are the hidden layers' widths (tanh).
	Hidden []int
	Epochs int
	Batch  int
	// LR is Adam's step size; it decays linearly to LR/10 over the epochs.
	LR   float64
	Seed uint64
	// Target is what the examples' Y are (MetaTargetReference or
	// MetaTargetCurrent); it is recorded in the header.
	Target string
	// Members is how many networks are trained, each from its own draw
	// of weights and minibatches; the prediction is their mean (0 or 1:
	// one network).
	Members int
	// Progress, if set, is called after every epoch of every member with
	// the epoch's mean squared error (log units).
	Progress func(member, epoch int, mse float64)
}

// TrainMeta fits a network to the examples with Adam on the mean squared
// error of the normalised target, from weights drawn with Seed (Glorot
// uniform) and minibatches shuffled with Seed: equal inputs give equal
// weights. It returns the network and its final mean squared error on the
// examples (log units).
func TrainMeta(examples []MetaExample, o MetaTrainOptions) (*Meta, float64, error) {
	if len(examples) == 0 {
		return nil, 0, fmt.Errorf("tune: no training examples")
	}
	if !validMetaTarget(o.Target) {
		return nil, 0, fmt.Errorf("tune: unknown meta-network target %q (want %s or %s)", o.Target, MetaTargetReference, MetaTargetCurrent)
	}
	if o.Epochs < 1 || o.Batch < 1 || !(o.LR > 0) || o.Members < 0 {
		return nil, 0, fmt.Errorf("tune: training needs epochs >= 1, batch >= 1, a positive rate and members >= 0, got %d, %d, %v, %d", o.Epochs, o.Batch, o.LR, o.Members)
	}
	for i, ex := range examples {
		if len(ex.X) != metaNumFeatures {
			return nil, 0, fmt.Errorf("tune: example %d has %d features, want %d", i, len(ex.X), metaNumFeatures)
		}
		if math.IsNaN(ex.Y) || math.IsInf(ex.Y, 0) {
			return nil, 0, fmt.Errorf("tune: example %d has target %v", i, ex.Y)
		}
		for j, v := range ex.X {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, 0, fmt.Errorf("tune: example %d feature %d (%s) is %v", i, j, MetaFeatureNames[j], v)
			}
		}
	}
	m := &Meta{Features: slices.Clone(MetaFeatureNames), InMean: make([]float64, metaNumFeatures), InStd: make([]float64, metaNumFeatures)}
	n := float64(len(examples))
	for _, ex := range examples {
		for j, v := range ex.X {
			m.InMean[j] += v / n
		}
		m.OutMean += ex.Y / n
	}
	for _, ex := range examples {
		for j, v := range ex.X {
			d := v - m.InMean[j]
			m.InStd[j] += d * d / n
		}
		m.OutStd += (ex.Y - m.OutMean) * (ex.Y - m.OutMean) / n
	}
	for j := range m.InStd {
		m.InStd[j] = math.Sqrt(m.InStd[j])
		if m.InStd[j] < 1e-6 {
			m.InStd[j] = 1 // a constant feature
		}
	}
	m.OutStd = max(math.Sqrt(m.OutStd), 1e-6)
	ys := make([]float64, len(examples))
	for i, ex := range examples {
		ys[i] = (ex.Y - m.OutMean) / m.OutStd
	}
	members := max(o.Members, 1)
	for k := range members {
		// Member k draws its weights and minibatches from its own stream;
		// member 0's is the one a single network has always used.
		rng := rand.New(rand.NewPCG(o.Seed, 0x6d657461+uint64(k)))
		layers := m.trainMember(examples, ys, o, rng, k)
		if k == 0 {
			m.Layers = layers
		} else {
			m.Ensemble = append(m.Ensemble, layers)
		}
	}
	sc := m.newScratch()
	// The loss of the final weights (the epoch's sum mixes weights).
	var final float64
	for i, ex := range examples {
		e := m.forward(ex.X, sc) - ys[i]
		final += e * e
	}
	final = final / n * m.OutStd * m.OutStd
	m.Header.Members = members
	m.Header.Hidden = slices.Clone(o.Hidden)
	m.Header.Epochs = o.Epochs
	m.Header.Seed = o.Seed
	m.Header.Target = o.Target
	m.Header.Examples = len(examples)
	m.Header.TrainLoss = final
	return m, final, nil
}

// trainMember draws one network's weights from rng (Glorot uniform), trains
// it with Adam on the normalised targets ys and returns its layers; m
// holds the normalisation.
func (m *Meta) trainMember(examples []MetaExample, ys []float64, o MetaTrainOptions, rng *rand.Rand, member int) []MetaLayer {
	v := m.view(nil)
	in := metaNumFeatures
	for _, h := range append(slices.Clone(o.Hidden), 1) {
		l := MetaLayer{In: in, Out: h, W: make([]float64, in*h), B: make([]float64, h)}
		a := math.Sqrt(6 / float64(in+h))
		for i := range l.W {
			l.W[i] = (2*rng.Float64() - 1) * a
		}
		v.Layers = append(v.Layers, l)
		in = h
	}

	// Adam state.
	g := v.newGrad()
	mw, vw, mb, vb := v.newGrad(), v.newGrad(), v.newGrad(), v.newGrad()
	const beta1, beta2, eps = 0.9, 0.999, 1e-8
	sc := v.newScratch()
	order := make([]int, len(examples))
	for i := range order {
		order[i] = i
	}
	n := float64(len(examples))
	t := 0
	for epoch := range o.Epochs {
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		lr := o.LR * (1 - 0.9*float64(epoch)/float64(max(o.Epochs-1, 1)))
		var sum float64
		for start := 0; start < len(order); start += o.Batch {
			batch := order[start:min(start+o.Batch, len(order))]
			g.zero()
			for _, i := range batch {
				sum += v.accumulate(examples[i].X, ys[i], sc, g)
			}
			t++
			c1, c2 := 1-math.Pow(beta1, float64(t)), 1-math.Pow(beta2, float64(t))
			bn := float64(len(batch))
			step := func(p, grad, mom, vel []float64) {
				for j := range p {
					gr := grad[j] / bn
					mom[j] = beta1*mom[j] + (1-beta1)*gr
					vel[j] = beta2*vel[j] + (1-beta2)*gr*gr
					p[j] -= lr * (mom[j] / c1) / (math.Sqrt(vel[j]/c2) + eps)
				}
			}
			for li := range v.Layers {
				step(v.Layers[li].W, g.w[li], mw.w[li], vw.w[li])
				step(v.Layers[li].B, g.b[li], mb.b[li], vb.b[li])
			}
		}
		if o.Progress != nil {
			o.Progress(member, epoch, sum/n*m.OutStd*m.OutStd)
		}
	}
	return v.Layers
}

// MetaScenarioEval is how well a network ranks one scenario's runs.
type MetaScenarioEval struct {
	Scenario MetaScenario `json:"scenario"`
	// Spearman is the rank correlation between predicted and measured
	// iteration times over the runs, averaged over every run taken as the
	// current state (NaN when the measured times are all equal).
	Spearman float64 `json:"spearman"`
	// BestGap is the measured time of the predicted best over the measured
	// best, minus 1, averaged over every run taken as the current state.
	BestGap float64 `json:"best_gap"`
	// Spread is the worst measured time over the best, minus 1.
	Spread float64 `json:"spread"`
}

// MetaMinSpread is the spread (worst over best time, minus 1) a scenario
// needs for its rank correlation to count in MetaEval.MeanSpearman.
const MetaMinSpread = 0.02

// MetaEval summarises a network's predictions over scenarios.
type MetaEval struct {
	Scenarios []MetaScenarioEval `json:"scenarios"`
	// MeanSpearman is over the scenarios whose Spread is at least
	// MetaMinSpread: where every configuration is within a percent or two
	// of the others, their order is noise and choosing does not matter.
	MeanSpearman float64 `json:"mean_spearman"`
	// Ranked counts those scenarios.
	Ranked       int     `json:"ranked"`
	MeanBestGap  float64 `json:"mean_best_gap"`
	WorstBestGap float64 `json:"worst_best_gap"`
	// Within5 is the fraction of scenarios whose BestGap is <= 5%.
	Within5 float64 `json:"within_5pct"`
	// MSE is the mean squared error of the log target over every pair.
	MSE float64 `json:"mse"`
}

// EvaluateMeta scores every scenario's runs from every run's statistics
// and compares the predictions with the measured times.
func EvaluateMeta(m *Meta, data []MetaScenarioRuns) MetaEval {
	var ev MetaEval
	var nSp, nPairs, within int
	cands := make([]sched.Config, 0)
	var pred []float64
	for _, d := range data {
		cands = cands[:0]
		truth := make([]float64, len(d.Runs))
		for i, r := range d.Runs {
			cands = append(cands, r.Config)
			truth[i] = r.IterationTimeS
		}
		best, worst := slices.Min(truth), slices.Max(truth)
		se := MetaScenarioEval{Scenario: d.Scenario, Spread: worst/best - 1}
		var sp, gap float64
		spN := 0
		for _, a := range d.Runs {
			pred = m.Score(pred, a.Stats, cands)
			for i, p := range pred {
				e := p - MetaTarget(m.Header.Target, a.Stats, truth[i])
				ev.MSE += e * e
				nPairs++
			}
			if r := Spearman(pred, truth); !math.IsNaN(r) {
				sp += r
				spN++
			}
			gap += truth[metaArgMin(pred)]/best - 1
		}
		se.BestGap = gap / float64(len(d.Runs))
		se.Spearman = math.NaN()
		if spN > 0 {
			se.Spearman = sp / float64(spN)
			if se.Spread >= MetaMinSpread {
				ev.MeanSpearman += se.Spearman
				nSp++
			}
		}
		ev.MeanBestGap += se.BestGap
		ev.WorstBestGap = max(ev.WorstBestGap, se.BestGap)
		if se.BestGap <= 0.05 {
			within++
		}
		ev.Scenarios = append(ev.Scenarios, se)
	}
	ev.Ranked = nSp
	if nSp > 0 {
		ev.MeanSpearman /= float64(nSp)
	}
	if n := len(data); n > 0 {
		ev.MeanBestGap /= float64(n)
		ev.Within5 = float64(within) / float64(n)
	}
	if nPairs > 0 {
		ev.MSE /= float64(nPairs)
	}
	return ev
}

// argMin is the index of the smallest value (the first on ties).
func metaArgMin(xs []float64) int {
	b := 0
	for i, x := range xs {
		if x < xs[b] {
			b = i
		}
	}
	return b
}

// Spearman is the rank correlation of x and y (ties get their mean rank);
// NaN when either is constant or they differ in length.
func Spearman(x, y []float64) float64 {
	if len(x) != len(y) || len(x) < 2 {
		return math.NaN()
	}
	rx, ry := metaRanks(x), metaRanks(y)
	n := float64(len(x))
	var mx, my float64
	for i := range rx {
		mx += rx[i] / n
		my += ry[i] / n
	}
	var sxy, sxx, syy float64
	for i := range rx {
		dx, dy := rx[i]-mx, ry[i]-my
		sxy += dx * dy
		sxx += dx * dx
		syy += dy * dy
	}
	if sxx == 0 || syy == 0 {
		return math.NaN()
	}
	return sxy / math.Sqrt(sxx*syy)
}

// metaRanks returns the ranks of xs (0-based, ties averaged).
func metaRanks(xs []float64) []float64 {
	idx := make([]int, len(xs))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case xs[a] < xs[b]:
			return -1
		case xs[a] > xs[b]:
			return 1
		}
		return 0
	})
	r := make([]float64, len(xs))
	for i := 0; i < len(idx); {
		j := i
		for j+1 < len(idx) && xs[idx[j+1]] == xs[idx[i]] {
			j++
		}
		for k := i; k <= j; k++ {
			r[idx[k]] = float64(i+j) / 2
		}
		i = j + 1
	}
	return r
}
