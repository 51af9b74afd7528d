package stats

// Collector measures one worker's statistics per iteration from the events
// of its pieces and compute steps, on any clock (times in seconds: the
// simulator's virtual time, or the runtime's wall clock). The simulator and
// the runtime feed the leader's events to the same Collector, so the tuner
// sees the same quantities measured the same way.
//
// Iteration k spans from the end of forward pass k to the end of forward
// pass k+1; span 0 starts when backward 0 starts. Measured per iteration:
//   - IterationS: the span;
//   - ForwardS, BackwardS: the compute steps of forward k+1 and backward k
//     (time computing, not waiting at gates);
//   - SentBytes: the gradient bytes of k's pieces this worker sent (a
//     piece's bytes on parameter servers; 2(N-1)/N of them on a ring of
//     N), and GoodputBps = SentBytes / IterationS;
//   - QueueDelayS: mean of (start - gradient ready) over k's pieces;
//   - Overlap: compute time with a piece in flight over time with a piece
//     in flight, within the span;
//   - InFlightBytes: the bytes in flight, time-weighted over the span;
//   - CommS: the time with at least one piece in flight within the span;
//   - per parameter server, of k's shards this worker pushed to it:
//     ServerBytes, ServerBusyS (the time it had at least one of them
//     unanswered: from handing a push to the server's connection to its
//     answer), ServerGoodputBps = ServerBytes / ServerBusyS, and
//     ServerResponseS (the mean time from push to answer: the server's
//     queueing and its link's). A server that sets the job's pace shows
//     the lowest goodput; these are what load-aware placement follows.
//
// A Collector is not safe for concurrent use.
type Collector struct {
	// RingShare is the fraction of a piece's bytes this worker sends: 1 on
	// parameter servers, 2(N-1)/N on a ring of N.
	RingShare float64

	inflight  int64
	last      float64 // time of the last in-flight change
	started   bool    // an in-flight change was seen
	active    float64 // total time with bytes in flight
	area      float64 // byte-seconds
	open      bool    // a busy interval is open (since openedAt)
	openedAt  float64
	closed    []interval // busy intervals a later compute step may still overlap
	spanOn    bool
	spanStart float64
	active0   float64
	area0     float64
	overlap   float64 // this span's compute time with pieces in flight
	iters     map[int]*iterSums
	// Servers is the number of parameter servers (0: all-reduce); the
	// per-server measurements have one entry each.
	Servers int
}

type interval struct{ from, to float64 }

type iterSums struct {
	fwd, bwd float64
	sent     float64
	queue    float64
	pieces   int
	servers  []serverSums
}

// serverSums are one server's shards of one iteration.
type serverSums struct {
	bytes float64
	// open counts the shards pushed and not answered, since openedAt.
	open     int
	openedAt float64
	busy     float64
	// pushedAt and answeredAt sum the push and answer times: their
	// difference over the count is the mean response time, whatever
	// order the answers come in.
	pushedAt, answeredAt float64
	shards, answers      int
}

// RingShare is the fraction of a piece's bytes each of a ring's workers
// sends (and receives) in a ring all-reduce: 2(N-1)/N.
func RingShare(workers int) float64 {
	n := float64(workers)
	return 2 * (n - 1) / n
}

// Iteration is what a Collector measured of one iteration.
type Iteration struct {
	Iteration              int
	IterationS             float64
	ForwardS, BackwardS    float64
	SentBytes, GoodputBps  float64
	QueueDelayS            float64
	Overlap, InFlightBytes float64
	CommS                  float64
	Pieces                 int
	// Per parameter server (nil for all-reduce).
	ServerBytes, ServerBusyS, ServerGoodputBps, ServerResponseS []float64
}

// NewCollector returns a collector for a worker that sends ringShare of
// each piece's bytes (1 on parameter servers).
func NewCollector(ringShare float64) *Collector {
	return &Collector{RingShare: ringShare, iters: map[int]*iterSums{}}
}

func (c *Collector) iter(k int) *iterSums {
	m := c.iters[k]
	if m == nil {
		m = &iterSums{}
		c.iters[k] = m
	}
	return m
}

// setInflight integrates the bytes in flight up to t and sets them to b.
func (c *Collector) setInflight(t float64, b int64) {
	if c.started && t > c.last {
		dt := t - c.last
		if c.inflight > 0 {
			c.active += dt
			c.area += float64(c.inflight) * dt
		}
	}
	if !c.started || t > c.last {
		c.last, c.started = t, true
	}
	switch {
	case c.inflight <= 0 && b > 0:
		c.open, c.openedAt = true, t
	case c.inflight > 0 && b <= 0:
		if c.open {
			c.closed = append(c.closed, interval{c.openedAt, t})
		}
		c.open = false
	}
	c.inflight = b
}

// integrals are the active time and area up to t.
func (c *Collector) integrals(t float64) (active, area float64) {
	active, area = c.active, c.area
	if c.inflight > 0 && t > c.last {
		dt := t - c.last
		active += dt
		area += float64(c.inflight) * dt
	}
	return active, area
}

// PieceStarted: a piece of iteration of bytes bytes, whose gradient was
// ready at posted, started at started; inflight are the worker's bytes in
// flight after it.
func (c *Collector) PieceStarted(iteration int, bytes int64, posted, started float64, inflight int64) {
	m := c.iter(iteration)
	m.sent += float64(bytes) * c.RingShare
	if started > posted {
		m.queue += started - posted
	}
	m.pieces++
	c.setInflight(started, inflight)
}

// server is iteration k's sums of server srv, grown on demand.
func (c *Collector) server(k, srv int) *serverSums {
	m := c.iter(k)
	if n := max(srv+1, c.Servers); len(m.servers) < n {
		m.servers = append(m.servers, make([]serverSums, n-len(m.servers))...)
	}
	return &m.servers[srv]
}

// ShardPushed: a shard of bytes bytes of a piece of iteration was handed
// to server's connection at t.
func (c *Collector) ShardPushed(iteration, server int, bytes int64, t float64) {
	if server < 0 {
		return
	}
	m := c.server(iteration, server)
	if m.open == 0 {
		m.openedAt = t
	}
	m.open++
	m.bytes += float64(bytes)
	m.pushedAt += t
	m.shards++
}

// ShardAnswered: server's answer to one of iteration's shards arrived at t.
func (c *Collector) ShardAnswered(iteration, server int, t float64) {
	if server < 0 {
		return
	}
	m := c.server(iteration, server)
	if m.open == 0 {
		return // an answer to nothing pushed: not ours to measure
	}
	m.open--
	if m.open == 0 {
		m.busy += t - m.openedAt
	}
	m.answeredAt += t
	m.answers++
}

// PieceDone: a piece finished at done, leaving inflight bytes in flight.
func (c *Collector) PieceDone(done float64, inflight int64) { c.setInflight(done, inflight) }

// Compute: a compute step of iteration ran from start to end, forward or
// backward. Steps are reported one after another (none starts before the
// previous one ended).
func (c *Collector) Compute(forward bool, iteration int, start, end float64) {
	d := end - start
	if forward {
		c.iter(iteration).fwd += d
	} else {
		c.iter(iteration).bwd += d
		if !c.spanOn {
			c.spanOn, c.spanStart = true, start
			c.active0, c.area0 = c.integrals(start)
		}
	}
	// No later step starts before end: busy intervals that closed by then
	// are done with.
	var ov float64
	keep := c.closed[:0]
	for _, b := range c.closed {
		ov += overlapOf(start, end, b.from, b.to)
		if b.to > end {
			keep = append(keep, b)
		}
	}
	c.closed = keep
	if c.open {
		ov += overlapOf(start, end, c.openedAt, end)
	}
	if c.spanOn {
		c.overlap += ov
	}
}

func overlapOf(a0, a1, b0, b1 float64) float64 {
	return max(0, min(a1, b1)-max(a0, b0))
}

// IterationEnded: forward pass k+1 ended at now, closing iteration k's span
// of length d; it returns iteration k's measurement.
func (c *Collector) IterationEnded(k int, d, now float64) Iteration {
	out := Iteration{Iteration: k, IterationS: d}
	m, next := c.iter(k), c.iter(k+1)
	out.ForwardS, out.BackwardS, out.SentBytes, out.Pieces = next.fwd, m.bwd, m.sent, m.pieces
	if d > 0 {
		out.GoodputBps = m.sent / d
	}
	if m.pieces > 0 {
		out.QueueDelayS = m.queue / float64(m.pieces)
	}
	if n := max(c.Servers, len(m.servers)); n > 0 {
		out.ServerBytes, out.ServerBusyS = make([]float64, n), make([]float64, n)
		out.ServerGoodputBps, out.ServerResponseS = make([]float64, n), make([]float64, n)
		for i, sv := range m.servers {
			busy := sv.busy
			if sv.open > 0 { // still unanswered at the span's end
				busy += now - sv.openedAt
			}
			out.ServerBytes[i], out.ServerBusyS[i] = sv.bytes, busy
			if busy > 0 {
				out.ServerGoodputBps[i] = sv.bytes / busy
			}
			if sv.answers > 0 && sv.answers == sv.shards {
				out.ServerResponseS[i] = (sv.answeredAt - sv.pushedAt) / float64(sv.answers)
			}
		}
	}
	active, area := c.integrals(now)
	if c.spanOn {
		out.CommS = active - c.active0
		if out.CommS > 0 {
			out.Overlap = min(1, c.overlap/out.CommS)
		}
		if span := now - c.spanStart; span > 0 {
			out.InFlightBytes = (area - c.area0) / span
		}
	}
	c.spanOn, c.spanStart, c.active0, c.area0, c.overlap = true, now, active, area, 0
	// Forward k+1's compute is in iteration k's statistics; keep only what
	// later iterations need.
	for it := range c.iters {
		if it <= k {
			delete(c.iters, it)
		}
	}
	return out
}
