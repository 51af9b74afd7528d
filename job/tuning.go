package job

// Runtime statistics and the tuner loop of a replaying worker's rank 0.
//
// A StatsCollector sits between the worker engine and the job's observer
// (timelines, metrics): it sees every piece the engine starts and finishes
// and every compute step and iteration the replay runs, and measures each
// iteration's tune.Stats with stats.Collector, the same measurement the
// simulator makes of its leader, from rank 0's own clock. A tuneLoop hands
// them to a tune.Tuner and applies its proposals under proto.Schedule with
// Engine.Reconfigure. docs/runtime-tuning.md says which fields are measured
// how.

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/autobyte/autobyte/proto"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/stats"
	"github.com/autobyte/autobyte/tune"
	"github.com/autobyte/autobyte/worker"
)

// ConfigChange is a scheduling configuration in force from FromIteration
// (until the next change).
type ConfigChange = tune.ConfigChange

// StatsContext is the part of tune.Stats that is constant over a run: the
// job's model and cluster.
func StatsContext(spec Spec) tune.Stats {
	return tune.JobContext(spec.Profile, spec.Arch.String(), spec.Workers, spec.Servers)
}

// Measurement is what a StatsCollector measured of one iteration: the
// measured fields of Stats (see StatsCollector), and CommS, the time the
// worker had at least one piece in flight during the iteration's span.
type Measurement struct {
	Stats tune.Stats
	CommS float64
	// measured is what Stats was filled from.
	measured stats.Iteration
}

// StatsCollector measures one worker's tune.Stats per iteration from the
// worker.Observer calls of its engine and replay, with the same
// stats.Collector the simulator uses (so both measure alike), and passes
// every call on to Next. Install it as the engine's Observer
// (ConnectOptions.Observer) and let the replay report iterations to it. It
// is safe for concurrent use; OnStats runs on the goroutine that reported
// the iteration (the replay's), without the collector's lock.
//
// The replay's compute steps are named "FW layer" and "BW layer";
// Iteration(k, d) ends iteration k (forward k+1 ended after d). BandwidthBps,
// Config and the job context are the caller's (tuneLoop).
type StatsCollector struct {
	// Next, if set, receives every call too (timelines, metrics).
	Next worker.Observer
	// OnStats, if set, receives each iteration's measurement as soon as
	// the iteration ends.
	OnStats func(Measurement)

	now func() time.Time // the clock of Iteration (tests set it)

	mu   sync.Mutex
	base time.Time // times are seconds since base
	c    *stats.Collector
}

// NewStatsCollector returns a collector for a worker of a job of arch with
// workers workers and servers parameter servers.
func NewStatsCollector(arch worker.Arch, workers, servers int, next worker.Observer, onStats func(Measurement)) *StatsCollector {
	share := 1.0
	if arch == worker.AllReduce {
		share, servers = stats.RingShare(workers), 0
	}
	c := stats.NewCollector(share)
	c.Servers = servers
	return &StatsCollector{Next: next, OnStats: onStats, now: time.Now, c: c}
}

// sec is t in seconds since the first time the collector saw; mu is held.
func (c *StatsCollector) sec(t time.Time) float64 {
	if c.base.IsZero() {
		c.base = t
	}
	return t.Sub(c.base).Seconds()
}

// PieceStarted implements worker.Observer.
func (c *StatsCollector) PieceStarted(p sched.Piece, posted, started time.Time, inflight int64) {
	c.mu.Lock()
	if posted.IsZero() {
		posted = started
	}
	c.c.PieceStarted(p.Iteration, p.Bytes, c.sec(posted), c.sec(started), inflight)
	c.mu.Unlock()
	if c.Next != nil {
		c.Next.PieceStarted(p, posted, started, inflight)
	}
}

// PieceDone implements worker.Observer.
func (c *StatsCollector) PieceDone(p sched.Piece, started, done time.Time, inflight int64) {
	c.mu.Lock()
	c.c.PieceDone(c.sec(done), inflight)
	c.mu.Unlock()
	if c.Next != nil {
		c.Next.PieceDone(p, started, done, inflight)
	}
}

// ShardPushed implements worker.ShardObserver.
func (c *StatsCollector) ShardPushed(server, iteration int, bytes int64, at time.Time) {
	c.mu.Lock()
	c.c.ShardPushed(iteration, server, bytes, c.sec(at))
	c.mu.Unlock()
}

// ShardAnswered implements worker.ShardObserver.
func (c *StatsCollector) ShardAnswered(server, iteration int, at time.Time) {
	c.mu.Lock()
	c.c.ShardAnswered(iteration, server, c.sec(at))
	c.mu.Unlock()
}

// Compute implements worker.Observer.
func (c *StatsCollector) Compute(name string, iteration int, start, end time.Time) {
	c.mu.Lock()
	switch {
	case strings.HasPrefix(name, "FW "):
		c.c.Compute(true, iteration, c.sec(start), c.sec(end))
	case strings.HasPrefix(name, "BW "):
		c.c.Compute(false, iteration, c.sec(start), c.sec(end))
	}
	c.mu.Unlock()
	if c.Next != nil {
		c.Next.Compute(name, iteration, start, end)
	}
}

// Iteration implements worker.Observer: iteration k ended (forward k+1
// ended) after d. It computes k's statistics and hands them to OnStats.
func (c *StatsCollector) Iteration(k int, d time.Duration) {
	now := c.now()
	c.mu.Lock()
	m := c.c.IterationEnded(k, d.Seconds(), c.sec(now))
	c.mu.Unlock()
	if c.Next != nil {
		c.Next.Iteration(k, d)
	}
	if c.OnStats != nil {
		c.OnStats(Measurement{Stats: tune.Stats{}.Measured(m), CommS: m.CommS, measured: m})
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
	st := l.context.Measured(ms.measured)
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
