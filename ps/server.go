// Package ps is the parameter server: it sums the pieces that workers push
// and answers each piece with its exact sum once every worker pushed it.
//
// It owns summation and the server's side of the push/answer protocol. It
// knows nothing of models, layers or scheduling: a piece is a key in a frame
// header (epoch, iteration, tensor, piece, shard), and the answer carries the
// priority the worker put on the push, so urgent sums go out first. Which
// server holds which piece is decided by package placement on the workers.
//
// Sums are bit-reproducible: every piece is summed in rank order,
// ((g0 + g1) + g2) + ... + g(N-1) element by element, whatever order the
// pushes arrive in (float32 addition is not associative, so arrival order
// would make runs differ in the last bits, and the differences grow over
// training). A push is added as soon as every lower rank's push is in the
// sum; a push that arrives before a lower rank's is held, in the buffer it
// was received into, until then. So a piece holds at most Workers-1 such
// buffers besides its accumulator, and only while a lower rank is late.
// Each element is summed in the same order however tensors are cut into
// pieces and shards, so the sums do not depend on the partition either.
//
// Pushes may carry 16-bit elements (bfloat16 or float16, each frame names
// its type and scale; see package dtype): the sum is kept in float32 and
// rounded once, to the pushes' type, when it is sent back. So a sum of
// 16-bit gradients is the correctly rounded float32 sum, where summing in
// the 16-bit type rounds at every addition.
package ps

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/autobyte/autobyte/cluster"
	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/proto"
	"github.com/autobyte/autobyte/transport"
)

// Mode is how a worker gets a piece's sum.
type Mode int

const (
	// AnswerPush answers each push with the sum once every worker pushed
	// (as P3 does): one message each way per piece.
	AnswerPush Mode = iota
	// SeparatePull answers a KindPull request, which the worker sends after
	// its push, once every worker pushed (as BytePS and MXNet do).
	SeparatePull
)

// Options configure a server.
type Options struct {
	// Workers is how many workers push every piece.
	Workers int
	Mode    Mode
	Logger  *slog.Logger
	// OnIteration, if set, is called (from a reader goroutine, one call at
	// a time) with k when the first push of an iteration k later than any
	// before has been received: a server host whose link follows a trace
	// by iteration changes its rate there.
	OnIteration func(k int)
}

type pieceKey struct {
	epoch, iter, key, piece, aux uint32
}

// accum is one piece being summed.
type accum struct {
	mu sync.Mutex
	// order is the shard's protocol (proto.ShardSum): which pushes to add
	// when, rank order, and completion.
	order *proto.ShardSum
	// sum holds the pushes added so far; added counts them.
	sum   []float32
	added int
	// held are pushes received before a lower rank's, by rank, with
	// their scale exponents; nil until one arrives early.
	held      [][]byte
	heldScale []int8
	// hdr is the first push's header: the others must match its size,
	// offset and element type, and the answer carries its priority (and
	// the sum's scale).
	hdr transport.Header
	// result is the encoded sum once complete (rank 0's buffer).
	result   []byte
	complete bool
	// inPlace: sum is a view of result, so the sum needs no encoding.
	inPlace bool
	// waiting are the workers whose answer is due once result is set.
	waiting []*transport.Conn
	// answered counts the answers sent; the piece is forgotten at Workers.
	answered int
	// written counts the answers the connections finished writing.
	written atomic.Int32
}

// Server sums pieces for a fixed set of worker connections.
type Server struct {
	o     Options
	log   *slog.Logger
	mu    sync.Mutex
	accs  map[pieceKey]*accum
	conns []*transport.Conn
	// finished remembers the pieces of the last few iterations that were
	// answered to everyone, so a late second push of one is refused
	// instead of starting a piece that can never complete.
	finished map[pieceKey]bool
	byIter   map[uint32][]pieceKey
	// left marks the workers that said goodbye; anyLeft is set with the
	// first. A piece such a worker did not push can never complete.
	left    []bool
	anyLeft atomic.Bool

	statsMu sync.Mutex
	pieces  int64
	bytesIn int64

	// held is the bytes of early pushes held now, heldPeak the most held
	// at once: the memory that rank order costs.
	held, heldPeak atomic.Int64
	// latest is the latest iteration a push was received of (-1: none);
	// iterMu serializes OnIteration.
	latest atomic.Int64
	iterMu sync.Mutex
	// arrivalOrder adds pushes as they arrive, the first one's buffer
	// becoming the accumulator, instead of in rank order. It is not
	// reproducible and exists only so that a benchmark can measure what
	// rank order costs and a test can show that its check catches
	// arrival-order sums; nothing outside the package can set it.
	arrivalOrder bool
}

// New returns a server for o.Workers workers.
func New(o Options) (*Server, error) {
	if o.Workers < 1 {
		return nil, fmt.Errorf("ps: workers must be >= 1, got %d", o.Workers)
	}
	if o.Mode != AnswerPush && o.Mode != SeparatePull {
		return nil, fmt.Errorf("ps: unknown mode %d", o.Mode)
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	srv := &Server{o: o, log: log, accs: map[pieceKey]*accum{}, finished: map[pieceKey]bool{}, byIter: map[uint32][]pieceKey{},
		left: make([]bool, o.Workers)}
	srv.latest.Store(-1)
	return srv, nil
}

// seen notes a push of iteration k and tells OnIteration of a new latest.
func (s *Server) seen(k int64) {
	if s.o.OnIteration == nil || k <= s.latest.Load() {
		return
	}
	s.iterMu.Lock()
	defer s.iterMu.Unlock()
	if k > s.latest.Load() {
		s.latest.Store(k)
		s.o.OnIteration(int(k))
	}
}

// Serve runs the server on conns, one per worker, until every worker closed
// its connection in order (nil) or one failed (an error naming it; every
// other connection is then closed with that reason). ctx cancels the run.
func (s *Server) Serve(ctx context.Context, conns []*transport.Conn) error {
	if len(conns) != s.o.Workers {
		return fmt.Errorf("ps: serve needs %d worker connections, got %d", s.o.Workers, len(conns))
	}
	s.conns = conns
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.read(c); err != nil {
				cancel(err)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return context.Cause(ctx) // nil unless a reader failed just before finishing
	case <-ctx.Done():
	}
	err := context.Cause(ctx)
	for _, c := range conns {
		_ = c.CloseWithReason(fmt.Sprintf("server stopping: %v", err))
	}
	<-done
	return err
}

// read handles one worker's frames until it closes.
func (s *Server) read(c *transport.Conn) error {
	// Pushes are received into pooled buffers: a push added into an
	// accumulator at once goes back to the pool; rank 0's push keeps its
	// buffer to carry the answer, which returns it to the pool once written
	// to every worker, and an early push keeps it until it is added.
	dest := transport.PoolDest(&bufs)
	for {
		f, err := c.RecvTo(dest)
		if err != nil {
			return fmt.Errorf("ps: lost worker %d: %w", c.PeerRank(), err)
		}
		if cluster.IsBye(f) {
			return s.leave(c.PeerRank())
		}
		switch f.Kind {
		case transport.KindPush:
			s.seen(int64(f.Iteration))
			kept, err := s.push(c, f)
			if err != nil {
				return err
			}
			if !kept {
				bufs.Put(f.Payload)
			}
		case transport.KindPull:
			if err := s.pull(c, f.Header); err != nil {
				return err
			}
		default:
			return fmt.Errorf("ps: worker %d sent an unexpected %v frame", c.PeerRank(), f.Kind)
		}
	}
}

// leave records worker r's goodbye. A worker says goodbye once it has every
// sum it will ever need, so every piece still open that it did not push is
// waiting for a push that will never come (the others ran more iterations
// than it did, e.g. it had fewer batches): that ends the job with an error
// that says so, instead of leaving the others waiting for ever.
func (s *Server) leave(r int) error {
	s.mu.Lock()
	s.left[r] = true
	s.anyLeft.Store(true)
	open := make([]*accum, 0, len(s.accs))
	for _, a := range s.accs {
		open = append(open, a)
	}
	s.mu.Unlock()
	for _, a := range open {
		a.mu.Lock()
		pushed, h := a.order.Pushed(r), a.hdr
		a.mu.Unlock()
		if !pushed {
			return leftError(r, h)
		}
	}
	return nil
}

// checkNoneLeft refuses a push by worker pusher into a when a worker that
// left did not push it (a.mu held).
func (s *Server) checkNoneLeft(a *accum, h transport.Header, pusher int) error {
	if !s.anyLeft.Load() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for r, gone := range s.left {
		if gone && !a.order.Pushed(r) {
			return fmt.Errorf("%w (worker %d pushed it)", leftError(r, h), pusher)
		}
	}
	return nil
}

func leftError(r int, h transport.Header) error {
	return fmt.Errorf("ps: worker %d finished and left the job without pushing tensor %d piece %d shard %d of iteration %d, which other workers pushed: "+
		"every worker must run the same iterations (did one run out of data first?)", r, h.Key, h.Piece, h.Aux, h.Iteration)
}

func keyOf(h transport.Header) pieceKey {
	return pieceKey{epoch: h.Epoch, iter: h.Iteration, key: h.Key, piece: h.Piece, aux: h.Aux}
}

func (s *Server) lookup(h transport.Header) (*accum, error) {
	k := keyOf(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.finished[k] {
		return nil, fmt.Errorf("tensor %d piece %d shard %d iteration %d epoch %d is already complete", h.Key, h.Piece, h.Aux, h.Iteration, h.Epoch)
	}
	a, ok := s.accs[k]
	if !ok {
		order, err := proto.NewShardSum(s.o.Workers)
		if err != nil {
			return nil, err
		}
		a = &accum{hdr: h, order: order}
		s.accs[k] = a
	}
	return a, nil
}

// forget drops a piece answered to every worker, remembering its key for
// a few iterations.
func (s *Server) forget(k pieceKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.accs, k)
	s.finished[k] = true
	s.byIter[k.iter] = append(s.byIter[k.iter], k)
	for it, keys := range s.byIter {
		if it+4 < k.iter {
			for _, old := range keys {
				delete(s.finished, old)
			}
			delete(s.byIter, it)
		}
	}
}

// push adds f into its piece; kept reports whether the piece kept f's
// payload (as its accumulator or until the lower ranks' pushes arrived).
func (s *Server) push(c *transport.Conn, f transport.Frame) (kept bool, err error) {
	d := dtype.DType(f.Elem)
	if !d.Valid() {
		return false, fmt.Errorf("ps: worker %d pushed tensor %d piece %d with element type %d, which is none of float32 (0), bfloat16 (1), float16 (2)", c.PeerRank(), f.Key, f.Piece, f.Elem)
	}
	if int(f.Length)%d.Size() != 0 {
		return false, fmt.Errorf("ps: worker %d pushed %d bytes for tensor %d piece %d: not whole %vs", c.PeerRank(), f.Length, f.Key, f.Piece, d)
	}
	a, err := s.lookup(f.Header)
	if err != nil {
		return false, fmt.Errorf("ps: worker %d pushed twice: %w", c.PeerRank(), err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	r := c.PeerRank()
	if r < 0 || r >= s.o.Workers {
		return false, fmt.Errorf("ps: push from worker %d, outside the %d workers", r, s.o.Workers)
	}
	if a.order.Pushed(r) {
		return false, fmt.Errorf("ps: worker %d pushed tensor %d piece %d shard %d iteration %d twice", r, f.Key, f.Piece, f.Aux, f.Iteration)
	}
	if err := s.checkNoneLeft(a, f.Header, r); err != nil {
		return false, err
	}
	if a.order.Count() == 0 {
		a.hdr = f.Header
	} else if f.Length != a.hdr.Length || f.Offset != a.hdr.Offset || f.Elem != a.hdr.Elem {
		return false, fmt.Errorf("ps: worker %d pushed tensor %d piece %d shard %d iteration %d as %d bytes of %v at offset %d, others as %d bytes of %v at offset %d",
			r, f.Key, f.Piece, f.Aux, f.Iteration, f.Length, d, f.Offset, a.hdr.Length, dtype.DType(a.hdr.Elem), a.hdr.Offset)
	}
	kept = s.take(a, r, f.Payload, f.Scale)
	if s.o.Mode == AnswerPush {
		a.waiting = append(a.waiting, c)
	}
	if a.complete {
		s.answer(a)
	}
	s.statsMu.Lock()
	s.bytesIn += int64(f.Length)
	s.statsMu.Unlock()
	return kept, nil
}

// take records rank r's checked push b into a (a.mu held) and adds what
// the shard's protocol (proto.ShardSum) says is due: in rank order, b and
// the held pushes that follow it, or nothing while a lower rank is missing
// (b is held). With the last push it encodes the sum into a.result and
// marks a complete. It reports whether a kept b. scale is b's exponent.
func (s *Server) take(a *accum, r int, b []byte, scale int8) (kept bool) {
	from, to, complete, _ := a.order.Push(r) // r was checked: in range, first push
	switch {
	case s.arrivalOrder:
		kept = a.added == 0
		s.addPush(a, b, scale)
		complete = a.added == s.o.Workers
	case from == to:
		if a.held == nil {
			a.held, a.heldScale = make([][]byte, s.o.Workers), make([]int8, s.o.Workers)
		}
		a.held[r], a.heldScale[r] = b, scale
		raise(&s.heldPeak, s.held.Add(int64(len(b))))
		kept = true
	default:
		kept = from == 0
		s.addPush(a, b, scale)
		for q := from + 1; q < to; q++ {
			h := a.held[q]
			a.held[q] = nil
			s.addPush(a, h, a.heldScale[q])
			s.held.Add(-int64(len(h)))
			bufs.Put(h)
		}
	}
	if complete {
		if !a.inPlace {
			d := dtype.DType(a.hdr.Elem)
			exp := d.Scale(a.sum)
			d.Encode(a.result, a.sum, exp)
			a.hdr.Scale = int8(exp)
			sums.Put(a.sum)
		}
		a.sum = nil
		a.complete = true
	}
	return kept
}

// raise sets peak to n if n is larger.
func raise(peak *atomic.Int64, n int64) {
	for {
		p := peak.Load()
		if n <= p || peak.CompareAndSwap(p, n) {
			return
		}
	}
}

// addPush adds b, the next push in summation order, into a's sum (a.mu
// held). The first one's buffer carries the sum back: where it can be
// viewed as float32s the sum accumulates in it directly (no decode, no
// encode), otherwise in a pooled float32 accumulator.
func (s *Server) addPush(a *accum, b []byte, scale int8) {
	d := dtype.DType(a.hdr.Elem)
	if a.added == 0 {
		if view, ok := transport.FloatView(b); ok && d == dtype.F32 {
			a.sum, a.inPlace = view, true
		} else {
			a.sum = sums.Get(len(b) / d.Size())
			d.Decode(a.sum, b, int(scale))
		}
		a.result = b
	} else {
		d.Add(a.sum, b, int(scale))
	}
	a.added++
}

func (s *Server) pull(c *transport.Conn, h transport.Header) error {
	a, err := s.lookup(h)
	if err != nil {
		return fmt.Errorf("ps: worker %d pulled twice: %w", c.PeerRank(), err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.waiting = append(a.waiting, c)
	if a.complete {
		s.answer(a)
	}
	return nil
}

// answer sends the sum to every waiting worker; a.mu is held.
func (s *Server) answer(a *accum) {
	h := a.hdr
	h.Kind = transport.KindAggregate
	h.Length = uint32(len(a.result))
	result := a.result
	for _, c := range a.waiting {
		// The buffer goes back to the pool once written to every worker. A
		// send error surfaces as that connection's Recv error.
		_ = c.SendNotify(transport.Frame{Header: h, Payload: result}, func(error) {
			if a.written.Add(1) == int32(s.o.Workers) {
				bufs.Put(result)
			}
		})
	}
	a.answered += len(a.waiting)
	a.waiting = a.waiting[:0]
	if a.answered == s.o.Workers {
		s.forget(keyOf(h))
		s.statsMu.Lock()
		s.pieces++
		s.statsMu.Unlock()
	}
}

// sums recycles accumulators and bufs receive buffers: a job sums the
// same piece sizes every iteration, and allocating megabytes per piece
// (page faults, zeroing, collections) costs more than the sum itself.
var (
	sums transport.Pool[float32]
	bufs transport.BufferPool
)

// Stats returns the pieces fully answered and the payload bytes received.
func (s *Server) Stats() (pieces, bytesIn int64) {
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	return s.pieces, s.bytesIn
}
