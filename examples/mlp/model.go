package main

import (
	"fmt"
	"math"
	"math/rand/v2"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"

	"github.com/autobyte/autobyte/model"
)

// Config is the model, the data and the optimiser: everything every worker
// must agree on besides the autobyte job itself.
type Config struct {
	Inputs, Hidden, Classes int
	// Batch is the per-worker batch; the global batch is Workers·Batch.
	Batch   int
	Workers int
	LR      float32
	Seed    uint64
	// Iterations is the number of SGD steps.
	Iterations int
	// TrainSize and TestSize are the numbers of synthetic points.
	TrainSize, TestSize int
}

// DefaultConfig is the example's MLP: 20 → 64 (tanh) → 4 classes.
func DefaultConfig() Config {
	return Config{Inputs: 20, Hidden: 64, Classes: 4, Batch: 16, Workers: 1, LR: 0.1, Seed: 1,
		Iterations: 200, TrainSize: 4096, TestSize: 1024}
}

// tensorSpec is one parameter tensor: rows×cols float32, row-major.
type tensorSpec struct {
	name       string
	layer      int
	rows, cols int
}

// The MLP has two layers and four tensors, in forward order. A layer's
// weights and bias are two tensors of that layer; the tensor index is the
// one Post takes, the layer the one WaitLayer takes.
const (
	tW1 = iota // fc1.weight, Inputs×Hidden
	tB1        // fc1.bias, Hidden
	tW2        // fc2.weight, Hidden×Classes
	tB2        // fc2.bias, Classes
	numTensors
	numLayers = 2
)

func (c Config) tensors() []tensorSpec {
	return []tensorSpec{
		tW1: {"fc1.weight", 0, c.Inputs, c.Hidden},
		tB1: {"fc1.bias", 0, 1, c.Hidden},
		tW2: {"fc2.weight", 1, c.Hidden, c.Classes},
		tB2: {"fc2.bias", 1, 1, c.Classes},
	}
}

// layerTensors lists the tensor indices of each layer.
var layerTensors = [numLayers][]int{{tW1, tB1}, {tW2, tB2}}

// Validate reports the first unusable field.
func (c Config) Validate() error {
	switch {
	case c.Inputs < 1 || c.Hidden < 1 || c.Classes < 2:
		return fmt.Errorf("mlp: need inputs >= 1, hidden >= 1, classes >= 2; got %d, %d, %d", c.Inputs, c.Hidden, c.Classes)
	case c.Batch < 1:
		return fmt.Errorf("mlp: batch must be >= 1, got %d", c.Batch)
	case c.Workers < 1:
		return fmt.Errorf("mlp: workers must be >= 1, got %d", c.Workers)
	case c.Iterations < 1:
		return fmt.Errorf("mlp: iterations must be >= 1, got %d", c.Iterations)
	case !(c.LR > 0) || math.IsInf(float64(c.LR), 0):
		return fmt.Errorf("mlp: learning rate must be a positive number, got %v", c.LR)
	case c.TrainSize < c.Workers*c.Batch:
		return fmt.Errorf("mlp: %d training points cannot fill a global batch of %d", c.TrainSize, c.Workers*c.Batch)
	case c.TestSize < 1:
		return fmt.Errorf("mlp: test size must be >= 1, got %d", c.TestSize)
	}
	return nil
}

// Profile is what autobyte needs to know of the model: one Tensor per
// parameter tensor with its element count, layers in forward order. The
// compute times stay 0 (they only matter to the simulator and the replay).
// The name carries the hyperparameters so that the job digest, checked at
// rendezvous, also refuses a process started with another batch, seed or
// learning rate.
func (c Config) Profile() *model.Profile {
	p := &model.Profile{
		Name:      fmt.Sprintf("mlp-%dx%dx%d-b%d-seed%d-lr%g-n%d", c.Inputs, c.Hidden, c.Classes, c.Batch, c.Seed, c.LR, c.TrainSize),
		BatchSize: c.Batch, Device: "cpu", BytesPerParam: 4,
		Layers: []model.Layer{{Name: "fc1"}, {Name: "fc2"}},
	}
	for _, t := range c.tensors() {
		p.Layers[t.layer].Tensors = append(p.Layers[t.layer].Tensors, model.Tensor{Name: t.name, Params: int64(t.rows * t.cols)})
	}
	return p
}

// Dataset holds points X (n×Inputs, row-major) and labels Y.
type Dataset struct {
	X      []float32
	Y      []int
	Inputs int
}

// Len is the number of points.
func (d *Dataset) Len() int { return len(d.Y) }

// MakeData draws the training and test sets: Classes Gaussian blobs in
// Inputs dimensions (unit noise around centres drawn with standard
// deviation 0.8 per coordinate), seeded by c.Seed.
func MakeData(c Config) (train, test *Dataset) {
	rng := rand.New(rand.NewPCG(c.Seed, 0xda7a))
	centres := make([]float32, c.Classes*c.Inputs)
	for i := range centres {
		centres[i] = float32(0.8 * rng.NormFloat64())
	}
	draw := func(n int) *Dataset {
		d := &Dataset{X: make([]float32, n*c.Inputs), Y: make([]int, n), Inputs: c.Inputs}
		for i := range n {
			k := rng.IntN(c.Classes)
			d.Y[i] = k
			for j := range c.Inputs {
				d.X[i*c.Inputs+j] = centres[k*c.Inputs+j] + float32(rng.NormFloat64())
			}
		}
		return d
	}
	return draw(c.TrainSize), draw(c.TestSize)
}

// MLP is the model's parameters, one float32 slice per tensor.
type MLP struct {
	cfg    Config
	specs  []tensorSpec
	Params [numTensors][]float32
}

// NewMLP initialises the parameters from c.Seed: weights uniform in
// ±sqrt(6/(fan_in+fan_out)) (Glorot), biases zero. Every worker starts
// from the same parameters.
func NewMLP(c Config) *MLP {
	m := &MLP{cfg: c, specs: c.tensors()}
	rng := rand.New(rand.NewPCG(c.Seed, 0x1417))
	for i, t := range m.specs {
		m.Params[i] = make([]float32, t.rows*t.cols)
		if t.rows == 1 {
			continue // bias
		}
		a := math.Sqrt(6 / float64(t.rows+t.cols))
		for j := range m.Params[i] {
			m.Params[i][j] = float32(a * (2*rng.Float64() - 1))
		}
	}
	return m
}

func (m *MLP) mat(t int) blas32.General {
	s := m.specs[t]
	return blas32.General{Rows: s.rows, Cols: s.cols, Stride: s.cols, Data: m.Params[t]}
}

// NewGrads allocates one gradient buffer per tensor.
func (m *MLP) NewGrads() [numTensors][]float32 {
	var g [numTensors][]float32
	for i := range g {
		g[i] = make([]float32, len(m.Params[i]))
	}
	return g
}

// Step applies plain SGD to layer l's tensors: p -= lr · sum/workers. With
// workers = 1 the gradient is used as it is.
func (m *MLP) Step(l int, grads *[numTensors][]float32, workers int) {
	n, lr := float32(workers), m.cfg.LR
	for _, t := range layerTensors[l] {
		p, g := m.Params[t], grads[t]
		for i := range p {
			p[i] -= lr * (g[i] / n)
		}
	}
}

// Batch is a forward/backward workspace for a fixed number of rows.
type Batch struct {
	rows int
	X    blas32.General // rows×Inputs
	Y    []int
	h    blas32.General // rows×Hidden: tanh activations
	p    blas32.General // rows×Classes: logits, then softmax probabilities
	dh   blas32.General // rows×Hidden: dLoss/dh, then dLoss/dz1
}

func general(r, c int) blas32.General {
	return blas32.General{Rows: r, Cols: c, Stride: c, Data: make([]float32, r*c)}
}

// NewBatch allocates a workspace for rows points.
func (m *MLP) NewBatch(rows int) *Batch {
	c := m.cfg
	return &Batch{rows: rows, X: general(rows, c.Inputs), Y: make([]int, rows),
		h: general(rows, c.Hidden), p: general(rows, c.Classes), dh: general(rows, c.Hidden)}
}

// Load copies points idx of d into the batch.
func (b *Batch) Load(d *Dataset, idx []int) {
	in := d.Inputs
	for r, i := range idx {
		copy(b.X.Data[r*in:(r+1)*in], d.X[i*in:(i+1)*in])
		b.Y[r] = d.Y[i]
	}
}

// broadcastRows sets every row of dst to v.
func broadcastRows(dst blas32.General, v []float32) {
	for r := range dst.Rows {
		copy(dst.Data[r*dst.Stride:r*dst.Stride+dst.Cols], v)
	}
}

// Forward runs layer l on the batch: layer 0 is h = tanh(X·W1 + b1), layer
// 1 the logits h·W2 + b2 and their softmax.
func (m *MLP) Forward(l int, b *Batch) {
	switch l {
	case 0:
		broadcastRows(b.h, m.Params[tB1])
		blas32.Gemm(blas.NoTrans, blas.NoTrans, 1, b.X, m.mat(tW1), 1, b.h)
		for i, z := range b.h.Data {
			b.h.Data[i] = float32(math.Tanh(float64(z)))
		}
	case 1:
		broadcastRows(b.p, m.Params[tB2])
		blas32.Gemm(blas.NoTrans, blas.NoTrans, 1, b.h, m.mat(tW2), 1, b.p)
		k := m.cfg.Classes
		for r := range b.rows {
			row := b.p.Data[r*k : (r+1)*k]
			mx := row[0]
			for _, z := range row {
				mx = max(mx, z)
			}
			var s float32
			for i, z := range row {
				row[i] = float32(math.Exp(float64(z - mx)))
				s += row[i]
			}
			for i := range row {
				row[i] /= s
			}
		}
	}
}

// Loss is the batch's mean cross-entropy and accuracy; Forward must have
// run both layers.
func (b *Batch) Loss() (loss float64, acc float64) {
	k := b.p.Cols
	correct := 0
	for r := range b.rows {
		row := b.p.Data[r*k : (r+1)*k]
		loss -= math.Log(max(float64(row[b.Y[r]]), 1e-30))
		best := 0
		for i, v := range row {
			if v > row[best] {
				best = i
			}
		}
		if best == b.Y[r] {
			correct++
		}
	}
	return loss / float64(b.rows), float64(correct) / float64(b.rows)
}

// Backward computes the gradients of the batch's mean cross-entropy into
// grads, last layer first, and calls ready(l) as soon as layer l's
// gradients are complete (the data-parallel worker posts them there, so
// layer 1 communicates while layer 0 is still being differentiated). It
// reads the parameters but does not change them.
func (m *MLP) Backward(b *Batch, grads *[numTensors][]float32, ready func(l int)) {
	k, inv := m.cfg.Classes, 1/float32(b.rows)
	// dz2 = (softmax - onehot) / rows, in place of the probabilities.
	for r := range b.rows {
		row := b.p.Data[r*k : (r+1)*k]
		row[b.Y[r]] -= 1
		for i := range row {
			row[i] *= inv
		}
	}
	gen := func(t int) blas32.General {
		s := m.specs[t]
		return blas32.General{Rows: s.rows, Cols: s.cols, Stride: s.cols, Data: grads[t]}
	}
	// Layer 1: dW2 = hᵀ·dz2, db2 = column sums of dz2.
	blas32.Gemm(blas.Trans, blas.NoTrans, 1, b.h, b.p, 0, gen(tW2))
	colSums(grads[tB2], b.p)
	// dh = dz2·W2ᵀ, then dz1 = dh ⊙ (1 - h²). W2 is read before any update.
	blas32.Gemm(blas.NoTrans, blas.Trans, 1, b.p, m.mat(tW2), 0, b.dh)
	ready(1)
	for i, h := range b.h.Data {
		b.dh.Data[i] *= 1 - h*h
	}
	// Layer 0: dW1 = Xᵀ·dz1, db1 = column sums of dz1.
	blas32.Gemm(blas.Trans, blas.NoTrans, 1, b.X, b.dh, 0, gen(tW1))
	colSums(grads[tB1], b.dh)
	ready(0)
}

func colSums(dst []float32, a blas32.General) {
	clear(dst)
	for r := range a.Rows {
		row := a.Data[r*a.Stride : r*a.Stride+a.Cols]
		for i, v := range row {
			dst[i] += v
		}
	}
}

// Evaluate is the mean cross-entropy and accuracy of the model on d.
func (m *MLP) Evaluate(d *Dataset) (loss, acc float64) {
	b := m.NewBatch(d.Len())
	copy(b.X.Data, d.X)
	copy(b.Y, d.Y)
	for l := range numLayers {
		m.Forward(l, b)
	}
	return b.Loss()
}

// order is the seeded permutation of the training set that global batches
// are cut from.
func order(c Config) []int {
	return rand.New(rand.NewPCG(c.Seed, 0x0dde)).Perm(c.TrainSize)
}

// shard lists the training points of worker rank's part of global batch
// it: the global batch is the next Workers·Batch points of the permutation
// (wrapping around), and rank takes the rank-th run of Batch of them, so
// the workers' shards are disjoint and together the global batch.
func shard(c Config, perm []int, it, rank int, dst []int) []int {
	dst = dst[:0]
	global := c.Workers * c.Batch
	start := it*global + rank*c.Batch
	for j := range c.Batch {
		dst = append(dst, perm[(start+j)%len(perm)])
	}
	return dst
}
