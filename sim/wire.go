package sim

import (
	"fmt"
	"math"
)

// Wire is the simulator's model of how messages share the network.
type Wire uint8

const (
	// WireHost gives each host one priority queue: its egress sends one
	// message at a time, the most urgent of everything the host has to
	// send, and the receiver's ingress serves arrivals in order. It is the
	// ideal of end-to-end priority (the package comment has the details).
	WireHost Wire = iota
	// WireConnections models the wire the runtime builds: every pair of
	// hosts that talk has a connection with its own sender, which sends one
	// message at a time, the most urgent of that connection's, and the
	// messages in flight on a host's link share it max-min fairly, as TCP
	// flows do. A server answering every worker at once finishes all the
	// answers together, and a worker pushing to two servers splits its
	// link between its most urgent piece and a less urgent one. The ring
	// keeps its pipeline model under both wires.
	WireConnections
)

var wireNames = [...]string{WireHost: "host", WireConnections: "connections"}

func (w Wire) String() string {
	if int(w) < len(wireNames) {
		return wireNames[w]
	}
	return fmt.Sprintf("Wire(%d)", int(w))
}

// ParseWire parses "host" or "connections".
func ParseWire(s string) (Wire, error) {
	for w, name := range wireNames {
		if s == name {
			return Wire(w), nil
		}
	}
	return 0, fmt.Errorf("unknown wire model %q (want host or connections)", s)
}

// connection is one sender's queue to one receiver under WireConnections.
type connection struct {
	queue minHeap[queued]
	busy  bool
}

// flow is a message whose bytes are on the wire under WireConnections.
type flow struct {
	msg  int32
	left float64 // bytes not yet sent at flows.at
	rate float64 // bytes/s since flows.at
}

// flows is the state of WireConnections: the connections, the messages in
// flight and their fair shares.
type flows struct {
	conns  map[[2]int32]*connection
	active []flow
	at     float64 // when active[i].left was last brought up to date
	// version tags the one pending completion check; a reshare makes the
	// earlier check stale.
	version int32
	// scratch for reshare, indexed by link (2h: host h's egress, 2h+1:
	// its ingress)
	capacity []float64
	crossing []int32
	fixed    []bool
	links    []int32
}

// connSend queues message id on its connection and starts it if the
// connection is idle.
func (s *simulation) connSend(id int32) {
	m := s.msgs.at(id)
	if s.wire.conns == nil {
		s.wire.conns = map[[2]int32]*connection{}
	}
	key := [2]int32{m.src, m.dst}
	c := s.wire.conns[key]
	if c == nil {
		c = &connection{}
		s.wire.conns[key] = c
	}
	c.queue.push(queued{urgency: urgency{prio: m.prio, seq: m.seq}, id: id})
	if !c.busy {
		s.connNext(c)
		s.reshare()
	}
}

// connNext starts the most urgent message of an idle connection: after the
// fixed cost per message, its bytes join the flows. The caller reshares.
func (s *simulation) connNext(c *connection) {
	if c.busy || c.queue.Len() == 0 {
		return
	}
	id := c.queue.pop().id
	m := s.msgs.at(id)
	c.busy = true
	s.hosts[m.src].egressBytes += m.bytes
	s.hosts[m.dst].ingressByte += m.bytes
	if s.o.MessageCostS > 0 {
		s.q.push(s.now+s.o.MessageCostS, evFlowStart, id)
		return
	}
	s.wire.active = append(s.wire.active, flow{msg: id, left: float64(m.bytes)})
}

// flowStart puts a message's bytes on the wire once its cost is paid.
func (s *simulation) flowStart(id int32) {
	s.wire.active = append(s.wire.active, flow{msg: id, left: float64(s.msgs.at(id).bytes)})
	s.reshare()
}

// flowCheck finishes the messages whose last byte left now: each is
// delivered one latency later and frees its connection for the next.
func (s *simulation) flowCheck(version int32) {
	if version != s.wire.version {
		return // a reshare since then moved the next completion
	}
	s.catchUp()
	var done []int32
	kept := s.wire.active[:0]
	for _, f := range s.wire.active {
		// Rounding leaves a few ulps of the message's bytes, or a rest
		// too small to move the clock.
		if f.left <= 1e-9*float64(s.msgs.at(f.msg).bytes) || s.now+f.left/f.rate <= s.now {
			done = append(done, f.msg)
		} else {
			kept = append(kept, f)
		}
	}
	s.wire.active = kept
	for _, id := range done {
		m := s.msgs.at(id)
		s.q.push(s.now+s.hosts[m.src].lat+s.hosts[m.dst].lat, evDeliver, id)
		c := s.wire.conns[[2]int32{m.src, m.dst}]
		c.busy = false
		s.connNext(c)
	}
	s.reshare()
}

// catchUp brings every flow's bytes left up to now at the rates in force
// (a flow added since then has rate 0 and loses nothing).
func (s *simulation) catchUp() {
	dt := s.now - s.wire.at
	if dt > 0 {
		for i := range s.wire.active {
			f := &s.wire.active[i]
			f.left = max(0, f.left-f.rate*dt)
		}
	}
	s.wire.at = s.now
}

// reshare gives every flow its max-min fair rate (progressive filling):
// the link with the smallest share per unfixed flow fixes its flows at
// that share, which leaves the rest of their other link to the others,
// until every flow has a rate. A link's capacity is its host's rate for
// the oldest iteration among its messages (link traces change by
// iteration). It then schedules the check for the next completion.
func (s *simulation) reshare() {
	s.catchUp()
	w := &s.wire
	w.version++
	if len(w.active) == 0 {
		return
	}
	if n := 2 * len(s.hosts); len(w.capacity) < n {
		w.capacity, w.crossing = make([]float64, n), make([]int32, n)
	}
	w.links = w.links[:0]
	for _, f := range w.active {
		m := s.msgs.at(f.msg)
		k := m.piece.Iteration
		for _, l := range [2]int32{2 * m.src, 2*m.dst + 1} {
			rate := s.o.hostRateAt(int(l/2), k)
			if w.crossing[l] == 0 {
				w.links = append(w.links, l)
				w.capacity[l] = rate
			}
			w.capacity[l] = min(w.capacity[l], rate)
			w.crossing[l]++
		}
	}
	w.fixed = append(w.fixed[:0], make([]bool, len(w.active))...)
	for left := len(w.active); left > 0; {
		bottleneck, share := int32(-1), math.Inf(1)
		for _, l := range w.links {
			if n := w.crossing[l]; n > 0 && w.capacity[l]/float64(n) < share {
				bottleneck, share = l, w.capacity[l]/float64(n)
			}
		}
		for i := range w.active {
			m := s.msgs.at(w.active[i].msg)
			e, in := 2*m.src, 2*m.dst+1
			if w.fixed[i] || (e != bottleneck && in != bottleneck) {
				continue
			}
			w.fixed[i] = true
			w.active[i].rate = share
			left--
			for _, l := range [2]int32{e, in} {
				w.capacity[l] = max(0, w.capacity[l]-share)
				w.crossing[l]--
			}
		}
	}
	next := math.Inf(1)
	for _, f := range w.active {
		next = min(next, f.left/f.rate)
	}
	s.q.push(s.now+next, evFlowCheck, w.version)
}
