package worker

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/autobyte/autobyte/model"
)

// Verify is how much of each sum a replay checks against the exact value.
type Verify int

const (
	VerifyNone Verify = iota
	// VerifySample checks every 61st element and the last of each tensor.
	VerifySample
	// VerifyFull checks every element.
	VerifyFull
)

// ReplayResult is what a replay measured on one worker.
type ReplayResult struct {
	// ForwardEnds are the times (since the start) the K+1 forward passes
	// ended; iteration k is ForwardEnds[k+1]-ForwardEnds[k].
	ForwardEnds []float64
	// Checked counts the elements compared with their exact sums.
	Checked int64
}

// TensorsOf lists a profile's tensors for the engine, in model order.
func TensorsOf(p *model.Profile) ([]Tensor, error) {
	var ts []Tensor
	for l, layer := range p.Layers {
		for _, t := range layer.Tensors {
			if p.BytesPerParam != 4 {
				return nil, fmt.Errorf("worker: profile %q has %d-byte parameters; the runtime moves float32 (4 bytes)", p.Name, p.BytesPerParam)
			}
			if t.Params > 1<<31-1 {
				return nil, fmt.Errorf("worker: tensor %q has %d parameters, more than one buffer holds", t.Name, t.Params)
			}
			ts = append(ts, Tensor{Name: t.Name, Layer: l, Elems: int(t.Params)})
		}
	}
	return ts, nil
}

// pattern is rank's gradient value at element i of tensor t: small
// integers, so float32 sums over up to thousands of ranks are exact and
// their order does not matter.
func pattern(rank, tensor, i int) float32 {
	return float32((rank + 1) * ((i+tensor)%251 + 1))
}

// Replay runs a profile's compute (as sleeps) for iterations iterations on
// engine e: each forward layer waits for its own layer of the previous
// iteration, each backward layer posts its tensors' gradients. Gradients
// hold a known integer pattern, and sums are checked as they are consumed.
// onIteration, if set, is called after every iteration with its index and
// duration.
func Replay(ctx context.Context, e *Engine, p *model.Profile, iterations int, verify Verify, onIteration func(k int, d time.Duration)) (*ReplayResult, error) {
	return ReplayWith(ctx, e, p, ReplayOptions{Iterations: iterations, Verify: verify, OnIteration: onIteration})
}

// ReplayOptions are the settings of ReplayWith.
type ReplayOptions struct {
	Iterations int
	Verify     Verify
	// OnIteration, if set, is called after every iteration k (when forward
	// k+1 ended, before backward k+1 starts) with k and its duration, after
	// the engine's Observer was told (Observer.Iteration).
	OnIteration func(k int, d time.Duration)
	// ComputeScale, if set, multiplies the compute times of iteration it's
	// forward and backward passes (forward it, then backward it, as the
	// simulator's compute trace and stragglers do; 2 = half as fast). It
	// must return a positive finite number; Replay fails naming the value
	// otherwise.
	ComputeScale func(it int) float64
}

// ReplayWith is Replay with every option.
func ReplayWith(ctx context.Context, e *Engine, p *model.Profile, o ReplayOptions) (*ReplayResult, error) {
	iterations, verify, onIteration := o.Iterations, o.Verify, o.OnIteration
	tensors, err := TensorsOf(p)
	if err != nil {
		return nil, err
	}
	rank, workers := e.cfg.Rank, e.cfg.Workers
	byLayer := make([][]int, len(p.Layers))
	for i, t := range tensors {
		byLayer[t.Layer] = append(byLayer[t.Layer], i)
	}
	// base holds each tensor's pattern for this rank; grads are the buffers
	// the engine sums into, refilled from base every iteration.
	base := make([][]float32, len(tensors))
	grads := make([][]float32, len(tensors))
	for i, t := range tensors {
		base[i] = make([]float32, t.Elems)
		for j := range base[i] {
			base[i][j] = pattern(rank, i, j)
		}
		grads[i] = make([]float32, t.Elems)
	}
	res := &ReplayResult{}
	scale := float32(workers * (workers + 1) / 2)
	check := func(it, tensor int) error {
		if verify == VerifyNone {
			return nil
		}
		g := grads[tensor]
		step := 61
		if verify == VerifyFull {
			step = 1
		}
		for j := 0; j < len(g); j += step {
			if want := scale * float32((j+tensor)%251+1); g[j] != want {
				return fmt.Errorf("worker %d: iteration %d: tensor %d %q element %d is %v, exact sum is %v", rank, it, tensor, tensors[tensor].Name, j, g[j], want)
			}
			res.Checked++
		}
		if j := len(g) - 1; g[j] != scale*float32((j+tensor)%251+1) {
			return fmt.Errorf("worker %d: iteration %d: tensor %d %q last element is %v, exact sum is %v", rank, it, tensor, tensors[tensor].Name, g[j], scale*float32((j+tensor)%251+1))
		}
		res.Checked++
		return nil
	}

	start := time.Now()
	now := func() float64 { return time.Since(start).Seconds() }
	// deadline-based sleeps: an overslept layer shortens the next one, so
	// timer slack does not accumulate over many short layers.
	var due time.Time
	obs := e.cfg.Observer
	compute := func(name string, it int, d float64) error {
		if t := time.Now(); due.Before(t) {
			due = t
		}
		due = due.Add(time.Duration(d * float64(time.Second)))
		timer := time.NewTimer(time.Until(due))
		defer timer.Stop()
		start := time.Now()
		select {
		case <-timer.C:
			if obs != nil {
				obs.Compute(name, it, start, time.Now())
			}
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	for it := 0; it <= iterations; it++ {
		cs := 1.0
		if o.ComputeScale != nil {
			cs = o.ComputeScale(it)
			if !(cs > 0) || math.IsInf(cs, 0) {
				return nil, fmt.Errorf("worker %d: compute scale of iteration %d is %v, want a positive number", rank, it, cs)
			}
		}
		for l, layer := range p.Layers {
			if it > 0 {
				if err := e.WaitLayer(l, it-1); err != nil {
					return nil, err
				}
				for _, t := range byLayer[l] {
					if err := check(it-1, t); err != nil {
						return nil, err
					}
				}
			}
			if err := compute("FW "+layer.Name, it, cs*layer.ForwardS); err != nil {
				return nil, err
			}
		}
		res.ForwardEnds = append(res.ForwardEnds, now())
		if it > 0 {
			n := len(res.ForwardEnds)
			d := time.Duration((res.ForwardEnds[n-1] - res.ForwardEnds[n-2]) * float64(time.Second))
			if obs != nil {
				obs.Iteration(it-1, d)
			}
			if onIteration != nil {
				onIteration(it-1, d)
			}
		}
		if it == iterations {
			break
		}
		for l := len(p.Layers) - 1; l >= 0; l-- {
			if err := compute("BW "+p.Layers[l].Name, it, cs*p.Layers[l].BackwardS); err != nil {
				return nil, err
			}
			for _, t := range byLayer[l] {
				copy(grads[t], base[t])
				if err := e.Post(t, it, grads[t]); err != nil {
					return nil, err
				}
			}
		}
	}
	return res, nil
}
