// Package worker is the per-worker runtime: gradients come in as "ready"
// events, go through the protocol machine and the transport to parameter
// servers or around an all-reduce ring, come back as exact sums, and open
// per-layer gates for the next forward pass.
//
// It is the I/O shell around the worker's protocol machine (package proto),
// which decides everything: what starts when, in which priority, on which
// server, which epoch applies, which gate opens. The engine owns what the
// machine must not know: goroutines, connections, frames, clocks and the
// gradient data. It knows nothing of models' compute, Python or process
// launch: callers hand it tensors and float32 gradients, and it calls them
// back when a tensor's sum is in place.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/autobyte/autobyte/cluster"
	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/proto"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/transport"
)

// Arch is the aggregation architecture.
type Arch = proto.Arch

const (
	PS        = proto.PS
	AllReduce = proto.AllReduce
)

// Tensor is one gradient tensor the engine synchronises.
type Tensor struct {
	Name string
	// Layer is the tensor's layer in forward order (0 first).
	Layer int
	// Elems is its number of elements.
	Elems int
	// Wire is its own type (default float32). A float32 tensor travels in
	// the configuration's compression type unless Exact (e.g. a broadcast
	// of parameters); a 16-bit one in its own. Posted data is float32
	// whatever the type: a 16-bit tensor's values are exact in float32,
	// and a float32 gradient sent in 16 bits is rounded on the way out.
	// Sums are kept in float32 and come back rounded to the wire type.
	Wire  dtype.DType
	Exact bool
	// Posted says which iterations post it (default every one; a
	// binding's broadcast at start is posted in iteration 0 only).
	Posted proto.Iterations
}

// wireOf is the type piece p travels in.
func (e *Engine) wireOf(p sched.Piece) dtype.DType {
	if p.Compression != dtype.F32 {
		return p.Compression
	}
	return e.m.Units(p.Epoch)[p.Tensor].Wire
}

// Ring is what the engine needs of an all-reduce ring (package allreduce).
type Ring interface {
	// Start all-reduces data (a piece, in place, travelling as d) once
	// every rank started it; done is called exactly once, from any
	// goroutine.
	Start(p sched.Piece, priority uint64, d dtype.DType, data []float32, done func(error))
}

// Config describes one worker's engine.
type Config struct {
	Rank, Workers int
	Arch          Arch
	Tensors       []Tensor
	Sched         sched.Config
	// ShardBytes is the PS big-array bound (see placement.Inputs).
	ShardBytes int64
	// Servers are the connections to the parameter servers, by server index
	// (PS only).
	Servers []*transport.Conn
	// PullMode sends a separate pull after each push (PS only).
	PullMode bool
	// Ring all-reduces pieces (all-reduce only).
	Ring Ring
	// Followers are the leader's (rank 0's) control connections to ranks
	// 1..Workers-1, in rank order; Leader is a follower's connection to
	// rank 0. Rank 0 announces each piece it starts, and each configuration
	// change (Reconfigure), on them.
	Followers []*transport.Conn
	Leader    *transport.Conn
	// OnDone is called, on the engine's goroutine, when a tensor's sum is in
	// place in the slice given to Post. It must not block for long.
	OnDone func(tensor, iteration int)
	// OnOpen is called, on the engine's goroutine, when layer's gate opens
	// for iteration (every tensor of the layer is in place; WaitLayer
	// returns for it now), and OnStop once, with the reason, when the
	// engine stops, before Stop returns. Bindings that wait without
	// entering Go use them. They must not block for long, nor call Stop.
	OnOpen func(layer, iteration int)
	OnStop func(err error)
	// Observer, if set, is told about every piece (and, by Replay, every
	// compute step and iteration): timelines and metrics.
	Observer Observer
	// Decisions, if set, records the machine's decisions (conformance
	// tests compare them with the simulator's).
	Decisions *proto.DecisionLog
	Logger    *slog.Logger
}

// Observer receives what a worker does, for timelines and metrics. Its
// methods are called from the engine's and the replay's goroutines.
type Observer interface {
	PieceStarted(p sched.Piece, posted, started time.Time, inflightBytes int64)
	PieceDone(p sched.Piece, started, done time.Time, inflightBytes int64)
	Compute(name string, iteration int, start, end time.Time)
	Iteration(k int, d time.Duration)
}

// ShardObserver, if the Observer also is one, is told when each shard is
// handed to its parameter server's connection and when its answer is
// handled: the per-server statistics (stats.Collector) come from these.
type ShardObserver interface {
	ShardPushed(server, iteration int, bytes int64, at time.Time)
	ShardAnswered(server, iteration int, at time.Time)
}

// Engine runs one worker's communication. Create with New, then Start.
type Engine struct {
	cfg    Config
	log    *slog.Logger
	m      *proto.Worker // the loop's only
	events chan event
	ctx    context.Context
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup // the loop
	// readers are the goroutines reading connections; they end when the
	// connections close (see Wait).
	readers sync.WaitGroup
	// running is set by Start (Reconfigure needs the loop).
	running atomic.Bool

	// gradsMu guards grads, which readers decode sums into. grads is
	// keyed by unit (proto.Unit, of the iteration's epoch), from its first
	// piece's start on: a tensor's own slice where the unit is one tensor,
	// else a buffer holding its tensors end to end (gather).
	gradsMu sync.RWMutex
	grads   map[taskKey][]float32

	// members holds the posted gradients by tensor, and unstaged counts
	// the members synced of a fused unit's iteration (by unit). Which
	// tensors travel together is known only when a piece of the iteration
	// starts (the fusion size is part of its epoch). The loop's only.
	members  map[taskKey][]float32
	unstaged map[taskKey]int

	// postedAt (by tensor) and started feed the observer (only when there
	// is one).
	postedAt map[taskKey]time.Time
	started  map[sched.PieceID]time.Time

	gateMu sync.Mutex
	gate   *sync.Cond
	synced []int // synced[l] = last iteration whose layer l is in place
	failed error
}

type taskKey struct{ iter, tensor int }

type eventKind int

const (
	evPost eventKind = iota
	evShard
	evAnnounce
	evPieceDone
	evReconfigure
)

type event struct {
	kind eventKind
	// posts are an evPost's gradients, all of iteration task.iter.
	posts  []Posting
	task   taskKey
	piece  sched.Piece
	server int // the parameter server of an evShard
	err    error
	reconf cluster.Reconfiguration
	// reply, if set, receives the outcome of a Reconfigure call.
	reply chan<- error
}

// New checks cfg and returns an engine.
func New(cfg Config) (*Engine, error) {
	switch {
	case cfg.Workers < 1 || cfg.Rank < 0 || cfg.Rank >= cfg.Workers:
		return nil, fmt.Errorf("worker: rank %d out of range for %d workers", cfg.Rank, cfg.Workers)
	case len(cfg.Tensors) == 0:
		return nil, errors.New("worker: no tensors")
	case cfg.Arch == PS && len(cfg.Servers) == 0:
		return nil, errors.New("worker: parameter-server mode needs at least one server connection")
	case cfg.Arch == AllReduce && cfg.Ring == nil && cfg.Workers > 1:
		return nil, errors.New("worker: all-reduce mode needs a ring")
	case cfg.Rank == 0 && len(cfg.Followers) != cfg.Workers-1:
		return nil, fmt.Errorf("worker: rank 0 needs control connections to %d followers, got %d", cfg.Workers-1, len(cfg.Followers))
	case cfg.Rank > 0 && cfg.Leader == nil:
		return nil, fmt.Errorf("worker: rank %d needs a control connection to rank 0", cfg.Rank)
	}
	pc := proto.Config{Rank: cfg.Rank, Workers: cfg.Workers, Arch: cfg.Arch, Sched: cfg.Sched,
		Servers: len(cfg.Servers), ShardBytes: cfg.ShardBytes}
	for i, t := range cfg.Tensors {
		if t.Elems < 1 || t.Layer < 0 {
			return nil, fmt.Errorf("worker: tensor %d %q: needs elements >= 1 and layer >= 0, got %d elements, layer %d", i, t.Name, t.Elems, t.Layer)
		}
		if !t.Wire.Valid() {
			return nil, fmt.Errorf("worker: tensor %d %q: unknown wire type %v", i, t.Name, t.Wire)
		}
		size := t.Wire.Size()
		pc.Tensors = append(pc.Tensors, proto.Tensor{Layer: t.Layer, Bytes: int64(size) * int64(t.Elems), ElemBytes: size,
			Compressible: t.Wire == dtype.F32 && !t.Exact, Posted: t.Posted, Wire: t.Wire})
	}
	m, err := proto.New(pc)
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	e := &Engine{cfg: cfg, log: cfg.Logger, m: m, events: make(chan event, 1024), grads: map[taskKey][]float32{},
		postedAt: map[taskKey]time.Time{}, started: map[sched.PieceID]time.Time{},
		members: map[taskKey][]float32{}, unstaged: map[taskKey]int{}}
	if e.log == nil {
		e.log = slog.Default()
	}
	e.synced = make([]int, m.Layers())
	for l := range e.synced {
		e.synced[l] = -1
	}
	e.gate = sync.NewCond(&e.gateMu)
	e.ctx, e.cancel = context.WithCancelCause(context.Background())
	return e, nil
}

// Start runs the engine until ctx ends, Stop is called or a peer fails.
func (e *Engine) Start(ctx context.Context) {
	e.running.Store(true)
	go func() {
		select {
		case <-ctx.Done():
			e.cancel(context.Cause(ctx))
		case <-e.ctx.Done():
		}
	}()
	if e.cfg.Arch == PS {
		for i, c := range e.cfg.Servers {
			e.readers.Add(1)
			go e.readServer(i, c)
		}
	}
	if e.cfg.Leader != nil {
		e.readers.Add(1)
		go e.readLeader()
	}
	for _, c := range e.cfg.Followers {
		e.readers.Add(1)
		go e.watch(c)
	}
	e.wg.Add(2)
	go e.loop()
	// Stop waits for this goroutine too: OnStop must not reach a binding
	// after Stop returned (libautobyte would mark the next session stopped).
	go func() {
		defer e.wg.Done()
		<-e.ctx.Done()
		e.gateMu.Lock()
		if e.failed == nil {
			e.failed = context.Cause(e.ctx)
		}
		failed := e.failed
		e.gateMu.Unlock()
		e.gate.Broadcast()
		if e.cfg.OnStop != nil {
			e.cfg.OnStop(failed)
		}
	}()
}

// Post hands over tensor's gradient of iteration. The engine reads grad and
// overwrites it in place with the sum over all workers; the caller must not
// touch it until OnDone(tensor, iteration) or WaitLayer returns for it.
func (e *Engine) Post(tensor, iteration int, grad []float32) error {
	return e.PostAll(iteration, []Posting{{Tensor: tensor, Grad: grad}})
}

// Posting is one tensor's gradient handed to PostAll.
type Posting struct {
	Tensor int
	Grad   []float32
}

// PostAll hands over several gradients of iteration as one event, in
// order, as Post would each: the protocol machine sees them all before any
// answer or announcement that arrives meanwhile, as the simulator's posts
// of one instant are (a replay posts a layer's tensors so). Nothing is
// posted if any is invalid.
func (e *Engine) PostAll(iteration int, posts []Posting) error {
	for _, p := range posts {
		if p.Tensor < 0 || p.Tensor >= len(e.cfg.Tensors) {
			return fmt.Errorf("worker: tensor %d out of range (have %d)", p.Tensor, len(e.cfg.Tensors))
		}
		if want := e.cfg.Tensors[p.Tensor].Elems; len(p.Grad) != want {
			return fmt.Errorf("worker: tensor %d %q: gradient has %d elements, want %d", p.Tensor, e.cfg.Tensors[p.Tensor].Name, len(p.Grad), want)
		}
	}
	if e.ctx.Err() != nil {
		return e.stoppedErr()
	}
	select {
	case e.events <- event{kind: evPost, task: taskKey{iter: iteration}, posts: append([]Posting(nil), posts...)}:
		return nil
	case <-e.ctx.Done():
		return e.stoppedErr()
	}
}

// Reconfigure changes the scheduling configuration (partition size, credit,
// order, admission) to cfg for every tensor of iteration from and later, on
// every worker and server of the job, while the engine runs. Only rank 0
// (the leader) decides changes; on other ranks it returns an error. It may
// be called from any goroutine once Start was called, and returns when the
// change is accepted and announced (or refused).
//
// Rank 0 hands the change to its protocol machine through the engine's
// loop, which numbers it as the next configuration epoch, and announces it
// to every follower on the control connection before any piece of the
// epoch can start, so a follower always knows an epoch's partition size
// before it meets a piece of it. Tasks posted before the change keep the
// partitioning they were cut with; pieces carry their epoch to the servers
// (and around the ring), which key what they sum by it, so pieces of
// different partitionings never mix.
//
// from must be later than every iteration rank 0 has posted (a Post made
// before this call counts, since both go through the loop) and than the
// change before it; otherwise, or if cfg is invalid, the change is refused
// with an error naming the values and nothing changes. A follower that
// already posted iteration from applies the new credit from its next
// iteration instead (credit is each worker's own business); the partition
// still changes at from everywhere, since followers start the leader's
// pieces.
func (e *Engine) Reconfigure(cfg sched.Config, from int) error {
	if e.cfg.Rank != 0 {
		return fmt.Errorf("worker %d: cannot reconfigure from iteration %d: only rank 0 (the leader) decides configuration changes", e.cfg.Rank, from)
	}
	if from < 0 || int64(from) > math.MaxUint32 {
		return fmt.Errorf("worker 0: configuration change from iteration %d: iterations are 0..%d", from, uint32(math.MaxUint32))
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("worker 0: configuration change from iteration %d: %w", from, err)
	}
	if !e.running.Load() {
		return fmt.Errorf("worker 0: configuration change from iteration %d: the engine is not started (set Config.Sched for the initial configuration)", from)
	}
	if e.ctx.Err() != nil {
		return e.stoppedErr()
	}
	reply := make(chan error, 1)
	select {
	case e.events <- event{kind: evReconfigure, reconf: cluster.Reconfiguration{From: from, Config: cfg}, reply: reply}:
	case <-e.ctx.Done():
		return e.stoppedErr()
	}
	select {
	case err := <-reply:
		return err
	case <-e.ctx.Done():
		select {
		case err := <-reply: // handled just before the engine stopped
			return err
		default:
			return e.stoppedErr()
		}
	}
}

// WaitLayer blocks until every tensor of layer of iteration is in place, or
// the engine failed.
func (e *Engine) WaitLayer(layer, iteration int) error {
	if layer < 0 || layer >= len(e.synced) {
		return fmt.Errorf("worker: layer %d out of range (have %d)", layer, len(e.synced))
	}
	e.gateMu.Lock()
	defer e.gateMu.Unlock()
	for e.synced[layer] < iteration && e.failed == nil {
		e.gate.Wait()
	}
	if e.synced[layer] >= iteration {
		return nil
	}
	return e.failed
}

// stoppedErr is why the engine stopped, for calls made after it did.
func (e *Engine) stoppedErr() error {
	if err := e.Err(); err != nil {
		return err
	}
	return fmt.Errorf("worker %d: engine stopped: %w", e.cfg.Rank, context.Cause(e.ctx))
}

// Err is the error that stopped the engine, if any.
func (e *Engine) Err() error {
	e.gateMu.Lock()
	defer e.gateMu.Unlock()
	return e.failed
}

// Stop ends the engine, with cause (nil for an orderly end), and waits for
// its loop. Goroutines reading the connections end when the caller closes
// the connections; Wait waits for them.
func (e *Engine) Stop(cause error) {
	if cause == nil {
		cause = errStopped
	}
	e.cancel(cause)
	e.wg.Wait()
}

// Wait waits until every connection reader has returned (after Stop and
// after the caller closed the connections).
func (e *Engine) Wait() { e.readers.Wait() }

var errStopped = errors.New("worker: engine stopped")

func (e *Engine) fail(err error) {
	e.cancel(err)
}

func (e *Engine) send(ev event) {
	select {
	case e.events <- ev:
	case <-e.ctx.Done():
	}
}

func (e *Engine) loop() {
	defer e.wg.Done()
	for {
		select {
		case <-e.ctx.Done():
			return
		case ev := <-e.events:
			if err := e.handle(ev); err != nil {
				e.fail(err)
				return
			}
		}
	}
}

// handle hands one event to the machine and carries out its effects.
func (e *Engine) handle(ev event) error {
	var err error
	switch ev.kind {
	case evPost:
		for _, p := range ev.posts {
			e.stage(ev.task.iter, p)
			if err = e.m.Post(p.Tensor, ev.task.iter); err != nil {
				break
			}
		}
	case evAnnounce:
		err = e.m.Announced(ev.piece)
	case evReconfigure:
		if e.cfg.Rank != 0 {
			err = e.m.EpochAnnounced(proto.Epoch{Number: ev.reconf.Epoch, From: ev.reconf.From, Config: ev.reconf.Config})
			break
		}
		_, rerr := e.m.Reconfigure(ev.reconf.Config, ev.reconf.From)
		// Announcing the epoch happens below, before any piece of it; an
		// error there ends the engine, and Reconfigure reports it.
		if cerr := e.carryOut(); cerr != nil {
			ev.reply <- cerr
			return cerr
		}
		ev.reply <- rerr
		return nil
	case evShard:
		if so, ok := e.cfg.Observer.(ShardObserver); ok {
			so.ShardAnswered(ev.server, ev.piece.Iteration, time.Now())
		}
		err = e.m.Answered(ev.piece.PieceID)
	case evPieceDone:
		if ev.err != nil {
			return ev.err
		}
		err = e.m.RingDone(ev.piece.PieceID)
	}
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	return e.carryOut()
}

// carryOut performs the machine's effects: messages in order, then the
// observer's calls, the sums in place and the gates.
func (e *Engine) carryOut() error {
	rd := e.m.Ready()
	if rd.Empty() {
		return nil
	}
	e.cfg.Decisions.Record(e.cfg.Rank, &rd)
	for _, msg := range rd.Messages {
		if err := e.sendMessage(msg); err != nil {
			return err
		}
	}
	for _, ep := range rd.Epochs {
		e.log.Debug("worker: configuration epoch", "rank", e.cfg.Rank, "epoch", ep.Number, "from", ep.From, "partition", ep.Config.PartitionBytes, "credit", ep.Config.CreditBytes)
	}
	if obs := e.cfg.Observer; obs != nil {
		now := time.Now()
		for _, s := range rd.Started {
			e.started[s.Piece.PieceID] = now
			obs.PieceStarted(s.Piece, e.postedAtUnit(s.Piece), now, s.InFlightBytes)
		}
		for _, f := range rd.Finished {
			obs.PieceDone(f.Piece, e.started[f.Piece.PieceID], now, f.InFlightBytes)
			delete(e.started, f.Piece.PieceID)
		}
	}
	for _, s := range rd.Synced {
		e.unstage(s)
		if e.cfg.OnDone != nil {
			e.cfg.OnDone(s.Tensor, s.Iteration)
		}
	}
	if len(rd.Opened) > 0 {
		e.gateMu.Lock()
		for _, g := range rd.Opened {
			e.synced[g.Layer] = max(e.synced[g.Layer], g.Iteration)
		}
		e.gateMu.Unlock()
		e.gate.Broadcast()
		if e.cfg.OnOpen != nil {
			for _, g := range rd.Opened {
				e.cfg.OnOpen(g.Layer, g.Iteration)
			}
		}
	}
	return nil
}

// stage records a posted gradient; gather finds it when a piece of its
// unit starts.
func (e *Engine) stage(iteration int, p Posting) {
	k := taskKey{iter: iteration, tensor: p.Tensor}
	e.members[k] = p.Grad
	if e.cfg.Observer != nil {
		e.postedAt[k] = time.Now()
	}
}

// gather is the data of piece p's unit, put together at its first piece:
// the tensor's own slice, or a fused unit's tensors copied end to end
// into one buffer. The machine starts a unit only once all of it is
// posted.
func (e *Engine) gather(p sched.Piece) []float32 {
	k := taskKey{iter: p.Iteration, tensor: p.Tensor}
	e.gradsMu.RLock()
	data, ok := e.grads[k]
	e.gradsMu.RUnlock()
	if ok {
		return data
	}
	u := e.m.Units(p.Epoch)[p.Tensor]
	if len(u.Tensors) == 1 {
		data = e.members[taskKey{iter: p.Iteration, tensor: u.Tensors[0]}]
	} else {
		// The machine lays a unit out in wire bytes; the posted data is
		// float32 elements, one per wire element.
		size := u.Wire.Size()
		data = make([]float32, int(u.Bytes)/size)
		for i, t := range u.Tensors {
			copy(data[int(u.Offsets[i])/size:], e.members[taskKey{iter: p.Iteration, tensor: t}])
		}
	}
	e.gradsMu.Lock()
	e.grads[k] = data
	e.gradsMu.Unlock()
	return data
}

// postedAtUnit is when piece p's unit was posted here: when the last of
// its tensors was.
func (e *Engine) postedAtUnit(p sched.Piece) time.Time {
	var at time.Time
	for _, t := range e.m.Units(p.Epoch)[p.Tensor].Tensors {
		if tp := e.postedAt[taskKey{iter: p.Iteration, tensor: t}]; tp.After(at) {
			at = tp
		}
	}
	return at
}

// unstage puts a synced tensor's sum in place (a fused unit's member:
// copied out of the unit's buffer) and forgets the unit once all of it is.
// A unit that never left (a one-worker ring) was never gathered: each
// tensor already holds its sum.
func (e *Engine) unstage(s proto.Synced) {
	tk := taskKey{iter: s.Iteration, tensor: s.Tensor}
	uk := taskKey{iter: s.Iteration, tensor: s.Unit}
	u := e.m.Units(s.Epoch)[s.Unit]
	if len(u.Tensors) > 1 {
		if data := e.grad(s.Iteration, s.Unit); data != nil {
			size := int64(u.Wire.Size())
			i := slices.Index(u.Tensors, s.Tensor)
			dst := e.members[tk]
			copy(dst, data[u.Offsets[i]/size:][:len(dst)])
		}
		if e.unstaged[uk]++; e.unstaged[uk] < len(u.Tensors) {
			delete(e.members, tk)
			delete(e.postedAt, tk)
			return
		}
		delete(e.unstaged, uk)
	}
	delete(e.members, tk)
	delete(e.postedAt, tk)
	e.gradsMu.Lock()
	delete(e.grads, uk)
	e.gradsMu.Unlock()
}

// sendMessage sends one of the machine's messages.
func (e *Engine) sendMessage(m proto.Message) error {
	switch m.Kind {
	case proto.Announce:
		for _, c := range e.cfg.Followers {
			if err := c.Send(announceFrame(m.Piece)); err != nil {
				return fmt.Errorf("worker: announcing to rank %d: %w", c.PeerRank(), err)
			}
		}
	case proto.AnnounceEpoch:
		r := cluster.Reconfiguration{Epoch: m.Epoch.Number, From: m.Epoch.From, Config: m.Epoch.Config}
		for _, c := range e.cfg.Followers {
			if err := c.Send(cluster.ReconfigureFrame(r)); err != nil {
				return fmt.Errorf("worker 0: announcing configuration epoch %d (from iteration %d) to rank %d: %w", r.Epoch, r.From, c.PeerRank(), err)
			}
		}
	case proto.RingStart:
		p := m.Piece
		d := e.wireOf(p)
		size := int64(d.Size())
		data := e.gather(p)[p.Offset/size : (p.Offset+p.Bytes)/size]
		e.cfg.Ring.Start(p, m.Priority, d, data, func(err error) { e.send(event{kind: evPieceDone, piece: p, err: err}) })
	case proto.Push:
		if so, ok := e.cfg.Observer.(ShardObserver); ok {
			so.ShardPushed(m.Server, m.Piece.Iteration, m.Bytes, time.Now())
		}
		return e.push(m)
	}
	return nil
}

func (e *Engine) grad(iteration, tensor int) []float32 {
	e.gradsMu.RLock()
	defer e.gradsMu.RUnlock()
	return e.grads[taskKey{iter: iteration, tensor: tensor}]
}

// push sends one shard of a piece to its server (and its pull, in pull
// mode).
func (e *Engine) push(m proto.Message) error {
	p := m.Piece
	d := e.wireOf(p)
	size := int64(d.Size())
	// The gradient itself goes out where it is already in wire format: its
	// sum only arrives (and overwrites it) after every worker's push was
	// written, ours included.
	src := e.gather(p)[m.Offset/size : (m.Offset+m.Bytes)/size]
	payload, zeroCopy := transport.WireBytes(src)
	exp := 0
	if zeroCopy = zeroCopy && d == dtype.F32; !zeroCopy {
		payload = payloads.Get(int(m.Bytes))
		exp = d.Scale(src)
		d.Encode(payload, src, exp)
	}
	h := transport.Header{Kind: transport.KindPush, Rank: uint32(e.cfg.Rank), Epoch: uint32(p.Epoch),
		Iteration: uint32(p.Iteration), Key: uint32(p.Tensor), Piece: uint32(p.Index), Aux: uint32(m.Shard),
		Priority: m.Priority, Offset: uint64(m.Offset), Length: uint32(m.Bytes), Elem: uint8(d), Scale: int8(exp)}
	c := e.cfg.Servers[m.Server]
	var done func(error)
	if !zeroCopy {
		done = func(error) { payloads.Put(payload) }
	}
	if err := c.SendNotify(transport.Frame{Header: h, Payload: payload}, done); err != nil {
		return fmt.Errorf("worker: push to server %d: %w", m.Server, err)
	}
	if e.cfg.PullMode {
		h.Kind, h.Length = transport.KindPull, 0
		if err := c.Send(transport.Frame{Header: h}); err != nil {
			return fmt.Errorf("worker: pull from server %d: %w", m.Server, err)
		}
	}
	return nil
}

// payloads recycles push buffers.
var payloads transport.BufferPool

// readServer decodes sums from one server into the gradients in place.
func (e *Engine) readServer(idx int, c *transport.Conn) {
	defer e.readers.Done()
	// Sums are received straight into the gradients they replace where the
	// wire format allows; otherwise into one reused buffer, decoded before
	// the next receive.
	var buf []byte
	dest := func(h transport.Header) []byte {
		if h.Kind == transport.KindAggregate && h.Elem == uint8(dtype.F32) && h.Length%4 == 0 {
			e.gradsMu.RLock()
			grad, ok := e.grads[taskKey{iter: int(h.Iteration), tensor: int(h.Key)}]
			e.gradsMu.RUnlock()
			lo, hi := h.Offset/4, (h.Offset+uint64(h.Length))/4
			if ok && hi <= uint64(len(grad)) {
				if b, ok := transport.WireBytes(grad[lo:hi]); ok {
					return b
				}
			}
		}
		return buf
	}
	for {
		f, err := c.RecvTo(dest)
		if err != nil {
			if e.ctx.Err() == nil {
				e.fail(fmt.Errorf("worker %d: lost parameter server %d: %w", e.cfg.Rank, idx, err))
			}
			return
		}
		if f.Kind != transport.KindAggregate {
			e.fail(fmt.Errorf("worker %d: server %d sent an unexpected %v frame", e.cfg.Rank, idx, f.Kind))
			return
		}
		k := taskKey{iter: int(f.Iteration), tensor: int(f.Key)}
		e.gradsMu.RLock()
		grad, ok := e.grads[k]
		e.gradsMu.RUnlock()
		// The server answers in the type the pushes travelled in (it
		// refuses a piece pushed in two), which the frame names.
		d := dtype.DType(f.Elem)
		if !d.Valid() {
			e.fail(fmt.Errorf("worker %d: server %d answered tensor %d iteration %d in unknown element type %d", e.cfg.Rank, idx, f.Key, f.Iteration, f.Elem))
			return
		}
		size := uint64(d.Size())
		lo, hi := f.Offset/size, (f.Offset+uint64(f.Length))/size
		if !ok || uint64(f.Length)%size != 0 || f.Offset%size != 0 || hi > uint64(len(grad)) {
			e.fail(fmt.Errorf("worker %d: server %d answered tensor %d iteration %d bytes [%d,%d) that this worker is not waiting for",
				e.cfg.Rank, idx, f.Key, f.Iteration, f.Offset, f.Offset+uint64(f.Length)))
			return
		}
		if b, ok := transport.WireBytes(grad[lo:hi]); d != dtype.F32 || !ok || len(f.Payload) == 0 || &b[0] != &f.Payload[0] {
			d.Decode(grad[lo:hi], f.Payload, int(f.Scale))
			if cap(f.Payload) > cap(buf) {
				buf = f.Payload[:cap(f.Payload)]
			}
		}
		e.send(event{kind: evShard, server: idx, piece: sched.Piece{PieceID: sched.PieceID{Iteration: int(f.Iteration), Tensor: int(f.Key), Index: int(f.Piece)}}})
	}
}
