package sim

// The simulator's queues: the event queue, each host's egress and the
// ring's ready pieces are binary min-heaps of one generic type, ordered by
// a key and a sequence number so that equal keys leave in the order they
// came, which makes every run deterministic. The heap is typed on its items
// rather than using container/heap because boxing each event into an
// interface would allocate millions of times in a large run.

import "github.com/autobyte/autobyte/sched"

// ordered is an item that knows whether it leaves before another.
type ordered[T any] interface {
	before(T) bool
}

// minHeap is a binary min-heap under T's before.
type minHeap[T ordered[T]] struct{ items []T }

func (h *minHeap[T]) Len() int { return len(h.items) }

func (h *minHeap[T]) push(x T) {
	h.items = append(h.items, x)
	q := h.items
	for i := len(q) - 1; i > 0; {
		parent := (i - 1) / 2
		if !q[i].before(q[parent]) {
			break
		}
		q[i], q[parent] = q[parent], q[i]
		i = parent
	}
}

func (h *minHeap[T]) pop() T {
	q := h.items
	top := q[0]
	n := len(q) - 1
	q[0] = q[n]
	q = q[:n]
	for i := 0; ; {
		child := 2*i + 1
		if child >= n {
			break
		}
		if r := child + 1; r < n && q[r].before(q[child]) {
			child = r
		}
		if !q[child].before(q[i]) {
			break
		}
		q[i], q[child] = q[child], q[i]
		i = child
	}
	h.items = q
	return top
}

type eventKind uint8

const (
	evCompute    eventKind = iota // a worker finished a forward or backward layer
	evEgressFree                  // a host's egress finished sending a message
	evDeliver                     // a message fully arrived at its destination
	evRingFree                    // the all-reduce ring can start the next piece
	evRingDone                    // an all-reduce piece completed on every rank
	evAnnounce                    // the leader's announcement (a piece or an epoch) reached the followers
	evFlowStart                   // WireConnections: a message's cost is paid, its bytes start
	evFlowCheck                   // WireConnections: the next message in flight may have finished
)

type event struct {
	t    float64
	seq  uint64
	kind eventKind
	// who is the worker, host, message or ring slot the event is about.
	who int32
}

func (a event) before(b event) bool {
	if a.t != b.t {
		return a.t < b.t
	}
	return a.seq < b.seq
}

// eventQueue orders events by (time, sequence).
type eventQueue struct {
	minHeap[event]
	seq uint64
}

func (q *eventQueue) push(t float64, kind eventKind, who int32) {
	q.seq++
	q.minHeap.push(event{t: t, seq: q.seq, kind: kind, who: who})
}

// urgency orders what waits for a link: the priority the protocol machine
// gave it, then the order it came in.
type urgency struct{ prio, seq uint64 }

func (a urgency) before(b urgency) bool {
	if a.prio != b.prio {
		return a.prio < b.prio
	}
	return a.seq < b.seq
}

// queued is a message waiting in a host's egress.
type queued struct {
	urgency
	id int32
}

func (a queued) before(b queued) bool { return a.urgency.before(b.urgency) }

// ringPiece is a piece every rank started, waiting for the ring.
type ringPiece struct {
	urgency
	p sched.Piece
}

func (a ringPiece) before(b ringPiece) bool { return a.urgency.before(b.urgency) }

// slab keeps values in reusable numbered slots, so that an event can name
// one by a small index and the slots of finished ones are used again.
type slab[T any] struct {
	items []T
	free  []int32
}

// put stores v in a free slot (or a new one) and returns its index.
func (s *slab[T]) put(v T) int32 {
	if n := len(s.free); n > 0 {
		id := s.free[n-1]
		s.free = s.free[:n-1]
		s.items[id] = v
		return id
	}
	s.items = append(s.items, v)
	return int32(len(s.items) - 1)
}

// at is the value in slot id, in place.
func (s *slab[T]) at(id int32) *T { return &s.items[id] }

// take returns the value in slot id and frees the slot.
func (s *slab[T]) take(id int32) T {
	s.free = append(s.free, id)
	return s.items[id]
}
