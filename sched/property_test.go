package sched

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// model is the test's own reference implementation of the scheduler: a
// plain unordered ready list scanned on every decision. The randomised test
// drives it and the real Scheduler with the same calls and requires them to
// agree decision by decision.
type model struct {
	cfg     Config
	epoch   int
	pending []pending // proposed changes, by from
	ready   []Piece   // unordered; seq is the model's own post counter
	// inflight is in start order, so a random index picks a piece
	// deterministically (map order would not).
	inflight      []Piece
	inflightBytes int64
	seq           uint64

	left    map[taskID]int   // pieces of each task not yet done
	posted  map[taskID]int64 // bytes of each task posted
	moved   map[taskID]int64 // bytes of each task started
	started map[PieceID]bool
	ended   int // tasks whose last piece is done
}

func newModel(cfg Config) *model {
	return &model{
		cfg:     cfg,
		left:    map[taskID]int{},
		posted:  map[taskID]int64{},
		moved:   map[taskID]int64{},
		started: map[PieceID]bool{},
	}
}

// post applies due configuration changes and queues the task's pieces,
// split the way the package documents: ceil(bytes/partition) pieces capped
// at one per element, the first bytes%count elements' worth one larger.
func (m *model) post(t Task) {
	for len(m.pending) > 0 && m.pending[0].from <= t.Iteration {
		m.cfg, m.epoch = m.pending[0].cfg, m.epoch+1
		m.pending = m.pending[1:]
	}
	elem := int64(t.ElemBytes)
	if elem == 0 {
		elem = DefaultElemBytes
	}
	elems, count := t.Bytes/elem, int64(1)
	if p := m.cfg.PartitionBytes; p > 0 && t.Bytes > p {
		count = min((t.Bytes-1)/p+1, elems)
	}
	var off int64
	for i := range count {
		n := elems / count
		if i < elems%count {
			n++
		}
		m.seq++
		m.ready = append(m.ready, Piece{
			PieceID: PieceID{Iteration: t.Iteration, Tensor: t.Tensor, Index: int(i)},
			Layer:   t.Layer, Count: int(count), Offset: off, Bytes: n * elem,
			Epoch: m.epoch, seq: m.seq,
		})
		off += n * elem
	}
	tid := taskID{t.Iteration, t.Tensor}
	m.left[tid] = int(count)
	m.posted[tid] = t.Bytes
}

// urgent is the documented order, written out independently of Before.
func (m *model) urgent(a, b Piece) bool {
	if m.cfg.Order == OrderFIFO {
		return a.seq < b.seq
	}
	ka := [4]int{a.Iteration, a.Layer, a.Tensor, a.Index}
	kb := [4]int{b.Iteration, b.Layer, b.Tensor, b.Index}
	return slices.Compare(ka[:], kb[:]) < 0
}

// best returns the index in ready of the most urgent piece that fits, or -1.
func (m *model) best(fits func(Piece) bool) int {
	at := -1
	for i, p := range m.ready {
		if fits(p) && (at < 0 || m.urgent(p, m.ready[at])) {
			at = i
		}
	}
	return at
}

// next returns the index in ready of the piece the scheduler must start
// now, or -1 if it must start none.
func (m *model) next() int {
	any := func(Piece) bool { return true }
	credit := m.cfg.CreditBytes
	switch {
	case len(m.ready) == 0:
		return -1
	case credit == 0:
		return m.best(any)
	case m.cfg.Admission == AdmitPositive:
		if m.inflightBytes < credit {
			return m.best(any)
		}
		return -1
	case m.inflightBytes == 0:
		// Strict with nothing in flight: the head starts, even oversize.
		return m.best(any)
	default:
		return m.best(func(p Piece) bool { return p.Bytes <= credit-m.inflightBytes })
	}
}

func (m *model) start(i int) Piece {
	p := m.ready[i]
	m.ready = slices.Delete(m.ready, i, i+1)
	m.inflight = append(m.inflight, p)
	m.inflightBytes += p.Bytes
	m.started[p.PieceID] = true
	m.moved[taskID{p.Iteration, p.Tensor}] += p.Bytes
	return p
}

func (m *model) done(i int) (Piece, bool) {
	p := m.inflight[i]
	m.inflight = slices.Delete(m.inflight, i, i+1)
	m.inflightBytes -= p.Bytes
	tid := taskID{p.Iteration, p.Tensor}
	m.left[tid]--
	if m.left[tid] == 0 {
		m.ended++
		return p, true
	}
	return p, false
}

// network is a random model: tensors with a layer and a size, the same in
// every iteration.
type network []Task

func randomNetwork(r *rand.Rand) network {
	n := 1 + r.IntN(24)
	layers := 1 + r.IntN(n)
	net := make(network, n)
	// Layers are assigned at random rather than by tensor id, so that
	// priority by layer and by tensor differ.
	for i := range net {
		elem := []int{0, 1, 2, 4, 8}[r.IntN(5)]
		e := int64(elem)
		if e == 0 {
			e = DefaultElemBytes
		}
		// Sizes spread over orders of magnitude, from one element up.
		net[i] = Task{Tensor: i, Layer: r.IntN(layers), ElemBytes: elem, Bytes: e * (1 + r.Int64N(1<<r.IntN(10)))}
	}
	return net
}

func (net network) maxBytes() int64 {
	var b int64
	for _, t := range net {
		b = max(b, t.Bytes)
	}
	return b
}

// randomConfig draws partition and credit sizes around the network's
// tensor sizes, including the edge values 0 and tiny.
func randomConfig(r *rand.Rand, net network, base Config, mix bool) Config {
	big := net.maxBytes()
	cfg := base
	switch r.IntN(6) {
	case 0:
		cfg.PartitionBytes = 0
	case 1:
		cfg.PartitionBytes = 1 + r.Int64N(8) // smaller than most elements
	case 2:
		cfg.PartitionBytes = big + r.Int64N(big) // larger than every tensor
	default:
		cfg.PartitionBytes = 1 + r.Int64N(big)
	}
	switch r.IntN(5) {
	case 0:
		cfg.CreditBytes = 0
	case 1:
		cfg.CreditBytes = 1 + r.Int64N(16) // smaller than most pieces
	default:
		cfg.CreditBytes = 1 + r.Int64N(3*big)
	}
	if mix {
		cfg.Order = Order(r.IntN(2))
		cfg.Admission = Admission(r.IntN(2))
	}
	return cfg
}

type simParams struct {
	seed  uint64
	base  Config // order and admission of the run
	mix   bool   // let reconfigurations change order and admission too
	steps int
}

// simulate drives a Scheduler and the model with the same random calls,
// checks them against each other and against the invariants after every
// call, drains everything, and returns the decision trace.
func simulate(t *testing.T, sp simParams) []string {
	t.Helper()
	r := rand.New(rand.NewPCG(sp.seed, 0x5eed))
	net := randomNetwork(r)
	cfg := randomConfig(r, net, sp.base, false)
	s := newSched(t, cfg)
	m := newModel(cfg)
	var trace []string
	logf := func(format string, args ...any) { trace = append(trace, fmt.Sprintf(format, args...)) }
	logf("network %v config %+v", net, cfg)

	iter, order := 0, r.Perm(len(net))
	lastFrom := -1
	postOne := func() {
		if len(order) == 0 {
			iter += 1 + r.IntN(2) // iterations may be skipped
			order = r.Perm(len(net))
		}
		task := net[order[0]]
		order = order[1:]
		task.Iteration = iter
		post(t, s, task)
		m.post(task)
		logf("post %d/%d", task.Iteration, task.Tensor)
	}
	nextAll := func() {
		for {
			want := m.next()
			got, ok := s.Next()
			if ok != (want >= 0) {
				t.Fatalf("seed %d: Next() ok = %v, model expects %v (ready %d, in flight %d bytes, config %+v)",
					sp.seed, ok, want >= 0, len(m.ready), m.inflightBytes, m.cfg)
			}
			if !ok {
				return
			}
			checkStart(t, sp.seed, s, m, got, want)
			logf("start %v %d", got.PieceID, got.Bytes)
		}
	}
	doneOne := func() {
		if len(m.inflight) == 0 {
			return
		}
		want, wantDone := m.done(r.IntN(len(m.inflight)))
		gotDone, err := s.Done(want.PieceID)
		if err != nil {
			t.Fatalf("seed %d: Done(%v): %v", sp.seed, want.PieceID, err)
		}
		if gotDone != wantDone {
			t.Fatalf("seed %d: Done(%v) taskDone = %v, want %v", sp.seed, want.PieceID, gotDone, wantDone)
		}
		// A second Done of the same piece must fail and change nothing.
		if r.IntN(8) == 0 {
			if _, err := s.Done(want.PieceID); err == nil {
				t.Fatalf("seed %d: second Done(%v) succeeded", sp.seed, want.PieceID)
			}
		}
		checkCounts(t, sp.seed, s, m)
		logf("done %v %v", want.PieceID, gotDone)
	}

	for range sp.steps {
		switch k := r.IntN(20); {
		case k == 0:
			// Propose a change from a future iteration.
			from := max(iter+1, lastFrom+1) + r.IntN(3)
			c := randomConfig(r, net, sp.base, sp.mix)
			if err := s.Reconfigure(c, from); err != nil {
				t.Fatalf("seed %d: Reconfigure(%+v, %d): %v", sp.seed, c, from, err)
			}
			m.pending = append(m.pending, pending{cfg: c, from: from})
			lastFrom = from
			logf("reconfigure %+v from %d", c, from)
		case k < 8:
			// Back-pressure, as in training: stop posting while a large
			// backlog waits, so the ready list (and the model's linear
			// scans) stay bounded.
			if len(m.ready) < 400 {
				postOne()
			} else {
				doneOne()
			}
		case k < 13:
			nextAll()
		default:
			doneOne()
		}
	}
	// Drain: everything posted must start and finish exactly once.
	for len(m.ready) > 0 || len(m.inflight) > 0 {
		nextAll()
		if len(m.inflight) == 0 && len(m.ready) > 0 {
			t.Fatalf("seed %d: %d pieces starve with nothing in flight", sp.seed, len(m.ready))
		}
		doneOne()
	}
	checkDrained(t, sp.seed, s, m)
	return trace
}

// checkStart checks the piece got that the scheduler just started against
// the model's choice ready[want], then records it in the model.
func checkStart(t *testing.T, seed uint64, s *Scheduler, m *model, got Piece, want int) {
	t.Helper()
	before := m.inflightBytes
	if m.started[got.PieceID] {
		t.Fatalf("seed %d: %v started twice", seed, got.PieceID)
	}
	exp := m.start(want)
	// The whole piece, including its layout and epoch, must be the model's.
	got.seq, exp.seq = 0, 0
	if got != exp {
		t.Fatalf("seed %d: Next() = %+v, model expects %+v", seed, got, exp)
	}
	credit := m.cfg.CreditBytes
	// (a) the credit window.
	switch {
	case credit == 0:
	case m.cfg.Admission == AdmitPositive:
		if after := s.InFlightBytes(); after-got.Bytes >= credit {
			t.Fatalf("seed %d: positive rule started %v with %d bytes already in flight, credit %d",
				seed, got.PieceID, after-got.Bytes, credit)
		}
	default:
		if s.InFlightBytes() > credit && s.InFlight() > 1 {
			t.Fatalf("seed %d: strict rule started %v: %d bytes in flight in %d pieces, credit %d",
				seed, got.PieceID, s.InFlightBytes(), s.InFlight(), credit)
		}
	}
	// (b) priority: nothing ready was more urgent, per Before, unless (strict
	// rule only) it did not fit.
	for _, p := range m.ready {
		if !Before(m.cfg.Order, p, m.inflight[len(m.inflight)-1]) {
			continue
		}
		fits := credit == 0 || m.cfg.Admission == AdmitPositive || before == 0 || p.Bytes <= credit-before
		if fits {
			t.Fatalf("seed %d: started %v while the more urgent %v was ready", seed, got.PieceID, p.PieceID)
		}
	}
	// (c) accounting.
	checkCounts(t, seed, s, m)
}

func checkCounts(t *testing.T, seed uint64, s *Scheduler, m *model) {
	t.Helper()
	if s.InFlightBytes() != m.inflightBytes || s.InFlight() != len(m.inflight) || s.Queued() != len(m.ready) {
		t.Fatalf("seed %d: InFlightBytes, InFlight, Queued = %d, %d, %d; model %d, %d, %d",
			seed, s.InFlightBytes(), s.InFlight(), s.Queued(), m.inflightBytes, len(m.inflight), len(m.ready))
	}
	if cfg, epoch := s.Config(); cfg != m.cfg || epoch != m.epoch {
		t.Fatalf("seed %d: Config() = %+v, %d; model %+v, %d", seed, cfg, epoch, m.cfg, m.epoch)
	}
}

// checkDrained checks conservation once everything has finished: each
// task's bytes were started exactly once and each task ended exactly once.
func checkDrained(t *testing.T, seed uint64, s *Scheduler, m *model) {
	t.Helper()
	checkCounts(t, seed, s, m)
	if m.ended != len(m.posted) {
		t.Fatalf("seed %d: %d tasks reported done, %d posted", seed, m.ended, len(m.posted))
	}
	for tid, b := range m.posted {
		if m.moved[tid] != b {
			t.Fatalf("seed %d: task %+v: %d bytes started, %d posted", seed, tid, m.moved[tid], b)
		}
	}
	if len(m.posted) < 10 {
		t.Fatalf("seed %d: only %d tasks posted: the run exercised little", seed, len(m.posted))
	}
}

func TestRandomised(t *testing.T) {
	steps := 2500
	if testing.Short() {
		steps = 800
	}
	for _, order := range []Order{OrderFIFO, OrderPriority} {
		for _, adm := range []Admission{AdmitPositive, AdmitStrict} {
			for _, mix := range []bool{false, true} {
				name := fmt.Sprintf("%v/%v/mix=%v", order, adm, mix)
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					for seed := range uint64(4) {
						simulate(t, simParams{seed: seed, base: Config{Order: order, Admission: adm}, mix: mix, steps: steps})
					}
				})
			}
		}
	}
}

// TestDeterministic: the scheduler has no hidden randomness (no map
// iteration in decisions), so the same inputs give the same decisions.
func TestDeterministic(t *testing.T) {
	for _, adm := range []Admission{AdmitPositive, AdmitStrict} {
		sp := simParams{seed: 42, base: Config{Order: OrderPriority, Admission: adm}, mix: true, steps: 3000}
		a, b := simulate(t, sp), simulate(t, sp)
		if !slices.Equal(a, b) {
			i := 0
			for i < min(len(a), len(b)) && a[i] == b[i] {
				i++
			}
			t.Fatalf("%v: runs diverge at decision %d of %d/%d", adm, i, len(a), len(b))
		}
		if len(a) < 1000 {
			t.Fatalf("%v: only %d decisions", adm, len(a))
		}
	}
}
