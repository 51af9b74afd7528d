// Package proto is the protocol machine of one worker: everything a worker
// decides about its gradients' communication, as one pure, deterministic
// state machine that the simulator (package sim, on a virtual clock) and the
// runtime engine (package worker, over sockets) both drive, so the two
// cannot disagree.
//
// It owns partitioning and admission (through package sched), the fusion
// of small tensors into units, the priority key a piece travels with,
// configuration epochs and their history, the placement of pieces on
// parameter servers (package placement, cached per configuration), the
// countdown of a sharded piece's answers, the per-layer gates and the
// global barrier of fifo, the leader's announcements to its
// followers (of pieces, parameter servers and ring alike, and of epochs),
// and the rule for when a tuner's proposal may apply (Schedule). On the
// server side, ShardSum decides the order a shard's pushes are summed in
// (rank order), when it is complete and the order its answers go out.
//
// In the style of etcd's raft package, events go in as method calls (a
// gradient was posted, an announcement or an answer arrived, a ring piece
// completed, a change was proposed) and the effects come out of Ready as one
// batch, in the order the driver must carry them out: messages to send on
// which connection with which priority, pieces started and finished, tensors
// whose sum is in place, layers whose gate opens. It has no goroutines, no
// clock and no I/O; it knows nothing of sockets, frames, float32 data or
// time. A Worker is not safe for concurrent use.
package proto

import (
	"errors"
	"fmt"
	"slices"

	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/placement"
	"github.com/autobyte/autobyte/sched"
)

// Arch is the aggregation architecture.
type Arch int

const (
	// PS is parameter servers: each worker pushes each piece to the
	// servers that hold it and receives the sum back.
	PS Arch = iota
	// AllReduce is ring all-reduce of pieces.
	AllReduce
)

// archNames serves both String and ParseArch, so that the names printed
// are the names parsed.
var archNames = [...]string{PS: "ps", AllReduce: "allreduce"}

func (a Arch) String() string {
	if a >= 0 && int(a) < len(archNames) {
		return archNames[a]
	}
	return fmt.Sprintf("Arch(%d)", int(a))
}

// ParseArch parses "ps" or "allreduce".
func ParseArch(s string) (Arch, error) {
	for a, name := range archNames {
		if s == name {
			return Arch(a), nil
		}
	}
	return 0, fmt.Errorf("unknown architecture %q (want ps or allreduce)", s)
}

// Tensor is one gradient tensor as the protocol sees it.
type Tensor struct {
	// Layer is the tensor's layer in forward order (0 first).
	Layer int
	// Bytes is the gradient's size on the wire.
	Bytes int64
	// ElemBytes is the size of one of its elements (its dtype's width);
	// pieces and shards hold whole elements. 0 means 4 (float32).
	ElemBytes int
	// Compressible: float32 gradients that travel in the epoch's
	// compression type (sched.Task.Cut).
	Compressible bool
	// Wire is the tensor's own element type; tensors fuse (Config.
	// FusionBytes) only with tensors of the same type.
	Wire dtype.DType
	// Posted says which iterations post the tensor; the layer gates and
	// fifo's barrier of an iteration wait for exactly those tensors.
	Posted Iterations
}

// Iterations says which iterations post a tensor.
type Iterations uint8

const (
	// EveryIteration posts the tensor in every iteration (a gradient).
	EveryIteration Iterations = iota
	// FirstOnly posts it in iteration 0 only (a binding's broadcast of
	// parameters or state at start).
	FirstOnly
	// AfterFirst posts it in every iteration but 0 (a gradient whose
	// parameter is broadcast through a FirstOnly tensor).
	AfterFirst
)

// in reports whether a tensor posted so is posted in iteration k.
func (p Iterations) in(k int) bool {
	switch p {
	case FirstOnly:
		return k == 0
	case AfterFirst:
		return k > 0
	}
	return true
}

func (p Iterations) String() string {
	switch p {
	case EveryIteration:
		return "every iteration"
	case FirstOnly:
		return "iteration 0 only"
	case AfterFirst:
		return "every iteration after 0"
	}
	return fmt.Sprintf("Iterations(%d)", uint8(p))
}

func (t Tensor) elemBytes() int64 {
	if t.ElemBytes == 0 {
		return sched.DefaultElemBytes
	}
	return int64(t.ElemBytes)
}

// task is tensor's task of iteration.
func (t Tensor) task(tensor, iteration int) sched.Task {
	return sched.Task{Iteration: iteration, Tensor: tensor, Layer: t.Layer, Bytes: t.Bytes, ElemBytes: int(t.elemBytes()), Compressible: t.Compressible}
}

// Config describes one worker of a job.
type Config struct {
	Rank, Workers int
	Arch          Arch
	// Tensors are the model's gradient tensors, by index.
	Tensors []Tensor
	// Sched is the initial scheduling configuration (epoch 0).
	Sched sched.Config
	// Servers is the number of parameter servers (PS only).
	Servers int
	// ShardBytes is the parameter servers' big-array bound: a piece larger
	// than it is split into shards on distinct servers (placement.Inputs).
	ShardBytes int64
	// Plans, if set, is a placement cache shared by the machines of one
	// job in one process (the simulator's), which place alike; nil: the
	// machine keeps its own.
	Plans *Plans
}

// weighs checks that c's server weights fit the job: none for all-reduce,
// one per server (or none) on parameter servers.
func (cfg Config) weighs(c sched.Config) error {
	n := c.ServerWeights.Len()
	switch {
	case n == 0:
		return nil
	case cfg.Arch != PS:
		return fmt.Errorf("server weights %v in an all-reduce job (it has no servers)", c.ServerWeights)
	case n != cfg.Servers:
		return fmt.Errorf("server weights %v weigh %d servers, the job has %d", c.ServerWeights, n, cfg.Servers)
	}
	return nil
}

// Plans caches placements by partition size, compression (what the
// tensors' sizes on the wire depend on) and server weights for machines with the same
// tensors, servers and shard bound. It is not safe for concurrent use.
type Plans struct{ byCut map[planKey]*placement.Plan }

type planKey struct {
	partition   int64
	compression dtype.DType
	weights     sched.ServerWeights
	fusion      int64
}

// NewPlans returns an empty cache.
func NewPlans() *Plans { return &Plans{byCut: map[planKey]*placement.Plan{}} }

// Epoch is a configuration epoch: the configuration every task of
// iteration From and later is cut and admitted with (until the next epoch).
// Epoch 0 is Config.Sched from iteration 0; the leader numbers each change
// it accepts as the next epoch.
type Epoch struct {
	Number, From int
	Config       sched.Config
}

// Barrier reports whether the forward pass after an iteration of this
// epoch waits for every layer (fifo: production order and a global
// barrier, like an unscheduled framework) rather than for each layer's own
// parameters only.
func (e Epoch) Barrier() bool { return e.Config.Order == sched.OrderFIFO }

// MessageKind is what a Message asks the driver to send.
type MessageKind int

const (
	// Announce: tell every follower that the leader started Piece.
	Announce MessageKind = iota
	// AnnounceEpoch: tell every follower about Epoch, before any piece of
	// it is announced.
	AnnounceEpoch
	// Push: send shard Shard of Piece (bytes [Offset, Offset+Bytes) of the
	// tensor) to parameter server Server.
	Push
	// RingStart: start Piece on the all-reduce ring.
	RingStart
)

func (k MessageKind) String() string {
	switch k {
	case Announce:
		return "announce"
	case AnnounceEpoch:
		return "epoch"
	case Push:
		return "push"
	case RingStart:
		return "ring"
	}
	return fmt.Sprintf("MessageKind(%d)", int(k))
}

// Message is one thing to send.
type Message struct {
	Kind  MessageKind
	Piece sched.Piece
	// Priority orders the message in its connection's send queue (smallest
	// first) and travels with it, so that servers answer by it too.
	Priority uint64
	// Server, Shard, Offset and Bytes locate a Push.
	Server, Shard int
	Offset, Bytes int64
	// Epoch is the epoch of an AnnounceEpoch.
	Epoch Epoch
}

// PieceEvent is a piece started or finished, with the worker's bytes in
// flight just after.
type PieceEvent struct {
	Piece         sched.Piece
	InFlightBytes int64
}

// Synced is a tensor of an iteration whose sum is in place; it travelled
// in unit Unit of configuration epoch Epoch (Units).
type Synced struct{ Tensor, Iteration, Unit, Epoch int }

// Gate is a layer of an iteration whose parameters are synchronised: the
// next forward pass may run that layer.
type Gate struct{ Layer, Iteration int }

// Ready is one batch of effects, in the order the driver carries them out:
// Messages in order (announcements before the pieces they announce reach a
// follower's connection, a piece's pushes in shard order), then Epochs,
// Started, Finished, Synced and Opened in the order they happened.
type Ready struct {
	Messages []Message
	// Epochs are the configuration epochs this worker accepted (the
	// leader) or learned (a follower).
	Epochs   []Epoch
	Started  []PieceEvent
	Finished []PieceEvent
	Synced   []Synced
	Opened   []Gate
}

// Empty reports whether r carries no effect.
func (r *Ready) Empty() bool {
	return len(r.Messages)+len(r.Epochs)+len(r.Started)+len(r.Finished)+len(r.Synced)+len(r.Opened) == 0
}

// Worker is one worker's protocol machine. Create it with New.
type Worker struct {
	cfg    Config
	layers int
	// perLayer[l] is how many tensors layer l has; perLayerAt[0] and [1]
	// how many iteration 0 and later iterations post (Tensor.Posted).
	perLayer   []int
	perLayerAt [2][]int
	leader     *sched.Scheduler
	follower   *sched.Follower
	epochs     []Epoch
	plans      *Plans
	// shardsLeft counts the answers still due for a sharded piece.
	shardsLeft map[sched.PieceID]int
	// layerLeft[k][l] counts layer l's tensors of iteration k not synced.
	layerLeft map[int][]int
	// synced[l] is the last iteration whose layer l is open.
	synced []int
	// seq numbers the pieces started, the priority of fifo's production
	// order (followers start the leader's pieces in its order, so every
	// worker numbers them alike).
	seq uint64
	// layouts are what travels under each fusion size an epoch used
	// (layoutFor); fusedPosted[k] says which members of a fused unit
	// iteration k has posted so far.
	layouts     map[int64]*layout
	fusedPosted map[fusedKey][]bool
	// lastPosted is the newest iteration posted here (-1: none). A
	// follower knows the epoch of every iteration up to settled (the
	// newest of an announced piece; later epochs start after it) and
	// holds back, in early, the tensors it posted for later iterations:
	// which of them travel together depends on that epoch's fusion size.
	lastPosted, settled int
	early               map[int]*earlyPosts
	// postedFused[k] is the fusion size iteration k's tensors were posted
	// under here, checked against each announced piece (a follower that
	// grouped an iteration otherwise than the leader would push the wrong
	// bytes).
	postedFused map[int]int64
	ready       Ready
}

// New checks cfg and returns its machine.
func New(cfg Config) (*Worker, error) {
	switch {
	case cfg.Workers < 1 || cfg.Rank < 0 || cfg.Rank >= cfg.Workers:
		return nil, fmt.Errorf("proto: rank %d out of range for %d workers", cfg.Rank, cfg.Workers)
	case len(cfg.Tensors) == 0:
		return nil, errors.New("proto: no tensors")
	case cfg.Arch != PS && cfg.Arch != AllReduce:
		return nil, fmt.Errorf("proto: unknown architecture %d", int(cfg.Arch))
	case cfg.Arch == PS && cfg.Servers < 1:
		return nil, fmt.Errorf("proto: parameter-server mode needs at least one server, got %d", cfg.Servers)
	case cfg.ShardBytes < 0:
		return nil, fmt.Errorf("proto: shard size must be >= 0 bytes (0 = no sharding), got %d", cfg.ShardBytes)
	}
	if err := cfg.Sched.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.weighs(cfg.Sched); err != nil {
		return nil, fmt.Errorf("proto: rank %d: initial configuration: %w", cfg.Rank, err)
	}
	w := &Worker{cfg: cfg, epochs: []Epoch{{Config: cfg.Sched}}, plans: cfg.Plans,
		shardsLeft: map[sched.PieceID]int{}, layerLeft: map[int][]int{}, fusedPosted: map[fusedKey][]bool{},
		layouts: map[int64]*layout{}, lastPosted: -1, settled: -1, early: map[int]*earlyPosts{}, postedFused: map[int]int64{}}
	for i, t := range cfg.Tensors {
		e := t.elemBytes()
		if t.Layer < 0 || t.Bytes <= 0 || e < 1 || t.Bytes%e != 0 {
			return nil, fmt.Errorf("proto: tensor %d: needs layer >= 0 and a positive whole number of elements, got layer %d, %d bytes of %d-byte elements", i, t.Layer, t.Bytes, e)
		}
		if !t.Wire.Valid() {
			return nil, fmt.Errorf("proto: tensor %d: unknown element type %d", i, int(t.Wire))
		}
		w.layers = max(w.layers, t.Layer+1)
	}
	if w.plans == nil {
		w.plans = NewPlans()
	}
	w.perLayer = make([]int, w.layers)
	w.perLayerAt = [2][]int{make([]int, w.layers), make([]int, w.layers)}
	for i, t := range cfg.Tensors {
		if t.Posted > AfterFirst {
			return nil, fmt.Errorf("proto: tensor %d: unknown posting schedule %v", i, t.Posted)
		}
		w.perLayer[t.Layer]++
		for at, k := range []int{0, 1} {
			if t.Posted.in(k) {
				w.perLayerAt[at][t.Layer]++
			}
		}
	}
	for l, n := range w.perLayer {
		if n == 0 {
			return nil, fmt.Errorf("proto: layer %d has no tensors (layers must be numbered 0..%d without gaps)", l, w.layers-1)
		}
	}
	w.synced = make([]int, w.layers)
	for l := range w.synced {
		w.synced[l] = -1
	}
	var err error
	if cfg.Rank == 0 {
		w.leader, err = sched.New(cfg.Sched)
	} else {
		w.follower, err = sched.NewFollower(cfg.Sched)
	}
	if err != nil {
		return nil, err
	}
	return w, nil
}

// Layers is the number of layers.
func (w *Worker) Layers() int { return w.layers }

// Epochs is the configuration history this worker knows, by epoch number.
func (w *Worker) Epochs() []Epoch { return append([]Epoch(nil), w.epochs...) }

// InFlightBytes is the bytes of the pieces this worker started and has not
// finished.
func (w *Worker) InFlightBytes() int64 {
	if w.leader != nil {
		return w.leader.InFlightBytes()
	}
	return w.follower.InFlightBytes()
}

// Ready returns the effects produced since the last call and forgets them.
// The slices are reused by later events: carry them out before the next.
func (w *Worker) Ready() Ready {
	r := w.ready
	w.ready = Ready{Messages: r.Messages[:0], Epochs: r.Epochs[:0], Started: r.Started[:0], Finished: r.Finished[:0], Synced: r.Synced[:0], Opened: r.Opened[:0]}
	return r
}

// Post records that tensor's gradient of iteration is ready here and
// starts what the credit window admits. Tensors travel in the units of
// the iteration's epoch; a follower that may not know that epoch yet (no
// piece of the iteration was announced) holds the tensor back until it
// does, which delays nothing: it starts only the leader's pieces.
func (w *Worker) Post(tensor, iteration int) error {
	if tensor < 0 || tensor >= len(w.cfg.Tensors) {
		return fmt.Errorf("proto: worker %d: tensor %d out of range (have %d)", w.cfg.Rank, tensor, len(w.cfg.Tensors))
	}
	if iteration < 0 {
		return fmt.Errorf("proto: worker %d: tensor %d posted for iteration %d, want >= 0", w.cfg.Rank, tensor, iteration)
	}
	t := w.cfg.Tensors[tensor]
	if !t.Posted.in(iteration) {
		return fmt.Errorf("proto: worker %d: tensor %d posted for iteration %d, but it is posted in %v", w.cfg.Rank, tensor, iteration, t.Posted)
	}
	if iteration < w.lastPosted {
		return fmt.Errorf("proto: worker %d: tensor %d posted for iteration %d after iteration %d", w.cfg.Rank, tensor, iteration, w.lastPosted)
	}
	w.lastPosted = iteration
	if _, ok := w.layerLeft[iteration]; !ok {
		w.layerLeft[iteration] = append([]int(nil), w.perLayerAt[min(iteration, 1)]...)
	}
	if w.follower != nil && iteration > w.settled {
		return w.holdBack(tensor, iteration)
	}
	if err := w.postUnit(tensor, iteration); err != nil {
		return err
	}
	return w.dispatch()
}

// postUnit hands tensor's task of iteration to the core as part of its
// unit under the iteration's epoch, once the unit is complete.
func (w *Worker) postUnit(tensor, iteration int) error {
	fusion := w.epochs[w.epochOf(iteration)].Config.FusionBytes
	l := w.layoutFor(fusion)
	w.postedFused[iteration] = fusion
	u := l.unitOf[tensor]
	if len(l.units[u].Tensors) > 1 {
		complete, err := w.postFused(l, tensor, iteration)
		if err != nil || !complete {
			return err
		}
	}
	task := l.units[u].task(u, iteration)
	var err error
	if w.leader != nil {
		err = w.leader.Post(task)
	} else {
		err = w.follower.Post(task)
	}
	if err != nil {
		return fmt.Errorf("proto: worker %d: %w", w.cfg.Rank, err)
	}
	return nil
}

// earlyPosts are the tensors a follower posted for one iteration whose
// epoch it does not know yet, in posting order.
type earlyPosts struct {
	tensors []int
	seen    []bool
}

// holdBack keeps a follower's post of an iteration past settled.
func (w *Worker) holdBack(tensor, iteration int) error {
	e := w.early[iteration]
	if e == nil {
		e = &earlyPosts{seen: make([]bool, len(w.cfg.Tensors))}
		w.early[iteration] = e
	}
	if e.seen[tensor] {
		return fmt.Errorf("proto: worker %d: tensor %d posted twice for iteration %d", w.cfg.Rank, tensor, iteration)
	}
	e.seen[tensor] = true
	e.tensors = append(e.tensors, tensor)
	return nil
}

// settle records that the epoch of every iteration up to k is known and
// posts what was held back for them, oldest iteration first.
func (w *Worker) settle(k int) error {
	if k <= w.settled {
		return nil
	}
	w.settled = k
	// Held back are at most a few iterations: a worker cannot post far
	// ahead of the sums of its previous iteration.
	its := make([]int, 0, len(w.early))
	for it := range w.early {
		if it <= k {
			its = append(its, it)
		}
	}
	slices.Sort(its)
	for _, it := range its {
		for _, t := range w.early[it].tensors {
			if err := w.postUnit(t, it); err != nil {
				return err
			}
		}
		delete(w.early, it)
	}
	return nil
}

// epochOf is the epoch iteration k is cut under: the last whose From is
// not after it.
func (w *Worker) epochOf(k int) int {
	e := len(w.epochs) - 1
	for e > 0 && w.epochs[e].From > k {
		e--
	}
	return e
}

// Announced is a follower's event: the leader announced that it started p.
// A piece this worker cannot place (of an epoch it was not told about, of
// a tensor it does not have, or cut otherwise than its epoch cuts the
// tensor) is refused: pushing it would mix partitionings.
func (w *Worker) Announced(p sched.Piece) error {
	if w.follower == nil {
		return fmt.Errorf("proto: worker 0 (the leader) was announced piece %d of tensor %d iteration %d", p.Index, p.Tensor, p.Iteration)
	}
	if err := w.checkAnnounced(p); err != nil {
		return err
	}
	// The leader posted p's iteration, so every later epoch starts after
	// it: the epoch of each iteration up to it is known here.
	if err := w.settle(p.Iteration); err != nil {
		return err
	}
	w.follower.Announce(p)
	return w.dispatch()
}

// Reconfigure is the leader's event: cfg applies to every task of
// iteration from and later, on every worker. It becomes the next epoch and
// is announced to the followers before any piece of it. from must be later
// than every iteration the leader posted and than the previous change;
// otherwise, or if cfg is invalid, nothing changes and the error says why.
func (w *Worker) Reconfigure(cfg sched.Config, from int) (Epoch, error) {
	if w.leader == nil {
		return Epoch{}, fmt.Errorf("proto: worker %d: cannot reconfigure from iteration %d: only rank 0 (the leader) decides configuration changes", w.cfg.Rank, from)
	}
	if from < 0 {
		return Epoch{}, fmt.Errorf("proto: worker 0: configuration change from iteration %d: iterations start at 0", from)
	}
	if err := w.cfg.weighs(cfg); err != nil {
		return Epoch{}, fmt.Errorf("proto: worker 0: configuration change from iteration %d: %w", from, err)
	}
	if err := w.leader.Reconfigure(cfg, from); err != nil {
		return Epoch{}, fmt.Errorf("proto: worker 0: %w", err)
	}
	e := Epoch{Number: len(w.epochs), From: from, Config: cfg}
	w.epochs = append(w.epochs, e)
	w.ready.Epochs = append(w.ready.Epochs, e)
	if w.cfg.Workers > 1 {
		w.ready.Messages = append(w.ready.Messages, Message{Kind: AnnounceEpoch, Epoch: e})
	}
	return e, nil
}

// EpochAnnounced is a follower's event: the leader announced epoch e. It
// must be the next epoch here. A follower that already posted iteration
// e.From (it runs ahead of the leader) takes the new credit window from
// its next iteration instead: credit is each worker's own business, and
// the partitioning still changes at e.From everywhere, since followers
// start the leader's pieces.
func (w *Worker) EpochAnnounced(e Epoch) error {
	if w.follower == nil {
		return fmt.Errorf("proto: worker 0 (the leader) was announced configuration epoch %d", e.Number)
	}
	if e.Number != len(w.epochs) {
		return fmt.Errorf("proto: worker %d: rank 0 announced configuration epoch %d (from iteration %d), but the next epoch here is %d", w.cfg.Rank, e.Number, e.From, len(w.epochs))
	}
	if err := w.cfg.weighs(e.Config); err != nil {
		return fmt.Errorf("proto: worker %d: configuration epoch %d from iteration %d: %w", w.cfg.Rank, e.Number, e.From, err)
	}
	if _, err := w.follower.Follow(e.Config, e.From); err != nil {
		return fmt.Errorf("proto: worker %d: configuration epoch %d from iteration %d: %w", w.cfg.Rank, e.Number, e.From, err)
	}
	w.epochs = append(w.epochs, e)
	w.ready.Epochs = append(w.ready.Epochs, e)
	return nil
}

// Answered is a parameter-server event: the sum of one shard of piece id
// is in place.
func (w *Worker) Answered(id sched.PieceID) error {
	if w.cfg.Arch != PS {
		return fmt.Errorf("proto: worker %d: a parameter server answered piece %d of tensor %d iteration %d in an all-reduce job", w.cfg.Rank, id.Index, id.Tensor, id.Iteration)
	}
	if n := w.shardsLeft[id]; n > 1 {
		w.shardsLeft[id] = n - 1
		return nil
	}
	delete(w.shardsLeft, id)
	if err := w.pieceDone(id); err != nil {
		return err
	}
	return w.dispatch()
}

// RingDone is an all-reduce event: piece id is summed on every rank.
func (w *Worker) RingDone(id sched.PieceID) error {
	if w.cfg.Arch != AllReduce {
		return fmt.Errorf("proto: worker %d: ring piece %d of tensor %d iteration %d completed in a parameter-server job", w.cfg.Rank, id.Index, id.Tensor, id.Iteration)
	}
	if err := w.pieceDone(id); err != nil {
		return err
	}
	return w.dispatch()
}

// Priority is the key a piece travels with: production order under fifo,
// (layer, tensor, piece) otherwise, as the piece's epoch says. It must be
// called once per started piece, in start order.
func (w *Worker) priority(p sched.Piece) uint64 {
	w.seq++
	if w.epochs[p.Epoch].Config.Order == sched.OrderFIFO {
		return w.seq
	}
	return PriorityKey(p)
}

// PriorityKey is the (layer, tensor, piece) key of priority order packed
// in 64 bits: 20 bits of layer, 20 of tensor, 24 of piece index.
func PriorityKey(p sched.Piece) uint64 {
	return uint64(p.Layer)<<44 | uint64(p.Tensor&0xFFFFF)<<24 | uint64(p.Index&0xFFFFFF)
}

// dispatch starts every piece the core admits.
func (w *Worker) dispatch() error {
	for {
		var p sched.Piece
		var ok bool
		if w.leader != nil {
			p, ok = w.leader.Next()
		} else {
			p, ok = w.follower.Next()
		}
		if !ok {
			return nil
		}
		if w.leader != nil && w.cfg.Workers > 1 {
			w.ready.Messages = append(w.ready.Messages, Message{Kind: Announce, Piece: p})
		}
		prio := w.priority(p)
		w.ready.Started = append(w.ready.Started, PieceEvent{Piece: p, InFlightBytes: w.InFlightBytes()})
		if w.cfg.Arch == AllReduce {
			if w.cfg.Workers == 1 {
				if err := w.pieceDone(p.PieceID); err != nil {
					return err
				}
				continue
			}
			w.ready.Messages = append(w.ready.Messages, Message{Kind: RingStart, Piece: p, Priority: prio})
			continue
		}
		pl, err := w.plan(p.Epoch)
		if err != nil {
			return err
		}
		shards := pl.Pieces[p.Tensor][p.Index]
		if len(shards) > 1 {
			w.shardsLeft[p.PieceID] = len(shards)
		}
		for i, sh := range shards {
			w.ready.Messages = append(w.ready.Messages, Message{Kind: Push, Piece: p, Priority: prio,
				Server: sh.Server, Shard: i, Offset: sh.Offset, Bytes: sh.Bytes})
		}
	}
}

// plan is the placement of epoch's partitioning, computed once per
// partition size.
func (w *Worker) plan(epoch int) (*placement.Plan, error) {
	if epoch < 0 || epoch >= len(w.epochs) {
		return nil, fmt.Errorf("proto: worker %d: piece of configuration epoch %d, but epochs here are 0..%d", w.cfg.Rank, epoch, len(w.epochs)-1)
	}
	cfg := w.epochs[epoch].Config
	key := planKey{cfg.PartitionBytes, cfg.Compression, cfg.ServerWeights, cfg.FusionBytes}
	if pl, ok := w.plans.byCut[key]; ok {
		return pl, nil
	}
	in := placement.Inputs{PartitionBytes: cfg.PartitionBytes, ShardBytes: w.cfg.ShardBytes, Servers: w.cfg.Servers}
	if cfg.ServerWeights.Weighted() {
		shares, err := cfg.ServerWeights.Shares(w.cfg.Servers) // weighs() checked the count
		if err != nil {
			return nil, fmt.Errorf("proto: worker %d: %w", w.cfg.Rank, err)
		}
		in.Weights = shares
	}
	for i, u := range w.layoutAt(epoch).units {
		bytes, elem, _ := u.task(i, 0).Cut(cfg)
		in.TensorBytes = append(in.TensorBytes, bytes)
		in.TensorElemBytes = append(in.TensorElemBytes, elem)
	}
	pl, err := placement.Place(in)
	if err != nil {
		return nil, fmt.Errorf("proto: worker %d: %w", w.cfg.Rank, err)
	}
	w.plans.byCut[key] = pl
	return pl, nil
}

func (w *Worker) pieceDone(id sched.PieceID) error {
	var p sched.Piece
	var taskDone bool
	var err error
	if w.leader != nil {
		p, taskDone, err = w.leader.Finish(id)
	} else {
		p, taskDone, err = w.follower.Finish(id)
	}
	if err != nil {
		return fmt.Errorf("proto: worker %d: %w", w.cfg.Rank, err)
	}
	w.ready.Finished = append(w.ready.Finished, PieceEvent{Piece: p, InFlightBytes: w.InFlightBytes()})
	if !taskDone {
		return nil
	}
	k := id.Iteration
	left := w.layerLeft[k]
	members := w.layoutAt(p.Epoch).units[id.Tensor].Tensors
	for _, t := range members {
		w.ready.Synced = append(w.ready.Synced, Synced{Tensor: t, Iteration: k, Unit: id.Tensor, Epoch: p.Epoch})
		left[w.cfg.Tensors[t].Layer]--
	}
	all := true
	for _, n := range left {
		all = all && n == 0
	}
	if all {
		delete(w.layerLeft, k)
		delete(w.postedFused, k)
	}
	switch {
	case w.epochs[p.Epoch].Barrier(): // the epoch the task was cut under, that of iteration k
		if all {
			for l := range w.synced {
				w.open(l, k)
			}
		}
	default:
		for _, t := range members {
			if l := w.cfg.Tensors[t].Layer; left[l] == 0 {
				w.open(l, k)
			}
		}
	}
	return nil
}

func (w *Worker) open(l, k int) {
	if k > w.synced[l] {
		w.synced[l] = k
		w.ready.Opened = append(w.ready.Opened, Gate{Layer: l, Iteration: k})
	}
}

// checkAnnounced refuses an announced piece this worker cannot place.
func (w *Worker) checkAnnounced(p sched.Piece) error {
	if p.Epoch < 0 || p.Epoch >= len(w.epochs) {
		return fmt.Errorf("proto: worker %d: rank 0 announced piece %d of tensor %d iteration %d in configuration epoch %d before announcing that epoch (epochs here are 0..%d)",
			w.cfg.Rank, p.Index, p.Tensor, p.Iteration, p.Epoch, len(w.epochs)-1)
	}
	cfg := w.epochs[p.Epoch].Config
	units := w.layoutAt(p.Epoch).units
	if p.Tensor < 0 || p.Tensor >= len(units) {
		have := fmt.Sprintf("%d tensors", len(units))
		if len(units) < len(w.cfg.Tensors) {
			have = fmt.Sprintf("%d units of communication in epoch %d (%d tensors fused at %d bytes)", len(units), p.Epoch, len(w.cfg.Tensors), cfg.FusionBytes)
		}
		return fmt.Errorf("proto: worker %d: rank 0 announced a piece of tensor %d iteration %d, but there are %s", w.cfg.Rank, p.Tensor, p.Iteration, have)
	}
	if f, ok := w.postedFused[p.Iteration]; ok && f != cfg.FusionBytes {
		return fmt.Errorf("proto: worker %d: rank 0 announced a piece of unit %d iteration %d fused at %d bytes (epoch %d), but this worker grouped that iteration's tensors fused at %d",
			w.cfg.Rank, p.Tensor, p.Iteration, cfg.FusionBytes, p.Epoch, f)
	}
	t := units[p.Tensor].Tensor
	bytes, elem, comp := t.task(p.Tensor, p.Iteration).Cut(cfg)
	part := cfg.PartitionBytes
	count := sched.PieceCount(bytes, elem, part)
	i := int64(p.Index)
	if int64(p.Count) != count || i < 0 || i >= count || p.Layer != t.Layer || p.Compression != comp {
		return fmt.Errorf("proto: worker %d: rank 0 announced piece %d of %d of tensor %d (layer %d, %v) iteration %d in epoch %d, but epoch %d's partition of %d bytes cuts the %d-byte tensor of layer %d (%v) into %d pieces",
			w.cfg.Rank, p.Index, p.Count, p.Tensor, p.Layer, p.Compression, p.Iteration, p.Epoch, p.Epoch, part, bytes, t.Layer, comp, count)
	}
	elems := bytes / elem
	off := elem * (i*(elems/count) + min(i, elems%count))
	if n := sched.PieceBytes(bytes, elem, count, i); p.Offset != off || p.Bytes != n {
		return fmt.Errorf("proto: worker %d: rank 0 announced piece %d of tensor %d iteration %d in epoch %d as bytes [%d,%d), want [%d,%d)",
			w.cfg.Rank, p.Index, p.Tensor, p.Iteration, p.Epoch, p.Offset, p.Offset+p.Bytes, off, off+n)
	}
	return nil
}
