package job

import (
	"fmt"
	"sync"
	"time"

	"github.com/autobyte/autobyte/worker"
)

// Tuning is rank 0's tuning loop for a worker driven through the Go API
// (ConnectWith) rather than by the profile replay: the caller reports its
// compute and iteration boundaries (ForwardBegin, ForwardEnd, BackwardEnd),
// the loop measures the statistics (StatsCollector) and applies the tuner's
// proposals with Engine.Reconfigure.
//
// Use: t := NewTuning(spec, o, observer); w, _ := ConnectWith(..., ConnectOptions{Observer: t.Observer()}); t.Attach(w.Engine).
type Tuning struct {
	loop      *tuneLoop
	collector *StatsCollector

	mu                     sync.Mutex
	fwBegin, fwEnd, lastFw time.Time
	fwIter                 int
	now                    func() time.Time
}

// NewTuning returns rank 0's tuning loop for spec; next, if set, sees
// every observer call too.
func NewTuning(spec Spec, o TuningOptions, next worker.Observer) *Tuning {
	t := &Tuning{loop: newTuneLoop(o, spec), fwIter: -1, now: time.Now}
	t.collector = NewStatsCollector(spec.Arch, spec.Workers, next, t.loop.observe)
	return t
}

// Observer is what ConnectWith must be given.
func (t *Tuning) Observer() worker.Observer { return t.collector }

// Attach gives the loop the engine it reconfigures.
func (t *Tuning) Attach(e *worker.Engine) { t.loop.engine = e }

// ForwardBegin and ForwardEnd bracket the forward pass of iteration k;
// ForwardEnd of k ends iteration k-1 and runs the tuner, so it must be
// called before any gradient of iteration k is posted. BackwardEnd ends the
// backward pass of k (it began when the forward ended).
func (t *Tuning) ForwardBegin(k int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.fwBegin, t.fwIter = t.now(), k
	return t.loop.err
}

// ForwardEnd: see ForwardBegin.
func (t *Tuning) ForwardEnd(k int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if k != t.fwIter {
		return fmt.Errorf("job: tuning: forward of iteration %d ended, but the forward that began was iteration %d", k, t.fwIter)
	}
	now := t.now()
	t.collector.Compute("FW model", k, t.fwBegin, now)
	if k > 0 && !t.lastFw.IsZero() {
		t.collector.Iteration(k-1, now.Sub(t.lastFw))
	}
	t.fwEnd, t.lastFw = now, now
	return t.loop.err
}

// BackwardEnd: see ForwardBegin.
func (t *Tuning) BackwardEnd(k int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if k != t.fwIter || t.fwEnd.IsZero() {
		return fmt.Errorf("job: tuning: backward of iteration %d ended without its forward", k)
	}
	t.collector.Compute("BW model", k, t.fwEnd, t.now())
	return t.loop.err
}

// Configs are the configurations applied so far, each with the iteration
// it applied from (the first is the spec's).
func (t *Tuning) Configs() []ConfigChange {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]ConfigChange(nil), t.loop.configs...)
}

// Err is the tuner's error (an invalid proposal), if any.
func (t *Tuning) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.loop.err
}
