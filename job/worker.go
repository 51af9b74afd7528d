package job

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/autobyte/autobyte/allreduce"
	"github.com/autobyte/autobyte/cluster"
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
}

// RunWorker runs worker rank through the job and returns what it measured.
func RunWorker(ctx context.Context, spec Spec, o WorkerOptions, n Net) (sum *Summary, err error) {
	start := time.Now()
	sum = &Summary{Role: "worker", Rank: o.Rank}
	if err := spec.Validate(); err != nil {
		return sum, err
	}
	if o.Rank < 0 || o.Rank >= spec.Workers {
		return sum, fmt.Errorf("job: rank %d out of range for %d workers", o.Rank, spec.Workers)
	}
	tensors, err := worker.TensorsOf(spec.Profile)
	if err != nil {
		return sum, err
	}
	cfg, err := n.transport("worker", o.Rank)
	if err != nil {
		return sum, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var conns []*transport.Conn
	defer func() {
		for _, c := range conns {
			s, r := c.Stats()
			sum.BytesSent += s
			sum.BytesReceived += r
			if err != nil {
				_ = c.CloseWithReason(err.Error())
			} else {
				_ = c.Close()
			}
		}
		sum.WallS = time.Since(start).Seconds()
	}()

	// A ring worker listens for its previous neighbour before registering.
	var ringL *transport.Listener
	self := cluster.Member{Role: "worker", Rank: o.Rank, Digest: spec.Digest()}
	if spec.Arch == worker.AllReduce && spec.Workers > 1 {
		if ringL, err = transport.Listen(listenAddr(n.Listen), cfg); err != nil {
			return sum, fmt.Errorf("job: worker %d: %w", o.Rank, err)
		}
		defer ringL.Close()
		_, port, _ := net.SplitHostPort(ringL.Addr().String())
		self.Addr = advertise(n.Listen, port)
	}

	ecfg := worker.Config{Rank: o.Rank, Workers: spec.Workers, Arch: spec.Arch, Tensors: tensors,
		Sched: spec.Sched, ShardBytes: spec.ShardBytes, PullMode: spec.PullMode, Logger: n.Logger}
	var table *cluster.Table
	if o.Rank == 0 {
		l, err := transport.Listen(n.Master, cfg)
		if err != nil {
			return sum, fmt.Errorf("job: rank 0 cannot listen for the rendezvous at %s: %w", n.Master, err)
		}
		var wctl, sctl []*transport.Conn
		table, wctl, sctl, err = cluster.Coordinate(ctx, l, self, spec.Workers, spec.Servers)
		l.Close()
		if err != nil {
			return sum, err
		}
		ecfg.Followers = wctl[1:]
		conns = append(conns, wctl[1:]...)
		conns = append(conns, sctl...)
		defer func() {
			if err == nil {
				for _, c := range sctl {
					_ = c.Send(cluster.ByeFrame(0))
				}
			}
		}()
	} else {
		var ctl *transport.Conn
		table, ctl, err = cluster.Join(ctx, n.Master, self, cfg)
		if err != nil {
			return sum, err
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
				return sum, fmt.Errorf("job: worker %d: connecting to server %d: %w", o.Rank, m, err)
			}
			conns = append(conns, c)
			ecfg.Servers = append(ecfg.Servers, c)
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
				return sum, fmt.Errorf("job: worker %d: connecting to next rank %d: %w", o.Rank, next.Rank, err)
			}
			conns = append(conns, nc)
			a := <-got
			if a.err != nil {
				return sum, fmt.Errorf("job: worker %d: waiting for the previous rank: %w", o.Rank, a.err)
			}
			conns = append(conns, a.c)
			ring, err = allreduce.New(allreduce.Options{Rank: o.Rank, Size: spec.Workers, Next: nc, Prev: a.c, Logger: n.Logger})
			if err != nil {
				return sum, err
			}
			ecfg.Ring = ring
			go func() {
				if err := ring.Run(ctx); err != nil && ctx.Err() == nil {
					cancel(err)
				}
			}()
		}
	}

	e, err := worker.New(ecfg)
	if err != nil {
		return sum, err
	}
	e.Start(ctx)
	res, rerr := worker.Replay(ctx, e, spec.Profile, spec.Iterations, o.Verify, o.OnIteration)
	if rerr != nil {
		if cause := context.Cause(ctx); cause != nil && e.Err() == nil {
			rerr = cause
		}
		e.Stop(rerr)
		return sum, rerr
	}
	// An orderly goodbye to everyone this worker talks to.
	for _, c := range ecfg.Servers {
		_ = c.Send(cluster.ByeFrame(o.Rank))
	}
	if ecfg.Leader != nil {
		_ = ecfg.Leader.Send(cluster.ByeFrame(o.Rank))
	}
	for _, c := range ecfg.Followers {
		_ = c.Send(cluster.ByeFrame(0))
	}
	e.Stop(nil)
	sum.IterationTimesS = stats.Intervals(res.ForwardEnds)
	sum.IterationTimeS = stats.SteadyState(sum.IterationTimesS)
	sum.Checked = res.Checked
	return sum, nil
}
