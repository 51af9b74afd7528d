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

// leadReconfigure is Reconfigure on rank 0, in the loop: the core accepts
// the change (or err says why not, and nothing changed), it becomes the
// next epoch, and every follower is told before any piece of it can start
// (pieces start later in this loop, and announcements of them follow on the
// same connections at the same priority). fatal is set when a follower
// could not be told: the job no longer agrees on its epochs.
func (e *Engine) leadReconfigure(cfg sched.Config, from int) (err, fatal error) {
	if err := e.core.(*sched.Scheduler).Reconfigure(cfg, from); err != nil {
		return fmt.Errorf("worker 0: %w", err), nil
	}
	r := cluster.Reconfiguration{Epoch: len(e.epochs), From: from, Config: cfg}
	e.epochs = append(e.epochs, cfg)
	for _, c := range e.cfg.Followers {
		if err := c.Send(cluster.ReconfigureFrame(r)); err != nil {
			err = fmt.Errorf("worker 0: announcing configuration epoch %d (from iteration %d) to rank %d: %w", r.Epoch, from, c.PeerRank(), err)
			return err, err
		}
	}
	e.log.Debug("worker: reconfigured", "epoch", r.Epoch, "from", from, "partition", cfg.PartitionBytes, "credit", cfg.CreditBytes)
	return nil, nil
}

// followReconfigure applies a change rank 0 announced: the epoch must be
// the next one here (epochs are numbered in the order rank 0 accepted
// them), and the follower core takes the new credit window and admission
// rule. The core refuses a change from an iteration already posted here,
// which happens when this worker is ahead of rank 0; credit is this
// worker's own business, so the change then applies from its next
// iteration (and after its previous change) instead. The partition is not
// affected: pieces of the new epoch are rank 0's, announced after this.
func (e *Engine) followReconfigure(r cluster.Reconfiguration) error {
	if r.Epoch != len(e.epochs) {
		return fmt.Errorf("worker %d: rank 0 announced configuration epoch %d (from iteration %d), but the next epoch here is %d", e.cfg.Rank, r.Epoch, r.From, len(e.epochs))
	}
	from := r.From
	if e.posted && from <= e.maxPosted {
		from = e.maxPosted + 1
	}
	if e.changed && from <= e.lastFrom {
		from = e.lastFrom + 1
	}
	if err := e.core.(*sched.Follower).Reconfigure(r.Config, from); err != nil {
		return fmt.Errorf("worker %d: configuration epoch %d from iteration %d: %w", e.cfg.Rank, r.Epoch, r.From, err)
	}
	e.changed, e.lastFrom = true, from
	e.epochs = append(e.epochs, r.Config)
	if from != r.From {
		e.log.Debug("worker: credit change applies late here", "rank", e.cfg.Rank, "epoch", r.Epoch, "from", r.From, "here_from", from)
	}
	return nil
}

// checkAnnounced refuses a piece rank 0 announced that this worker cannot
// place: one of an epoch it was not told about, of a tensor it does not
// have, or cut otherwise than its epoch's partition size cuts the tensor
// (pushing it would mix partitionings on the servers).
func (e *Engine) checkAnnounced(p sched.Piece) error {
	if p.Epoch >= len(e.epochs) {
		return fmt.Errorf("worker %d: rank 0 announced piece %d of tensor %d iteration %d in configuration epoch %d before announcing that epoch (epochs here are 0..%d)",
			e.cfg.Rank, p.Index, p.Tensor, p.Iteration, p.Epoch, len(e.epochs)-1)
	}
	if p.Tensor < 0 || p.Tensor >= len(e.cfg.Tensors) {
		return fmt.Errorf("worker %d: rank 0 announced a piece of tensor %d iteration %d, but there are %d tensors", e.cfg.Rank, p.Tensor, p.Iteration, len(e.cfg.Tensors))
	}
	t := e.cfg.Tensors[p.Tensor]
	size := 4 * int64(t.Elems)
	part := e.epochs[p.Epoch].PartitionBytes
	count := sched.PieceCount(size, 4, part)
	i := int64(p.Index)
	if int64(p.Count) != count || i < 0 || i >= count || p.Layer != t.Layer {
		return fmt.Errorf("worker %d: rank 0 announced piece %d of %d of tensor %d (layer %d) iteration %d in epoch %d, but epoch %d's partition of %d bytes cuts the %d-byte tensor of layer %d into %d pieces",
			e.cfg.Rank, p.Index, p.Count, p.Tensor, p.Layer, p.Iteration, p.Epoch, p.Epoch, part, size, t.Layer, count)
	}
	elems := size / 4
	off := 4 * (i*(elems/count) + min(i, elems%count))
	if n := sched.PieceBytes(size, 4, count, i); p.Offset != off || p.Bytes != n {
		return fmt.Errorf("worker %d: rank 0 announced piece %d of tensor %d iteration %d in epoch %d as bytes [%d,%d), want [%d,%d)",
			e.cfg.Rank, p.Index, p.Tensor, p.Iteration, p.Epoch, p.Offset, p.Offset+p.Bytes, off, off+n)
	}
	return nil
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
