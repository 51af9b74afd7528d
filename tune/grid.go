package tune

import (
	"fmt"
	"math"

	"github.com/autobyte/autobyte/sched"
)

// Grid tries every candidate configuration for K iterations each, one after
// another, and then fixes the best: the one whose trial had the lowest mean
// iteration time, not counting each trial's first iteration (a warm-up: the
// pipeline still holds the previous configuration's effects). Ties go to
// the earlier candidate.
//
// Proposals are pipelined so that no iteration is lost between trials:
// observing iteration k it proposes from k+Lead, so trial i+1 is proposed
// while trial i still runs. The final choice is known only after the last
// trial's last iteration, so the last trial runs Lead-1 iterations longer
// (unmeasured) before the best takes over; if the last trial is the best,
// nothing changes. The first trial starts Lead iterations after the first
// observed one.
//
// It is a simple online baseline, and offline (on a simulator with fixed
// conditions) a cheap search for the best static configuration.
type Grid struct {
	k      int
	trials []Trial
	next   int // trials proposed so far
	best   int // -1 until chosen
}

// Trial is one candidate's trial.
type Trial struct {
	Config sched.Config
	// FromIteration is the first iteration of the trial, -1 until proposed.
	FromIteration int
	// Measured counts the iterations measured so far (at most K-1) and
	// MeanS is their mean iteration time (NaN while none).
	Measured int
	MeanS    float64
	sum      float64
}

// NewGrid returns a Grid over the candidates, k >= 2 iterations each (one
// warm-up and at least one measured).
func NewGrid(candidates []sched.Config, k int) (*Grid, error) {
	if len(candidates) == 0 {
		return nil, fmt.Errorf("tune: grid needs at least one candidate configuration")
	}
	if k < 2 {
		return nil, fmt.Errorf("tune: grid trials must last >= 2 iterations (1 warm-up + 1 measured), got %d", k)
	}
	g := &Grid{k: k, best: -1}
	for i, c := range candidates {
		if err := c.Validate(); err != nil {
			return nil, fmt.Errorf("tune: grid candidate %d (%+v): %w", i, c, err)
		}
		g.trials = append(g.trials, Trial{Config: c, FromIteration: -1, MeanS: math.NaN()})
	}
	return g, nil
}

// Cross returns base with every (partition, credit) pair, partitions
// varying slowest.
func Cross(base sched.Config, partitions, credits []int64) []sched.Config {
	var out []sched.Config
	for _, p := range partitions {
		for _, c := range credits {
			cfg := base
			cfg.PartitionBytes, cfg.CreditBytes = p, c
			out = append(out, cfg)
		}
	}
	return out
}

// Name returns "grid".
func (*Grid) Name() string { return "grid" }

// Observe records s in the trial it belongs to and proposes the next trial
// or, once every trial is measured, the best candidate.
func (g *Grid) Observe(s Stats) (Proposal, bool) {
	it := s.Iteration
	if g.next > 0 {
		// Trials occupy consecutive windows of k iterations, the last one
		// open-ended: find the one holding it.
		for i := g.next - 1; i >= 0; i-- {
			t := &g.trials[i]
			if it < t.FromIteration {
				continue
			}
			if it > t.FromIteration && it < t.FromIteration+g.k {
				t.sum += s.IterationTimeS
				t.Measured++
				t.MeanS = t.sum / float64(t.Measured)
			}
			break
		}
	}
	if g.best >= 0 {
		return Proposal{}, false
	}
	if g.next == 0 {
		return g.propose(it + Lead), true
	}
	last := g.trials[g.next-1]
	if g.next < len(g.trials) {
		if it >= last.FromIteration+g.k-Lead {
			return g.propose(max(last.FromIteration+g.k, it+Lead)), true
		}
		return Proposal{}, false
	}
	if it < last.FromIteration+g.k-1 {
		return Proposal{}, false
	}
	g.best = 0
	for i, t := range g.trials {
		if b := g.trials[g.best].MeanS; t.MeanS < b || math.IsNaN(b) && !math.IsNaN(t.MeanS) {
			g.best = i
		}
	}
	if g.best == g.next-1 {
		return Proposal{}, false // already in force
	}
	return Proposal{Config: g.trials[g.best].Config, FromIteration: it + Lead}, true
}

func (g *Grid) propose(from int) Proposal {
	t := &g.trials[g.next]
	t.FromIteration = from
	g.next++
	return Proposal{Config: t.Config, FromIteration: from}
}

// Trials returns a copy of the trials so far.
func (g *Grid) Trials() []Trial { return append([]Trial(nil), g.trials...) }

// Best returns the chosen configuration once every trial was measured.
func (g *Grid) Best() (sched.Config, bool) {
	if g.best < 0 {
		return sched.Config{}, false
	}
	return g.trials[g.best].Config, true
}
