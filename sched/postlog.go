package sched

import "fmt"

// postLog is what a Scheduler and a Follower both keep about posting: the
// order of iterations, the tasks posted for the newest one (to refuse a
// task posted twice, even after it finished) and the configuration changes
// waiting for their iteration.
type postLog struct {
	posted  bool
	maxIter int // highest iteration posted so far
	// postedNow holds the tensors posted for iteration maxIter.
	postedNow map[int]bool
	pending   []pending // sorted by from, strictly increasing
}

type pending struct {
	cfg  Config
	from int
}

// schedule queues a change of configuration from iteration from.
func (l *postLog) schedule(cfg Config, from int) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if l.posted && from <= l.maxIter {
		return fmt.Errorf("sched: configuration change from iteration %d comes too late: iteration %d already posted", from, l.maxIter)
	}
	if n := len(l.pending); n > 0 && from <= l.pending[n-1].from {
		return fmt.Errorf("sched: configuration change from iteration %d must come after the pending one from iteration %d", from, l.pending[n-1].from)
	}
	l.pending = append(l.pending, pending{cfg: cfg, from: from})
	return nil
}

// earliestFrom is the first iteration a change may apply from: after every
// iteration posted and after the last pending change.
func (l *postLog) earliestFrom() int {
	from := 0
	if l.posted {
		from = l.maxIter + 1
	}
	if n := len(l.pending); n > 0 {
		from = max(from, l.pending[n-1].from+1)
	}
	return from
}

// record checks that t may be posted now and records it; due returns the
// configuration changes that apply from t's iteration on, in order.
func (l *postLog) record(t Task) (due []Config, err error) {
	if t.Bytes <= 0 {
		return nil, fmt.Errorf("sched: task of tensor %d iteration %d: size must be > 0 bytes, got %d", t.Tensor, t.Iteration, t.Bytes)
	}
	if l.posted && t.Iteration < l.maxIter {
		return nil, fmt.Errorf("sched: task of tensor %d posted for iteration %d after iteration %d", t.Tensor, t.Iteration, l.maxIter)
	}
	if l.postedNow == nil {
		l.postedNow = map[int]bool{}
	}
	if t.Iteration != l.maxIter || !l.posted {
		clear(l.postedNow)
	}
	if l.postedNow[t.Tensor] {
		return nil, fmt.Errorf("sched: task of tensor %d iteration %d posted twice", t.Tensor, t.Iteration)
	}
	l.posted, l.maxIter = true, t.Iteration
	l.postedNow[t.Tensor] = true
	for len(l.pending) > 0 && l.pending[0].from <= t.Iteration {
		due = append(due, l.pending[0].cfg)
		l.pending = l.pending[1:]
	}
	return due, nil
}
