package tune

// The meta-network: a small multilayer perceptron that predicts, from one
// window of runtime statistics and a candidate (partition, credit), the
// iteration time the job would have under the candidate, relative to the
// iteration time measured in that window (or, for older weights, to a
// reference computed from the same statistics). See docs/tuner.md.

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"math"

	"github.com/autobyte/autobyte/sched"
)

// MetaFeatureNames name the inputs of the meta-network, in order. Every
// feature is dimensionless, so one network serves clusters of any speed:
// sizes are relative to the model's gradient bytes S or to the bytes the
// link carries during one iteration's compute (B·C), times relative to the
// reference time or the iteration time.
//
// The tensor-size skew and the tensor count are deliberately not inputs:
// with five training models they identify the model, and the network
// learned per-model answers that ranked held-out models worse (mean rank
// correlation 0.69 with them, 0.81 without, in one ablation; docs/tuner.md). The tensor
// count still enters through the partition relative to the mean tensor.
var MetaFeatureNames = []string{
	"log_comm_over_compute",     // log(link bound / compute)
	"log_workers",               // log(N)
	"log_workers_per_server",    // log(N/M), 0 for all-reduce
	"arch_ps",                   // 1 for parameter servers
	"arch_allreduce",            // 1 for ring all-reduce
	"overlap",                   // measured fraction of communication overlapping compute
	"queue_over_iteration",      // measured queueing delay / iteration time
	"goodput_over_bandwidth",    // measured goodput / link bandwidth
	"log_inflight_over_model",   // log(mean bytes in flight / S)
	"log_time_over_reference",   // measured log(iteration time / reference), current config
	"log_cur_partition_model",   // log(current partition / S)
	"log_cur_credit_model",      // log(current credit / S)
	"log_partition_model",       // log(candidate partition / S)
	"log_credit_model",          // log(candidate credit / S)
	"log_partition_bdp",         // log(candidate partition / (B·C))
	"log_credit_bdp",            // log(candidate credit / (B·C))
	"log_partition_mean_tensor", // log(candidate partition / (S/tensors))
	"log_credit_over_partition", // log(candidate credit / candidate partition)
	"log_partition_change",      // log(candidate partition / current partition)
	"log_credit_change",         // log(candidate credit / current credit)
	"log_partition_time_rtt",    // log(candidate partition's transfer time at B / round trip)
	"log_credit_time_rtt",       // log(candidate credit's transfer time at B / round trip)
}

// metaNumFeatures is len(MetaFeatureNames).
const metaNumFeatures = 22

// metaDefaultRTT is the round trip assumed when the statistics carry none.
// metaMinRTT and metaMaxRTT bound the round trips the network sees: those
// of its training scenarios (twice 10-100 µs of latency,
// SampleMetaScenarios). A real link's measured round trip can lie outside
// (a veth pair's is about 10 µs), and the network would then extrapolate.
const (
	metaDefaultRTT = 100e-6
	metaMinRTT     = 20e-6
	metaMaxRTT     = 200e-6
)

// metaMaxRel caps sizes relative to the model: a partition of 0 (none) or
// above S means whole tensors, a credit of 0 (no window) or above
// metaMaxRel·S means every piece may start.
const metaMaxRel = 16

// ReferenceTimeS is the reference of the target MetaTargetReference and of
// the feature log_time_over_reference:
// the largest of the compute time (forward + backward) and the link bounds
// that follow from the statistics alone (docs/design.md, lower bounds): S/B per worker
// and N·S/(M·B) per server for parameter servers, 2(N-1)/N·S/B for ring
// all-reduce. It is a lower bound on the iteration time that needs no model
// profile (sim.LowerBounds' fluid bound needs the per-layer profile, which a
// tuner does not see). It is 0 when the statistics carry no compute and no
// bandwidth.
func ReferenceTimeS(s Stats) float64 {
	return max(s.ForwardS+s.BackwardS, metaLinkBoundS(s))
}

// metaLinkBoundS is the communication bound of s (0 without bandwidth).
func metaLinkBoundS(s Stats) float64 {
	if !(s.BandwidthBps > 0) {
		return 0
	}
	S, B, N := float64(s.ModelBytes), s.BandwidthBps, float64(s.Workers)
	if s.Arch == "allreduce" {
		if s.Workers <= 1 {
			return 0
		}
		return 2 * (N - 1) / N * S / B
	}
	b := S / B
	if s.Servers > 0 {
		b = max(b, N*S/(float64(s.Servers)*B))
	}
	return b
}

// metaLog is log(x) for x > 0, floored at 1e-9 so that no feature is
// infinite.
func metaLog(x float64) float64 {
	if !(x > 1e-9) {
		x = 1e-9
	}
	return math.Log(x)
}

// metaSizes returns the partition and credit of c relative to the model's
// bytes S, with 0 and oversized values capped (see metaMaxRel).
func metaSizes(c sched.Config, S float64) (part, credit float64) {
	part, credit = 1, metaMaxRel
	if c.PartitionBytes > 0 {
		part = min(float64(c.PartitionBytes)/S, 1)
	}
	if c.CreditBytes > 0 {
		credit = min(float64(c.CreditBytes)/S, metaMaxRel)
	}
	return part, credit
}

// MetaFeatures appends to dst the features of state s (statistics measured
// under s.Config) and candidate cand, in the order of MetaFeatureNames.
func MetaFeatures(dst []float64, s Stats, cand sched.Config) []float64 {
	S := max(float64(s.ModelBytes), 1)
	C := s.ForwardS + s.BackwardS
	T := s.IterationTimeS
	ref := ReferenceTimeS(s)
	bdp := max(s.BandwidthBps*C, 1)
	tensors := max(float64(s.Tensors), 1)
	var perServer, ps, ar float64
	if s.Arch == "allreduce" {
		ar = 1
	} else {
		ps = 1
		if s.Servers > 0 {
			perServer = math.Log(float64(max(s.Workers, 1)) / float64(s.Servers))
		}
	}
	var queue, goodput, eff float64
	if T > 0 {
		queue = min(s.QueueDelayS/T, 10)
		if ref > 0 {
			eff = metaLog(T / ref)
		}
	}
	if s.BandwidthBps > 0 {
		goodput = min(s.GoodputBps/s.BandwidthBps, 2)
	}
	commRatio := 0.0
	if C > 0 {
		commRatio = metaLog(metaLinkBoundS(s) / C)
	}
	cp, cc := metaSizes(s.Config, S)
	p, c := metaSizes(cand, S)
	rtt := s.RoundTripS
	if !(rtt > 0) {
		rtt = metaDefaultRTT
	}
	rtt = min(max(rtt, metaMinRTT), metaMaxRTT)
	var pTime, cTime float64
	if s.BandwidthBps > 0 {
		pTime = metaLog(p * S / s.BandwidthBps / rtt)
		cTime = metaLog(c * S / s.BandwidthBps / rtt)
	}
	return append(dst,
		commRatio,
		math.Log(float64(max(s.Workers, 1))),
		perServer,
		ps,
		ar,
		s.Overlap,
		queue,
		goodput,
		metaLog(s.InFlightBytes/S+1e-3),
		eff,
		math.Log(cp),
		math.Log(cc),
		math.Log(p),
		math.Log(c),
		metaLog(p*S/bdp),
		metaLog(c*S/bdp),
		math.Log(p*tensors),
		math.Log(c/p),
		math.Log(p/cp),
		math.Log(c/cc),
		pTime,
		cTime,
	)
}

// Meta is a trained meta-network with its input normalisation. Predict and
// Score are safe for concurrent use; FineTune is not (a tuner owns a Clone).
type Meta struct {
	Header MetaHeader `json:"header"`
	// Features names the inputs (MetaFeatureNames when trained).
	Features []string `json:"features"`
	// InMean and InStd standardise the inputs; OutMean and OutStd map the
	// network's output back to the target (MetaTarget of Header.Target).
	InMean  []float64 `json:"in_mean"`
	InStd   []float64 `json:"in_std"`
	OutMean float64   `json:"out_mean"`
	OutStd  float64   `json:"out_std"`
	// Layers are the dense layers, tanh between them, linear at the end.
	Layers []MetaLayer `json:"layers"`
	// Ensemble are further networks of the same shape as Layers, trained
	// from other random draws; the prediction is the mean of Layers' and
	// theirs (none: Layers alone).
	Ensemble [][]MetaLayer `json:"ensemble,omitempty"`
}

// view is m with layers as its only network, sharing m's normalisation
// (and layers' weights).
func (m *Meta) view(layers []MetaLayer) *Meta {
	v := *m
	v.Layers, v.Ensemble = layers, nil
	return &v
}

// MetaLayer is one dense layer: out = W·in + B, W row-major (Out rows of
// In columns).
type MetaLayer struct {
	In  int       `json:"in"`
	Out int       `json:"out"`
	W   []float64 `json:"w"`
	B   []float64 `json:"b"`
}

// MetaHeader records how a network was trained and how well it predicts
// held-out models.
type MetaHeader struct {
	Command string `json:"command"`
	Seed    uint64 `json:"seed"`
	// Target is what the network predicts (MetaTargetReference or
	// MetaTargetCurrent; "" is MetaTargetReference).
	Target           string   `json:"target,omitempty"`
	TrainModels      []string `json:"train_models"`
	HeldOutModels    []string `json:"held_out_models"`
	TrainScenarios   int      `json:"train_scenarios"`
	HeldOutScenarios int      `json:"held_out_scenarios"`
	Simulations      int      `json:"simulations"`
	Iterations       int      `json:"iterations_per_simulation"`
	Examples         int      `json:"examples"`
	Hidden           []int    `json:"hidden"`
	Members          int      `json:"members,omitempty"`
	Epochs           int      `json:"epochs"`
	TrainLoss        float64  `json:"train_loss_mse_log"`
	HeldOutLoss      float64  `json:"held_out_loss_mse_log"`
	HeldOutSpearman  float64  `json:"held_out_mean_spearman"`
	HeldOutBestGap   float64  `json:"held_out_mean_best_gap"`
	HeldOutWorstGap  float64  `json:"held_out_worst_best_gap"`
	HeldOutWithin5   float64  `json:"held_out_fraction_best_within_5pct"`
	Partitions       []int64  `json:"grid_partitions"`
	Credits          []int64  `json:"grid_credits"`
	SimulateSeconds  float64  `json:"simulate_seconds"`
	TrainSeconds     float64  `json:"train_seconds"`
}

//go:embed weights.json
var shippedWeights []byte

// DefaultMeta returns a fresh copy of the network shipped in the binary
// (tune/weights.json, regenerated by 'autobyte tune train').
func DefaultMeta() (*Meta, error) {
	m, err := ParseMeta(shippedWeights)
	if err != nil {
		return nil, fmt.Errorf("tune: shipped weights: %w", err)
	}
	return m, nil
}

// ParseMeta reads a network written by Meta.MarshalJSON (the weights file)
// and checks its shapes.
func ParseMeta(data []byte) (*Meta, error) {
	var m Meta
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("tune: meta-network weights: %w", err)
	}
	if err := m.validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

func (m *Meta) validate() error {
	if !validMetaTarget(m.Header.Target) {
		return fmt.Errorf("tune: meta-network target %q, want %q or %q", m.Header.Target, MetaTargetReference, MetaTargetCurrent)
	}
	if len(m.Features) != metaNumFeatures {
		return fmt.Errorf("tune: meta-network has %d features, this build computes %d", len(m.Features), metaNumFeatures)
	}
	for i, f := range m.Features {
		if f != MetaFeatureNames[i] {
			return fmt.Errorf("tune: meta-network feature %d is %q, this build computes %q", i, f, MetaFeatureNames[i])
		}
	}
	if len(m.InMean) != metaNumFeatures || len(m.InStd) != metaNumFeatures {
		return fmt.Errorf("tune: meta-network normalisation has %d means and %d deviations, want %d", len(m.InMean), len(m.InStd), metaNumFeatures)
	}
	for i, s := range m.InStd {
		if !(s > 0) || math.IsInf(s, 0) {
			return fmt.Errorf("tune: meta-network feature %d (%s) has deviation %v, want > 0", i, m.Features[i], s)
		}
	}
	if !(m.OutStd > 0) || math.IsInf(m.OutStd, 0) || math.IsNaN(m.OutMean) {
		return fmt.Errorf("tune: meta-network output scale %v (mean %v), want a deviation > 0", m.OutStd, m.OutMean)
	}
	if len(m.Layers) == 0 {
		return fmt.Errorf("tune: meta-network has no layers")
	}
	in := metaNumFeatures
	for i, l := range m.Layers {
		if l.In != in || l.Out < 1 || len(l.W) != l.In*l.Out || len(l.B) != l.Out {
			return fmt.Errorf("tune: meta-network layer %d is %d→%d with %d weights and %d biases, want %d inputs", i, l.In, l.Out, len(l.W), len(l.B), in)
		}
		for j, w := range l.W {
			if math.IsNaN(w) || math.IsInf(w, 0) {
				return fmt.Errorf("tune: meta-network layer %d weight %d is %v", i, j, w)
			}
		}
		in = l.Out
	}
	if in != 1 {
		return fmt.Errorf("tune: meta-network ends with %d outputs, want 1", in)
	}
	for k, e := range m.Ensemble {
		if len(e) != len(m.Layers) {
			return fmt.Errorf("tune: meta-network ensemble member %d has %d layers, want %d", k+1, len(e), len(m.Layers))
		}
		for i, l := range e {
			w := m.Layers[i]
			if l.In != w.In || l.Out != w.Out || len(l.W) != len(w.W) || len(l.B) != len(w.B) {
				return fmt.Errorf("tune: meta-network ensemble member %d layer %d is %d→%d with %d weights and %d biases, want %d→%d", k+1, i, l.In, l.Out, len(l.W), len(l.B), w.In, w.Out)
			}
			for j, x := range l.W {
				if math.IsNaN(x) || math.IsInf(x, 0) {
					return fmt.Errorf("tune: meta-network ensemble member %d layer %d weight %d is %v", k+1, i, j, x)
				}
			}
		}
	}
	return nil
}

// Clone returns a deep copy of m (to fine-tune without touching m).
func (m *Meta) Clone() *Meta {
	c := *m
	c.Features = append([]string(nil), m.Features...)
	c.InMean = append([]float64(nil), m.InMean...)
	c.InStd = append([]float64(nil), m.InStd...)
	c.Layers = cloneLayers(m.Layers)
	c.Ensemble = nil
	for _, e := range m.Ensemble {
		c.Ensemble = append(c.Ensemble, cloneLayers(e))
	}
	return &c
}

func cloneLayers(ls []MetaLayer) []MetaLayer {
	out := make([]MetaLayer, len(ls))
	for i, l := range ls {
		out[i] = MetaLayer{In: l.In, Out: l.Out, W: append([]float64(nil), l.W...), B: append([]float64(nil), l.B...)}
	}
	return out
}

// metaScratch holds a forward pass's activations.
type metaScratch struct {
	acts [][]float64 // acts[0] = normalised input, acts[i+1] = layer i's output
}

func (m *Meta) newScratch() *metaScratch {
	s := &metaScratch{acts: make([][]float64, len(m.Layers)+1)}
	s.acts[0] = make([]float64, metaNumFeatures)
	for i, l := range m.Layers {
		s.acts[i+1] = make([]float64, l.Out)
	}
	return s
}

// forward runs the network (the mean of the ensemble's) on raw features x
// and returns the normalised output; activations (of the last member) stay
// in sc.
func (m *Meta) forward(x []float64, sc *metaScratch) float64 {
	if len(m.Ensemble) == 0 {
		return m.forwardLayers(m.Layers, x, sc)
	}
	sum := m.forwardLayers(m.Layers, x, sc)
	for _, e := range m.Ensemble {
		sum += m.forwardLayers(e, x, sc)
	}
	return sum / float64(1+len(m.Ensemble))
}

// forwardLayers runs one network.
func (m *Meta) forwardLayers(layers []MetaLayer, x []float64, sc *metaScratch) float64 {
	in := sc.acts[0]
	for i, v := range x {
		in[i] = (v - m.InMean[i]) / m.InStd[i]
	}
	last := len(layers) - 1
	for li, l := range layers {
		out := sc.acts[li+1]
		in = in[:l.In]
		for o := 0; o < l.Out; o++ {
			// row has len(in) elements: no bounds checks in the loop.
			row := l.W[o*l.In : (o+1)*l.In]
			row = row[:len(in)]
			z := l.B[o]
			for j, v := range in {
				z += row[j] * v
			}
			if li < last {
				z = math.Tanh(z)
			}
			out[o] = z
		}
		in = out
	}
	return in[0]
}

// PredictLog returns the predicted log(iteration time / denominator) of
// candidate cand, given statistics s measured under s.Config; the
// denominator is s.IterationTimeS or ReferenceTimeS(s), as Header.Target
// says (MetaTarget).
func (m *Meta) PredictLog(s Stats, cand sched.Config) float64 {
	x := MetaFeatures(make([]float64, 0, metaNumFeatures), s, cand)
	return m.forward(x, m.newScratch())*m.OutStd + m.OutMean
}

// Score returns PredictLog of every candidate, given statistics s measured under s.Config; dst is reused if
// it has the capacity.
func (m *Meta) Score(dst []float64, s Stats, cands []sched.Config) []float64 {
	dst = dst[:0]
	var scs [metaLanes]*metaScratch
	var xs [metaLanes][]float64
	for b := range scs {
		scs[b] = m.newScratch()
		xs[b] = make([]float64, 0, metaNumFeatures)
	}
	// metaLanes candidates at a time: the same arithmetic as forward, in
	// independent chains the processor can overlap.
	k := 0
	for ; k+metaLanes <= len(cands); k += metaLanes {
		for b := range xs {
			xs[b] = MetaFeatures(xs[b][:0], s, cands[k+b])
		}
		var sum [metaLanes]float64
		for i := range 1 + len(m.Ensemble) {
			layers := m.Layers
			if i > 0 {
				layers = m.Ensemble[i-1]
			}
			r := m.forwardLanes(layers, &xs, &scs)
			for b := range sum {
				sum[b] += r[b]
			}
		}
		for b := range sum {
			y := sum[b]
			if len(m.Ensemble) > 0 {
				y /= float64(1 + len(m.Ensemble))
			}
			dst = append(dst, y*m.OutStd+m.OutMean)
		}
	}
	for _, c := range cands[k:] {
		xs[0] = MetaFeatures(xs[0][:0], s, c)
		dst = append(dst, m.forward(xs[0], scs[0])*m.OutStd+m.OutMean)
	}
	return dst
}

// metaLanes is how many inputs forwardLanes runs at once.
const metaLanes = 4

// forwardLanes runs one network on metaLanes inputs at once; each output
// is bit for bit forwardLayers' (the same operations in the same order).
func (m *Meta) forwardLanes(layers []MetaLayer, xs *[metaLanes][]float64, scs *[metaLanes]*metaScratch) [metaLanes]float64 {
	var in [metaLanes][]float64
	for b := range in {
		in[b] = scs[b].acts[0]
		for i, v := range xs[b] {
			in[b][i] = (v - m.InMean[i]) / m.InStd[i]
		}
	}
	last := len(layers) - 1
	for li, l := range layers {
		i0 := in[0][:l.In]
		i1, i2, i3 := in[1][:len(i0)], in[2][:len(i0)], in[3][:len(i0)]
		o0, o1, o2, o3 := scs[0].acts[li+1], scs[1].acts[li+1], scs[2].acts[li+1], scs[3].acts[li+1]
		o1, o2, o3 = o1[:len(o0)], o2[:len(o0)], o3[:len(o0)]
		for o := range o0 {
			row := l.W[o*l.In : (o+1)*l.In]
			row = row[:len(i0)]
			z0, z1, z2, z3 := l.B[o], l.B[o], l.B[o], l.B[o]
			for j, w := range row {
				z0 += w * i0[j]
				z1 += w * i1[j]
				z2 += w * i2[j]
				z3 += w * i3[j]
			}
			if li < last {
				z0, z1, z2, z3 = math.Tanh(z0), math.Tanh(z1), math.Tanh(z2), math.Tanh(z3)
			}
			o0[o], o1[o], o2[o], o3[o] = z0, z1, z2, z3
		}
		in = [metaLanes][]float64{o0, o1, o2, o3}
	}
	return [metaLanes]float64{in[0][0], in[1][0], in[2][0], in[3][0]}
}

// metaGrad accumulates gradients of the squared error over a batch.
type metaGrad struct {
	w, b  [][]float64
	delta [][]float64 // per layer output
}

func (m *Meta) newGrad() *metaGrad {
	g := &metaGrad{}
	for _, l := range m.Layers {
		g.w = append(g.w, make([]float64, len(l.W)))
		g.b = append(g.b, make([]float64, len(l.B)))
		g.delta = append(g.delta, make([]float64, l.Out))
	}
	return g
}

func (g *metaGrad) zero() {
	for i := range g.w {
		clear(g.w[i])
		clear(g.b[i])
	}
}

// accumulate adds the gradient of (out - y)² / 2 for one example, where y
// is the normalised target, and returns the squared error.
func (m *Meta) accumulate(x []float64, y float64, sc *metaScratch, g *metaGrad) float64 {
	out := m.forward(x, sc)
	e := out - y
	last := len(m.Layers) - 1
	g.delta[last][0] = e
	for li := last; li >= 0; li-- {
		l := m.Layers[li]
		d := g.delta[li]
		in := sc.acts[li]
		gw, gb := g.w[li], g.b[li]
		for o := 0; o < l.Out; o++ {
			gb[o] += d[o]
			row := gw[o*l.In : (o+1)*l.In]
			for j, v := range in {
				row[j] += d[o] * v
			}
		}
		if li == 0 {
			break
		}
		// Back through layer li's weights and the tanh of layer li-1.
		prev := g.delta[li-1]
		for j := range prev {
			var s float64
			for o := 0; o < l.Out; o++ {
				s += l.W[o*l.In+j] * d[o]
			}
			a := in[j]
			prev[j] = s * (1 - a*a)
		}
	}
	return e * e
}

// MetaExample is one training pair: features (MetaFeatures) and the target
// of the network's Header.Target (MetaTarget).
type MetaExample struct {
	X []float64
	Y float64
}

// FineTune takes steps plain gradient steps of rate lr on the mean squared
// error over examples (targets as for PredictLog) and returns the mean
// squared error (in log units) before the first step. It changes m; a tuner
// fine-tunes its own Clone. Its cost is steps × len(examples) forward and
// backward passes.
func (m *Meta) FineTune(examples []MetaExample, steps int, lr float64) float64 {
	if len(examples) == 0 || steps < 1 {
		return 0
	}
	if len(m.Ensemble) > 0 {
		// Each member takes the steps on its own error; the loss
		// reported is the ensemble's before the first step.
		sc := m.newScratch()
		var first float64
		for _, ex := range examples {
			e := m.forward(ex.X, sc) - (ex.Y-m.OutMean)/m.OutStd
			first += e * e
		}
		m.view(m.Layers).FineTune(examples, steps, lr)
		for _, e := range m.Ensemble {
			m.view(e).FineTune(examples, steps, lr)
		}
		return first / float64(len(examples)) * m.OutStd * m.OutStd
	}
	sc, g := m.newScratch(), m.newGrad()
	var first float64
	for step := range steps {
		g.zero()
		var loss float64
		for _, ex := range examples {
			loss += m.accumulate(ex.X, (ex.Y-m.OutMean)/m.OutStd, sc, g)
		}
		if step == 0 {
			first = loss / float64(len(examples)) * m.OutStd * m.OutStd
		}
		scale := lr / float64(len(examples))
		for li := range m.Layers {
			l := &m.Layers[li]
			for j := range l.W {
				l.W[j] -= scale * g.w[li][j]
			}
			for j := range l.B {
				l.B[j] -= scale * g.b[li][j]
			}
		}
	}
	return first
}
