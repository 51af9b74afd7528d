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
	start := time.Now()
	sum := &Summary{Role: "server", Rank: index}
	if err := spec.ValidateServer(); err != nil {
		return sum, err
	}
	if index < 0 || index >= spec.Servers {
		return sum, fmt.Errorf("job: server index %d out of range for %d servers", index, spec.Servers)
	}
	cfg, err := n.transport("server", index)
	if err != nil {
		return sum, err
	}
	l, err := transport.Listen(listenAddr(n.Listen), cfg)
	if err != nil {
		return sum, fmt.Errorf("job: server %d: %w", index, err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	self := cluster.Member{Role: "server", Rank: index, Addr: advertise(n.Listen, port), Digest: spec.ServerDigest()}
	_, ctl, err := cluster.Join(ctx, n.Master, self, cfg, n.patience())
	if err != nil {
		return sum, err
	}
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
			return sum, fmt.Errorf("job: server %d waiting for %d more workers: %w", index, spec.Workers-got, context.Cause(ctx))
		}
		r := c.PeerRank()
		if c.PeerRole() != "worker" || r < 0 || r >= spec.Workers || conns[r] != nil {
			err := fmt.Errorf("job: server %d: unexpected peer %s (want each of %d workers once)", index, c.Peer(), spec.Workers)
			_ = c.CloseWithReason(err.Error())
			closeAll(conns, err)
			return sum, err
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
		return sum, err
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
	return sum, err
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
