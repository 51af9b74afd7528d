// Package sim is a discrete-event simulator of synchronous data-parallel
// training: it replays a model profile's compute on every worker and drives
// every worker's protocol machine (package proto, the same one the runtime
// engine drives) on a virtual clock, over a network of full-duplex host
// links, with parameter servers or ring all-reduce.
//
// It owns the network and compute models and the lower bounds; it must not
// contain protocol decisions (what starts when, in which order, where, which
// epoch, which gate opens: those belong to proto) and does no I/O except
// an optional trace writer handed to it.
//
// Network model. Every host (worker or server) has a full-duplex link to a
// non-blocking switch with a bandwidth per direction and a latency. A
// message leaves its sender's egress one at a time, the one of smallest
// priority first (the runtime's senders pick the most urgent frame), and is
// cut through the switch into the receiver's ingress, which serves arriving
// messages in arrival order: it occupies the sender's egress for
// bytes/(the sender's rate) and the ingress for at least bytes/(the
// receiver's rate), and cannot finish before its last byte left the sender
// plus the latency (the switch buffers what a fast sender sends a slow
// receiver, as the receiver's connection buffers do). A ring all-reduce of a piece occupies every worker's
// links symmetrically, so the ring is modelled as one shared pipeline that
// a piece enters once every rank started it: 2(N-1)/N of the piece crosses
// each link at the slowest worker's rate, and the piece completes
// 2(N-1) latencies after its last byte entered the ring.
//
// Per-message cost. With Options.MessageCostS = c > 0 every message also
// occupies its sender's egress for c before its first byte leaves (a fixed
// processing time per message, like a header time), so it reaches the
// receiver c later and holds back the messages queued behind it. A ring
// piece takes 2(N-1) steps of one message per worker each, so it occupies
// the ring for 2(N-1)·c more. The lower bounds ignore c (they stay bounds).
//
// Options.Wire = WireConnections replaces the one queue per host with the
// runtime's one sender per connection, whose messages share each link
// max-min fairly (wire.go).
package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/autobyte/autobyte/model"
	"github.com/autobyte/autobyte/proto"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/stats"
	"github.com/autobyte/autobyte/trace"
	"github.com/autobyte/autobyte/tune"
)

// Arch is the aggregation architecture.
type Arch = proto.Arch

const (
	// PS is parameter servers: each worker pushes each piece to the server
	// that holds it and receives the sum once every worker pushed it.
	PS = proto.PS
	// AllReduce is ring all-reduce; rank 0 schedules, the others follow
	// its order.
	AllReduce = proto.AllReduce
)

// ParseArch parses "ps" or "allreduce".
func ParseArch(s string) (Arch, error) { return proto.ParseArch(s) }

// Options describe one simulated job.
type Options struct {
	Profile *model.Profile
	Arch    Arch
	Workers int
	// Servers is the number of parameter servers (PS only).
	Servers int
	// BandwidthBps is each host's link rate per direction, in bytes/s.
	BandwidthBps float64
	// LatencyS is the one-way latency of one message between two hosts.
	LatencyS float64
	// MessageCostS is a fixed processing time per message, in seconds (0:
	// none): every push, pull and ring step occupies its sender's egress
	// (its connection under WireConnections) for MessageCostS before its
	// bytes (see sendNext, connNext and ringNext).
	MessageCostS float64
	// Wire is how messages share the links (WireHost, the default, or
	// WireConnections: wire.go).
	Wire Wire
	// Sched is the initial scheduling configuration (epoch 0) of every
	// worker; fifo order brings fifo's global barrier with it.
	Sched sched.Config
	// ShardBytes is the parameter-server transport's big-array bound: a
	// piece larger than this is split into ceil(size/ShardBytes) near-equal
	// shards on distinct servers (at most one per server), as MXNet's
	// kvstore and BytePS do for large arrays, so that no single server
	// carries a whole large tensor. The shards of a piece still form one
	// scheduling unit. 0 disables sharding.
	ShardBytes int64
	// Iterations is how many training iterations to simulate (>= 1).
	Iterations int
	// Jitter slows each compute step by a factor drawn uniformly from
	// [1, 1+Jitter) with a generator seeded by Seed and the worker's rank.
	Jitter float64
	Seed   uint64
	// Trace, if set, receives a Chrome-trace timeline of rank 0.
	Trace *trace.Writer
	// Decisions, if set, records the protocol machines' decisions
	// (conformance tests compare them with the runtime's).
	Decisions *proto.DecisionLog

	// Changing conditions (see dynamics.go for the exact rule).

	// BandwidthTrace sets every host's bandwidth (bytes/s) from given
	// iterations on: the messages of iteration k's gradients run at the
	// last step at or before k, or at BandwidthBps before the first step.
	// Steps must be at increasing iterations >= 0 with positive values.
	BandwidthTrace []Step
	// ComputeTrace multiplies forward and backward compute times of
	// iteration k by the last step at or before k (1 before the first
	// step; 2 = half as fast, like the CLI's --compute-scale).
	ComputeTrace []Step
	// WorkerLinkTraces and ServerLinkTraces set one host's link rate
	// (bytes/s, both directions) from given iterations on, in place of
	// BandwidthAt for that host: a server whose host shares its NIC with
	// another job from iteration 150 to 300 is {{150, slow}, {300, fast}}.
	// Before a host's first step its rate is BandwidthAt. Keys are ranks.
	WorkerLinkTraces map[int][]Step
	ServerLinkTraces map[int][]Step
	// Stragglers slows worker rank's compute by a factor >= 1.
	Stragglers map[int]float64
	// StragglerTraces slow worker rank's compute of iteration k by the last
	// step at or before k (1 before the first step; values >= 1), on top
	// of Stragglers and ComputeTrace: a worker that straggles 3x from
	// iteration 150 and recovers at 300 is {{150, 3}, {300, 1}}.
	StragglerTraces map[int][]Step
	// Tuner, if set, sees every iteration's statistics and may reconfigure
	// the scheduling of every worker from a later iteration (tuning.go).
	// It is stateful: use a fresh one per run.
	Tuner tune.Tuner

	// Progress, if set, is called each time the leader ends an iteration,
	// with that iteration and the events handled so far. It only observes
	// (a long run's progress report); the run does not depend on it.
	Progress func(iteration int, events int64)
}

// Result is what one run measured.
type Result struct {
	// IterationTimeS is the steady-state iteration time: the mean of
	// IterationTimesS after dropping the warm-up (the first fifth, at least
	// one when there are two or more).
	IterationTimeS float64
	// IterationTimesS[k] is the slowest worker's time between the ends of
	// its forward passes k and k+1, i.e. backward k, its communication and
	// the gated forward k+1 (stats.JobIterationTimes, as launch reports).
	IterationTimesS []float64
	SamplesPerS     float64
	Bounds          Bounds
	Links           LinkBytes
	// Events is the number of simulation events processed.
	Events int64
	// Pieces is the number of pieces scheduled per worker per iteration in
	// the last iteration (the leader's, for all-reduce).
	Pieces int

	// MeanIterationTimeS is the mean of IterationTimesS over the whole run,
	// warm-up and changes included.
	MeanIterationTimeS float64
	// LowerBoundsAt[k] are the bounds under the conditions of iteration k
	// (see LowerBoundsAt); Bounds are those of iteration 0's conditions.
	LowerBoundsAt []Bounds
	// PiecesPerIteration[k] is how many pieces of iteration k the leader
	// (rank 0, or the all-reduce leader) started.
	PiecesPerIteration []int
	// Configs are the scheduling configurations in force during the run,
	// by increasing FromIteration: Options.Sched from 0, then each change
	// the tuner made that applied before the run ended.
	Configs []ConfigChange
	// Stats[k] are the statistics of iteration k, as a tuner saw them: the
	// leader's measurements (tune.Stats), as in the runtime.
	Stats []tune.Stats
}

// LinkBytes sums the bytes each link carried over the run.
type LinkBytes struct {
	WorkerEgress, WorkerIngress []int64
	ServerEgress, ServerIngress []int64
}

// Validate reports the first invalid option.
func (o *Options) Validate() error {
	switch {
	case o.Profile == nil:
		return errors.New("sim: no model profile")
	case o.Workers < 1:
		return fmt.Errorf("sim: workers must be >= 1, got %d", o.Workers)
	case o.Arch == PS && o.Servers < 1:
		return fmt.Errorf("sim: parameter servers must be >= 1, got %d", o.Servers)
	case o.Arch == AllReduce && o.Servers != 0:
		return fmt.Errorf("sim: all-reduce has no servers, got --servers %d", o.Servers)
	case o.Arch != PS && o.Arch != AllReduce:
		return fmt.Errorf("sim: unknown architecture %d", int(o.Arch))
	case !(o.BandwidthBps > 0) || math.IsInf(o.BandwidthBps, 0):
		return fmt.Errorf("sim: bandwidth must be a positive rate, got %v B/s", o.BandwidthBps)
	case !(o.LatencyS >= 0) || math.IsInf(o.LatencyS, 0):
		return fmt.Errorf("sim: latency must be >= 0 s, got %v", o.LatencyS)
	case !(o.MessageCostS >= 0) || math.IsInf(o.MessageCostS, 0):
		return fmt.Errorf("sim: message cost must be >= 0 s, got %v", o.MessageCostS)
	case o.Iterations < 1:
		return fmt.Errorf("sim: iterations must be >= 1, got %d", o.Iterations)
	case o.ShardBytes < 0:
		return fmt.Errorf("sim: shard size must be >= 0 bytes (0 = no sharding), got %d", o.ShardBytes)
	case !(o.Jitter >= 0) || math.IsInf(o.Jitter, 0):
		return fmt.Errorf("sim: jitter must be >= 0, got %v", o.Jitter)
	case o.Wire != WireHost && o.Wire != WireConnections:
		return fmt.Errorf("sim: unknown wire model %v", o.Wire)
	}
	if err := o.Sched.Validate(); err != nil {
		return err
	}
	if err := o.ValidateDynamics(); err != nil {
		return err
	}
	if err := o.validateBudget(); err != nil {
		return err
	}
	return o.ValidateCompute()
}

// tensorInfo is a tensor of the profile with its global index.
type tensorInfo struct {
	layer int
	bytes int64
}

type message struct {
	src, dst int32
	// worker is the pushing worker (push) or the receiving worker (answer).
	worker int32
	push   bool
	// shard is this message's part of the piece when the piece is sharded
	// across servers.
	shard int32
	bytes int64
	piece sched.Piece
	// prio is the priority the protocol machine gave the piece (answers
	// carry their push's); seq breaks ties in send order.
	prio uint64
	seq  uint64
}

type host struct {
	lat float64 // latency of this host's link (half of a host-to-host latency)
	// queue holds the messages waiting for the egress, most urgent first:
	// the runtime's senders pick the frame of smallest priority next.
	queue       minHeap[queued]
	busy        bool
	ingressFree float64
	egressBytes int64
	ingressByte int64
}

type worker struct {
	rank int
	// m is the worker's protocol machine: it decides what starts, where
	// and in what order, and which gates open.
	m    *proto.Worker
	iter int
	fwd  bool
	// stepping is set while a finished compute step posts its gradients:
	// the step's own bookkeeping starts the next one.
	stepping bool
	layer    int
	busy     bool
	done     bool
	synced   []int // synced[l] = last iteration whose layer l is open
	rng      *rand.Rand
	fwdEnds  []float64
	opStart  float64
	// postT[t] is when tensor t's latest gradient was posted here.
	postT []float64
}

type pieceKey struct {
	epoch, iter, tensor, index, shard int32
}

type simulation struct {
	o       Options
	now     float64
	q       eventQueue
	tensors []tensorInfo
	layerT  [][]int // tensors of each layer
	fwdS    []float64
	bwdS    []float64
	workers []*worker
	hosts   []host // workers first, then servers
	msgs    slab[message]
	msgSeq  uint64
	wire    flows // WireConnections only
	// ctl are the leader's announcements (pieces and epochs) on their way
	// to the followers; the queue empties whenever the last one arrives.
	ctl []proto.Message
	// arrived is the protocol state of each shard a server is summing.
	arrived map[pieceKey]*proto.ShardSum
	// all-reduce state: ringStarts counts the ranks that started a piece;
	// ringReady holds the pieces every rank started, most urgent first.
	ringStarts map[pieceKey]int32
	ringReady  minHeap[ringPiece]
	ringSeq    uint64
	ringBusy   bool
	ringSlots  slab[sched.Piece] // pieces on the ring, named by their ring-done events
	ringBytes  float64           // bytes each worker sent (and received) on the ring
	events     int64
	err        error
	// measurements and reconfiguration (tuning.go): the leader's
	// statistics and the pieces it started per iteration
	measure      *stats.Collector
	leaderPieces []int
	context      tune.Stats // the constant part of every iteration's stats
	stats        []tune.Stats
	configs      []ConfigChange // accepted, by increasing FromIteration
	// pushed, if set, sees every push as it arrives at its server (tests).
	pushed func(server int32, k pieceKey, bytes int64)
}

// Run simulates the job described by o.
func Run(o Options) (*Result, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	s, err := newSimulation(o)
	if err != nil {
		return nil, err
	}
	return s.run()
}

func (s *simulation) run() (*Result, error) {
	s.start()
	for s.q.Len() > 0 && s.err == nil {
		e := s.q.pop()
		s.now = e.t
		s.events++
		s.handle(e)
	}
	if s.err != nil {
		return nil, s.err
	}
	for _, w := range s.workers {
		if !w.done {
			return nil, fmt.Errorf("sim: deadlock: worker %d stopped in iteration %d (forward=%v layer %d) with no pending events", w.rank, w.iter, w.fwd, w.layer)
		}
	}
	return s.result(), nil
}

func newSimulation(o Options) (*simulation, error) {
	p := o.Profile
	s := &simulation{o: o, arrived: map[pieceKey]*proto.ShardSum{}, ringStarts: map[pieceKey]int32{},
		leaderPieces: make([]int, o.Iterations+1), configs: []ConfigChange{{Config: o.Sched}}}
	share := 1.0
	if o.Arch == AllReduce {
		share = stats.RingShare(o.Workers)
	}
	s.measure = stats.NewCollector(share)
	s.measure.Servers = o.Servers
	var tensors []proto.Tensor
	elem := int64(p.BytesPerParam) // the machines cut by each epoch's compression
	for l, layer := range p.Layers {
		var ids []int
		for _, t := range layer.Tensors {
			ids = append(ids, len(s.tensors))
			b := t.Params * elem
			s.tensors = append(s.tensors, tensorInfo{layer: l, bytes: b})
			tensors = append(tensors, proto.Tensor{Layer: l, Bytes: b, ElemBytes: int(elem), Compressible: elem == 4})
		}
		s.layerT = append(s.layerT, ids)
		s.fwdS = append(s.fwdS, layer.ForwardS)
		s.bwdS = append(s.bwdS, layer.BackwardS)
	}
	nHosts := o.Workers
	if o.Arch == PS {
		nHosts += o.Servers
	}
	s.hosts = make([]host, nHosts)
	for i := range s.hosts {
		s.hosts[i] = host{lat: o.LatencyS / 2}
	}
	L := len(p.Layers)
	plans := proto.NewPlans()
	for r := 0; r < o.Workers; r++ {
		m, err := proto.New(proto.Config{Rank: r, Workers: o.Workers, Arch: o.Arch, Tensors: tensors, Sched: o.Sched,
			Servers: o.Servers, ShardBytes: o.ShardBytes, Plans: plans})
		if err != nil {
			return nil, fmt.Errorf("sim: %w", err)
		}
		w := &worker{rank: r, m: m, fwd: true, synced: make([]int, L),
			rng: rand.New(rand.NewPCG(o.Seed, uint64(r)))}
		w.postT = make([]float64, len(s.tensors))
		for l := range w.synced {
			w.synced[l] = -1
		}
		s.workers = append(s.workers, w)
	}
	s.context = tune.JobContext(o.Profile, o.Arch.String(), o.Workers, o.Servers)
	s.context.RoundTripS = 2 * o.LatencyS
	return s, nil
}

func (s *simulation) start() {
	if tw := s.o.Trace; tw != nil {
		_ = tw.ProcessName(0, "rank 0 compute")
		_ = tw.ProcessName(1, "rank 0 communication")
	}
	for _, w := range s.workers {
		s.advance(w)
	}
}

func (s *simulation) handle(e event) {
	switch e.kind {
	case evCompute:
		s.computeDone(s.workers[e.who])
	case evEgressFree:
		h := &s.hosts[e.who]
		h.busy = false
		s.sendNext(e.who)
	case evDeliver:
		s.deliver(e.who)
	case evFlowStart:
		s.flowStart(e.who)
	case evFlowCheck:
		s.flowCheck(e.who)
	case evRingFree:
		s.ringBusy = false
		s.ringNext()
	case evRingDone:
		s.ringDone(e.who)
	case evAnnounce:
		m := s.ctl[e.who]
		for _, w := range s.workers[1:] {
			if m.Kind == proto.AnnounceEpoch {
				s.check(w.m.EpochAnnounced(m.Epoch))
			} else {
				s.check(w.m.Announced(m.Piece))
			}
			s.drain(w)
		}
		if int(e.who) == len(s.ctl)-1 {
			s.ctl = s.ctl[:0]
		}
	}
}

// drain carries out the effects of worker w's machine: it puts messages on
// the wire (announcements one latency away, pushes into the worker's
// egress, ring starts into the ring), accounts the pieces started and
// finished, and opens gates.
func (s *simulation) drain(w *worker) {
	rd := w.m.Ready()
	if rd.Empty() {
		return
	}
	s.o.Decisions.Record(w.rank, &rd)
	for _, m := range rd.Messages {
		switch m.Kind {
		case proto.Announce, proto.AnnounceEpoch:
			s.ctl = append(s.ctl, m)
			s.q.push(s.now+s.o.LatencyS, evAnnounce, int32(len(s.ctl)-1))
		case proto.Push:
			if w.rank == 0 {
				s.measure.ShardPushed(m.Piece.Iteration, m.Server, m.Bytes, s.now)
			}
			s.send(message{src: int32(w.rank), dst: int32(s.o.Workers + m.Server), worker: int32(w.rank), push: true,
				bytes: m.Bytes, piece: m.Piece, shard: int32(m.Shard), prio: m.Priority})
		case proto.RingStart:
			s.ringStarted(m)
		}
	}
	if w.rank == 0 {
		// The tuner's statistics are the leader's (tune.Stats).
		for _, st := range rd.Started {
			p := st.Piece
			s.measure.PieceStarted(p.Iteration, p.Bytes, w.unitPosted(p), s.now, st.InFlightBytes)
			s.leaderPieces[p.Iteration]++
		}
		for _, f := range rd.Finished {
			s.measure.PieceDone(s.now, f.InFlightBytes)
			if s.o.Trace != nil {
				s.traceComm(f.Piece)
			}
		}
	}
	for _, g := range rd.Opened {
		w.synced[g.Layer] = max(w.synced[g.Layer], g.Iteration)
		if s.o.Trace != nil && w.rank == 0 {
			_ = s.o.Trace.Instant(fmt.Sprintf("layer %d synced", g.Layer), "sync", 1, 0, s.now, nil)
		}
	}
	if len(rd.Opened) > 0 && !w.stepping {
		s.advance(w)
	}
}

// advance starts the worker's next compute step if its gate is open.
func (s *simulation) advance(w *worker) {
	if w.busy || w.done {
		return
	}
	var d float64
	if w.fwd {
		if w.synced[w.layer] < w.iter-1 {
			return // opening the gate will call advance again
		}
		d = s.fwdS[w.layer]
	} else {
		d = s.bwdS[w.layer]
	}
	if c := s.o.ComputeScaleAt(w.iter) * s.o.SlowdownAt(w.rank, w.iter); c != 1 {
		d *= c
	}
	if s.o.Jitter > 0 {
		d *= 1 + s.o.Jitter*w.rng.Float64()
	}
	w.busy = true
	w.opStart = s.now
	s.q.push(s.now+d, evCompute, int32(w.rank))
}

func (s *simulation) computeDone(w *worker) {
	w.busy = false
	if w.rank == 0 {
		s.measure.Compute(w.fwd, w.iter, w.opStart, s.now)
	}
	if w.rank == 0 && s.o.Trace != nil {
		name := fmt.Sprintf("FW %s", s.o.Profile.Layers[w.layer].Name)
		if !w.fwd {
			name = fmt.Sprintf("BW %s", s.o.Profile.Layers[w.layer].Name)
		}
		_ = s.o.Trace.Complete(name, "compute", 0, 0, w.opStart, s.now-w.opStart, map[string]any{"iteration": w.iter})
	}
	L := len(s.fwdS)
	if w.fwd {
		w.layer++
		if w.layer == L {
			w.fwdEnds = append(w.fwdEnds, s.now)
			if j := len(w.fwdEnds) - 1; w.rank == 0 && j > 0 {
				s.iterationDone(j - 1)
			}
			if w.iter == s.o.Iterations {
				w.done = true
				return
			}
			w.fwd, w.layer = false, L-1
		}
	} else {
		w.stepping = true
		s.postLayer(w, w.layer)
		w.stepping = false
		w.layer--
		if w.layer < 0 {
			w.iter++
			w.fwd, w.layer = true, 0
		}
	}
	s.advance(w)
}

// unitPosted is when piece p's unit (proto.Unit) was posted here: when
// the last of its tensors was.
func (w *worker) unitPosted(p sched.Piece) float64 {
	var t float64
	for _, m := range w.m.Units(p.Epoch)[p.Tensor].Tensors {
		t = max(t, w.postT[m])
	}
	return t
}

// postLayer hands the gradients of layer l of the worker's iteration to its
// machine, one tensor at a time as the runtime's engine receives them.
func (s *simulation) postLayer(w *worker, l int) {
	for _, t := range s.layerT[l] {
		w.postT[t] = s.now
		s.check(w.m.Post(t, w.iter))
		s.drain(w)
	}
}

func (s *simulation) check(err error) {
	if err != nil && s.err == nil {
		s.err = fmt.Errorf("sim: t=%gs: %w", s.now, err)
	}
}

// ---- the wire and parameter servers ----

func (s *simulation) send(m message) {
	s.msgSeq++
	m.seq = s.msgSeq
	id := s.msgs.put(m)
	if s.o.Wire == WireConnections {
		s.connSend(id)
		return
	}
	h := &s.hosts[m.src]
	h.queue.push(queued{urgency: urgency{prio: m.prio, seq: m.seq}, id: id})
	if !h.busy {
		s.sendNext(m.src)
	}
}

// sendNext starts the most urgent queued message on host src's egress and
// books its passage through the receiver's ingress.
//
// The message's fixed cost (MessageCostS) is charged to the sender's egress
// only, before its bytes: the egress is busy for cost + bytes/bandwidth and
// the first byte reaches the receiver cost + latency after the start. The
// runtime's cost per message is CPU time (framing, system calls, the core's
// bookkeeping, a server's answer) that is measured per message per host
// (scripts/message-cost.sh), and in parameter-server mode every host sends
// as many messages as it receives (a worker: one push out and one answer in
// per piece; a server: one push in and one answer out per worker), so one
// charge per message sent counts each host's send and receive work once.
// Charging the ingress as well would count it twice; charging it on the
// duplex link's other direction would let a host's send and receive work
// overlap, which one CPU does not. The egress is also where the cost delays
// the next message, as a busy sender does.
func (s *simulation) sendNext(src int32) {
	h := &s.hosts[src]
	if h.busy || h.queue.Len() == 0 {
		return
	}
	id := h.queue.pop().id
	m := s.msgs.at(id)
	d := &s.hosts[m.dst]
	k := m.piece.Iteration
	start := s.now + s.o.MessageCostS // the first byte leaves (s.now when 0)
	egressEnd := start + float64(m.bytes)/s.o.hostRateAt(int(m.src), k)
	lat := h.lat + d.lat
	inStart := max(start+lat, d.ingressFree)
	inEnd := max(inStart+float64(m.bytes)/s.o.hostRateAt(int(m.dst), k), egressEnd+lat)
	d.ingressFree = inEnd
	h.egressBytes += m.bytes
	d.ingressByte += m.bytes
	h.busy = true
	s.q.push(egressEnd, evEgressFree, src)
	s.q.push(inEnd, evDeliver, id)
}

func (s *simulation) deliver(id int32) {
	m := s.msgs.take(id)
	p := m.piece
	if m.push {
		// A server sums what it receives by (epoch, key): pieces of
		// different partitionings never mix. It follows the shard's
		// protocol (proto.ShardSum), as the runtime's server does: once
		// every worker pushed, it answers each, in rank order, with the
		// push's priority.
		k := pieceKey{epoch: int32(p.Epoch), iter: int32(p.Iteration), tensor: int32(p.Tensor), index: int32(p.Index), shard: m.shard}
		if s.pushed != nil {
			s.pushed(m.dst, k, m.bytes)
		}
		shard := s.arrived[k]
		if shard == nil {
			shard, _ = proto.NewShardSum(s.o.Workers) // Workers >= 1: validated
			s.arrived[k] = shard
		}
		_, _, complete, err := shard.Push(int(m.worker))
		if err != nil || !complete {
			s.check(err)
			return
		}
		delete(s.arrived, k)
		for r := 0; r < s.o.Workers; r++ {
			s.send(message{src: m.dst, dst: int32(r), worker: int32(r), bytes: m.bytes, piece: p, shard: m.shard, prio: m.prio})
		}
		return
	}
	w := s.workers[m.worker]
	if w.rank == 0 {
		s.measure.ShardAnswered(p.Iteration, int(m.src)-s.o.Workers, s.now)
	}
	s.check(w.m.Answered(p.PieceID))
	s.drain(w)
}

// traceComm draws rank 0's piece p from its tensor's post to now. The
// tensor's post time is still p's iteration's: the next iteration posts it
// only after its forward pass, which waited for this piece.
func (s *simulation) traceComm(p sched.Piece) {
	posted := s.workers[0].unitPosted(p)
	_ = s.o.Trace.Complete(fmt.Sprintf("tensor %d piece %d/%d", p.Tensor, p.Index, p.Count), "comm", 1, p.Tensor, posted, s.now-posted,
		map[string]any{"iteration": p.Iteration, "layer": p.Layer, "bytes": p.Bytes})
}

// ---- ring all-reduce ----

// ringStarted records that one rank started a ring piece; once every rank
// did, the piece is ready for the ring (the runtime's ring completes a
// piece's steps only when every rank has started it).
func (s *simulation) ringStarted(m proto.Message) {
	p := m.Piece
	k := pieceKey{epoch: int32(p.Epoch), iter: int32(p.Iteration), tensor: int32(p.Tensor), index: int32(p.Index)}
	s.ringStarts[k]++
	if s.ringStarts[k] < int32(s.o.Workers) {
		return
	}
	delete(s.ringStarts, k)
	s.ringSeq++
	s.ringReady.push(ringPiece{urgency: urgency{prio: m.Priority, seq: s.ringSeq}, p: p})
	s.ringNext()
}

// ringNext puts the most urgent ready piece on the ring. The ring is one
// shared pipeline: every worker's links carry 2(N-1)/N of each piece.
func (s *simulation) ringNext() {
	if s.ringBusy || s.ringReady.Len() == 0 {
		return
	}
	p := s.ringReady.pop().p
	n := float64(s.o.Workers)
	share := stats.RingShare(s.o.Workers) * float64(p.Bytes) // bytes each worker sends and receives
	s.ringBytes += share
	// Each of the piece's 2(N-1) ring steps is one message per worker, each
	// charged MessageCostS on its sender, all workers at once: the ring is
	// busy 2(N-1)·MessageCostS longer per piece (+0 when it is 0).
	occupy := share/s.o.slowestWorkerAt(p.Iteration) + 2*(n-1)*s.o.MessageCostS
	done := s.now + occupy + 2*(n-1)*s.o.LatencyS
	slot := s.ringSlots.put(p)
	s.ringBusy = true
	s.q.push(s.now+occupy, evRingFree, 0)
	s.q.push(done, evRingDone, slot)
}

func (s *simulation) ringDone(slot int32) {
	p := s.ringSlots.take(slot)
	for _, w := range s.workers {
		s.check(w.m.RingDone(p.PieceID))
		s.drain(w)
	}
}

// ---- results ----

func (s *simulation) result() *Result {
	o := s.o
	r := &Result{Events: s.events, Pieces: s.piecesPerIteration()}
	var perWorker [][]float64
	for _, w := range s.workers {
		perWorker = append(perWorker, stats.Intervals(w.fwdEnds))
	}
	r.IterationTimesS = stats.JobIterationTimes(perWorker)
	sum := stats.Summarize(r.IterationTimesS, o.Profile.BatchSize*o.Workers)
	r.IterationTimeS, r.SamplesPerS, r.MeanIterationTimeS = sum.SteadyS, sum.SamplesPerS, sum.MeanS
	r.Bounds = initialBounds(o)
	r.LowerBoundsAt = boundsPerIteration(o)
	for k := range r.IterationTimesS {
		r.PiecesPerIteration = append(r.PiecesPerIteration, s.leaderPieces[k])
	}
	for _, c := range s.configs {
		if c.FromIteration < o.Iterations {
			r.Configs = append(r.Configs, c)
		}
	}
	r.Stats = s.stats
	for i, h := range s.hosts {
		eg, in := h.egressBytes, h.ingressByte
		if o.Arch == AllReduce {
			eg, in = int64(math.Round(s.ringBytes)), int64(math.Round(s.ringBytes))
		}
		if i < o.Workers {
			r.Links.WorkerEgress = append(r.Links.WorkerEgress, eg)
			r.Links.WorkerIngress = append(r.Links.WorkerIngress, in)
		} else {
			r.Links.ServerEgress = append(r.Links.ServerEgress, eg)
			r.Links.ServerIngress = append(r.Links.ServerIngress, in)
		}
	}
	return r
}

// piecesPerIteration is how many pieces the leader started in the last
// iteration (its configuration, compression and fusion included).
func (s *simulation) piecesPerIteration() int {
	return s.leaderPieces[s.o.Iterations-1] // what the leader's machine cut and started
}
