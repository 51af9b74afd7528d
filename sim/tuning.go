package sim

// Reconfiguration while a run goes on, and the per-iteration statistics a
// tuner sees.
//
// After iteration k completes on the leader (rank 0 ends forward k+1) the
// simulator computes k's tune.Stats from the leader's events with
// stats.Collector, as the runtime's leader does, and hands them to
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

// iterationDone computes iteration k's statistics, now that the leader
// ended forward k+1, from what the leader's stats.Collector measured (the
// runtime's leader measures with the same collector), and consults the
// tuner.
func (s *simulation) iterationDone(k int) {
	leader := s.workers[0]
	m := s.measure.IterationEnded(k, s.now-leader.fwdEnds[k], s.now)
	st := s.context.Measured(m)
	st.BandwidthBps = s.o.BandwidthAt(k)
	st.Config = s.configAt(k)
	s.stats = append(s.stats, st)
	if s.o.Progress != nil {
		s.o.Progress(k, s.events)
	}
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
	// The run's budget was estimated with the first configuration; a
	// smaller partition from a tuner multiplies the pieces, so the rest of
	// the run is estimated again under the new one and ended if over.
	rest := s.o
	rest.Sched, rest.Iterations = ch.Config, max(1, s.o.Iterations-ch.FromIteration)
	if _, err := rest.Budget(); err != nil {
		s.check(fmt.Errorf("the %s tuner's configuration from iteration %d (%s): %w", s.o.Tuner.Name(), ch.FromIteration, ch.Config.Knobs(), err))
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
