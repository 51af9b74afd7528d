package job

// Runtime statistics and the tuner loop of a replaying worker's rank 0.
//
// A StatsCollector sits between the worker engine and the job's observer
// (timelines, metrics): it sees every piece the engine starts and finishes
// and every compute step and iteration the replay runs, and measures each
// iteration's tune.Stats as the simulator computes them (sim/tuning.go),
// from rank 0's own clock. A tuneLoop hands them to a tune.Tuner and
// applies its proposals with Engine.Reconfigure. docs/runtime-tuning.md
// says which fields are measured how.

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/autobyte/autobyte/proto"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/tune"
	"github.com/autobyte/autobyte/worker"
)

// ConfigChange is a scheduling configuration in force from FromIteration
// (until the next change).
type ConfigChange = tune.ConfigChange

// StatsContext is the part of tune.Stats that is constant over a run: the
// job's model and cluster.
func StatsContext(spec Spec) tune.Stats {
	st := tune.Stats{Workers: spec.Workers, Servers: spec.Servers, Arch: "ps"}
	if spec.Arch == worker.AllReduce {
		st.Servers, st.Arch = 0, "allreduce"
	}
	if spec.Profile == nil {
		return st
	}
	st.ModelBytes = spec.Profile.TotalBytes()
	var largest int64
	for _, l := range spec.Profile.Layers {
		for _, t := range l.Tensors {
			st.Tensors++
			largest = max(largest, t.Params*int64(spec.Profile.BytesPerParam))
		}
	}
	if st.Tensors > 0 && st.ModelBytes > 0 {
		st.SizeSkew = float64(largest) / (float64(st.ModelBytes) / float64(st.Tensors))
	}
	return st
}

// Measurement is what a StatsCollector measured of one iteration: the
// measured fields of Stats (see StatsCollector), and CommS, the time the
// worker had at least one piece in flight during the iteration's span.
type Measurement struct {
	Stats tune.Stats
	CommS float64
}

// busy is an interval with at least one piece in flight.
type busy struct{ from, to time.Time }

// iterMeasure sums what one iteration's pieces and compute steps measured.
type iterMeasure struct {
	fwd, bwd time.Duration // compute of forward k and backward k
	sent     float64       // bytes this worker sent for k's gradients
	queue    time.Duration // queueing delay of k's pieces
	pieces   int
}

// StatsCollector measures one worker's tune.Stats per iteration from the
// worker.Observer calls of its engine and replay, and passes every call on
// to Next. Install it as the engine's Observer (ConnectOptions.Observer)
// and let the replay report iterations to it. It is safe for concurrent
// use; OnStats runs on the goroutine that reported the iteration (the
// replay's), without the collector's lock.
//
// Iteration k spans from the end of forward k to the end of forward k+1
// (the replay reports Iteration(k) then); span 0 starts when backward 0
// starts. Measured per iteration, on this worker only:
//   - IterationTimeS: the span (the duration the replay reports);
//   - ForwardS, BackwardS: the compute steps of forward k+1 and backward k
//     (time sleeping in compute, not waiting at gates);
//   - GoodputBps: the gradient bytes of k's pieces this worker sent (piece
//     bytes on parameter servers; 2(N-1)/N of them on a ring), over
//     IterationTimeS;
//   - QueueDelayS: mean of (start - gradient ready) over k's pieces;
//   - Overlap: compute time with a piece in flight over time with a piece
//     in flight, within the span;
//   - InFlightBytes: the engine's bytes in flight, time-weighted over the
//     span.
//
// BandwidthBps, Config and the job context are the caller's (tuneLoop).
type StatsCollector struct {
	// Next, if set, receives every call too (timelines, metrics).
	Next worker.Observer
	// OnStats, if set, receives each iteration's measurement as soon as
	// the iteration ends.
	OnStats func(Measurement)

	arch    worker.Arch
	workers int
	now     func() time.Time // the clock of Iteration (tests set it)

	mu        sync.Mutex
	inflight  int64
	last      time.Time // of the last in-flight change
	active    time.Duration
	area      float64 // byte-seconds
	open      bool    // a busy interval is open (since openedAt)
	openedAt  time.Time
	closed    []busy // busy intervals a later compute step may still overlap
	spanOn    bool
	spanStart time.Time
	active0   time.Duration
	area0     float64
	overlap   time.Duration // this span's compute time with pieces in flight
	iters     map[int]*iterMeasure
}

// NewStatsCollector returns a collector for a worker of a job of arch with
// workers workers.
func NewStatsCollector(arch worker.Arch, workers int, next worker.Observer, onStats func(Measurement)) *StatsCollector {
	return &StatsCollector{Next: next, OnStats: onStats, arch: arch, workers: workers, now: time.Now, iters: map[int]*iterMeasure{}}
}

func (c *StatsCollector) iter(k int) *iterMeasure {
	m := c.iters[k]
	if m == nil {
		m = &iterMeasure{}
		c.iters[k] = m
	}
	return m
}

// setInflight integrates the bytes in flight up to t and sets them to b.
func (c *StatsCollector) setInflight(t time.Time, b int64) {
	if !c.last.IsZero() && t.After(c.last) {
		dt := t.Sub(c.last)
		if c.inflight > 0 {
			c.active += dt
			c.area += float64(c.inflight) * dt.Seconds()
		}
		c.last = t
	} else if c.last.IsZero() {
		c.last = t
	}
	switch {
	case c.inflight <= 0 && b > 0:
		c.open, c.openedAt = true, t
	case c.inflight > 0 && b <= 0:
		if c.open {
			c.closed = append(c.closed, busy{c.openedAt, t})
		}
		c.open = false
	}
	c.inflight = b
}

// integrals are the active time and area up to t.
func (c *StatsCollector) integrals(t time.Time) (time.Duration, float64) {
	active, area := c.active, c.area
	if c.inflight > 0 && t.After(c.last) {
		dt := t.Sub(c.last)
		active += dt
		area += float64(c.inflight) * dt.Seconds()
	}
	return active, area
}

// PieceStarted implements worker.Observer.
func (c *StatsCollector) PieceStarted(p sched.Piece, posted, started time.Time, inflight int64) {
	c.mu.Lock()
	m := c.iter(p.Iteration)
	sent := float64(p.Bytes)
	if c.arch == worker.AllReduce {
		n := float64(c.workers)
		sent *= 2 * (n - 1) / n
	}
	m.sent += sent
	if !posted.IsZero() && started.After(posted) {
		m.queue += started.Sub(posted)
	}
	m.pieces++
	c.setInflight(started, inflight)
	c.mu.Unlock()
	if c.Next != nil {
		c.Next.PieceStarted(p, posted, started, inflight)
	}
}

// PieceDone implements worker.Observer.
func (c *StatsCollector) PieceDone(p sched.Piece, started, done time.Time, inflight int64) {
	c.mu.Lock()
	c.setInflight(done, inflight)
	c.mu.Unlock()
	if c.Next != nil {
		c.Next.PieceDone(p, started, done, inflight)
	}
}

// Compute implements worker.Observer: the replay's compute steps are
// named "FW layer" and "BW layer".
func (c *StatsCollector) Compute(name string, iteration int, start, end time.Time) {
	c.mu.Lock()
	d := end.Sub(start)
	switch {
	case strings.HasPrefix(name, "FW "):
		c.iter(iteration).fwd += d
	case strings.HasPrefix(name, "BW "):
		c.iter(iteration).bwd += d
		if !c.spanOn {
			c.spanOn, c.spanStart = true, start
			c.active0, c.area0 = c.integrals(start)
		}
	}
	// Compute steps run one after another on the replay's goroutine, so no
	// later step starts before end: intervals that closed by then are done.
	var ov time.Duration
	keep := c.closed[:0]
	for _, b := range c.closed {
		ov += overlapOf(start, end, b.from, b.to)
		if b.to.After(end) {
			keep = append(keep, b)
		}
	}
	c.closed = keep
	if c.open {
		ov += overlapOf(start, end, c.openedAt, end)
	}
	if c.spanOn {
		c.overlap += ov
	}
	c.mu.Unlock()
	if c.Next != nil {
		c.Next.Compute(name, iteration, start, end)
	}
}

func overlapOf(a0, a1, b0, b1 time.Time) time.Duration {
	lo, hi := a0, a1
	if b0.After(lo) {
		lo = b0
	}
	if b1.Before(hi) {
		hi = b1
	}
	if hi.After(lo) {
		return hi.Sub(lo)
	}
	return 0
}

// Iteration implements worker.Observer: iteration k ended (forward k+1
// ended) after d. It closes k's span, computes k's statistics and hands
// them to OnStats.
func (c *StatsCollector) Iteration(k int, d time.Duration) {
	now := c.now()
	c.mu.Lock()
	st := tune.Stats{Iteration: k, IterationTimeS: d.Seconds()}
	m, next := c.iter(k), c.iter(k+1)
	st.ForwardS, st.BackwardS = next.fwd.Seconds(), m.bwd.Seconds()
	if d > 0 {
		st.GoodputBps = m.sent / d.Seconds()
	}
	if m.pieces > 0 {
		st.QueueDelayS = m.queue.Seconds() / float64(m.pieces)
	}
	active, area := c.integrals(now)
	var commS float64
	if c.spanOn {
		comm := active - c.active0
		commS = comm.Seconds()
		if comm > 0 {
			st.Overlap = min(1, c.overlap.Seconds()/comm.Seconds())
		}
		if span := now.Sub(c.spanStart); span > 0 {
			st.InFlightBytes = (area - c.area0) / span.Seconds()
		}
	}
	c.spanOn, c.spanStart, c.active0, c.area0, c.overlap = true, now, active, area, 0
	delete(c.iters, k)
	// Forward k+1's compute is in the next iteration's statistics, as the
	// simulator's; keep only what later iterations need.
	for it := range c.iters {
		if it < k {
			delete(c.iters, it)
		}
	}
	c.mu.Unlock()
	if c.Next != nil {
		c.Next.Iteration(k, d)
	}
	if c.OnStats != nil {
		c.OnStats(Measurement{Stats: st, CommS: commS})
	}
}

// TuningOptions make rank 0 of a replaying worker job tune itself.
type TuningOptions struct {
	// Tuner sees every iteration's statistics; its proposals are applied
	// with Engine.Reconfigure. Nil: no tuning (statistics are still
	// collected when Collect is set).
	Tuner tune.Tuner
	// Collect measures statistics without a tuner (Summary.Stats).
	Collect bool
	// BandwidthAt is the link rate (bytes/s) configured for iteration k's
	// communication (the testbed's tc rate, or the in-process shaping
	// rate); nil or a non-positive answer means unknown, and the statistics
	// then carry the rate rank 0 measured while it had pieces in flight
	// (its goodput over its communication time, a lower bound on the
	// link's rate).
	BandwidthAt func(k int) float64
	// RoundTripS is the configured round trip between two hosts (twice the
	// one-way latency); 0 means measure it: the statistics then carry the
	// kernel's shortest round trip on rank 0's data connections
	// (Worker.RoundTripS), or 0 if none (the tuner then assumes its
	// default).
	RoundTripS float64
	// OnStats, if set, sees every iteration's statistics after the tuner
	// did, and OnChange every configuration change rank 0 applied.
	OnStats  func(tune.Stats)
	OnChange func(ConfigChange)
}

// tuneLoop drives a tuner from rank 0's statistics.
type tuneLoop struct {
	o       TuningOptions
	context tune.Stats
	engine  *worker.Engine
	// roundTripS measures the round trip when none is configured.
	roundTripS func() float64
	configs    []ConfigChange
	stats      []tune.Stats
	err        error
}

func newTuneLoop(o TuningOptions, spec Spec) *tuneLoop {
	return &tuneLoop{o: o, context: StatsContext(spec), configs: []ConfigChange{{FromIteration: 0, Config: spec.Sched}}}
}

// attach gives the loop the worker it reconfigures and measures.
func (l *tuneLoop) attach(w *Worker) {
	l.engine, l.roundTripS = w.Engine, w.RoundTripS
}

// configAt is the configuration in force for iteration k's tasks.
func (l *tuneLoop) configAt(k int) sched.Config { return tune.ConfigAt(l.configs, k) }

// observe completes rank 0's measurement of iteration k and consults the
// tuner; it runs on the replay's goroutine between forward k+1 and
// backward k+1, when rank 0 has posted iterations up to k only, so a
// change from k+1 on is still legal for the engine.
func (l *tuneLoop) observe(ms Measurement) {
	if l.err != nil {
		return
	}
	m, comm := ms.Stats, ms.CommS
	k := m.Iteration
	st := l.context
	st.Iteration, st.IterationTimeS, st.ForwardS, st.BackwardS = k, m.IterationTimeS, m.ForwardS, m.BackwardS
	st.GoodputBps, st.QueueDelayS, st.Overlap, st.InFlightBytes = m.GoodputBps, m.QueueDelayS, m.Overlap, m.InFlightBytes
	st.Config, st.RoundTripS = l.configAt(k), l.o.RoundTripS
	if !(st.RoundTripS > 0) && l.roundTripS != nil {
		st.RoundTripS = l.roundTripS()
	}
	if l.o.BandwidthAt != nil {
		st.BandwidthBps = l.o.BandwidthAt(k)
	}
	if !(st.BandwidthBps > 0) && comm > 0 {
		st.BandwidthBps = m.GoodputBps * m.IterationTimeS / comm
	}
	l.stats = append(l.stats, st)
	if l.o.Tuner != nil {
		if p, ok := l.o.Tuner.Observe(st); ok {
			l.err = l.apply(p, k)
		}
	}
	if l.o.OnStats != nil {
		l.o.OnStats(st)
	}
}

// apply puts a proposal made after iteration k in force on every worker
// and server, under the one rule for proposals (proto.Schedule): from the
// iteration it states, which must be k+tune.Lead or later and after the
// previous change, or the job ends with an error naming the values.
func (l *tuneLoop) apply(p tune.Proposal, k int) error {
	name := l.o.Tuner.Name()
	ch, err := proto.Schedule(l.configs, p, k, name)
	if err != nil {
		return fmt.Errorf("job: %w", err)
	}
	if err := l.engine.Reconfigure(ch.Config, ch.FromIteration); err != nil {
		return fmt.Errorf("job: tuner %s's configuration (partition %d, credit %d) from iteration %d: %w", name, p.Config.PartitionBytes, p.Config.CreditBytes, ch.FromIteration, err)
	}
	l.configs = append(l.configs, ch)
	if l.o.OnChange != nil {
		l.o.OnChange(ch)
	}
	return nil
}
