package worker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/autobyte/autobyte/dtype"
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

// TensorsOf lists a profile's tensors for the engine, in model order: a
// profile of 4-byte parameters is a float32 model (which the
// configuration's compression may send in 16 bits), one of 2-byte
// parameters a bfloat16 model.
func TensorsOf(p *model.Profile) ([]Tensor, error) {
	wire, err := dtype.WireOf(p.BytesPerParam, dtype.F32)
	if err != nil {
		return nil, fmt.Errorf("worker: profile %q: %w", p.Name, err)
	}
	var ts []Tensor
	for l, layer := range p.Layers {
		for _, t := range layer.Tensors {
			if t.Params > 1<<31-1 {
				return nil, fmt.Errorf("worker: tensor %q has %d parameters, more than one buffer holds", t.Name, t.Params)
			}
			ts = append(ts, Tensor{Name: t.Name, Layer: l, Elems: int(t.Params), Wire: wire})
		}
	}
	return ts, nil
}

// pattern is rank's gradient value at element i of tensor t, and sumOf
// the sum over workers ranks: for float32, small integers, so sums over up
// to thousands of ranks are exact and their order does not matter; for a
// 16-bit wire, 1 or 2 (by rank) times a power of two up to 2^7, so the
// values and every partial sum are exact in the 16-bit type while the sum
// is at most exactLimit (its integers).
func pattern(rank, tensor, i int, wire dtype.DType) float32 {
	if wire != dtype.F32 {
		return float32((rank%2 + 1) << ((i + tensor) % 8))
	}
	return float32((rank + 1) * ((i+tensor)%251 + 1))
}

func sumOf(workers, tensor, i int, wire dtype.DType) float32 {
	if wire != dtype.F32 {
		return float32((workers + workers/2) << ((i + tensor) % 8))
	}
	return float32(workers*(workers+1)/2) * float32((i+tensor)%251+1)
}

// verifiable refuses to verify 16-bit sums of more workers than the
// replay's values stay exact for.
func verifiable(wires []dtype.DType, workers int, verify Verify) error {
	for _, d := range wires {
		if verify != VerifyNone && d != dtype.F32 && workers+workers/2 > exactLimit(d) {
			most := exactLimit(d) * 2 / 3
			for most+1+(most+1)/2 <= exactLimit(d) {
				most++
			}
			return fmt.Errorf("worker: verifying %v sums of %d workers: the replay's sums exceed %d, above which %v integers are not exact (verify none, or at most %d workers)",
				d, workers, exactLimit(d), d, most)
		}
	}
	return nil
}

// patternWires are the types whose exactness each tensor's replay values
// must respect: its own 16-bit type, or, for a float32 gradient that a
// configuration may compress (from the start or when a tuner says so,
// which any rank may learn only later), bfloat16's, the stricter; only a
// float32 tensor pinned Exact gets float32's wider values. limits are the
// types whose worker limit applies up front: the 16-bit ones, and the
// initial compression (a later one is checked as its sums arrive).
func patternWires(tensors []Tensor, initial dtype.DType) (patterns, limits []dtype.DType) {
	patterns, limits = make([]dtype.DType, len(tensors)), make([]dtype.DType, len(tensors))
	for i, t := range tensors {
		switch {
		case t.Wire != dtype.F32:
			patterns[i], limits[i] = t.Wire, t.Wire
		case !t.Exact:
			patterns[i], limits[i] = dtype.BF16, initial
		}
	}
	return patterns, limits
}

// exactLimit is the largest integer below which every integer is exact
// in a 16-bit wire type (its significand bits, plus the implicit one).
func exactLimit(d dtype.DType) int {
	if d == dtype.BF16 {
		return 1 << 8
	}
	return 1 << 11
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
	if e == nil {
		return nil, errors.New("worker: replay without an engine")
	}
	tensors := e.cfg.Tensors
	rank, workers := e.cfg.Rank, e.cfg.Workers
	if want, err := TensorsOf(p); err != nil {
		return nil, err
	} else if len(want) != len(tensors) {
		return nil, fmt.Errorf("worker: replaying profile %q of %d tensors on an engine of %d", p.Name, len(want), len(tensors))
	}
	wires, limits := patternWires(tensors, e.cfg.Sched.Compression)
	if err := verifiable(limits, workers, verify); err != nil {
		return nil, err
	}
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
			base[i][j] = pattern(rank, i, j, wires[i])
		}
		grads[i] = make([]float32, t.Elems)
	}
	res := &ReplayResult{}
	check := func(it, tensor int) error {
		if verify == VerifyNone {
			return nil
		}
		g := grads[tensor]
		step := 61
		if verify == VerifyFull {
			step = 1
		}
		wire := wires[tensor]
		for j := 0; j < len(g); j += step {
			if want := sumOf(workers, tensor, j, wire); g[j] != want {
				return fmt.Errorf("worker %d: iteration %d: tensor %d %q element %d is %v, exact sum is %v", rank, it, tensor, tensors[tensor].Name, j, g[j], want)
			}
			res.Checked++
		}
		if j := len(g) - 1; g[j] != sumOf(workers, tensor, j, wire) {
			return fmt.Errorf("worker %d: iteration %d: tensor %d %q last element is %v, exact sum is %v", rank, it, tensor, tensors[tensor].Name, g[j], sumOf(workers, tensor, j, wire))
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
			// One event per layer: its tensors are ready at one instant,
			// as in the simulator, so no answer is handled between them.
			posts := make([]Posting, 0, len(byLayer[l]))
			for _, t := range byLayer[l] {
				copy(grads[t], base[t])
				posts = append(posts, Posting{Tensor: t, Grad: grads[t]})
			}
			if err := e.PostAll(it, posts); err != nil {
				return nil, err
			}
		}
	}
	return res, nil
}
