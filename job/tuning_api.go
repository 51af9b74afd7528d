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
// Use: t := NewTuning(spec, o, observer); w, _ := ConnectWith(..., ConnectOptions{Observer: t.Observer()}); t.Attach(w).
type Tuning struct {
	loop      *tuneLoop
	collector *StatsCollector

	mu                     sync.Mutex
	fwBegin, fwEnd, lastFw time.Time
	fwIter                 int
	inForward              bool
	// waits are the intervals the current forward spent blocked on layer
	// gates: communication, not compute.
	waits []struct{ from, to time.Time }
	now   func() time.Time
}

// NewTuning returns rank 0's tuning loop for spec; next, if set, sees
// every observer call too.
func NewTuning(spec Spec, o TuningOptions, next worker.Observer) *Tuning {
	t := &Tuning{loop: newTuneLoop(o, spec), fwIter: -1, now: time.Now}
	t.collector = NewStatsCollector(spec.Arch, spec.Workers, spec.Servers, next, t.loop.observe)
	return t
}

// Observer is what ConnectWith must be given.
func (t *Tuning) Observer() worker.Observer { return t.collector }

// Attach gives the loop the worker it reconfigures and whose round trip
// it measures.
func (t *Tuning) Attach(w *Worker) { t.loop.attach(w) }

// ForwardBegin and ForwardEnd bracket the forward pass of iteration k;
// ForwardEnd of k ends iteration k-1 and runs the tuner, so it must be
// called before any gradient of iteration k is posted. BackwardEnd ends the
// backward pass of k (it began when the forward ended).
func (t *Tuning) ForwardBegin(k int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.fwBegin, t.fwIter, t.inForward, t.waits = t.now(), k, true, t.waits[:0]
	return t.loop.err
}

// Waited reports that the caller was blocked on a layer gate from from to
// to; during a forward pass that time is not compute.
func (t *Tuning) Waited(from, to time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.inForward && to.After(from) {
		t.waits = append(t.waits, struct{ from, to time.Time }{from, to})
	}
}

// ForwardEnd: see ForwardBegin.
func (t *Tuning) ForwardEnd(k int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if k != t.fwIter {
		return fmt.Errorf("job: tuning: forward of iteration %d ended, but the forward that began was iteration %d", k, t.fwIter)
	}
	now := t.now()
	// The forward's compute is its span minus the waits on layer gates.
	at := t.fwBegin
	for _, w := range t.waits {
		if w.from.After(at) {
			t.collector.Compute("FW model", k, at, w.from)
		}
		if w.to.After(at) {
			at = w.to
		}
	}
	if now.After(at) {
		t.collector.Compute("FW model", k, at, now)
	}
	t.inForward = false
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
