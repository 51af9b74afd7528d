package job

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/autobyte/autobyte/allreduce"
	"github.com/autobyte/autobyte/cluster"
	"github.com/autobyte/autobyte/proto"
	"github.com/autobyte/autobyte/stats"
	"github.com/autobyte/autobyte/transport"
	"github.com/autobyte/autobyte/worker"
)

// WorkerOptions are a worker process's own settings.
type WorkerOptions struct {
	Rank   int
	Verify worker.Verify
	// OnIteration, if set, is called after each iteration (progress).
	OnIteration func(k int, d time.Duration)
	// Observer, if set, records timelines and metrics.
	Observer worker.Observer
	// Decisions, if set, records the worker's protocol decisions
	// (conformance tests).
	Decisions *proto.DecisionLog
	// ComputeScaleAt, if set, multiplies the replay's compute times of
	// iteration k (a compute trace, a straggler); see
	// worker.ReplayOptions.ComputeScale.
	ComputeScaleAt func(k int) float64
	// Tuning makes rank 0 measure its statistics per iteration and, with a
	// tuner, reconfigure the job as it proposes (ignored on other ranks).
	Tuning TuningOptions
}

// RunWorker runs worker rank through the job, replaying the profile's
// compute, and returns what it measured.
func RunWorker(ctx context.Context, spec Spec, o WorkerOptions, n Net) (sum *Summary, err error) {
	start := time.Now()
	sum = &Summary{Role: "worker", Rank: o.Rank}
	if spec.Iterations < 1 {
		return sum, fmt.Errorf("job: a replaying worker needs iterations >= 1, got %d", spec.Iterations)
	}
	obs := o.Observer
	var loop *tuneLoop
	if o.Rank == 0 && (o.Tuning.Tuner != nil || o.Tuning.Collect) {
		loop = newTuneLoop(o.Tuning, spec)
		obs = NewStatsCollector(spec.Arch, spec.Workers, spec.Servers, o.Observer, loop.observe)
	}
	w, err := ConnectWith(ctx, spec, o.Rank, n, ConnectOptions{Observer: obs, Decisions: o.Decisions})
	if err != nil {
		return sum, err
	}
	defer func() {
		sum.BytesSent, sum.BytesReceived = w.Close(err)
		sum.WallS = time.Since(start).Seconds()
	}()
	ro := worker.ReplayOptions{Iterations: spec.Iterations, Verify: o.Verify, OnIteration: o.OnIteration, ComputeScale: o.ComputeScaleAt}
	if loop != nil {
		loop.attach(w)
		ro.OnIteration = func(k int, d time.Duration) {
			if o.OnIteration != nil {
				o.OnIteration(k, d)
			}
			if loop.err != nil {
				// Stop the replay at the tuner's error: the deferred
				// Close ends the job with it.
				w.cancel(loop.err)
			}
		}
	}
	res, err := worker.ReplayWith(w.ctx, w.Engine, spec.Profile, ro)
	if loop != nil {
		sum.Configs, sum.Stats = loop.configs, loop.stats
		if loop.err != nil {
			return sum, loop.err
		}
	}
	if err != nil {
		return sum, w.cause(err)
	}
	sum.IterationTimesS = stats.Intervals(res.ForwardEnds)
	sum.IterationTimeS = stats.SteadyState(sum.IterationTimesS)
	sum.Checked = res.Checked
	return sum, nil
}

// Worker is a connected, running worker engine: the Go API's entry point.
// Post gradients to Engine, wait on its layer gates, and Close when done.
type Worker struct {
	*worker.Engine
	ctx    context.Context
	cancel context.CancelCauseFunc
	conns  []*transport.Conn
	// data are the connections pieces travel on: to the servers, or to
	// the ring's neighbours.
	data []*transport.Conn
	cfg  worker.Config
	// ctlServers are rank 0's control connections to the servers.
	ctlServers []*transport.Conn
	ring       *allreduce.Ring
	ringDone   chan struct{} // closed when the ring's Run returned
}

// RoundTripS is the shortest round trip the kernel has seen on any of the
// worker's data connections (TCP_INFO's minimum; transport.Conn.RoundTrip),
// in seconds: the network's latency without queueing. It is 0 when there
// is none to measure (a one-worker ring) or the kernel cannot say.
func (w *Worker) RoundTripS() float64 {
	best := 0.0
	for _, c := range w.data {
		rt, err := c.RoundTrip()
		if err != nil || rt.Min <= 0 {
			continue
		}
		if s := rt.Min.Seconds(); best == 0 || s < best {
			best = s
		}
	}
	return best
}

// cause prefers the reason the job stopped (a lost peer) over the error a
// caller saw as a consequence.
func (w *Worker) cause(err error) error {
	if c := context.Cause(w.ctx); c != nil && w.Engine.Err() == nil {
		return c
	}
	if e := w.Engine.Err(); e != nil {
		return e
	}
	return err
}

// Close ends the worker: with err == nil it says an orderly goodbye to
// every peer first; otherwise it closes every connection with err as the
// reason. It returns the bytes sent and received over all connections.
func (w *Worker) Close(err error) (sent, received int64) {
	if err == nil {
		// Every goodbye is written before any connection closes.
		var byes []*transport.Conn
		byes = append(byes, w.cfg.Servers...)
		byes = append(byes, w.cfg.Followers...)
		byes = append(byes, w.ctlServers...)
		if w.cfg.Leader != nil {
			byes = append(byes, w.cfg.Leader)
		}
		for _, c := range byes {
			if berr := cluster.SayBye(c, w.cfg.Rank, 5*time.Second); berr != nil {
				err = berr
			}
		}
		if w.ring != nil {
			if berr := w.ring.Goodbye(5 * time.Second); berr != nil {
				err = berr
			}
		}
	}
	w.Engine.Stop(err)
	if w.ringDone != nil {
		// Stop the ring before closing its connections, so it does not
		// mistake our own close for a lost neighbour.
		w.cancel(err)
		<-w.ringDone
	}
	for _, c := range w.conns {
		s, r := c.Stats()
		sent += s
		received += r
		if err != nil {
			_ = c.CloseWithReason(err.Error())
		} else {
			_ = c.Close()
		}
	}
	w.Engine.Wait()
	w.cancel(nil)
	return sent, received
}

// Connect joins the job as worker rank: rendezvous, connections to the
// servers or ring neighbours, and a started engine. onDone, if set, is
// called when a tensor's sum is in place (see worker.Config.OnDone).
func Connect(ctx context.Context, spec Spec, rank int, n Net, onDone func(tensor, iteration int)) (*Worker, error) {
	return ConnectWith(ctx, spec, rank, n, ConnectOptions{OnDone: onDone})
}

// ConnectOptions are optional hooks of a worker engine.
type ConnectOptions struct {
	OnDone func(tensor, iteration int)
	// OnOpen and OnStop: see worker.Config.
	OnOpen    func(layer, iteration int)
	OnStop    func(err error)
	Observer  worker.Observer
	Decisions *proto.DecisionLog
	// Tensors, if set, are the engine's tensors in place of those of
	// worker.TensorsOf(spec.Profile): the same names, layers and sizes,
	// with their own wire types (a binding's 16-bit parameters, or a
	// float32 broadcast kept exact beside compressed gradients). Every
	// worker must give the same types.
	Tensors []worker.Tensor
}

// ConnectWith is Connect with every option.
func ConnectWith(ctx context.Context, spec Spec, rank int, n Net, co ConnectOptions) (_ *Worker, err error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if rank < 0 || rank >= spec.Workers {
		return nil, fmt.Errorf("job: rank %d out of range for %d workers", rank, spec.Workers)
	}
	tensors, err := worker.TensorsOf(spec.Profile)
	if err != nil {
		return nil, err
	}
	if co.Tensors != nil {
		if len(co.Tensors) != len(tensors) {
			return nil, fmt.Errorf("job: %d tensors given for a profile of %d", len(co.Tensors), len(tensors))
		}
		for i, t := range co.Tensors {
			if w := tensors[i]; t.Name != w.Name || t.Layer != w.Layer || t.Elems != w.Elems {
				return nil, fmt.Errorf("job: tensor %d is %q (layer %d, %d elements), but the profile's is %q (layer %d, %d elements)", i, t.Name, t.Layer, t.Elems, w.Name, w.Layer, w.Elems)
			}
		}
		tensors = co.Tensors
	}
	cfg, err := n.transport("worker", rank)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	var conns []*transport.Conn
	defer func() {
		if err != nil {
			for _, c := range conns {
				_ = c.CloseWithReason(err.Error())
			}
			cancel(err)
		}
	}()
	o := WorkerOptions{Rank: rank}
	w := &Worker{ctx: ctx, cancel: cancel}

	// A ring worker listens for its previous neighbour before registering.
	var ringL *transport.Listener
	self := cluster.Member{Role: "worker", Rank: o.Rank, Digest: spec.Digest(), ServerDigest: spec.ServerDigest(), Config: spec.Config()}
	if spec.Arch == worker.AllReduce && spec.Workers > 1 {
		if ringL, err = transport.Listen(listenAddr(n.Listen), cfg); err != nil {
			return nil, fmt.Errorf("job: worker %d: %w", o.Rank, err)
		}
		defer ringL.Close()
		_, port, _ := net.SplitHostPort(ringL.Addr().String())
		self.Addr = advertise(n.Listen, port)
	}

	ecfg := worker.Config{Rank: o.Rank, Workers: spec.Workers, Arch: spec.Arch, Tensors: tensors,
		Sched: spec.Sched, ShardBytes: spec.ShardBytes, PullMode: spec.PullMode, Logger: n.Logger}
	var table *cluster.Table
	if o.Rank == 0 {
		// Listen on every interface at the master port: MASTER_ADDR is how
		// the others reach rank 0, which may be a name or an outside address.
		_, port, err := net.SplitHostPort(n.Master)
		if err != nil {
			return nil, fmt.Errorf("job: master address %q: %w", n.Master, err)
		}
		l, err := transport.Listen(net.JoinHostPort("", port), cfg)
		if err != nil {
			return nil, fmt.Errorf("job: rank 0 cannot listen for the rendezvous on port %s (master %s; AUTOBYTE_MASTER_PORT or --master picks another port, the same for every process of the job): %w", port, n.Master, err)
		}
		var wctl, sctl []*transport.Conn
		table, wctl, sctl, err = cluster.Coordinate(ctx, l, self, spec.Workers, spec.Servers, n.patience())
		l.Close()
		if err != nil {
			return nil, err
		}
		ecfg.Followers = wctl[1:]
		conns = append(conns, wctl[1:]...)
		conns = append(conns, sctl...)
		w.ctlServers = sctl
	} else {
		var ctl *transport.Conn
		table, ctl, err = cluster.Join(ctx, n.Master, self, cfg, n.patience())
		if err != nil {
			return nil, err
		}
		ecfg.Leader = ctl
		conns = append(conns, ctl)
	}

	var ring *allreduce.Ring
	switch spec.Arch {
	case worker.PS:
		for m, srv := range table.Servers {
			c, err := transport.Dial(ctx, srv.Addr, cfg)
			if err != nil {
				return nil, fmt.Errorf("job: worker %d: connecting to server %d: %w", o.Rank, m, err)
			}
			conns = append(conns, c)
			ecfg.Servers = append(ecfg.Servers, c)
			w.data = append(w.data, c)
		}
	case worker.AllReduce:
		if spec.Workers > 1 {
			next := table.Workers[(o.Rank+1)%spec.Workers]
			type accepted struct {
				c   *transport.Conn
				err error
			}
			got := make(chan accepted, 1)
			go func() {
				c, err := ringL.Accept(ctx)
				got <- accepted{c, err}
			}()
			nc, err := transport.Dial(ctx, next.Addr, cfg)
			if err != nil {
				return nil, fmt.Errorf("job: worker %d: connecting to next rank %d: %w", o.Rank, next.Rank, err)
			}
			conns = append(conns, nc)
			a := <-got
			if a.err != nil {
				return nil, fmt.Errorf("job: worker %d: waiting for the previous rank: %w", o.Rank, a.err)
			}
			conns = append(conns, a.c)
			w.data = append(w.data, nc, a.c)
			ring, err = allreduce.New(allreduce.Options{Rank: o.Rank, Size: spec.Workers, Next: nc, Prev: a.c, Logger: n.Logger})
			if err != nil {
				return nil, err
			}
			ecfg.Ring = ring
			w.ringDone = make(chan struct{})
			go func() {
				defer close(w.ringDone)
				if err := ring.Run(ctx); err != nil && ctx.Err() == nil {
					cancel(err)
				}
			}()
		}
	}

	ecfg.OnDone, ecfg.OnOpen, ecfg.OnStop = co.OnDone, co.OnOpen, co.OnStop
	ecfg.Observer, ecfg.Decisions = co.Observer, co.Decisions
	e, err := worker.New(ecfg)
	if err != nil {
		return nil, err
	}
	e.Start(ctx)
	w.Engine, w.conns, w.cfg, w.ring = e, conns, ecfg, ring
	return w, nil
}
