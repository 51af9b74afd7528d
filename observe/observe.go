// Package observe turns what a runtime process does into a Chrome-trace
// timeline and Prometheus metrics. The worker engine and the replay call it
// through the worker.Observer interface; it knows nothing of how pieces are
// scheduled or moved.
package observe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/trace"
)

// Metrics are one process's Prometheus metrics.
type Metrics struct {
	Registry     *prometheus.Registry
	iteration    prometheus.Histogram
	lastIter     prometheus.Gauge
	queueDelay   prometheus.Histogram
	commTime     prometheus.Histogram
	pieces       prometheus.Counter
	bytesStarted prometheus.Counter
	creditInUse  prometheus.Gauge
	epoch        prometheus.Gauge
}

// NewMetrics registers the metrics of a process with the given role and
// rank (constant labels) on a fresh registry.
func NewMetrics(role string, rank int) *Metrics {
	reg := prometheus.NewRegistry()
	labels := prometheus.Labels{"role": role, "rank": strconv.Itoa(rank)}
	f := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "autobyte", Name: name, Help: help, ConstLabels: labels}
	}
	h := func(name, help string, buckets []float64) prometheus.Histogram {
		o := f(name, help)
		return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: o.Namespace, Name: o.Name, Help: o.Help, ConstLabels: o.ConstLabels, Buckets: buckets})
	}
	m := &Metrics{
		Registry:     reg,
		iteration:    h("iteration_seconds", "Iteration time (end of forward k to end of forward k+1).", prometheus.ExponentialBuckets(0.001, 1.5, 30)),
		lastIter:     prometheus.NewGauge(prometheus.GaugeOpts(f("last_iteration_seconds", "Duration of the most recent iteration."))),
		queueDelay:   h("piece_queue_seconds", "Time a piece waited between its gradient being ready and its start (credit and order).", prometheus.ExponentialBuckets(1e-5, 2, 24)),
		commTime:     h("piece_comm_seconds", "Time from a piece's start to its sum being in place.", prometheus.ExponentialBuckets(1e-5, 2, 24)),
		pieces:       prometheus.NewCounter(prometheus.CounterOpts(f("pieces_total", "Pieces started."))),
		bytesStarted: prometheus.NewCounter(prometheus.CounterOpts(f("piece_bytes_total", "Gradient bytes of the pieces started."))),
		creditInUse:  prometheus.NewGauge(prometheus.GaugeOpts(f("credit_in_use_bytes", "Bytes of pieces in flight (started, sum not yet in place)."))),
		epoch:        prometheus.NewGauge(prometheus.GaugeOpts(f("config_epoch", "Configuration epoch of the most recent piece."))),
	}
	reg.MustRegister(m.iteration, m.lastIter, m.queueDelay, m.commTime, m.pieces, m.bytesStarted, m.creditInUse, m.epoch,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Serve exposes the registry at http://addr/metrics until ctx ends. It
// returns once the listener is up (or failed), with the bound address.
func (m *Metrics) Serve(ctx context.Context, addr string) (net.Addr, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("observe: metrics listener on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = err // the process goes on without metrics
		}
	}()
	return l.Addr(), nil
}

// Observer records a worker's pieces and compute into a trace and metrics;
// either may be nil. It is safe for concurrent use.
type Observer struct {
	mu    sync.Mutex
	start time.Time
	// origin is added to every time written (AlignClock).
	origin  float64
	tw      *trace.Writer
	file    *os.File
	metrics *Metrics
	err     error
}

// New returns an observer. traceFile, if not empty, receives rank's
// Chrome-trace timeline (written as the run goes; Close finishes it).
func New(traceFile string, rank int, m *Metrics) (*Observer, error) {
	o := &Observer{start: time.Now(), metrics: m}
	if traceFile != "" {
		f, err := os.Create(traceFile)
		if err != nil {
			return nil, fmt.Errorf("observe: trace file: %w", err)
		}
		o.file, o.tw = f, trace.NewWriter(f)
		_ = o.tw.ProcessName(0, fmt.Sprintf("rank %d compute", rank))
		_ = o.tw.ProcessName(1, fmt.Sprintf("rank %d communication", rank))
	}
	return o, nil
}

func (o *Observer) since(t time.Time) float64 { return o.origin + t.Sub(o.start).Seconds() }

// AlignClock makes the trace's times those of another clock that read
// refS seconds at ref (e.g. the Python plugin's time.perf_counter), so
// the two timelines line up. Call it before recording anything.
func (o *Observer) AlignClock(ref time.Time, refS float64) {
	o.mu.Lock()
	o.start, o.origin = ref, refS
	o.mu.Unlock()
}

// PieceStarted records that p started after waiting queued, with inflight
// bytes now in flight.
func (o *Observer) PieceStarted(p sched.Piece, posted, started time.Time, inflight int64) {
	if m := o.metrics; m != nil {
		m.queueDelay.Observe(started.Sub(posted).Seconds())
		m.pieces.Inc()
		m.bytesStarted.Add(float64(p.Bytes))
		m.creditInUse.Set(float64(inflight))
		m.epoch.Set(float64(p.Epoch))
	}
	if o.tw != nil {
		o.mu.Lock()
		o.record(o.tw.Complete("QUEUE", "queue", 1, p.Tensor, o.since(posted), started.Sub(posted).Seconds(),
			map[string]any{"iteration": p.Iteration, "piece": p.Index, "layer": p.Layer, "bytes": p.Bytes}))
		o.mu.Unlock()
	}
}

// PieceDone records that p's sum is in place; inflight is what remains in
// flight.
func (o *Observer) PieceDone(p sched.Piece, started, done time.Time, inflight int64) {
	if m := o.metrics; m != nil {
		m.commTime.Observe(done.Sub(started).Seconds())
		m.creditInUse.Set(float64(inflight))
	}
	if o.tw != nil {
		o.mu.Lock()
		o.record(o.tw.Complete("COMMUNICATION", "comm", 1, p.Tensor, o.since(started), done.Sub(started).Seconds(),
			map[string]any{"iteration": p.Iteration, "piece": p.Index, "layer": p.Layer, "bytes": p.Bytes}))
		o.mu.Unlock()
	}
}

// Compute records one forward or backward layer.
func (o *Observer) Compute(name string, iteration int, start, end time.Time) {
	if o.tw != nil {
		o.mu.Lock()
		o.record(o.tw.Complete(name, "compute", 0, 0, o.since(start), end.Sub(start).Seconds(), map[string]any{"iteration": iteration}))
		o.mu.Unlock()
	}
}

// Iteration records a finished iteration.
func (o *Observer) Iteration(k int, d time.Duration) {
	if m := o.metrics; m != nil {
		m.iteration.Observe(d.Seconds())
		m.lastIter.Set(d.Seconds())
	}
}

func (o *Observer) record(err error) {
	if err != nil && o.err == nil {
		o.err = err
	}
}

// Close finishes the trace file.
func (o *Observer) Close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.tw == nil {
		return o.err
	}
	o.record(o.tw.Close())
	o.record(o.file.Close())
	o.tw = nil
	return o.err
}
