package job

import (
	"context"
	"fmt"
	"math"
	"net"
	"time"

	"github.com/autobyte/autobyte/cluster"
	"github.com/autobyte/autobyte/ps"
	"github.com/autobyte/autobyte/transport"
	"golang.org/x/time/rate"
)

// RunServer runs parameter server index until every worker said goodbye,
// or fails with an error naming the lost peer. It uses only the spec's
// architecture, worker and server counts and pull mode (ServerDigest): the
// profile may be nil.
func RunServer(ctx context.Context, spec Spec, index int, n Net) (*Summary, error) {
	sum, _, err := runServer(ctx, spec, index, n, n.patience())
	return sum, err
}

// ServeSessions serves successive jobs of the same workers as parameter
// server index: after a job ends in order it joins the next rendezvous at
// the same coordinator (a training script that opens the engine again,
// e.g. after autobyte.torch.shutdown()), up to sessions jobs (0: until ctx
// ends). The first job is awaited as RunServer awaits it; a later one
// without a timeout and without progress logs, since a script may train
// for hours before it opens the engine again or never do, and ctx ending
// while the server waits for it is a normal end (nil). The summary adds up
// the bytes of every job, and an error ends the loop.
func ServeSessions(ctx context.Context, spec Spec, index int, n Net, sessions int) (*Summary, error) {
	if sessions < 0 {
		return &Summary{Role: "server", Rank: index}, fmt.Errorf("job: server %d: sessions must be >= 0 (0: until stopped), got %d", index, sessions)
	}
	start := time.Now()
	total := &Summary{Role: "server", Rank: index}
	idle := cluster.Patience{Timeout: -1}
	for k := 0; sessions == 0 || k < sessions; k++ {
		p := n.patience()
		if k > 0 {
			p = idle
		}
		sum, joined, err := runServer(ctx, spec, index, n, p)
		total.BytesSent += sum.BytesSent
		total.BytesReceived += sum.BytesReceived
		total.WallS = time.Since(start).Seconds()
		if err != nil {
			if k > 0 && !joined && ctx.Err() != nil {
				return total, nil // stopped between jobs
			}
			return total, err
		}
		if n.Logger != nil && sessions != 1 {
			n.Logger.Info("job: server finished a job; waiting for the next", "server", index, "jobs", k+1,
				"bytes_received", sum.BytesReceived, "bytes_sent", sum.BytesSent)
		}
	}
	return total, nil
}

// runServer is RunServer with the rendezvous's patience given; joined
// reports whether the server got as far as the job's member table.
func runServer(ctx context.Context, spec Spec, index int, n Net, patience cluster.Patience) (sum *Summary, joined bool, err error) {
	start := time.Now()
	sum = &Summary{Role: "server", Rank: index}
	if err := spec.ValidateServer(); err != nil {
		return sum, joined, err
	}
	if index < 0 || index >= spec.Servers {
		return sum, joined, fmt.Errorf("job: server index %d out of range for %d servers", index, spec.Servers)
	}
	cfg, err := n.transport("server", index)
	if err != nil {
		return sum, joined, err
	}
	l, err := transport.Listen(listenAddr(n.Listen), cfg)
	if err != nil {
		return sum, joined, fmt.Errorf("job: server %d: %w", index, err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	self := cluster.Member{Role: "server", Rank: index, Addr: advertise(n.Listen, port), Digest: spec.ServerDigest(), Config: spec.ServerConfig()}
	_, ctl, err := cluster.Join(ctx, n.Master, self, cfg, patience)
	if err != nil {
		return sum, joined, err
	}
	joined = true
	defer ctl.Close()

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// The control connection to rank 0 carries only its goodbye; losing it
	// means losing the job.
	go func() {
		for {
			f, err := ctl.Recv()
			if err != nil {
				cancel(fmt.Errorf("job: server %d: lost rank 0: %w", index, err))
				return
			}
			if cluster.IsBye(f) {
				return
			}
		}
	}()

	conns := make([]*transport.Conn, spec.Workers)
	for got := 0; got < spec.Workers; got++ {
		c, err := l.Accept(ctx)
		if err != nil {
			closeAll(conns, err)
			return sum, joined, fmt.Errorf("job: server %d waiting for %d more workers: %w", index, spec.Workers-got, context.Cause(ctx))
		}
		r := c.PeerRank()
		if c.PeerRole() != "worker" || r < 0 || r >= spec.Workers || conns[r] != nil {
			err := fmt.Errorf("job: server %d: unexpected peer %s (want each of %d workers once)", index, c.Peer(), spec.Workers)
			_ = c.CloseWithReason(err.Error())
			closeAll(conns, err)
			return sum, joined, err
		}
		conns[r] = c
	}
	mode := ps.AnswerPush
	if spec.PullMode {
		mode = ps.SeparatePull
	}
	po := ps.Options{Workers: spec.Workers, Mode: mode, Logger: n.Logger}
	if n.RateAt != nil && cfg.Egress != nil {
		current := n.BandwidthBps
		po.OnIteration = func(k int) {
			r := n.RateAt(k)
			if !(r > 0) || math.IsInf(r, 0) || r == current {
				return
			}
			current = r
			cfg.Egress.SetLimit(rate.Limit(r))
			cfg.Ingress.SetLimit(rate.Limit(r))
			if n.Logger != nil {
				n.Logger.Info("job: server link rate", "server", index, "iteration", k, "bytes_per_s", r)
			}
		}
	}
	srv, err := ps.New(po)
	if err != nil {
		return sum, joined, err
	}
	err = srv.Serve(ctx, conns)
	for _, c := range conns {
		s, r := c.Stats()
		sum.BytesSent += s
		sum.BytesReceived += r
	}
	if err == nil {
		// Courtesy only: rank 0 may already have closed the control
		// connection after its own goodbye, which is no failure.
		_ = cluster.SayBye(ctl, index, time.Second)
		for _, c := range conns {
			_ = c.Close()
		}
	}
	sum.WallS = time.Since(start).Seconds()
	return sum, joined, err
}

func closeAll(conns []*transport.Conn, err error) {
	for _, c := range conns {
		if c != nil {
			_ = c.CloseWithReason(err.Error())
		}
	}
}

// listenAddr defaults to every interface on a free port.
func listenAddr(s string) string {
	if s == "" {
		return ":0"
	}
	return s
}

// advertise is the address others dial: the listen host if it names one,
// else ":port" for the coordinator to fill in with the host it saw.
func advertise(listen, port string) string {
	host, _, err := net.SplitHostPort(listenAddr(listen))
	if err != nil || host == "" || host == "0.0.0.0" || host == "::" {
		return ":" + port
	}
	return net.JoinHostPort(host, port)
}
