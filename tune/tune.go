// Package tune holds the tuners that configure the scheduling core while a
// job runs, behind one interface, and the statistics they see.
//
// A tuner is a pure state machine like the core itself: it is handed one
// iteration's Stats at a time and may answer with a Proposal, a scheduling
// configuration that applies from a stated later iteration. It has no
// clock, goroutines or I/O, and knows nothing of how the statistics were
// measured: the simulator (package sim) computes them from its events and
// the runtime will compute the same quantities from its measurements. It
// must not know about the simulator or the transports; the caller (the
// simulator or rank 0 of a real job) applies proposals to every worker.
package tune

import (
	"github.com/autobyte/autobyte/model"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/stats"
)

// Stats are one iteration's runtime statistics, as a tuner sees them.
//
// They are the leader's (rank 0's) measurements, in the simulator as in the
// runtime, where only rank 0 tunes: iteration k spans, on rank 0, from the
// end of its forward pass k to the end of its forward pass k+1 (backward k,
// the communication of k's gradients and the gated forward k+1), and the
// tuner sees them right after that forward pass.
type Stats struct {
	// Iteration is the iteration these statistics describe.
	Iteration int `json:"iteration"`
	// IterationTimeS is rank 0's span of iteration k: from the end of its
	// forward k to the end of its forward k+1 (in a synchronous job every
	// worker's span is the job's iteration time, up to the spread of the
	// workers' ends).
	IterationTimeS float64 `json:"iteration_time_s"`
	// ForwardS and BackwardS are the compute time of forward k+1 and
	// backward k (time spent computing, not waiting at gates).
	ForwardS  float64 `json:"forward_s"`
	BackwardS float64 `json:"backward_s"`
	// BandwidthBps is the link rate per direction in force for the
	// iteration's communication (configured, or measured by the runtime),
	// in bytes/s.
	BandwidthBps float64 `json:"bandwidth_bps"`
	// GoodputBps is the bytes rank 0 sent for the iteration's gradients
	// (pushes on parameter servers, its share of the ring for all-reduce),
	// divided by IterationTimeS.
	GoodputBps float64 `json:"goodput_bps"`
	// QueueDelayS is the mean time a piece of the iteration waited between
	// its gradient being ready on rank 0 and its start there (credit and
	// order).
	QueueDelayS float64 `json:"queue_delay_s"`
	// Overlap is the fraction of communication time that overlapped with
	// compute: communication time is when rank 0 had at least one piece
	// in flight (started, not done); 0 when nothing was communicated.
	Overlap float64 `json:"overlap"`
	// InFlightBytes is the mean of rank 0's bytes in flight (started, not
	// done), time-weighted over its span.
	InFlightBytes float64 `json:"in_flight_bytes"`
	// RoundTripS is the round-trip time of a message between two hosts
	// without queueing (twice the one-way latency), as configured or
	// measured; 0 if unknown.
	RoundTripS float64 `json:"round_trip_s,omitempty"`
	// Config is the scheduling configuration in force for the iteration.
	Config sched.Config `json:"config"`
	// ServerGoodputBps[i] is the bytes rank 0 pushed to parameter server i
	// for the iteration over the time it had one of them unanswered, and
	// ServerResponseS[i] the mean time from push to answer
	// (stats.Collector); nil for all-reduce. The server whose link or
	// host sets the pace shows the lowest goodput.
	ServerGoodputBps []float64 `json:"server_goodput_bps,omitempty"`
	ServerResponseS  []float64 `json:"server_response_s,omitempty"`

	// Context: the job, constant over a run.

	// ModelBytes is the gradient size per worker per iteration.
	ModelBytes int64 `json:"model_bytes"`
	// Tensors is the number of gradient tensors.
	Tensors int `json:"tensors"`
	// SizeSkew is the largest tensor's size over the mean tensor size.
	SizeSkew float64 `json:"size_skew"`
	Workers  int     `json:"workers"`
	// Servers is the number of parameter servers (0 for all-reduce).
	Servers int `json:"servers"`
	// Arch is "ps" or "allreduce".
	Arch string `json:"arch"`
}

// Proposal is a configuration a tuner wants in force from FromIteration on.
// FromIteration must be later than the iteration in progress when it is
// proposed: a caller handed Stats of iteration k refuses any proposal from
// before k+2, since workers may already be posting k+1's gradients.
type Proposal struct {
	Config        sched.Config
	FromIteration int
}

// ConfigChange is a scheduling configuration in force from FromIteration
// (until the next change): the history a run reports.
type ConfigChange struct {
	FromIteration int          `json:"from_iteration"`
	Config        sched.Config `json:"config"`
}

// Measured returns s with the fields a stats.Collector measured of an
// iteration: the simulator's leader and the runtime's rank 0 fill Stats
// through it alike.
func (s Stats) Measured(m stats.Iteration) Stats {
	s.Iteration, s.IterationTimeS, s.ForwardS, s.BackwardS = m.Iteration, m.IterationS, m.ForwardS, m.BackwardS
	s.GoodputBps, s.QueueDelayS, s.Overlap, s.InFlightBytes = m.GoodputBps, m.QueueDelayS, m.Overlap, m.InFlightBytes
	s.ServerGoodputBps, s.ServerResponseS = m.ServerGoodputBps, m.ServerResponseS
	return s
}

// JobContext is the part of Stats that is constant over a run: the model's
// gradient bytes, tensor count and size skew (largest tensor over the mean),
// and the cluster. The simulator and the runtime both take it from here. An
// all-reduce job has no servers; a nil profile leaves the model's fields 0.
func JobContext(p *model.Profile, arch string, workers, servers int) Stats {
	st := Stats{Workers: workers, Servers: servers, Arch: arch}
	if arch == "allreduce" {
		st.Servers = 0
	}
	if p == nil {
		return st
	}
	st.ModelBytes = p.TotalBytes()
	var largest int64
	for _, l := range p.Layers {
		for _, t := range l.Tensors {
			st.Tensors++
			largest = max(largest, t.Params*int64(p.BytesPerParam))
		}
	}
	if st.Tensors > 0 && st.ModelBytes > 0 {
		st.SizeSkew = float64(largest) / (float64(st.ModelBytes) / float64(st.Tensors))
	}
	return st
}

// ConfigAt is the configuration in force for iteration k's tasks, given a
// history that starts at iteration 0 and is ordered by FromIteration.
func ConfigAt(history []ConfigChange, k int) sched.Config {
	c := history[0].Config
	for _, ch := range history[1:] {
		if ch.FromIteration > k {
			break
		}
		c = ch.Config
	}
	return c
}

// Tuner sees each iteration's statistics, in iteration order, and may
// propose a configuration for a future iteration. Successive proposals must
// apply from strictly increasing iterations. A Tuner is not safe for
// concurrent use.
type Tuner interface {
	// Name names the tuner in results and errors.
	Name() string
	// Observe is called once per iteration, after it completes. It returns
	// a proposal and true to change the configuration.
	Observe(s Stats) (Proposal, bool)
}

// Lead is how many iterations after an observed one a proposal can apply
// at the earliest: observing iteration k, a tuner may propose from k+Lead.
const Lead = 2
