// Package model owns model profiles: the tensors a data-parallel job
// synchronises (per-tensor parameter counts, grouped into layers in forward
// order) and the per-layer forward and backward compute times on a stated
// reference GPU. It holds the built-in zoo and reads and writes profile files.
//
// It must not know about scheduling, networks or transports: a profile is
// pure data that the scheduler core, the simulator and the runtime consume.
package model

import (
	"fmt"
	"math"
)

// Tensor is one parameter tensor of a layer, synchronised as one gradient.
type Tensor struct {
	// Name is unique within the profile, e.g. "conv1.weight".
	Name string `json:"name"`
	// Params is the number of elements (parameters) of the tensor.
	Params int64 `json:"params"`
}

// Layer is a group of tensors that the forward pass consumes together. Layers
// are listed in forward order: layer 0 runs first in the forward pass and its
// gradients are produced last in the backward pass.
type Layer struct {
	Name string `json:"name"`
	// ForwardS and BackwardS are the compute times of this layer, in seconds,
	// for one worker at the profile's batch size on its reference GPU.
	ForwardS  float64  `json:"forward_s"`
	BackwardS float64  `json:"backward_s"`
	Tensors   []Tensor `json:"tensors"`
}

// Profile describes one model for communication scheduling.
type Profile struct {
	Name string `json:"name"`
	// BatchSize is the per-worker batch the compute times are for.
	BatchSize int `json:"batch_size"`
	// Device names the reference device the times were derived or measured on.
	Device string `json:"device"`
	// BytesPerParam is the gradient element size in bytes (4 for fp32).
	BytesPerParam int     `json:"bytes_per_param"`
	Layers        []Layer `json:"layers"`
}

// Validate reports the first problem that makes p unusable: an empty name, a
// batch size or element size that is not positive, no layers, a layer without
// tensors, a tensor whose parameter count is not positive, a compute time that
// is negative or not finite, or a tensor name used twice. The error names the
// offending layer and tensor and the bad value.
func (p *Profile) Validate() error {
	if p == nil {
		return fmt.Errorf("profile is nil")
	}
	if err := p.validate(); err != nil {
		if p.Name == "" {
			return fmt.Errorf("profile: %w", err)
		}
		return fmt.Errorf("profile %q: %w", p.Name, err)
	}
	return nil
}

// validate is Validate without the profile-name prefix, so that callers that
// know a better label (a file name) can add their own.
func (p *Profile) validate() error {
	if p.Name == "" {
		return fmt.Errorf("name must be non-empty")
	}
	if p.BatchSize <= 0 {
		return fmt.Errorf("batch_size must be > 0, got %d", p.BatchSize)
	}
	if p.BytesPerParam <= 0 {
		return fmt.Errorf("bytes_per_param must be > 0, got %d", p.BytesPerParam)
	}
	if len(p.Layers) == 0 {
		return fmt.Errorf("must have at least one layer, got 0")
	}
	type where struct {
		layer int
		name  string
	}
	seen := make(map[string]where)
	var total int64
	maxTotal := int64(math.MaxInt64) / int64(p.BytesPerParam)
	for i := range p.Layers {
		l := &p.Layers[i]
		if l.Name == "" {
			return fmt.Errorf("layer %d: name must be non-empty", i)
		}
		if math.IsNaN(l.ForwardS) || math.IsInf(l.ForwardS, 0) || l.ForwardS < 0 {
			return fmt.Errorf("layer %d %q: forward_s must be finite and >= 0, got %v", i, l.Name, l.ForwardS)
		}
		if math.IsNaN(l.BackwardS) || math.IsInf(l.BackwardS, 0) || l.BackwardS < 0 {
			return fmt.Errorf("layer %d %q: backward_s must be finite and >= 0, got %v", i, l.Name, l.BackwardS)
		}
		if len(l.Tensors) == 0 {
			return fmt.Errorf("layer %d %q: must have at least one tensor, got 0", i, l.Name)
		}
		for j, t := range l.Tensors {
			if t.Name == "" {
				return fmt.Errorf("layer %d %q: tensor %d: name must be non-empty", i, l.Name, j)
			}
			if t.Params <= 0 {
				return fmt.Errorf("layer %d %q: tensor %q: params must be > 0, got %d", i, l.Name, t.Name, t.Params)
			}
			if w, dup := seen[t.Name]; dup {
				return fmt.Errorf("layer %d %q: tensor %q: duplicate tensor name (first used in layer %d %q)", i, l.Name, t.Name, w.layer, w.name)
			}
			seen[t.Name] = where{i, l.Name}
			if t.Params > maxTotal-total {
				return fmt.Errorf("layer %d %q: tensor %q: params %d make the profile's size in bytes overflow int64", i, l.Name, t.Name, t.Params)
			}
			total += t.Params
		}
	}
	if c := p.ForwardS() + p.BackwardS(); c > MaxIterationComputeS {
		return fmt.Errorf("one iteration's compute (forward_s + backward_s over all layers) is %.4g s, more than the %d s (a day) a profile may ask for: check that the times are in seconds", c, MaxIterationComputeS)
	}
	return nil
}

// MaxIterationComputeS bounds a profile's compute per iteration. A replay
// sleeps that long for real, and beyond about 292 years a duration no
// longer fits in time.Duration and would silently wrap; a day is far
// beyond any real model and still catches times given in the wrong unit
// or scaled by mistake.
const MaxIterationComputeS = 86400

// TotalParams is the number of parameters over all tensors.
func (p *Profile) TotalParams() int64 {
	if p == nil {
		return 0
	}
	var n int64
	for _, l := range p.Layers {
		for _, t := range l.Tensors {
			n += t.Params
		}
	}
	return n
}

// TotalBytes is the gradient size in bytes over all tensors
// (TotalParams × BytesPerParam).
func (p *Profile) TotalBytes() int64 {
	if p == nil {
		return 0
	}
	return p.TotalParams() * int64(p.BytesPerParam)
}

// NumTensors is the number of tensors over all layers.
func (p *Profile) NumTensors() int {
	if p == nil {
		return 0
	}
	n := 0
	for _, l := range p.Layers {
		n += len(l.Tensors)
	}
	return n
}

// ForwardS is the forward compute time of one iteration in seconds: the sum
// of the layers' ForwardS.
func (p *Profile) ForwardS() float64 {
	return p.sumLayers(func(l Layer) float64 { return l.ForwardS })
}

// BackwardS is the backward compute time of one iteration in seconds: the
// sum of the layers' BackwardS.
func (p *Profile) BackwardS() float64 {
	return p.sumLayers(func(l Layer) float64 { return l.BackwardS })
}

// sumLayers adds up one time of every layer, in layer order (0 for a nil
// profile): ForwardS and BackwardS differ only in the field they sum.
func (p *Profile) sumLayers(time func(Layer) float64) float64 {
	if p == nil {
		return 0
	}
	var s float64
	for _, l := range p.Layers {
		s += time(l)
	}
	return s
}

// LargestTensor returns the tensor with the most parameters (the first such
// in forward order) and false if p has no tensors.
func (p *Profile) LargestTensor() (Tensor, bool) {
	var best Tensor
	found := false
	if p == nil {
		return best, false
	}
	for _, l := range p.Layers {
		for _, t := range l.Tensors {
			if !found || t.Params > best.Params {
				best, found = t, true
			}
		}
	}
	return best, found
}

// Clone returns a deep copy of p (nil for nil): changing the copy's layers or
// tensors does not change p.
func (p *Profile) Clone() *Profile {
	if p == nil {
		return nil
	}
	c := *p
	if p.Layers != nil {
		c.Layers = make([]Layer, len(p.Layers))
		for i, l := range p.Layers {
			c.Layers[i] = l
			if l.Tensors != nil {
				c.Layers[i].Tensors = append([]Tensor(nil), l.Tensors...)
			}
		}
	}
	return &c
}

// Scaled returns a deep copy of p with every layer's forward and backward
// time multiplied by computeScale (2 models a GPU half as fast as the
// reference). p is not changed. The copy is not validated: a negative or
// non-finite computeScale yields a profile that Validate rejects.
func (p *Profile) Scaled(computeScale float64) *Profile {
	c := p.Clone()
	if c == nil {
		return nil
	}
	for i := range c.Layers {
		c.Layers[i].ForwardS *= computeScale
		c.Layers[i].BackwardS *= computeScale
	}
	return c
}
