// Package allreduce owns ring all-reduce of pieces: each piece is summed
// over all ranks in place by a reduce-scatter followed by an all-gather,
// over one connection to the next rank and one from the previous rank.
//
// It knows nothing of models, layers or how the order of pieces was chosen:
// the leader's scheduling core chooses, and every rank starts pieces in the
// same order, each when its own gradient is ready. Frames for a piece this
// rank has not started yet are buffered until it does, so ranks may see
// readiness at different times, and several pieces may be in flight at
// once, their frames interleaved on the wire in priority order. Start never
// blocks and the reader never waits for a Start (sends are queued by the
// transport), so pieces complete as soon as every rank has started them;
// starting them in the same order keeps the buffered frames few.
//
// Per piece of n elements and S ranks, the piece is cut into S near-equal
// chunks of whole elements (the larger first; some are empty when n < S).
// In reduce-scatter step s = 0..S-2, rank r sends chunk (r-s) mod S to the
// next rank and adds the chunk (r-s-1) mod S received from the previous
// rank; in all-gather step s = 0..S-2 it sends chunk (r+1-s) mod S (its
// fully reduced chunk first) and overwrites chunk (r-s) mod S with the one
// received. Frames are transport.KindRing with Aux = the step number
// (0..2S-3, all-gather steps after reduce-scatter steps) and Offset and
// Length locating the chunk in bytes within the piece. With integer-valued
// float32 data every rank ends with bit-identical exact sums: every chunk is
// summed once, on one rank, and then copied.
//
// Summation order. Chunk c is summed along the ring from rank c: it leaves
// rank c as g_c (rank c's values), and each rank after it adds its own
// values to the partial sum it received, so the reduced chunk, on rank c-1,
// is ((g_c + g_c+1) + g_c+2) + ... + g_c-1, ranks mod S, element by
// element; the all-gather copies it, so every rank ends with the same bits.
// The order depends only on S, the piece's length and the element's place
// in it, never on timing: a rank processes a piece's steps strictly in step
// order, each step is a function of the rank's own data and the one frame
// received for it, and pieces share no state, so neither when frames
// arrive nor how many pieces are in flight changes a bit. It is rank order
// 0..S-1 only for chunk 0 (and for every chunk with 2 ranks, where
// addition's commutativity makes both orders equal). Rank order for every
// chunk would need every chunk to start at rank 0: a chain that carries up
// to 2n elements over a link instead of the ring's 2n(S-1)/S, 1.5x as long
// with 3 ranks and 1.14x with 8, so the ring keeps its own order. Because
// chunks are cut from pieces, runs reproduce bit for bit when they cut
// tensors alike (the same partition in every epoch); a run whose partition
// changes at other iterations (a tuner following measured timings) sums
// some elements in another order.
//
// Copies. On a little-endian machine a float32 piece is not copied into
// frames: a rank sends its own chunk, the chunk it completes and the
// chunks it forwards in the all-gather straight from the caller's data,
// adds a partial sum into the received frame itself and sends that on, and
// reads all-gather payloads into the chunk they overwrite, as gloo's ring
// does. The caller's data therefore stays in use until every frame sent
// from it is written: done is called only then.
//
// 16-bit pieces (bfloat16 or float16, package dtype) travel in 16 bits:
// each rank adds the partial sum it receives to its own values in float32
// and rounds the result once to send it on, so a chunk is rounded once per
// hop (S-1 times, as a ring that sums in the 16-bit type does, but never
// in between). The rank that completes a chunk keeps the rounded value it
// sends, so every rank still ends with the same bits.
package allreduce

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"
	"unsafe"

	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/transport"
)

// Options configures a Ring.
type Options struct {
	// Rank is this rank, in 0..Size-1.
	Rank, Size int
	// Next is the connection to rank (Rank+1) mod Size, which we send on;
	// Prev the one from rank (Rank-1) mod Size, which we receive on. Both
	// must be distinct connections whose peers announced those ranks in the
	// handshake. Neither is used when Size is 1. The Ring owns them: Run
	// closes them when it returns.
	Next, Prev *transport.Conn
	// Logger receives the ring's failure; default slog.Default().
	Logger *slog.Logger
}

// Ring all-reduces pieces. Create with New, call Run once (in its own
// goroutine) and Start from any goroutine.
type Ring struct {
	rank, size int
	steps      int // 2(size-1) steps per piece
	next, prev *transport.Conn
	nextRank   int
	prevRank   int
	log        *slog.Logger

	mu      sync.Mutex
	pieces  map[pieceKey]*piece
	err     error         // first failure; set once
	failed  chan struct{} // closed when err is set
	running bool          // Run was called
	// prevLeft and nextLeft: that neighbour said goodbye. It finished
	// every piece it will ever start, so a piece started here afterwards
	// can never complete (the others ran more iterations than it did).
	prevLeft, nextLeft bool
	stopping           bool // the owner ended Run's context: a failure not worth a warning
	// heldBack counts pieces whose done waited for frames sent from their
	// data (tests check the wait is exercised).
	heldBack int
}

// pieceKey identifies a piece on the wire.
type pieceKey struct {
	epoch, iteration, tensor, index uint32
}

func (k pieceKey) String() string {
	return fmt.Sprintf("piece (epoch %d, iteration %d, tensor %d, index %d)", k.epoch, k.iteration, k.tensor, k.index)
}

func keyOf(p sched.Piece) pieceKey {
	return pieceKey{epoch: uint32(p.Epoch), iteration: uint32(p.Iteration), tensor: uint32(p.Tensor), index: uint32(p.Index)}
}

func frameKey(h transport.Header) pieceKey {
	return pieceKey{epoch: h.Epoch, iteration: h.Iteration, tensor: h.Key, index: h.Piece}
}

// piece is the state of one piece: started (Start was called) or not yet
// (frames arrived first). Fields are guarded by Ring.mu, except that data
// is only touched by the goroutine that set busy.
type piece struct {
	key     pieceKey
	started bool
	// busy: one goroutine (Start's caller or the reader) is working on the
	// piece outside the lock; others only buffer frames for it.
	busy bool
	data []float32
	elem dtype.DType // the wire type of data's chunks
	prio uint64
	done func(error)
	// next is the next received step to process; recv holds received
	// frames by step until they are processed.
	next int
	recv []*transport.Frame
	// sending counts frames sent straight from data (float32 chunks on a
	// little-endian machine) that are not written yet; a piece whose steps
	// are all processed (or that failed) is finished, and its done waits
	// until sending is 0, so that data is not given back while a queued
	// frame still reads it.
	sending  int
	finished bool
	result   error // what done is called with, once finished
	// startWritten: step 0, sent from data, is written (all-gather step 0
	// may overwrite its chunk).
	startWritten bool
}

// completion is a done callback to run once the lock is released.
type completion struct {
	done func(error)
	err  error
}

func runAll(cs []completion) {
	for _, c := range cs {
		c.done(c.err)
	}
}

// New checks o and returns a ring; nothing is sent or received until Start
// and Run are called.
func New(o Options) (*Ring, error) {
	if o.Size < 1 {
		return nil, fmt.Errorf("allreduce: ring size must be >= 1, got %d", o.Size)
	}
	if o.Rank < 0 || o.Rank >= o.Size {
		return nil, fmt.Errorf("allreduce: rank %d out of range for a ring of %d", o.Rank, o.Size)
	}
	r := &Ring{rank: o.Rank, size: o.Size, steps: 2 * (o.Size - 1), log: o.Logger,
		pieces: make(map[pieceKey]*piece), failed: make(chan struct{})}
	if r.log == nil {
		r.log = slog.Default()
	}
	if o.Size == 1 {
		return r, nil
	}
	r.nextRank, r.prevRank = (o.Rank+1)%o.Size, (o.Rank+o.Size-1)%o.Size
	switch {
	case o.Next == nil:
		return nil, fmt.Errorf("allreduce: rank %d: no connection to the next rank %d", o.Rank, r.nextRank)
	case o.Prev == nil:
		return nil, fmt.Errorf("allreduce: rank %d: no connection from the previous rank %d", o.Rank, r.prevRank)
	case o.Next == o.Prev:
		return nil, fmt.Errorf("allreduce: rank %d: Next and Prev are the same connection (to rank %d); the ring needs one to the next rank and another from the previous rank", o.Rank, o.Next.PeerRank())
	case o.Next.PeerRank() != r.nextRank:
		return nil, fmt.Errorf("allreduce: rank %d: Next is connected to rank %d (%s), want the next rank %d", o.Rank, o.Next.PeerRank(), o.Next.Peer(), r.nextRank)
	case o.Prev.PeerRank() != r.prevRank:
		return nil, fmt.Errorf("allreduce: rank %d: Prev is connected to rank %d (%s), want the previous rank %d", o.Rank, o.Prev.PeerRank(), o.Prev.Peer(), r.prevRank)
	}
	r.next, r.prev = o.Next, o.Prev
	return r, nil
}

// Err returns the error that stopped the ring, or nil while it works.
func (r *Ring) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Run receives from the previous rank (and watches the next one) until ctx
// ends or the ring fails, then fails every piece in flight, closes both
// connections (telling the neighbours why) and returns the error: one
// naming the lost neighbour ("allreduce: rank 2: lost previous rank 1:
// ..."), a protocol violation, or "allreduce: rank 2: stopped: ..."
// wrapping context.Cause(ctx). Call it once.
func (r *Ring) Run(ctx context.Context) error {
	r.mu.Lock()
	if r.running {
		r.mu.Unlock()
		return fmt.Errorf("allreduce: rank %d: Run called twice", r.rank)
	}
	r.running = true
	r.mu.Unlock()
	if r.size == 1 {
		select {
		case <-ctx.Done():
			r.stop(ctx)
		case <-r.failed:
		}
		return r.Err()
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		r.readPrev()
	}()
	go func() {
		defer wg.Done()
		r.watchNext()
	}()
	select {
	case <-ctx.Done():
		r.stop(ctx)
	case <-r.failed:
	}
	err := r.Err()
	// Tell both neighbours why; each close is bounded by the transport's
	// handshake timeout, and unblocks the goroutines' Recv.
	reason := err.Error()
	wg.Add(2)
	go func() {
		defer wg.Done()
		r.next.CloseWithReason(reason)
	}()
	go func() {
		defer wg.Done()
		r.prev.CloseWithReason(reason)
	}()
	wg.Wait()
	return err
}

// goodbyeAux marks a KindControl frame as a ring neighbour's orderly
// goodbye (the same subtype as cluster.CtlBye).
const goodbyeAux = 4

func isGoodbye(f transport.Frame) bool {
	return f.Kind == transport.KindControl && f.Aux == goodbyeAux
}

// Goodbye tells both neighbours that this rank finished every piece it will
// ever start, and waits until the goodbyes are written. They go out last
// (lowest priority), after every ring frame still queued, so a neighbour
// that receives one has everything it needs from this rank and stops
// reading; closing the connections afterwards is then no failure.
//
// A goodbye that cannot be written because a neighbour closed its
// connection first (typically in reaction to the other goodbye, when it
// still had a piece this rank will never start) is not this rank's
// failure: that neighbour stopped, told everyone why, and needs no
// goodbye. Goodbye then returns nil; the neighbours report the job's
// failure.
func (r *Ring) Goodbye(timeout time.Duration) error {
	if r.size == 1 {
		return nil
	}
	done := make(chan error, 2)
	queued := 0
	for _, c := range []*transport.Conn{r.next, r.prev} {
		f := transport.Frame{Header: transport.Header{Kind: transport.KindControl, Aux: goodbyeAux, Priority: math.MaxUint64}}
		err := c.SendNotify(f, func(err error) { done <- err })
		switch {
		case err == nil:
			queued++
		case !r.neighbourClosed(err):
			return fmt.Errorf("allreduce: rank %d: goodbye to %s: %w", r.rank, c.Peer(), err)
		}
	}
	deadline := time.After(timeout)
	for range queued {
		select {
		case err := <-done:
			if err != nil && !r.neighbourClosed(err) {
				return fmt.Errorf("allreduce: rank %d: goodbye: %w", r.rank, err)
			}
		case <-deadline:
			return fmt.Errorf("allreduce: rank %d: goodbyes not written within %v", r.rank, timeout)
		}
	}
	return nil
}

// neighbourClosed reports whether a goodbye's write failed because a
// neighbour closed its connection with a reason: this one directly, or
// either one whereupon this ring failed and closed its own connections
// (the other end may then see the crossing closes as a lost peer).
func (r *Ring) neighbourClosed(err error) bool {
	var pc *transport.PeerClosedError
	return errors.As(err, &pc) || errors.As(r.Err(), &pc)
}

// readPrev receives ring frames from the previous rank until an error.
func (r *Ring) readPrev() {
	// Each payload is summed into and forwarded as the next step's (step),
	// then recycled once written; all-gather payloads of float32 pieces
	// land in the piece's data (gatherInto).
	for {
		f, err := r.prev.RecvTo(r.gatherInto)
		if err != nil {
			r.fail(fmt.Errorf("allreduce: rank %d: lost previous rank %d: %w", r.rank, r.prevRank, err))
			return
		}
		if isGoodbye(f) {
			r.prevSaidGoodbye() // it sends nothing more
			return
		}
		if err := r.receive(f); err != nil {
			r.fail(err)
			return
		}
	}
}

// watchNext reads the connection to the next rank, which carries nothing
// but heartbeats that way, so that a next rank that dies or goes silent is
// noticed even when nothing is being sent to it.
func (r *Ring) watchNext() {
	f, err := r.next.Recv()
	if err == nil && isGoodbye(f) {
		// The next rank finished and needs nothing more from us; pieces
		// started here from now on would need it.
		r.mu.Lock()
		r.nextLeft = true
		r.mu.Unlock()
		return
	}
	if err == nil {
		err = fmt.Errorf("allreduce: rank %d: next rank %d sent an unexpected %v frame (iteration %d, key %d, piece %d, aux %d) on the ring's forward connection",
			r.rank, r.nextRank, f.Kind, f.Iteration, f.Key, f.Piece, f.Aux)
	} else {
		err = fmt.Errorf("allreduce: rank %d: lost next rank %d: %w", r.rank, r.nextRank, err)
	}
	r.fail(err)
}

// prevSaidGoodbye records the previous rank's goodbye. Every frame it sent
// came before it, so a piece in flight here that still lacks a step's
// frame will never get it: the ring fails, naming the piece.
func (r *Ring) prevSaidGoodbye() {
	r.mu.Lock()
	r.prevLeft = true
	var cs []completion
	for _, pc := range r.pieces {
		if !pc.started || pc.finished {
			continue
		}
		for s := pc.next; s < r.steps; s++ {
			if pc.recv[s] == nil {
				cs = r.failLocked(r.leftError(r.prevRank, pc.key))
				break
			}
		}
		if r.err != nil {
			break
		}
	}
	r.mu.Unlock()
	runAll(cs)
}

// leftError is the ring's failure when neighbour rank left before piece k,
// which this rank started.
func (r *Ring) leftError(rank int, k pieceKey) error {
	return fmt.Errorf("allreduce: rank %d: rank %d finished and left the job before %v, which this rank started: "+
		"every worker must run the same iterations (did one run out of data first?)", r.rank, rank, k)
}

// fail records err as the ring's failure (the first one wins) and calls
// done(err) of every started piece nobody is working on; a piece being
// worked on is failed by its worker when it takes the lock again.
func (r *Ring) fail(err error) {
	r.mu.Lock()
	cs := r.failLocked(err)
	r.mu.Unlock()
	runAll(cs)
}

// stop fails the ring because its owner ended ctx: the owner knows why,
// so unlike a failure the ring found itself it is not logged.
func (r *Ring) stop(ctx context.Context) {
	r.mu.Lock()
	r.stopping = true
	cs := r.failLocked(fmt.Errorf("allreduce: rank %d: stopped: %w", r.rank, context.Cause(ctx)))
	r.mu.Unlock()
	runAll(cs)
}

func (r *Ring) failLocked(err error) []completion {
	if r.err != nil {
		return nil
	}
	r.err = err
	close(r.failed)
	var cs []completion
	for k, p := range r.pieces {
		if p.started && !p.busy {
			cs = append(cs, r.finishLocked(p, err)...)
		}
		delete(r.pieces, k)
	}
	if !r.stopping && !errors.Is(err, context.Canceled) {
		r.log.Warn("allreduce: ring failed", "rank", r.rank, "pieces_in_flight", len(cs), "err", err)
	}
	return cs
}

// Start all-reduces data, the piece p of this rank, in place: when
// done(nil) is called every element holds the sum over all ranks. Every
// rank must start the same pieces, of the same length, in the same order;
// priority orders this piece's frames in the connection's send queue
// (smaller first). done is called exactly once, never from within Start
// and never with the ring's lock held; after it is called the ring no
// longer touches data. It gets the ring's error if the ring failed first.
// With one rank, done(nil) is called at once and data is only rounded to d.
// d is the type data travels in (every rank must start a piece with the
// same d).
func (r *Ring) Start(p sched.Piece, priority uint64, d dtype.DType, data []float32, done func(error)) {
	if r.size == 1 {
		if d != dtype.F32 { // the sum is this rank's values, in the wire type all the same
			d.Round(make([]byte, d.Size()*len(data)), data)
		}
		go done(nil)
		return
	}
	k := keyOf(p)
	r.mu.Lock()
	if r.err != nil {
		err := r.err
		r.mu.Unlock()
		go done(err)
		return
	}
	if r.prevLeft || r.nextLeft {
		rank := r.prevRank
		if !r.prevLeft {
			rank = r.nextRank
		}
		cs := append(r.failLocked(r.leftError(rank, k)), completion{done, r.err})
		r.mu.Unlock()
		go runAll(cs)
		return
	}
	pc := r.pieces[k]
	if pc == nil {
		pc = &piece{key: k, recv: make([]*transport.Frame, r.steps)}
		r.pieces[k] = pc
	} else if pc.started {
		r.mu.Unlock()
		go done(fmt.Errorf("allreduce: rank %d: %v started twice while in flight", r.rank, k))
		return
	}
	pc.started, pc.busy = true, true
	pc.data, pc.elem, pc.prio, pc.done = data, d, priority, done
	r.mu.Unlock()

	lo, hi := chunk(len(data), r.size, r.rank)
	var err error
	if b, ok := dataBytes(d, data[lo:hi]); ok {
		// This chunk is next written by all-gather step 0, with its sum,
		// which cannot exist before the next rank has read this frame.
		err = r.sendData(pc, 0, lo, b)
	} else {
		payload := payloads.Get(d.Size() * (hi - lo))
		exp := d.Scale(data[lo:hi])
		d.Encode(payload, data[lo:hi], exp)
		err = r.send(pc, 0, lo, payload, exp)
	}

	r.mu.Lock()
	var cs []completion
	if err != nil {
		cs = r.failLocked(err)
	}
	cs = append(cs, r.drive(pc)...)
	r.mu.Unlock()
	if len(cs) > 0 {
		go runAll(cs)
	}
}

// receive files a frame from the previous rank and, if its piece is
// started and idle, works on the piece.
func (r *Ring) receive(f transport.Frame) error {
	if f.Kind != transport.KindRing {
		return fmt.Errorf("allreduce: rank %d: previous rank %d sent an unexpected %v frame (iteration %d, key %d, piece %d)", r.rank, r.prevRank, f.Kind, f.Iteration, f.Key, f.Piece)
	}
	k := frameKey(f.Header)
	if int(f.Rank) != r.prevRank {
		return fmt.Errorf("allreduce: rank %d: ring frame for %v from the previous rank's connection says it is from rank %d, want %d", r.rank, k, f.Rank, r.prevRank)
	}
	step := int(f.Aux)
	if f.Aux >= uint32(r.steps) {
		return fmt.Errorf("allreduce: rank %d: previous rank %d sent step %d of %v, but a ring of %d has steps 0..%d", r.rank, r.prevRank, f.Aux, k, r.size, r.steps-1)
	}
	r.mu.Lock()
	if r.err != nil {
		r.mu.Unlock()
		return nil
	}
	pc := r.pieces[k]
	if pc == nil {
		pc = &piece{key: k, recv: make([]*transport.Frame, r.steps)}
		r.pieces[k] = pc
	}
	if step < pc.next || pc.recv[step] != nil {
		r.mu.Unlock()
		return fmt.Errorf("allreduce: rank %d: previous rank %d sent step %d of %v twice", r.rank, r.prevRank, step, k)
	}
	pc.recv[step] = &f
	if !pc.started || pc.busy {
		r.mu.Unlock()
		return nil
	}
	pc.busy = true
	cs := r.drive(pc)
	r.mu.Unlock()
	runAll(cs)
	return nil
}

// drive processes pc's received steps in order while the next one is
// there. It is called with r.mu held and pc.busy set by the caller; it
// releases the lock around the float work and returns with it held and
// pc.busy cleared, with the done callback to run if the piece ended.
func (r *Ring) drive(pc *piece) []completion {
	for {
		if r.err != nil {
			pc.busy = false
			return r.finishLocked(pc, r.err)
		}
		s := pc.next
		f := pc.recv[s]
		if f == nil {
			pc.busy = false
			return nil
		}
		pc.recv[s] = nil
		r.mu.Unlock()
		err := r.step(pc, s, f)
		r.mu.Lock()
		if err != nil {
			cs := r.failLocked(err)
			pc.busy = false
			return append(cs, r.finishLocked(pc, r.err)...)
		}
		pc.next++
		if pc.next == r.steps {
			if r.pieces[pc.key] == pc {
				delete(r.pieces, pc.key)
			}
			pc.busy = false
			return r.finishLocked(pc, nil)
		}
	}
}

// step applies received step s of pc (adding or copying its chunk) and
// sends step s+1, which forwards the chunk just updated.
func (r *Ring) step(pc *piece, s int, f *transport.Frame) error {
	var c int
	if s < r.size-1 {
		c = mod(r.rank-s-1, r.size) // reduce-scatter
	} else {
		c = mod(r.rank-(s-(r.size-1)), r.size) // all-gather
	}
	d := pc.elem
	if dtype.DType(f.Elem) != d {
		return fmt.Errorf("allreduce: rank %d: previous rank %d sent step %d of %v as %v, but this rank started it as %v (do the ranks disagree on its type?)",
			r.rank, r.prevRank, s, pc.key, dtype.DType(f.Elem), d)
	}
	lo, hi := chunk(len(pc.data), r.size, c)
	size := d.Size()
	if f.Offset != uint64(size*lo) || int(f.Length) != size*(hi-lo) || len(f.Payload) != size*(hi-lo) {
		return fmt.Errorf("allreduce: rank %d: previous rank %d sent bytes [%d,%d) as step %d of %v, want chunk %d = bytes [%d,%d) of a %d-element %v piece (do the ranks disagree on its size?)",
			r.rank, r.prevRank, f.Offset, f.Offset+uint64(f.Length), s, pc.key, c, size*lo, size*hi, len(pc.data), d)
	}
	dst := pc.data[lo:hi]
	exp := int(f.Scale)
	if own, ok := dataBytes(d, dst); ok && len(own) > 0 {
		// float32 chunks on a little-endian machine: frames are sent
		// straight from data where data holds what they carry, and
		// all-gather frames are received into it (gatherInto). A chunk
		// sent from data is not written again before the piece finishes.
		switch {
		case s >= r.size-1: // all-gather: forward the chunk as it came
			if !sameMemory(f.Payload, own) {
				copy(own, f.Payload)
				payloads.Put(f.Payload)
			}
			if s+1 == r.steps {
				return nil
			}
			return r.sendData(pc, s+1, lo, own)
		case s == r.size-2: // the last reduce-scatter step: this chunk's sum
			transport.AddFloat32s(dst, f.Payload)
			payloads.Put(f.Payload)
			return r.sendData(pc, s+1, lo, own)
		default: // a partial sum, sent on in the received frame's memory
			addInto(f.Payload, dst)
			return r.send(pc, s+1, lo, f.Payload, exp)
		}
	}
	switch {
	case s >= r.size-1:
		d.Decode(dst, f.Payload, exp) // forwarded as it came
	case d == dtype.F32:
		addPut(dst, f.Payload) // the payload becomes the next step's
	default:
		// Added in float32, rounded once into the payload, which becomes
		// the next step's; dst keeps the rounded values, so the rank that
		// completes the chunk holds what the all-gather hands the others.
		exp = d.AddRound(dst, f.Payload, exp)
	}
	if s+1 == r.steps {
		payloads.Put(f.Payload)
		return nil
	}
	return r.send(pc, s+1, lo, f.Payload, exp)
}

// payloads recycles the frames received from the previous rank.
var (
	payloads transport.BufferPool
	poolDest = transport.PoolDest(&payloads)
)

// send enqueues step s of pc, the chunk at element lo encoded with scale
// exponent exp, to the next rank. payload must not be modified afterwards.
func (r *Ring) send(pc *piece, s, lo int, payload []byte, exp int) error {
	return r.enqueue(pc, s, lo, payload, exp, func(err error) {
		payloads.Put(payload)
		r.written(err)
	})
}

// enqueue queues step s of pc, the chunk at element lo carried by payload
// with scale exponent exp, on the connection to the next rank; written is
// its send callback.
func (r *Ring) enqueue(pc *piece, s, lo int, payload []byte, exp int, written func(error)) error {
	k := pc.key
	h := transport.Header{Kind: transport.KindRing, Epoch: k.epoch, Iteration: k.iteration, Key: k.tensor, Piece: k.index,
		Aux: uint32(s), Priority: pc.prio, Offset: uint64(pc.elem.Size() * lo), Elem: uint8(pc.elem), Scale: int8(exp)}
	if err := r.next.SendNotify(transport.Frame{Header: h, Payload: payload}, written); err != nil {
		return fmt.Errorf("allreduce: rank %d: lost next rank %d: sending step %d of %v: %w", r.rank, r.nextRank, s, k, err)
	}
	return nil
}

// sendData enqueues step s of pc, the float32 chunk at element lo sent
// from pc's data itself (b views it). pc does not finish until it is
// written.
func (r *Ring) sendData(pc *piece, s, lo int, b []byte) error {
	r.mu.Lock()
	pc.sending++ // before the frame is queued: its callback may run at once
	r.mu.Unlock()
	written := func(err error) {
		r.written(err)
		r.mu.Lock()
		pc.sending--
		pc.startWritten = pc.startWritten || (s == 0 && err == nil)
		var cs []completion
		if pc.sending == 0 && pc.finished {
			cs = []completion{{pc.done, pc.result}}
		}
		r.mu.Unlock()
		if len(cs) > 0 {
			go runAll(cs) // not on the sender goroutine, which must not block
		}
	}
	err := r.enqueue(pc, s, lo, b, 0, written)
	if err != nil {
		r.mu.Lock()
		pc.sending-- // not queued: written is never called
		r.mu.Unlock()
	}
	return err
}

// finishLocked ends started piece pc, which no goroutine is working on,
// with err (nil: its sums are in place): its done callback when no frame
// sent from its data is queued, else later, from the last one's callback.
func (r *Ring) finishLocked(pc *piece, err error) []completion {
	pc.finished, pc.result = true, err
	if pc.sending > 0 {
		r.heldBack++
		return nil
	}
	return []completion{{pc.done, err}}
}

// dataBytes views a chunk of data as the bytes of its frame, when data
// travels as float32 and this machine's float32s are the wire format.
func dataBytes(d dtype.DType, data []float32) ([]byte, bool) {
	if d != dtype.F32 {
		return nil, false
	}
	b, ok := transport.WireBytes(data)
	return b[:len(b):len(b)], ok
}

// sameMemory reports whether a and b are the same bytes.
func sameMemory(a, b []byte) bool {
	return len(a) == len(b) && len(a) > 0 && unsafe.SliceData(a) == unsafe.SliceData(b)
}

// gatherInto is the reader's destination for the payload of frame h: for
// an all-gather step of a float32 piece this rank has started, the chunk
// of its data the step overwrites (so the sum lands where it belongs, and
// is forwarded from there), when nothing can still be reading or writing
// that chunk; else a buffer from the pool.
func (r *Ring) gatherInto(h transport.Header) []byte {
	step := int(h.Aux)
	if h.Kind == transport.KindRing && dtype.DType(h.Elem) == dtype.F32 && step >= r.size-1 && step < r.steps {
		r.mu.Lock()
		b := r.gatherChunkLocked(h, step)
		r.mu.Unlock()
		if b != nil {
			return b
		}
	}
	return poolDest(h)
}

func (r *Ring) gatherChunkLocked(h transport.Header, step int) []byte {
	pc := r.pieces[frameKey(h)]
	if pc == nil || !pc.started || pc.elem != dtype.F32 || step < pc.next || pc.recv[step] != nil {
		return nil // (a step sent twice is refused by receive)
	}
	// All-gather step g overwrites chunk rank-g: for g = 0 the chunk step 0
	// sent from data, for g >= 1 the one reduce-scatter step g-1 summed
	// into (processed once pc.next >= g). A peer that keeps to the
	// protocol cannot send the frame before both (its sum needs them);
	// one that does not gets a pool buffer.
	g := step - (r.size - 1)
	if (g == 0 && !pc.startWritten) || pc.next < g {
		return nil
	}
	lo, hi := chunk(len(pc.data), r.size, mod(r.rank-g, r.size))
	if h.Offset != uint64(4*lo) || int(h.Length) != 4*(hi-lo) || hi == lo {
		return nil
	}
	b, ok := dataBytes(dtype.F32, pc.data[lo:hi:hi])
	if !ok {
		return nil
	}
	return b
}

// addInto adds dst's values to the little-endian float32s encoded in b,
// in b: the partial sum a reduce-scatter step sends on.
func addInto(b []byte, dst []float32) {
	if xs, ok := transport.FloatView(b); ok && len(xs) == len(dst) {
		transport.AddFloats(xs, dst)
		return
	}
	addPut(dst, b) // unaligned: dst's own sum is overwritten by the all-gather anyway
}

// written is the send callback: a frame that could not be written fails
// the ring. It runs on the connection's sender goroutine, which must not
// block, so done callbacks run on their own goroutine.
func (r *Ring) written(err error) {
	if err == nil {
		return
	}
	r.mu.Lock()
	cs := r.failLocked(fmt.Errorf("allreduce: rank %d: lost next rank %d: %w", r.rank, r.nextRank, err))
	r.mu.Unlock()
	if len(cs) > 0 {
		go runAll(cs)
	}
}

// addPut adds the len(dst) little-endian float32 values encoded in b to
// dst and writes the sums back into b. len(b) must be 4*len(dst).
func addPut(dst []float32, b []byte) {
	if len(b) != 4*len(dst) {
		panic(fmt.Sprintf("allreduce: addPut: %d bytes for %d floats", len(b), len(dst)))
	}
	transport.AddFloat32s(dst, b) // vectorised where b is aligned
	transport.PutFloat32s(b, dst)
}

// chunk returns the element range [lo, hi) of chunk i of n elements cut
// into size near-equal chunks, the larger first.
func chunk(n, size, i int) (lo, hi int) {
	base, rem := n/size, n%size
	lo = i*base + min(i, rem)
	hi = lo + base
	if i < rem {
		hi++
	}
	return lo, hi
}

func mod(a, m int) int {
	a %= m
	if a < 0 {
		a += m
	}
	return a
}
