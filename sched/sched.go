// Package sched is the scheduling core: it turns gradient tasks (one per
// tensor per iteration) into pieces, orders them, and admits them under a
// credit window, as ByteScheduler does. A configuration's compression
// decides how many bytes a float32 task's pieces take (Task.Cut); what the
// bytes hold is not its business.
//
// It is a pure, deterministic state machine in the style of etcd's raft
// package: inputs are calls (a task was posted, a piece finished, a new
// configuration applies from iteration k) and outputs are decisions (start
// this piece now). It has no goroutines, no clock and no I/O, and knows
// nothing of sockets, servers or simulated time. The protocol machine
// (package proto) wraps it with epochs, placement, gates and announcements,
// and the simulator and the real runtime both drive that. A Scheduler is
// not safe for concurrent use.
package sched

import (
	"fmt"

	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/units"
)

// Order is the order in which ready pieces are started.
type Order int

const (
	// OrderFIFO starts pieces in the order their tasks were posted
	// (production order: the last layer's gradients first).
	OrderFIFO Order = iota
	// OrderPriority starts the piece with the smallest
	// (iteration, layer, tensor, piece index) first: layer 0, which the next
	// forward pass needs first, goes first.
	OrderPriority
)

func (o Order) String() string {
	switch o {
	case OrderFIFO:
		return "fifo"
	case OrderPriority:
		return "priority"
	}
	return fmt.Sprintf("Order(%d)", int(o))
}

// Admission is the rule that decides whether the credit window lets the
// next piece start.
type Admission int

const (
	// AdmitPositive is ByteScheduler's rule: a piece starts while the
	// remaining credit is > 0, then its size is subtracted. In-flight bytes
	// may exceed the credit by less than one piece, and a piece larger than
	// the credit never starves.
	AdmitPositive Admission = iota
	// AdmitStrict is BytePS's rule: a piece starts only if its size fits in
	// the remaining credit; a smaller ready piece further down the order may
	// start instead. To avoid starving a piece larger than the whole credit,
	// it is started when nothing else is in flight.
	AdmitStrict
)

func (a Admission) String() string {
	switch a {
	case AdmitPositive:
		return "positive"
	case AdmitStrict:
		return "strict"
	}
	return fmt.Sprintf("Admission(%d)", int(a))
}

// DefaultElemBytes is the element size assumed when a Task leaves it zero
// (fp32 gradients).
const DefaultElemBytes = 4

// Config is one scheduling configuration. The zero value is FIFO with no
// partitioning and no credit window, i.e. an unscheduled framework.
type Config struct {
	// PartitionBytes splits a tensor larger than this into near-equal
	// pieces; 0 disables partitioning.
	PartitionBytes int64
	// CreditBytes bounds the bytes in flight (see Admission); 0 means no
	// window: every ready piece starts at once.
	CreditBytes int64
	Order       Order
	Admission   Admission
	// Compression is the wire type of compressible tasks' elements
	// (float32 gradients): dtype.F32 sends them as they are, a 16-bit
	// type in half the bytes.
	Compression dtype.DType
	// ServerWeights are the shares of the bytes each parameter server is
	// given (the zero value: by bytes alone); placement uses them, the
	// core only carries them through epochs.
	ServerWeights ServerWeights `json:",omitzero"`
	// FusionBytes fuses runs of neighbouring tensors smaller than it into
	// units of at most this many bytes, each communicated as one task
	// (fewer, larger messages for models of many small tensors, as DDP's
	// buckets do); 0: none. Package proto groups the tensors; the core
	// only carries the value through epochs.
	FusionBytes int64 `json:",omitzero"`
}

// Knobs names c's tuned knobs for people: "partition 4 MB, credit 16 MB"
// ("none" for 0), then the compression, server weights and fusion where
// they are not the defaults.
func (c Config) Knobs() string {
	size := func(n int64) string {
		if n == 0 {
			return "none"
		}
		return units.FormatBytes(n)
	}
	s := fmt.Sprintf("partition %s, credit %s", size(c.PartitionBytes), size(c.CreditBytes))
	if c.Compression != dtype.F32 {
		s += ", compression " + c.Compression.String()
	}
	if c.ServerWeights.Weighted() {
		s += ", server weights " + c.ServerWeights.String()
	}
	if c.FusionBytes > 0 {
		s += ", fusion " + units.FormatBytes(c.FusionBytes)
	}
	return s
}

// Validate reports the first invalid field of c.
func (c Config) Validate() error {
	if c.PartitionBytes < 0 {
		return fmt.Errorf("sched: partition size must be >= 0 bytes (0 = no partitioning), got %d", c.PartitionBytes)
	}
	if c.CreditBytes < 0 {
		return fmt.Errorf("sched: credit size must be >= 0 bytes (0 = no window), got %d", c.CreditBytes)
	}
	if c.Order != OrderFIFO && c.Order != OrderPriority {
		return fmt.Errorf("sched: unknown order %d", int(c.Order))
	}
	if c.Admission != AdmitPositive && c.Admission != AdmitStrict {
		return fmt.Errorf("sched: unknown admission rule %d", int(c.Admission))
	}
	if !c.Compression.Valid() {
		return fmt.Errorf("sched: unknown compression %v", c.Compression)
	}
	if err := c.ServerWeights.Validate(); err != nil {
		return err
	}
	if c.FusionBytes < 0 {
		return fmt.Errorf("sched: fusion size must be >= 0 bytes (0 = no fusion), got %d", c.FusionBytes)
	}
	return nil
}

// Task is one tensor's gradient of one iteration, ready to be communicated.
type Task struct {
	Iteration int
	// Tensor identifies the tensor; it is unique within the model and also
	// breaks priority ties between tensors of one layer.
	Tensor int
	// Layer is the tensor's layer in forward order (0 = first).
	Layer int
	Bytes int64
	// ElemBytes is the size of one element; pieces hold whole elements.
	// 0 means DefaultElemBytes.
	ElemBytes int
	// Compressible: the elements are float32 values that travel in the
	// configuration's Compression type (see Cut).
	Compressible bool
}

// Cut is how t travels under cfg: its size in bytes, its element size
// and the compression its pieces carry (dtype.F32: its own elements). A
// compressible task of 4-byte elements under a 16-bit Compression takes
// that type's size per element; any other task travels as it is.
func (t Task) Cut(cfg Config) (bytes, elemBytes int64, compression dtype.DType) {
	elem := int64(t.ElemBytes)
	if elem == 0 {
		elem = DefaultElemBytes
	}
	if !t.Compressible || cfg.Compression == dtype.F32 || elem != 4 {
		return t.Bytes, elem, dtype.F32
	}
	size := int64(cfg.Compression.Size())
	return t.Bytes / elem * size, size, cfg.Compression
}

// PieceID names a piece uniquely among those in a Scheduler.
type PieceID struct {
	Iteration, Tensor, Index int
}

// Piece is a contiguous part of a task's tensor, the unit of scheduling.
type Piece struct {
	PieceID
	Layer int
	// Count is how many pieces the task was split into.
	Count int
	// Offset and Bytes locate the piece within the tensor.
	Offset, Bytes int64
	// Epoch is the configuration epoch the task was partitioned under
	// (0 for the initial configuration, +1 for each applied change), so
	// peers can tell pieces of different partitionings apart.
	Epoch int
	// Compression is the type the piece's elements travel in, when the
	// epoch compresses its task (Task.Cut); dtype.F32: the task's own.
	Compression dtype.DType
	seq         uint64
}

// PieceCount is how many pieces a tensor of size bytes is cut into under a
// partition size: ceil(size/partition), at most one per element, and 1 when
// partition is 0 (no partitioning) or not smaller than the tensor.
func PieceCount(size, elemBytes, partition int64) int64 {
	if partition <= 0 || size <= partition {
		return 1
	}
	return min((size-1)/partition+1, size/elemBytes) // not (size+p-1)/p, which overflows
}

// PieceBytes is the size of piece i of count near-equal pieces of whole
// elements of a tensor of size bytes; the larger pieces come first.
func PieceBytes(size, elemBytes, count, i int64) int64 {
	elems := size / elemBytes
	n := elems / count
	if i < elems%count {
		n++
	}
	return n * elemBytes
}

// Scheduler is the core state machine. Create one with New.
type Scheduler struct {
	postLog
	cfg   Config
	epoch int
	ready pieceHeap
	credit
	seq uint64
}

// New returns a scheduler with the initial configuration cfg.
func New(cfg Config) (*Scheduler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Scheduler{cfg: cfg, credit: newCredit(cfg)}
	s.ready.order = cfg.Order
	return s, nil
}

// Config returns the configuration in force and its epoch.
func (s *Scheduler) Config() (Config, int) { return s.cfg, s.epoch }

// Reconfigure schedules cfg to apply to every task of iteration from and
// later. Tasks already posted keep their partitioning; the credit window and
// order change when the first task of iteration from is posted. Changes must
// be proposed in increasing order of from, and from must be later than every
// iteration already posted.
func (s *Scheduler) Reconfigure(cfg Config, from int) error {
	return s.schedule(cfg, from)
}

// Post queues the pieces of task t. Tasks must be posted in non-decreasing
// iteration order, each (iteration, tensor) once.
func (s *Scheduler) Post(t Task) error {
	elem := int64(t.ElemBytes)
	if elem == 0 {
		elem = DefaultElemBytes
	}
	if t.Bytes > 0 && (elem < 0 || t.Bytes%elem != 0) {
		return fmt.Errorf("sched: task of tensor %d iteration %d: size %d bytes is not a whole number of %d-byte elements", t.Tensor, t.Iteration, t.Bytes, elem)
	}
	due, err := s.record(t)
	if err != nil {
		return err
	}
	for _, cfg := range due {
		s.apply(cfg)
	}
	tid := taskID{iteration: t.Iteration, tensor: t.Tensor}
	bytes, elem, comp := t.Cut(s.cfg)
	count := PieceCount(bytes, elem, s.cfg.PartitionBytes)
	s.left[tid] = int(count)
	var off int64
	for i := int64(0); i < count; i++ {
		n := PieceBytes(bytes, elem, count, i)
		s.seq++
		s.ready.push(Piece{
			PieceID: PieceID{Iteration: t.Iteration, Tensor: t.Tensor, Index: int(i)},
			Layer:   t.Layer, Count: int(count), Offset: off, Bytes: n,
			Epoch: s.epoch, Compression: comp, seq: s.seq,
		})
		off += n
	}
	return nil
}

func (s *Scheduler) apply(cfg Config) {
	s.epoch++
	if cfg.Order != s.cfg.Order {
		s.ready.reorder(cfg.Order)
	}
	s.resize(cfg)
	s.cfg = cfg
}

// Next returns the next piece to start now, if the credit window admits
// one, and accounts it as in flight. Call it until it returns false, then
// again after each Done or Post.
func (s *Scheduler) Next() (Piece, bool) {
	if s.ready.Len() == 0 {
		return Piece{}, false
	}
	if s.cfg.CreditBytes == 0 {
		return s.start(s.ready.pop()), true
	}
	if s.cfg.Admission == AdmitPositive {
		if s.available <= 0 {
			return Piece{}, false
		}
		return s.start(s.ready.pop()), true
	}
	// Strict: the most urgent piece that fits; when nothing is in flight
	// the head starts even if it is larger than the whole credit.
	if s.inflightBytes == 0 && s.ready.items[0].Bytes > s.available {
		return s.start(s.ready.pop()), true
	}
	if s.available <= 0 {
		return Piece{}, false
	}
	best := -1
	for i := range s.ready.items {
		if s.ready.items[i].Bytes <= s.available && (best < 0 || s.ready.less(i, best)) {
			best = i
		}
	}
	if best < 0 {
		return Piece{}, false
	}
	return s.start(s.ready.remove(best)), true
}

func (s *Scheduler) start(p Piece) Piece {
	s.take(p)
	return p
}

// Done reports that an in-flight piece finished and returns its credit.
// taskDone is true when it was the last unfinished piece of its task.
func (s *Scheduler) Done(id PieceID) (taskDone bool, err error) {
	_, taskDone, err = s.finish(id)
	return taskDone, err
}

// Finish is Done that also returns the finished piece.
func (s *Scheduler) Finish(id PieceID) (p Piece, taskDone bool, err error) {
	return s.finish(id)
}

// InFlightBytes is the sum of the sizes of pieces started and not yet done.
func (s *Scheduler) InFlightBytes() int64 { return s.inflightBytes }

// InFlight is the number of pieces started and not yet done.
func (s *Scheduler) InFlight() int { return len(s.inflight) }

// Queued is the number of ready pieces waiting to start.
func (s *Scheduler) Queued() int { return s.ready.Len() }

// Before reports whether piece a is more urgent than piece b under order o.
func Before(o Order, a, b Piece) bool {
	if o == OrderFIFO {
		return a.seq < b.seq
	}
	if a.Iteration != b.Iteration {
		return a.Iteration < b.Iteration
	}
	if a.Layer != b.Layer {
		return a.Layer < b.Layer
	}
	if a.Tensor != b.Tensor {
		return a.Tensor < b.Tensor
	}
	return a.Index < b.Index
}

type taskID struct{ iteration, tensor int }

// pieceHeap is the ready queue, most urgent first: a binary min-heap typed
// on Piece because container/heap would box (allocate) every piece.
type pieceHeap struct {
	order Order
	items []Piece
}

func (h *pieceHeap) Len() int { return len(h.items) }

func (h *pieceHeap) less(i, j int) bool { return Before(h.order, h.items[i], h.items[j]) }

func (h *pieceHeap) push(p Piece) {
	h.items = append(h.items, p)
	h.up(len(h.items) - 1)
}

func (h *pieceHeap) pop() Piece {
	top := h.items[0]
	n := len(h.items) - 1
	h.items[0] = h.items[n]
	h.items = h.items[:n]
	if n > 0 {
		h.down(0)
	}
	return top
}

// remove takes out and returns the item at index i.
func (h *pieceHeap) remove(i int) Piece {
	p := h.items[i]
	n := len(h.items) - 1
	if i != n {
		h.items[i] = h.items[n]
		h.items = h.items[:n]
		h.down(i)
		h.up(i)
	} else {
		h.items = h.items[:n]
	}
	return p
}

func (h *pieceHeap) reorder(o Order) {
	h.order = o
	for i := len(h.items)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *pieceHeap) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !h.less(i, parent) {
			return
		}
		h.items[i], h.items[parent] = h.items[parent], h.items[i]
		i = parent
	}
}

func (h *pieceHeap) down(i int) {
	n := len(h.items)
	for {
		child := 2*i + 1
		if child >= n {
			return
		}
		if r := child + 1; r < n && h.less(r, child) {
			child = r
		}
		if !h.less(child, i) {
			return
		}
		h.items[i], h.items[child] = h.items[child], h.items[i]
		i = child
	}
}
