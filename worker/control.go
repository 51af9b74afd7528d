package worker

import (
	"fmt"

	"github.com/autobyte/autobyte/cluster"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/transport"
)

func announceFrame(p sched.Piece) transport.Frame { return cluster.AnnounceFrame(p) }

// readLeader passes rank 0's piece announcements and configuration changes
// to the loop, in the order rank 0 sent them.
func (e *Engine) readLeader() {
	defer e.readers.Done()
	for {
		f, err := e.cfg.Leader.Recv()
		if err != nil {
			if e.ctx.Err() == nil {
				e.fail(fmt.Errorf("worker %d: lost rank 0 (the leader): %w", e.cfg.Rank, err))
			}
			return
		}
		if cluster.IsBye(f) {
			return
		}
		var ev event
		if f.Kind == transport.KindControl && f.Aux == cluster.CtlReconfigure {
			ev.kind = evReconfigure
			ev.reconf, err = cluster.DecodeReconfigure(f)
		} else {
			ev.kind = evAnnounce
			ev.piece, err = cluster.DecodeAnnounce(f)
		}
		if err != nil {
			e.fail(fmt.Errorf("worker %d: from rank 0: %w", e.cfg.Rank, err))
			return
		}
		e.send(ev)
	}
}

// watch reads a follower's control connection on the leader, which carries
// nothing but its goodbye, to notice a lost follower at once.
func (e *Engine) watch(c *transport.Conn) {
	defer e.readers.Done()
	f, err := c.Recv()
	switch {
	case err != nil:
		if e.ctx.Err() == nil {
			e.fail(fmt.Errorf("worker 0: lost worker %d: %w", c.PeerRank(), err))
		}
	case !cluster.IsBye(f):
		e.fail(fmt.Errorf("worker 0: worker %d sent an unexpected %v frame on the control connection", c.PeerRank(), f.Kind))
	}
}
