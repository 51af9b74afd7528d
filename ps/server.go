// Package ps is the parameter server: it sums the pieces that workers push
// and answers each piece with its exact sum once every worker pushed it.
//
// It owns summation and the server's side of the push/answer protocol. It
// knows nothing of models, layers or scheduling: a piece is a key in a frame
// header (epoch, iteration, tensor, piece, shard), and the answer carries the
// priority the worker put on the push, so urgent sums go out first. Which
// server holds which piece is decided by package placement on the workers.
package ps

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/autobyte/autobyte/cluster"
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
}

type pieceKey struct {
	epoch, iter, key, piece, aux uint32
}

// accum is one piece being summed.
type accum struct {
	mu     sync.Mutex
	sum    []float32
	pushes int
	hdr    transport.Header
	// result is the encoded sum once complete (the first push's buffer).
	result   []byte
	complete bool
	// waiting are the workers whose answer is due once result is set.
	waiting []*transport.Conn
	// answered counts the answers sent; the piece is forgotten at Workers.
	answered int
}

// Server sums pieces for a fixed set of worker connections.
type Server struct {
	o     Options
	log   *slog.Logger
	mu    sync.Mutex
	accs  map[pieceKey]*accum
	conns []*transport.Conn

	statsMu sync.Mutex
	pieces  int64
	bytesIn int64
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
	return &Server{o: o, log: log, accs: map[pieceKey]*accum{}}, nil
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
	for {
		f, err := c.Recv()
		if err != nil {
			return fmt.Errorf("ps: lost worker %d: %w", c.PeerRank(), err)
		}
		if cluster.IsBye(f) {
			return nil
		}
		switch f.Kind {
		case transport.KindPush:
			if err := s.push(c, f); err != nil {
				return err
			}
		case transport.KindPull:
			s.pull(c, f.Header)
		default:
			return fmt.Errorf("ps: worker %d sent an unexpected %v frame", c.PeerRank(), f.Kind)
		}
	}
}

func keyOf(h transport.Header) pieceKey {
	return pieceKey{epoch: h.Epoch, iter: h.Iteration, key: h.Key, piece: h.Piece, aux: h.Aux}
}

func (s *Server) lookup(h transport.Header) *accum {
	k := keyOf(h)
	s.mu.Lock()
	a, ok := s.accs[k]
	if !ok {
		a = &accum{hdr: h}
		s.accs[k] = a
	}
	s.mu.Unlock()
	return a
}

func (s *Server) push(c *transport.Conn, f transport.Frame) error {
	if f.Length%4 != 0 {
		return fmt.Errorf("ps: worker %d pushed %d bytes for tensor %d piece %d: not whole float32s", c.PeerRank(), f.Length, f.Key, f.Piece)
	}
	a := s.lookup(f.Header)
	a.mu.Lock()
	defer a.mu.Unlock()
	n := int(f.Length / 4)
	switch {
	case a.pushes == 0:
		a.sum = getSum(n)
		transport.Float32s(a.sum, f.Payload)
		a.hdr = f.Header
		// The first push's buffer will carry the encoded sum back.
		a.result = f.Payload
	case len(a.sum) != n || a.hdr.Offset != f.Offset:
		return fmt.Errorf("ps: worker %d pushed tensor %d piece %d shard %d iteration %d as %d bytes at offset %d, others as %d bytes at offset %d",
			c.PeerRank(), f.Key, f.Piece, f.Aux, f.Iteration, f.Length, f.Offset, 4*len(a.sum), a.hdr.Offset)
	default:
		transport.AddFloat32s(a.sum, f.Payload)
	}
	a.pushes++
	if a.pushes > s.o.Workers {
		return fmt.Errorf("ps: tensor %d piece %d shard %d iteration %d pushed %d times by %d workers (worker %d pushed twice?)",
			f.Key, f.Piece, f.Aux, f.Iteration, a.pushes, s.o.Workers, c.PeerRank())
	}
	if s.o.Mode == AnswerPush {
		a.waiting = append(a.waiting, c)
	}
	if a.pushes == s.o.Workers {
		transport.PutFloat32s(a.result, a.sum)
		putSum(a.sum)
		a.sum = nil
		a.complete = true
		s.answer(a)
	}
	s.statsMu.Lock()
	s.bytesIn += int64(f.Length)
	s.statsMu.Unlock()
	return nil
}

func (s *Server) pull(c *transport.Conn, h transport.Header) {
	a := s.lookup(h)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.waiting = append(a.waiting, c)
	if a.complete {
		s.answer(a)
	}
}

// answer sends the sum to every waiting worker; a.mu is held.
func (s *Server) answer(a *accum) {
	h := a.hdr
	h.Kind = transport.KindAggregate
	h.Length = uint32(len(a.result))
	for _, c := range a.waiting {
		// A send error surfaces as that connection's Recv error.
		_ = c.Send(transport.Frame{Header: h, Payload: a.result})
	}
	a.answered += len(a.waiting)
	a.waiting = a.waiting[:0]
	if a.answered == s.o.Workers {
		s.mu.Lock()
		delete(s.accs, keyOf(h))
		s.mu.Unlock()
		s.statsMu.Lock()
		s.pieces++
		s.statsMu.Unlock()
	}
}

// sums recycles accumulators: a job sums the same piece sizes every
// iteration, and allocating (and zeroing) megabytes per piece costs more
// than the sum itself.
var sums sync.Pool

func getSum(n int) []float32 {
	if p, ok := sums.Get().(*[]float32); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]float32, n)
}

func putSum(s []float32) { sums.Put(&s) }

// Stats returns the pieces fully answered and the payload bytes received.
func (s *Server) Stats() (pieces, bytesIn int64) {
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	return s.pieces, s.bytesIn
}
