package sim

// Reconfiguration while a run goes on, and the per-iteration statistics a
// tuner sees.
//
// After iteration k completes (the last worker ends forward k+1) the
// simulator computes k's tune.Stats from its events and hands them to
// Options.Tuner. A proposal must apply from iteration k+tune.Lead or later:
// by then some workers may already have posted gradients of k+1, which keep
// the partitioning they were cut with (proto.Schedule is the rule). The
// leader's machine accepts the change as its next epoch and announces it to
// the followers one latency later, as the runtime's leader does. Every piece
// carries the leader's epoch, and a parameter server keys what it sums by
// (epoch, iteration, tensor, piece, shard) and places pieces by the epoch's
// partition size, so pieces of different partitionings never mix.

import (
	"fmt"

	"github.com/autobyte/autobyte/proto"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/tune"
)

// ConfigChange is a scheduling configuration in force from FromIteration
// (until the next change).
type ConfigChange = tune.ConfigChange

// flight integrates a scheduling core's bytes in flight over time.
type flight struct {
	t      float64 // last update
	bytes  int64   // in flight now
	active float64 // total time with bytes in flight
	area   float64 // integral of the bytes in flight over time
}

// at brings the integrals up to now.
func (f *flight) at(now float64) {
	if f.bytes > 0 {
		dt := now - f.t
		f.active += dt
		f.area += float64(f.bytes) * dt
	}
	f.t = now
}

func (f *flight) add(now float64, b int64) {
	f.at(now)
	f.bytes += b
}

// acct is a worker's measurements of its current iteration span (from the
// end of its last forward pass).
type acct struct {
	fl        *flight // the worker's core, or the all-reduce leader
	opMark    float64 // fl.active when the current compute step started
	overlap   float64 // compute time with bytes in flight, this span
	spanStart float64
	active0   float64 // fl.active at spanStart
	area0     float64 // fl.area at spanStart
	// postT[t] is when tensor t's latest gradient was posted here.
	postT []float64
}

// iterAcct sums the leader's measurements of one iteration (tune.Stats
// are rank 0's), and counts the pieces it started.
type iterAcct struct {
	fwd, bwd     float64 // compute of forward k (for span k-1) and backward k
	sent         float64 // bytes the leader sent for k's gradients
	queue        float64 // queueing delays of k's pieces
	queued       int64   // pieces counted in queue
	comm         float64 // time with pieces in flight, span k
	overlap      float64
	area, span   float64
	leaderPieces int // pieces of k the leader started
}

// jobContext is the part of tune.Stats that is constant over a run.
func (s *simulation) jobContext() tune.Stats {
	o := s.o
	st := tune.Stats{ModelBytes: o.Profile.TotalBytes(), Tensors: len(s.tensors), Workers: o.Workers,
		Servers: o.Servers, Arch: o.Arch.String(), RoundTripS: 2 * o.LatencyS}
	var largest int64
	for _, t := range s.tensors {
		largest = max(largest, t.bytes)
	}
	if n := len(s.tensors); n > 0 && st.ModelBytes > 0 {
		st.SizeSkew = float64(largest) / (float64(st.ModelBytes) / float64(n))
	}
	return st
}

// opStarted notes that w starts a compute step now.
func (s *simulation) opStarted(w *worker) {
	w.acct.fl.at(s.now)
	w.acct.opMark = w.acct.fl.active
}

// opDone accounts the compute step w just finished (before its phase
// advances: w.fwd and w.iter still describe the step). Only the leader's
// steps count: tune.Stats are rank 0's measurements, in the simulator as in
// the runtime, where only rank 0 tunes.
func (s *simulation) opDone(w *worker) {
	a := &w.acct
	a.fl.at(s.now)
	a.overlap += a.fl.active - a.opMark
	if w.rank != 0 {
		return
	}
	if w.fwd {
		s.iters[w.iter].fwd += s.now - w.opStart
	} else {
		s.iters[w.iter].bwd += s.now - w.opStart
	}
}

// forwardEnded closes the leader's span of the previous iteration when it
// ended forward pass j (j = len(w.fwdEnds)-1) and completes iteration j-1,
// as the runtime's leader does after its own forward pass.
func (s *simulation) forwardEnded(w *worker, j int) {
	if w.rank != 0 {
		return
	}
	a := &w.acct
	a.fl.at(s.now)
	if j > 0 {
		it := &s.iters[j-1]
		it.comm += a.fl.active - a.active0
		it.overlap += a.overlap
		it.area += a.fl.area - a.area0
		it.span += s.now - a.spanStart
	}
	a.overlap, a.spanStart, a.active0, a.area0 = 0, s.now, a.fl.active, a.fl.area
	if j > 0 {
		s.iterationDone(j - 1)
	}
}

// iterationDone computes iteration k's statistics, now that the leader
// ended forward k+1, and consults the tuner.
func (s *simulation) iterationDone(k int) {
	it, next := &s.iters[k], &s.iters[k+1]
	st := s.context
	st.Iteration = k
	st.IterationTimeS = s.now - s.workers[0].fwdEnds[k]
	st.ForwardS, st.BackwardS = next.fwd, it.bwd
	st.BandwidthBps = s.o.BandwidthAt(k)
	if st.IterationTimeS > 0 {
		st.GoodputBps = it.sent / st.IterationTimeS
	}
	if it.queued > 0 {
		st.QueueDelayS = it.queue / float64(it.queued)
	}
	if it.comm > 0 {
		st.Overlap = it.overlap / it.comm
	}
	if it.span > 0 {
		st.InFlightBytes = it.area / it.span
	}
	st.Config = s.configAt(k)
	s.stats = append(s.stats, st)
	if s.o.Tuner == nil {
		return
	}
	if p, ok := s.o.Tuner.Observe(st); ok {
		s.reconfigure(p, k)
	}
}

// reconfigure hands a tuner's proposal made after iteration k to the
// leader's machine, under the one rule for proposals (proto.Schedule); the
// leader announces the new epoch to the followers as the runtime's does.
func (s *simulation) reconfigure(p tune.Proposal, k int) {
	ch, err := proto.Schedule(s.configs, p, k, s.o.Tuner.Name())
	if err != nil {
		s.check(err)
		return
	}
	leader := s.workers[0]
	if _, err := leader.m.Reconfigure(ch.Config, ch.FromIteration); err != nil {
		s.check(err)
		return
	}
	s.drain(leader)
	s.configs = append(s.configs, ch)
}

// configAt is the configuration in force for iteration k's tasks.
func (s *simulation) configAt(k int) sched.Config { return tune.ConfigAt(s.configs, k) }

// BestStatic runs o once per candidate configuration, each fixed for the
// whole run (o.Tuner and o.Trace are ignored), and returns the index of the
// candidate with the lowest MeanIterationTimeS (the earlier one on ties)
// and every run's result: the best static configuration in hindsight for
// o's conditions.
func BestStatic(o Options, candidates []sched.Config) (int, []*Result, error) {
	if len(candidates) == 0 {
		return -1, nil, fmt.Errorf("sim: no candidate configurations")
	}
	o.Tuner, o.Trace = nil, nil
	best := -1
	var results []*Result
	for i, c := range candidates {
		o.Sched = c
		r, err := Run(o)
		if err != nil {
			return -1, nil, fmt.Errorf("sim: candidate %d (%+v): %w", i, c, err)
		}
		results = append(results, r)
		if best < 0 || r.MeanIterationTimeS < results[best].MeanIterationTimeS {
			best = i
		}
	}
	return best, results, nil
}
