package proto

import "fmt"

// ShardSum is a parameter server's protocol for one shard of a piece: the
// order the workers' pushes are added in, when the shard is complete, and
// the order its answers go out. The parameter server (package ps) and the
// simulator both follow it.
//
// Pushes are added in rank order, ((g0 + g1) + g2) + ..., whatever order
// they arrive in, so equal runs give equal bits: a push that arrives before
// a lower rank's is held until the pushes before it are in. Answers go out
// in rank order once the shard is complete. Like Worker it is pure and not
// safe for concurrent use.
type ShardSum struct {
	pushed []bool
	// next is the rank whose push is added next; count the pushes seen.
	next, count int
}

// NewShardSum returns the protocol of a shard that workers workers push.
func NewShardSum(workers int) (*ShardSum, error) {
	if workers < 1 {
		return nil, fmt.Errorf("proto: a shard needs >= 1 pushing workers, got %d", workers)
	}
	return &ShardSum{pushed: make([]bool, workers)}, nil
}

// Pushed reports whether rank's push was recorded.
func (s *ShardSum) Pushed(rank int) bool { return rank >= 0 && rank < len(s.pushed) && s.pushed[rank] }

// Push records worker rank's push. The pushes of ranks [from, to) are to be
// added now, in that order: the arriving one and the held ones that follow
// it, or none (to == from) when a lower rank's push is still missing, so
// this one is held. complete is set with the shard's last push, when every
// push has been added; the answers then go to ranks 0, 1, ... in order. A
// rank out of range or pushing twice is refused and changes nothing.
func (s *ShardSum) Push(rank int) (from, to int, complete bool, err error) {
	switch {
	case rank < 0 || rank >= len(s.pushed):
		return 0, 0, false, fmt.Errorf("proto: push from worker %d, outside the %d workers", rank, len(s.pushed))
	case s.pushed[rank]:
		return 0, 0, false, fmt.Errorf("proto: worker %d pushed the same shard twice", rank)
	}
	s.pushed[rank] = true
	s.count++
	from = s.next
	for s.next < len(s.pushed) && s.pushed[s.next] {
		s.next++
	}
	if rank != from {
		// Held: a lower rank is missing, so nothing can be added yet
		// (from is unchanged, since rank > from).
		return from, from, false, nil
	}
	return from, s.next, s.count == len(s.pushed), nil
}

// Count is the number of pushes recorded.
func (s *ShardSum) Count() int { return s.count }

// Next is the rank whose push is added next (the number of workers once
// every push is added).
func (s *ShardSum) Next() int { return s.next }
