package sim

// The event queue: a binary min-heap on (time, sequence) so that events at
// equal times run in the order they were scheduled, which makes every run
// deterministic. It is typed on event rather than using container/heap
// because boxing each event into an interface would allocate millions of
// times in a large run.

type eventKind uint8

const (
	evCompute    eventKind = iota // a worker finished a forward or backward layer
	evEgressFree                  // a host's egress finished sending a message
	evDeliver                     // a message fully arrived at its destination
	evRingFree                    // the all-reduce ring can start the next piece
	evRingDone                    // an all-reduce piece completed on every rank
	evAnnounce                    // the PS leader's start of a piece reached the followers
)

type event struct {
	t    float64
	seq  uint64
	kind eventKind
	// who is the worker, host, message or ring slot the event is about.
	who int32
}

type eventQueue struct {
	items []event
	seq   uint64
}

func (q *eventQueue) Len() int { return len(q.items) }

func (q *eventQueue) less(i, j int) bool {
	a, b := &q.items[i], &q.items[j]
	if a.t != b.t {
		return a.t < b.t
	}
	return a.seq < b.seq
}

func (q *eventQueue) push(t float64, kind eventKind, who int32) {
	q.seq++
	q.items = append(q.items, event{t: t, seq: q.seq, kind: kind, who: who})
	i := len(q.items) - 1
	for i > 0 {
		parent := (i - 1) / 2
		if !q.less(i, parent) {
			break
		}
		q.items[i], q.items[parent] = q.items[parent], q.items[i]
		i = parent
	}
}

func (q *eventQueue) pop() event {
	top := q.items[0]
	n := len(q.items) - 1
	q.items[0] = q.items[n]
	q.items = q.items[:n]
	i := 0
	for {
		child := 2*i + 1
		if child >= n {
			break
		}
		if r := child + 1; r < n && q.less(r, child) {
			child = r
		}
		if !q.less(child, i) {
			break
		}
		q.items[i], q.items[child] = q.items[child], q.items[i]
		i = child
	}
	return top
}
