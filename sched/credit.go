package sched

import "fmt"

// credit is the accounting of pieces in flight that a Scheduler and a
// Follower share: which pieces are started and not done, their bytes, the
// remaining credit, and how many pieces of each task are still unfinished.
type credit struct {
	inflight map[PieceID]Piece
	// left counts the unfinished pieces of each task (set by the owner
	// when it learns a task's piece count).
	left          map[taskID]int
	inflightBytes int64
	// available is the remaining credit; it may go negative under
	// AdmitPositive.
	available int64
}

func newCredit(cfg Config) credit {
	return credit{inflight: map[PieceID]Piece{}, left: map[taskID]int{}, available: cfg.CreditBytes}
}

// resize applies a new credit size, keeping what is in flight in flight.
func (c *credit) resize(cfg Config) { c.available = cfg.CreditBytes - c.inflightBytes }

// take accounts p as started.
func (c *credit) take(p Piece) {
	c.inflight[p.PieceID] = p
	c.inflightBytes += p.Bytes
	c.available -= p.Bytes
}

// finish returns a piece's credit and the piece; taskDone is true when it
// was the last unfinished piece of its task.
func (c *credit) finish(id PieceID) (p Piece, taskDone bool, err error) {
	p, ok := c.inflight[id]
	if !ok {
		return Piece{}, false, fmt.Errorf("sched: piece %d of tensor %d iteration %d finished but is not in flight", id.Index, id.Tensor, id.Iteration)
	}
	delete(c.inflight, id)
	c.inflightBytes -= p.Bytes
	c.available += p.Bytes
	tid := taskID{iteration: id.Iteration, tensor: id.Tensor}
	if c.left[tid]--; c.left[tid] == 0 {
		delete(c.left, tid)
		return p, true, nil
	}
	return p, false, nil
}
