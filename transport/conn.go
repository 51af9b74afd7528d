package transport

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ErrClosed is wrapped by the errors of Send, SendNotify and Recv on a
// connection closed on our side.
var ErrClosed = errors.New("transport: connection closed")

// PeerClosedError is returned by Recv when the peer closed the connection
// with a KindClose frame.
type PeerClosedError struct {
	Peer   string // e.g. "worker 3 (127.0.0.1:4567)"
	Reason string
	// Role and Rank are what the peer announced in the handshake.
	Role string
	Rank int
}

// LostPeerError is a connection that broke without a close frame: the
// peer was silent for PeerTimeout (Silent), reset the connection, hung up,
// or died in the middle of a frame. Its message is the one the errors
// always had; the fields let a supervisor tell a process that failed on
// its own from one that failed because it lost this peer.
type LostPeerError struct {
	Role   string // as the peer announced it: "worker", "server"
	Rank   int
	Silent bool
	err    error
}

func (e *LostPeerError) Error() string { return e.err.Error() }
func (e *LostPeerError) Unwrap() error { return e.err }

// lost wraps err, which names the peer, as a *LostPeerError.
func (c *Conn) lost(err error, silent bool) error {
	return &LostPeerError{Role: c.peerRole, Rank: c.peerRank, Silent: silent, err: err}
}

// Peer is a peer a connection error names: the one lost, or the one that
// closed the connection with a reason (its own failure, passed on).
type Peer struct {
	Role string
	Rank int
	// Silent: the peer sent nothing for PeerTimeout (it may be hung rather
	// than dead); Closed: it closed the connection with a reason.
	Silent, Closed bool
}

// LostPeer returns the peer err says was lost or closed the connection,
// if err (or an error it wraps) is a *LostPeerError or *PeerClosedError.
func LostPeer(err error) (Peer, bool) {
	var lp *LostPeerError
	if errors.As(err, &lp) {
		return Peer{Role: lp.Role, Rank: lp.Rank, Silent: lp.Silent}, true
	}
	var pc *PeerClosedError
	if errors.As(err, &pc) {
		return Peer{Role: pc.Role, Rank: pc.Rank, Closed: true}, true
	}
	return Peer{}, false
}

func (e *PeerClosedError) Error() string {
	return fmt.Sprintf("transport: peer %s closed the connection: %s", e.Peer, e.Reason)
}

// Conn is an authenticated connection to one peer. Send and SendNotify may
// be called from any goroutine; Recv from one goroutine at a time.
//
// One sender goroutine per connection writes queued frames, most urgent
// (smallest Priority, ties in Send order) first, and sends heartbeats when
// idle. The send queue is not bounded: the caller's credit window bounds it.
type Conn struct {
	nc net.Conn
	// vw writes nc with one call for several buffers when nc is a plain
	// TCP connection read and written with raw system calls
	// (rawsock_linux.go) or a same-host connection through shared memory
	// (shm_linux.go); nil with TLS.
	vw       vecWriter
	shared   bool         // nc is a *shmConn
	tcp      *net.TCPConn // the underlying TCP connection (also under TLS)
	cfg      Config
	peerRank int
	peerRole string
	peer     string // "worker 3 (127.0.0.1:4567)"

	ctx    context.Context // canceled when the connection fails or closes
	cancel context.CancelFunc

	mu          sync.Mutex
	q           sendQueue
	seq         uint64
	err         error   // first terminal error; set once
	closeReason *string // a KindClose frame to write next
	closeErr    error   // the result of writing it
	wake        chan struct{}
	senderDone  chan struct{}

	recvMu sync.Mutex
	rhdr   [HeaderSize]byte
	shdr   [HeaderSize]byte // used by the sender goroutine only
	last   time.Time        // last write; sender goroutine only

	sent, received atomic.Int64
}

type sendItem struct {
	h       Header
	payload []byte
	done    func(error)
	seq     uint64
}

type sendQueue []*sendItem

func (q sendQueue) Len() int { return len(q) }
func (q sendQueue) Less(i, j int) bool {
	if q[i].h.Priority != q[j].h.Priority {
		return q[i].h.Priority < q[j].h.Priority
	}
	return q[i].seq < q[j].seq
}
func (q sendQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *sendQueue) Push(x any)   { *q = append(*q, x.(*sendItem)) }
func (q *sendQueue) Pop() any {
	old := *q
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return it
}

func describePeer(role string, rank int, addr net.Addr) string {
	if role == "" {
		role = "rank"
	}
	return fmt.Sprintf("%s %d (%s)", role, rank, addr)
}

type vecWriter interface {
	writev(bufs [][]byte) (int64, error)
}

// newConn starts the sender of an authenticated connection. seg, if not
// nil, is the shared-memory segment the handshake agreed on, of which we
// write ring number ring.
func newConn(nc net.Conn, tcp *net.TCPConn, cfg Config, peerRank int, peerRole string, seg *shmSegment, ring int) *Conn {
	ctx, cancel := context.WithCancel(context.Background())
	peer := describePeer(peerRole, peerRank, nc.RemoteAddr())
	var vw vecWriter
	var setupErr error
	if tcp != nil && nc == net.Conn(tcp) {
		rs, err := newRawSocket(tcp)
		switch {
		case err == nil && seg != nil:
			var sc *shmConn
			if sc, err = sharedConn(rs, seg, ring, peer); err == nil {
				vw, nc = sc, sc
			}
		case err == nil:
			vw, nc = rs, rs
		}
		if err != nil && seg != nil {
			seg.unmap()
			setupErr = fmt.Errorf("transport: connection to %s: the peer mapped our shared memory but we cannot use it: %w", peer, err)
		}
	}
	c := &Conn{
		nc: nc, tcp: tcp, cfg: cfg, vw: vw,
		peerRank: peerRank, peerRole: peerRole,
		peer:       peer,
		ctx:        ctx,
		cancel:     cancel,
		wake:       make(chan struct{}, 1),
		senderDone: make(chan struct{}),
		last:       time.Now(),
	}
	_, c.shared = nc.(*shmConn)
	go c.sendLoop()
	if setupErr != nil {
		c.fail(setupErr)
	}
	return c
}

// SharedMemory reports whether the connection's bytes go through shared
// memory (a same-host peer; see Config.SharedMemoryRing) rather than TCP.
func (c *Conn) SharedMemory() bool { return c.shared }

// PeerRank is the rank the peer announced in the handshake.
func (c *Conn) PeerRank() int { return c.peerRank }

// PeerRole is the role the peer announced in the handshake.
func (c *Conn) PeerRole() string { return c.peerRole }

// Peer describes the peer as "role rank (address)", as errors name it.
func (c *Conn) Peer() string { return c.peer }

// LocalAddr and RemoteAddr are the connection's addresses.
func (c *Conn) LocalAddr() net.Addr  { return c.nc.LocalAddr() }
func (c *Conn) RemoteAddr() net.Addr { return c.nc.RemoteAddr() }

// Stats returns the bytes (headers and payloads, heartbeats included)
// written and read so far, handshake excluded.
func (c *Conn) Stats() (sent, received int64) { return c.sent.Load(), c.received.Load() }

// Queued returns the number of frames waiting to be written (not counting
// one being written).
func (c *Conn) Queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.q)
}

// Send enqueues f. Header.Rank and Header.Length are set by the connection;
// Kind must be a data kind (push .. control). The payload must not be
// modified until it was written: use SendNotify to know when. Send fails
// only if the frame is invalid or the connection has failed or closed.
func (c *Conn) Send(f Frame) error { return c.SendNotify(f, nil) }

// SendNotify is Send with a callback: done (if not nil) is called exactly
// once, with nil after the frame was fully written to the socket, or with
// the error that prevented it (if SendNotify itself returns an error, done
// is not called). done runs on the connection's sender goroutine: it must
// return quickly and must not call Close or CloseWithReason.
func (c *Conn) SendNotify(f Frame, done func(error)) error {
	if f.Kind < KindPush || f.Kind > KindControl {
		return fmt.Errorf("transport: send to %s: kind %v cannot be sent as data (want push, aggregate, pull, ring or control)", c.peer, f.Kind)
	}
	if len(f.Payload) > MaxPayload {
		return fmt.Errorf("transport: send to %s: payload of %d bytes exceeds MaxPayload %d", c.peer, len(f.Payload), MaxPayload)
	}
	h := f.Header
	h.Rank = uint32(c.cfg.Rank)
	h.Length = uint32(len(f.Payload))
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return err
	}
	if c.closeReason != nil {
		c.mu.Unlock()
		return fmt.Errorf("transport: send to %s: %w", c.peer, ErrClosed)
	}
	c.seq++
	heap.Push(&c.q, &sendItem{h: h, payload: f.Payload, done: done, seq: c.seq})
	c.mu.Unlock()
	c.signal()
	return nil
}

func (c *Conn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// fail records the connection's first terminal error and tears it down:
// the socket is closed, so a blocked Recv or write returns, and the sender
// fails every queued frame and exits.
func (c *Conn) fail(err error) error {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	err = c.err
	c.mu.Unlock()
	c.cancel()
	c.nc.Close()
	c.signal()
	return err
}

// Close closes the connection at once: a frame being written is cut,
// queued frames are dropped (their done callbacks get an error wrapping
// ErrClosed), a blocked Recv returns. It waits for the sender goroutine to
// exit and is idempotent.
func (c *Conn) Close() error {
	c.fail(fmt.Errorf("transport: connection to %s: %w", c.peer, ErrClosed))
	<-c.senderDone
	return nil
}

// CloseWithReason drops the queued frames, lets a frame being written
// finish, sends a KindClose frame carrying reason (truncated to
// MaxCloseReason bytes) and closes the connection. The peer's Recv then
// returns a *PeerClosedError with the reason. Writing is bounded by
// HandshakeTimeout. To deliver queued frames first, wait for their
// SendNotify callbacks before calling it.
func (c *Conn) CloseWithReason(reason string) error {
	if len(reason) > MaxCloseReason {
		reason = strings.ToValidUTF8(reason[:MaxCloseReason], "")
	}
	c.mu.Lock()
	if c.err != nil || c.closeReason != nil {
		c.mu.Unlock()
		<-c.senderDone
		return nil
	}
	c.closeReason = &reason
	dropped := c.q
	c.q = nil
	c.mu.Unlock()
	closed := fmt.Errorf("transport: connection to %s: %w", c.peer, ErrClosed)
	for _, it := range dropped {
		if it.done != nil {
			it.done(closed)
		}
	}
	c.nc.SetWriteDeadline(time.Now().Add(c.cfg.HandshakeTimeout))
	c.signal()
	<-c.senderDone
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closeErr
}

// closeLinger bounds how long a connection closed with a reason stays
// half-open for the peer to read that reason.
const closeLinger = 200 * time.Millisecond

// linger half-closes the connection after the close frame and waits until
// the peer has closed its side too (a reader saw it) or closeLinger passed.
// Closing at once while the peer's frames sit unread in our receive buffer
// makes the kernel send a reset, and a peer that is writing then sees
// "connection reset" instead of the reason.
func (c *Conn) linger() {
	cw, ok := c.nc.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		return
	}
	for end := time.Now().Add(closeLinger); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		c.mu.Lock()
		done := c.err != nil
		c.mu.Unlock()
		if done {
			return
		}
	}
}

func (c *Conn) sendLoop() {
	defer close(c.senderDone)
	timer := time.NewTimer(c.cfg.HeartbeatInterval)
	defer timer.Stop()
	for {
		c.mu.Lock()
		if c.err != nil {
			q, err := c.q, c.err
			c.q = nil
			c.mu.Unlock()
			for _, it := range q {
				if it.done != nil {
					it.done(err)
				}
			}
			return
		}
		if c.closeReason != nil {
			reason := *c.closeReason
			c.mu.Unlock()
			err := c.write(Header{Kind: KindClose, Rank: uint32(c.cfg.Rank), Length: uint32(len(reason))}, []byte(reason), false)
			if err != nil {
				err = fmt.Errorf("transport: sending close to %s: %w", c.peer, err)
			} else {
				c.linger()
			}
			c.mu.Lock()
			c.closeErr = err
			c.mu.Unlock()
			c.fail(fmt.Errorf("transport: connection to %s: %w", c.peer, ErrClosed))
			continue
		}
		if len(c.q) > 0 {
			it := heap.Pop(&c.q).(*sendItem)
			c.mu.Unlock()
			err := c.write(it.h, it.payload, true)
			if err != nil {
				err = c.fail(c.writeErr(err, it.h))
			}
			if it.done != nil {
				it.done(err)
			}
			continue
		}
		c.mu.Unlock()
		wait := c.cfg.HeartbeatInterval - time.Since(c.last)
		if wait <= 0 {
			if err := c.write(Header{Kind: KindHeartbeat, Rank: uint32(c.cfg.Rank)}, nil, false); err != nil {
				c.fail(c.writeErr(err, Header{Kind: KindHeartbeat}))
			}
			continue
		}
		timer.Reset(wait)
		select {
		case <-c.wake:
		case <-timer.C:
		case <-c.ctx.Done():
		}
	}
}

func (c *Conn) writeErr(err error, h Header) error {
	if c.ctx.Err() != nil {
		// Closed or failed meanwhile: report that, not the cut write.
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.err != nil {
			return c.err
		}
	}
	return c.lost(fmt.Errorf("transport: lost peer %s: writing %v frame: %w", c.peer, h.Kind, err), false)
}

// write writes one frame, header and payload in one writev when unshaped,
// in chunks of at most the Egress burst when shaped.
func (c *Conn) write(h Header, payload []byte, shaped bool) error {
	h.put(c.shdr[:])
	defer func() { c.last = time.Now() }()
	chunk := 0
	if shaped {
		chunk = chunkLimit(c.cfg.Egress)
	}
	if chunk == 0 {
		n, err := c.writeBuffers(net.Buffers{c.shdr[:], payload})
		c.sent.Add(n)
		return err
	}
	segs := [2][]byte{c.shdr[:], payload}
	s := 0
	for s < 2 {
		var bufs net.Buffers
		n := 0
		for s < 2 && n < chunk {
			take := min(chunk-n, len(segs[s]))
			bufs = append(bufs, segs[s][:take])
			segs[s] = segs[s][take:]
			n += take
			if len(segs[s]) == 0 {
				s++
			}
		}
		if err := c.cfg.Egress.WaitN(c.ctx, n); err != nil {
			return fmt.Errorf("egress limiter: %w", err)
		}
		w, err := c.writeBuffers(bufs)
		c.sent.Add(w)
		if err != nil {
			return err
		}
	}
	return nil
}

// Recv returns the next data frame; heartbeats are consumed silently. The
// payload is freshly allocated and owned by the caller. A KindClose frame
// makes Recv return a *PeerClosedError; a lost peer (no bytes for
// PeerTimeout, reset, EOF), a truncated frame or a garbage header make it
// return an error naming the peer. Any error closes the connection and is
// returned again by later calls.
func (c *Conn) Recv() (Frame, error) { return c.RecvInto(nil) }

// RecvInto is Recv, reading the payload into buf[:Length] when buf has the
// capacity (allocating a fresh slice otherwise), so a receive loop can
// reuse one buffer, e.g. decode or AddFloat32s it and receive the next
// frame into it. Allocating a fresh 4 MiB payload per frame costs about a
// third of loopback throughput (see docs/transport.md).
func (c *Conn) RecvInto(buf []byte) (Frame, error) {
	return c.RecvTo(func(Header) []byte { return buf })
}

// RecvTo is Recv, reading the payload into the buffer dest returns for the
// frame's header, when it has the capacity (allocating otherwise). It lets
// a receiver put a payload straight where it belongs, e.g. a sum into the
// gradient it replaces, without a copy. dest runs on the receiving
// goroutine before the payload is read.
func (c *Conn) RecvTo(dest func(Header) []byte) (Frame, error) {
	c.recvMu.Lock()
	defer c.recvMu.Unlock()
	for {
		if err := c.stickyErr(); err != nil {
			return Frame{}, err
		}
		if err := c.readFull(c.rhdr[:], "header", Header{}); err != nil {
			return Frame{}, c.fail(err)
		}
		h, err := DecodeHeader(c.rhdr[:])
		if err != nil {
			return Frame{}, c.fail(&badFrameError{peer: c.peer, err: err.(*HeaderError)})
		}
		switch h.Kind {
		case KindHeartbeat:
			if h.Length != 0 {
				return Frame{}, c.fail(fmt.Errorf("transport: bad frame from %s: heartbeat with length %d, want 0", c.peer, h.Length))
			}
			continue
		case KindClose:
			if h.Length > MaxCloseReason {
				return Frame{}, c.fail(fmt.Errorf("transport: bad frame from %s: close reason length %d exceeds %d", c.peer, h.Length, MaxCloseReason))
			}
			reason := make([]byte, h.Length)
			if err := c.readFull(reason, "close reason", h); err != nil {
				return Frame{}, c.fail(err)
			}
			return Frame{}, c.fail(&PeerClosedError{Peer: c.peer, Reason: string(reason), Role: c.peerRole, Rank: c.peerRank})
		}
		payload, err := c.readPayload(h, dest(h))
		if err != nil {
			return Frame{}, c.fail(err)
		}
		return Frame{Header: h, Payload: payload}, nil
	}
}

func (c *Conn) stickyErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// eagerAlloc is the largest payload allocated in full before its bytes
// arrive; larger ones grow as they arrive, so a lying header cannot make
// us allocate a gigabyte up front.
const eagerAlloc = 16 << 20

func (c *Conn) readPayload(h Header, buf []byte) ([]byte, error) {
	n := int(h.Length)
	if cap(buf) >= n {
		p := buf[:n]
		return p, c.readFull(p, "payload", h)
	}
	if n <= eagerAlloc {
		p := make([]byte, n)
		return p, c.readFull(p, "payload", h)
	}
	p := make([]byte, 0, eagerAlloc)
	for len(p) < n {
		if len(p) == cap(p) {
			np := make([]byte, len(p), min(2*cap(p), n))
			copy(np, p)
			p = np
		}
		if err := c.readFull(p[len(p):cap(p)], "payload", h); err != nil {
			return nil, c.partialErr(err, len(p), n)
		}
		p = p[:cap(p)]
	}
	return p, nil
}

// partialErr rewrites a truncation error of a payload read in steps so
// that it counts from the start of the payload.
func (c *Conn) partialErr(err error, before, total int) error {
	var te *truncatedError
	if errors.As(err, &te) {
		te.got += before
		te.want = total
	}
	return err
}

// badFrameError is a header from the peer that DecodeHeader rejected.
type badFrameError struct {
	peer string
	err  *HeaderError
}

func (e *badFrameError) Error() string {
	return fmt.Sprintf("transport: bad frame from %s: %s", e.peer, e.err.msg)
}

func (e *badFrameError) Unwrap() error { return e.err }

type truncatedError struct {
	peer      string
	what      string
	h         Header
	got, want int
	err       error
}

func (e *truncatedError) Error() string {
	s := fmt.Sprintf("transport: peer %s sent a truncated frame: got %d of %d %s bytes", e.peer, e.got, e.want, e.what)
	if e.what != "header" {
		s += fmt.Sprintf(" (%v frame, iteration %d, key %d, piece %d)", e.h.Kind, e.h.Iteration, e.h.Key, e.h.Piece)
	}
	return s + ": " + e.err.Error()
}

func (e *truncatedError) Unwrap() error { return e.err }

// writeBuffers writes bufs with one writev where the socket allows.
func (c *Conn) writeBuffers(bufs net.Buffers) (int64, error) {
	if c.vw != nil {
		return c.vw.writev(bufs)
	}
	return bufs.WriteTo(c.nc)
}

// readFull reads len(b) bytes, failing when no byte arrived for
// PeerTimeout while we were waiting, and taking bytes from the Ingress
// limiter after each chunk. h describes the frame for error messages.
func (c *Conn) readFull(b []byte, what string, h Header) error {
	chunk := chunkLimit(c.cfg.Ingress)
	timeout := c.cfg.PeerTimeout
	total := len(b)
	got := 0
	progress := time.Now() // silence is measured from here
	deadline := time.Time{}
	for got < total {
		end := total
		if chunk > 0 {
			end = min(total, got+chunk)
		}
		// Refresh the deadline lazily: at most every timeout/8.
		if deadline.IsZero() || time.Until(deadline) < timeout-timeout/8 {
			deadline = progress.Add(timeout)
			c.nc.SetReadDeadline(deadline)
		}
		start := got
		for got < end {
			n, err := c.nc.Read(b[got:end])
			got += n
			if n > 0 {
				c.received.Add(int64(n))
				progress = time.Now()
				if time.Until(deadline) < timeout-timeout/8 {
					deadline = progress.Add(timeout)
					c.nc.SetReadDeadline(deadline)
				}
			}
			if err == nil {
				continue
			}
			if se := c.stickyErr(); se != nil {
				return se // closed locally or the sender failed: say so
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				if silence := time.Since(progress); silence < timeout {
					deadline = progress.Add(timeout)
					c.nc.SetReadDeadline(deadline)
					continue
				}
				if what == "header" && got == 0 {
					return c.lost(fmt.Errorf("transport: lost peer %s: no data for %v: %w", c.peer, timeout, err), true)
				}
				return c.lost(fmt.Errorf("transport: lost peer %s: no data for %v after %d of %d %s bytes: %w", c.peer, timeout, got, total, what, err), true)
			}
			if errors.Is(err, io.EOF) {
				if what == "header" && got == 0 {
					return c.lost(fmt.Errorf("transport: lost peer %s: connection closed without a close frame: %w", c.peer, err), false)
				}
				return c.lost(&truncatedError{peer: c.peer, what: what, h: h, got: got, want: total, err: io.ErrUnexpectedEOF}, false)
			}
			return c.lost(fmt.Errorf("transport: lost peer %s: %w", c.peer, err), false)
		}
		if chunk > 0 {
			if err := c.cfg.Ingress.WaitN(c.ctx, got-start); err != nil {
				if se := c.stickyErr(); se != nil {
					return se
				}
				return fmt.Errorf("transport: receiving from %s: ingress limiter: %w", c.peer, err)
			}
			progress = time.Now() // we were not reading while waiting
		}
	}
	return nil
}
