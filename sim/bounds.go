package sim

import (
	"math"

	"github.com/autobyte/autobyte/model"
)

// Bounds are lower bounds on the steady-state iteration time of a job, in
// seconds. Each holds for any scheduling of the job's
// communication on the simulator's network model. They ignore
// Options.MessageCostS, which only adds to every message's time, so they
// hold with it too (less tightly).
type Bounds struct {
	// ComputeS is forward plus backward compute.
	ComputeS float64 `json:"compute_s"`
	// WorkerLinkS is the bytes each worker must send per iteration over its
	// link: S/B for parameter servers (push and pull use the two
	// directions), 2(N-1)/N·S/B for ring all-reduce.
	WorkerLinkS float64 `json:"worker_link_s"`
	// ServerLinkS is N·S/(M·B): the servers' links receiving every push
	// (parameter servers only).
	ServerLinkS float64 `json:"server_link_s,omitempty"`
	// FirstLayerS is compute plus the time to synchronise layer 0, whose
	// gradient is produced last and consumed first.
	FirstLayerS float64 `json:"first_layer_s"`
	// FluidS is the fluid relaxation: infinitely fine pieces, perfect
	// preemptive priority and per-layer gates, no per-message cost but the
	// latency of one synchronisation. It is the tightest bound here for the
	// given profile.
	FluidS float64 `json:"fluid_s"`
	// MaxS is the largest of the above: the lower bound.
	MaxS float64 `json:"max_s"`
}

// LowerBounds computes the bounds for o (which must be valid) with every
// link at o.BandwidthBps.
func LowerBounds(o Options) Bounds {
	return lowerBounds(o, o.BandwidthBps, float64(o.Servers)*o.BandwidthBps)
}

// lowerBounds are the bounds with the slowest worker link at bw and the
// servers' links adding up to servers (bytes/s; parameter servers only).
// Every worker sends all its bytes, so the slowest one's link bounds the
// worker terms and the fluid rate; every push crosses some server's link,
// so their sum bounds the server term, whatever the placement.
func lowerBounds(o Options, bw, servers float64) Bounds {
	p := o.Profile
	n := float64(o.Workers)
	var b Bounds
	var bytes []float64
	for _, l := range p.Layers {
		var lb float64
		for _, t := range l.Tensors {
			lb += float64(t.Params * o.elemBytes())
		}
		bytes = append(bytes, lb)
	}
	total := 0.0
	for _, x := range bytes {
		total += x
	}
	b.ComputeS = p.ForwardS() + p.BackwardS()

	// rate is how fast one worker's gradient bytes can be synchronised
	// (bytes of gradient per second); syncLat the fixed latency of one
	// synchronisation.
	var rate, syncLat float64
	switch o.Arch {
	case PS:
		rate, syncLat = bw, 2*o.LatencyS
		b.WorkerLinkS = total / bw
		b.ServerLinkS = n * total / servers
	case AllReduce:
		if o.Workers == 1 {
			rate, syncLat = math.Inf(1), 0
		} else {
			rate, syncLat = bw*n/(2*(n-1)), 2*(n-1)*o.LatencyS
			b.WorkerLinkS = total / rate
		}
	}
	b.FirstLayerS = b.ComputeS + bytes[0]/rate + syncLat
	b.FluidS = fluid(p.Layers, bytes, rate, syncLat)
	b.MaxS = max(b.ComputeS, b.WorkerLinkS, b.ServerLinkS, b.FirstLayerS, b.FluidS)
	return b
}

// fluid returns the period of the fluid schedule. With the backward pass
// starting at time 0, layer l's gradient is ready when its backward ends;
// one server of the given rate synchronises ready bytes preemptively, lowest
// layer first; layer l is synchronised syncLat after its last byte is
// served; the next forward runs layer l once it is synchronised and layer
// l-1 has run, and the next backward starts when it ends. No iteration's
// communication can overlap the next backward (the forward between them
// needs all of it), so the pattern repeats exactly and its period is a
// lower bound: preemptive lowest-layer-first finishes every prefix of layers
// as early as any schedule can, and the forward needs the prefixes in order.
func fluid(layers []model.Layer, bytes []float64, rate, syncLat float64) float64 {
	L := len(layers)
	ready := make([]float64, L)
	t := 0.0
	for l := L - 1; l >= 0; l-- {
		t += layers[l].BackwardS
		ready[l] = t
	}
	remaining := append([]float64(nil), bytes...)
	synced := make([]float64, L)
	now := 0.0
	for done := 0; done < L; {
		// The most urgent ready layer with bytes left, and the next release.
		cur, next := -1, math.Inf(1)
		for l := 0; l < L; l++ {
			if remaining[l] < 0 {
				continue
			}
			if ready[l] <= now {
				if cur < 0 {
					cur = l
				}
			} else {
				next = min(next, ready[l])
			}
		}
		if cur < 0 {
			now = next
			continue
		}
		finish := now + remaining[cur]/rate
		if finish <= next {
			now = finish
			remaining[cur] = -1
			synced[cur] = now + syncLat
			done++
			continue
		}
		remaining[cur] -= (next - now) * rate
		now = next
	}
	start := 0.0
	for l := range layers {
		start = max(start, synced[l]) + layers[l].ForwardS
	}
	return start
}
