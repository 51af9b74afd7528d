package model

import (
	"fmt"
	"sort"
	"strings"
)

// Reference device of the built-in zoo. Compute times of the derived models
// are forward FLOPs × batch size / (ReferencePeakFLOPS × ReferenceEfficiency);
// backward time is BackwardFactor × forward time.
const (
	// ReferencePeakFLOPS is the NVIDIA V100 (SXM2) peak fp32 rate, FLOP/s.
	ReferencePeakFLOPS = 15.7e12
	// ReferenceEfficiency is the fraction of peak the zoo assumes is sustained.
	ReferenceEfficiency = 0.5
	// BackwardFactor is backward FLOPs per forward FLOP (gradients with
	// respect to both the inputs and the weights).
	BackwardFactor = 2.0
	// ReferenceDevice is the Device string of the FLOP-derived zoo profiles.
	ReferenceDevice = "NVIDIA V100 fp32 (15.7 TFLOP/s peak, 50% efficiency; FLOP model)"
)

// zoo maps each built-in model name to its builder. Builders return a new
// profile on every call.
var zoo = map[string]func() *Profile{
	"alexnet":     alexNet,
	"vgg16":       vgg16,
	"resnet50":    func() *Profile { return resNet("resnet50", [4]int{3, 4, 6, 3}) },
	"resnet101":   func() *Profile { return resNet("resnet101", [4]int{3, 4, 23, 3}) },
	"transformer": transformerBase,
	"bert-base":   bertBase,
	"gpt2":        gpt2Small,
	"toy3":        toy3,
}

// Zoo returns the names of the built-in models, sorted.
func Zoo() []string {
	names := make([]string, 0, len(zoo))
	for n := range zoo {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Get returns the built-in model called name. Each call returns a new
// profile, so callers may change it freely.
func Get(name string) (*Profile, error) {
	build, ok := zoo[name]
	if !ok {
		return nil, fmt.Errorf("unknown model %q (known models: %s)", name, strings.Join(Zoo(), ", "))
	}
	return build(), nil
}

// toy3 is the three-layer example model: 1.5 MB, 3 MB and 1.5 MB of fp32
// gradients and 1 s forward and 1 s backward per layer.
func toy3() *Profile {
	p := &Profile{Name: "toy3", BatchSize: 1, Device: "toy (unit time)", BytesPerParam: 4}
	for i, n := range []int64{375_000, 750_000, 375_000} {
		name := fmt.Sprintf("layer%d", i)
		p.Layers = append(p.Layers, Layer{
			Name: name, ForwardS: 1, BackwardS: 1,
			Tensors: []Tensor{{Name: name + ".weight", Params: n}},
		})
	}
	return p
}

// builder assembles a FLOP-derived profile layer by layer in forward order.
type builder struct {
	p     *Profile
	flops []float64 // forward FLOPs per sample, per layer
}

func newBuilder(name string, batch int) *builder {
	return &builder{p: &Profile{Name: name, BatchSize: batch, Device: ReferenceDevice, BytesPerParam: 4}}
}

// add appends a layer whose forward pass costs flopsPerSample FLOPs for one
// sample and whose parameters are the given tensors.
func (b *builder) add(name string, flopsPerSample float64, tensors ...[]Tensor) {
	var ts []Tensor
	for _, t := range tensors {
		ts = append(ts, t...)
	}
	b.p.Layers = append(b.p.Layers, Layer{Name: name, Tensors: ts})
	b.flops = append(b.flops, flopsPerSample)
}

// addFLOPs adds forward FLOPs per sample to the most recent layer (for work
// done by a module without parameters of its own, such as a tied LM head).
func (b *builder) addFLOPs(flopsPerSample float64) {
	b.flops[len(b.flops)-1] += flopsPerSample
}

// build converts FLOPs to times on the reference device and returns the
// profile.
func (b *builder) build() *Profile {
	rate := ReferencePeakFLOPS * ReferenceEfficiency
	for i := range b.p.Layers {
		f := b.flops[i] * float64(b.p.BatchSize) / rate
		b.p.Layers[i].ForwardS = f
		b.p.Layers[i].BackwardS = BackwardFactor * f
	}
	return b.p
}

// Parameter tensors of common modules, named as in PyTorch state dicts.

// conv is a k×k convolution from cin to cout channels: weight
// [cout, cin, k, k] and, if bias, bias [cout].
func conv(name string, cin, cout, k int, bias bool) []Tensor {
	ts := []Tensor{{Name: name + ".weight", Params: int64(cout) * int64(cin) * int64(k) * int64(k)}}
	if bias {
		ts = append(ts, Tensor{Name: name + ".bias", Params: int64(cout)})
	}
	return ts
}

// linear is a fully connected layer: weight [out, in] and, if bias, bias [out].
func linear(name string, in, out int, bias bool) []Tensor {
	ts := []Tensor{{Name: name + ".weight", Params: int64(in) * int64(out)}}
	if bias {
		ts = append(ts, Tensor{Name: name + ".bias", Params: int64(out)})
	}
	return ts
}

// norm is a batch or layer normalisation over c channels: affine weight and
// bias (running statistics are buffers, not parameters).
func norm(name string, c int) []Tensor {
	return []Tensor{{Name: name + ".weight", Params: int64(c)}, {Name: name + ".bias", Params: int64(c)}}
}

// embedding is a lookup table of n rows of dimension d.
func embedding(name string, n, d int) []Tensor {
	return []Tensor{{Name: name, Params: int64(n) * int64(d)}}
}

// FLOP counts: one multiply-add is 2 FLOPs.

// convFLOPs is the forward cost of a k×k convolution producing an hout×wout
// map: 2·k²·cin·cout·hout·wout.
func convFLOPs(cin, cout, k, hout, wout int) float64 {
	return 2 * float64(k) * float64(k) * float64(cin) * float64(cout) * float64(hout) * float64(wout)
}

// linearFLOPs is the forward cost of a linear layer applied to tokens inputs.
func linearFLOPs(in, out, tokens int) float64 {
	return 2 * float64(in) * float64(out) * float64(tokens)
}

// attnFLOPs is the cost of the two attention matmuls (Q·Kᵀ and weights·V)
// for nq queries over nk keys of total width d: 4·nq·nk·d.
func attnFLOPs(nq, nk, d int) float64 {
	return 4 * float64(nq) * float64(nk) * float64(d)
}

// outSize is the spatial output size of a convolution or pooling window.
func outSize(in, k, stride, pad int) int {
	return (in+2*pad-k)/stride + 1
}
