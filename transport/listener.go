package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"
)

// maxPendingHandshakes bounds the handshakes a Listener runs at once; more
// connections wait in the kernel's accept backlog.
const maxPendingHandshakes = 64

// setupTCP applies TCP_NODELAY and SO_SNDBUF.
func setupTCP(tcp *net.TCPConn, cfg Config) error {
	if err := tcp.SetNoDelay(true); err != nil {
		return fmt.Errorf("setting TCP_NODELAY: %w", err)
	}
	if err := tcp.SetWriteBuffer(cfg.SendBuffer); err != nil {
		return fmt.Errorf("setting SO_SNDBUF to %d: %w", cfg.SendBuffer, err)
	}
	return nil
}

// Probe checks whether an autobyte listener (without TLS) answers at addr:
// it connects, reads the listener's hello, says it is only probing and
// hangs up, all within timeout. The listener logs a probe at debug level,
// not as a refused peer. It returns nil for an autobyte listener and an
// error saying what answered otherwise: nothing (connection refused),
// or something that sends no autobyte hello (another program on the port,
// such as a torch.distributed store, which waits for its client to speak).
func Probe(ctx context.Context, addr string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("transport: probe %s: %w", addr, err)
	}
	defer nc.Close()
	dl, _ := ctx.Deadline()
	nc.SetDeadline(dl)
	hello := make([]byte, helloSize)
	if err := readMsg(nc, hello, "hello", timeout); err != nil {
		return fmt.Errorf("transport: probe %s: %v (not an autobyte listener)", addr, err)
	}
	if err := checkPrefix(hello, "hello", msgHello); err != nil {
		return fmt.Errorf("transport: probe %s: %v", addr, err)
	}
	_, _ = nc.Write(msgPrefix(msgProbe))
	return nil
}

// Dial connects to addr and runs the client handshake. Connection refused
// is retried (with backoff up to 1 s) until ctx is done, so peers may start
// in any order. The handshake is bounded by cfg.HandshakeTimeout and ctx.
// A server that refuses us yields a *RefusedError.
func Dial(ctx context.Context, addr string, cfg Config) (*Conn, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("transport: dial %s: %w", addr, err)
	}
	var d net.Dialer
	var raw net.Conn
	backoff := 20 * time.Millisecond
	for attempt := 1; ; attempt++ {
		raw, err = d.DialContext(ctx, "tcp", addr)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("transport: dial %s: gave up after %d attempts: %w (last error: %v)", addr, attempt, ctx.Err(), err)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("transport: dial %s: %w", addr, err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("transport: dial %s: gave up after %d attempts: %w (last error: %v)", addr, attempt, ctx.Err(), err)
		}
		backoff = min(2*backoff, time.Second)
	}
	tcp := raw.(*net.TCPConn)
	if err := setupTCP(tcp, cfg); err != nil {
		raw.Close()
		return nil, fmt.Errorf("transport: dial %s: %w", addr, err)
	}
	deadline := time.Now().Add(cfg.HandshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	tcp.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { tcp.SetDeadline(time.Unix(1, 0)) })
	nc := net.Conn(tcp)
	var rank int
	var role string
	var seg *shmSegment
	if cfg.TLS != nil {
		tc := tls.Client(tcp, clientTLS(cfg.TLS, addr))
		if err = tc.Handshake(); err != nil {
			err = fmt.Errorf("transport: TLS handshake with %s: %w", addr, err)
		}
		nc = tc
	}
	if err == nil {
		rank, role, seg, err = clientHandshake(nc, cfg, addr, cfg.sharesMemory(tcp))
	}
	if !stop() {
		if seg != nil {
			seg.unmap()
		}
		nc.Close()
		return nil, fmt.Errorf("transport: dial %s: handshake interrupted: %w", addr, ctx.Err())
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	tcp.SetDeadline(time.Time{})
	return newConn(nc, tcp, cfg, rank, role, seg, 0), nil
}

func clientTLS(c *tls.Config, addr string) *tls.Config {
	c = c.Clone()
	if c.ServerName == "" && !c.InsecureSkipVerify {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			c.ServerName = host
		}
	}
	return c
}

// Listener accepts authenticated connections. Handshakes run concurrently
// in the background (at most 64 at once), so a slow or silent peer does not
// delay a good one; a peer that fails the handshake is logged with its
// address and the reason, and dropped.
type Listener struct {
	ln    net.Listener
	cfg   Config
	conns chan *Conn
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
	sem   chan struct{}

	mu      sync.Mutex
	pending map[net.Conn]struct{}
}

// Listen listens on addr (e.g. ":4000" or "127.0.0.1:0") and starts
// accepting and handshaking connections.
func Listen(addr string, cfg Config) (*Listener, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("transport: listen %s: %w", addr, err)
	}
	if cfg.TLS != nil && len(cfg.TLS.Certificates) == 0 && cfg.TLS.GetCertificate == nil && cfg.TLS.GetConfigForClient == nil {
		return nil, fmt.Errorf("transport: listen %s: TLS config has no certificate", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("transport: listen %s: %w", addr, err)
	}
	l := &Listener{
		ln:      ln,
		cfg:     cfg,
		conns:   make(chan *Conn),
		done:    make(chan struct{}),
		sem:     make(chan struct{}, maxPendingHandshakes),
		pending: make(map[net.Conn]struct{}),
	}
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

// Addr is the address the listener is bound to.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Accept returns the next connection that completed the handshake.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	select {
	case <-l.done:
		return nil, fmt.Errorf("transport: accept on %s: %w", l.Addr(), net.ErrClosed)
	default:
	}
	select {
	case c := <-l.conns:
		return c, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("transport: accept on %s: %w", l.Addr(), ctx.Err())
	case <-l.done:
		return nil, fmt.Errorf("transport: accept on %s: %w", l.Addr(), net.ErrClosed)
	}
}

// Close stops listening, aborts handshakes in progress and closes
// handshaked connections not yet returned by Accept. Connections already
// returned are not affected. It waits for the listener's goroutines.
func (l *Listener) Close() error {
	var err error
	l.once.Do(func() {
		close(l.done)
		err = l.ln.Close()
		l.mu.Lock()
		for nc := range l.pending {
			nc.Close()
		}
		l.mu.Unlock()
	})
	l.wg.Wait()
	return err
}

func (l *Listener) closed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		raw, err := l.ln.Accept()
		if err != nil {
			if l.closed() || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: wait and retry.
			l.cfg.Logger.Warn("transport: accept failed; retrying", "listener", l.Addr().String(), "err", err, "retry_in", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-l.done:
				t.Stop()
				return
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		select {
		case l.sem <- struct{}{}:
		case <-l.done:
			raw.Close()
			return
		}
		l.mu.Lock()
		if l.closed() {
			l.mu.Unlock()
			raw.Close()
			<-l.sem
			return
		}
		l.pending[raw] = struct{}{}
		l.mu.Unlock()
		l.wg.Add(1)
		go l.handshake(raw)
	}
}

func (l *Listener) refused(addr, reason string) {
	l.cfg.Logger.Warn(fmt.Sprintf("refused peer %s: %s", addr, reason), "remote", addr, "reason", reason, "listener", l.Addr().String())
}

func (l *Listener) handshake(raw net.Conn) {
	defer l.wg.Done()
	defer func() { <-l.sem }()
	addr := raw.RemoteAddr().String()
	tcp := raw.(*net.TCPConn)
	untrack := func() {
		l.mu.Lock()
		delete(l.pending, raw)
		l.mu.Unlock()
	}
	if err := setupTCP(tcp, l.cfg); err != nil {
		untrack()
		raw.Close()
		l.refused(addr, err.Error())
		return
	}
	raw.SetDeadline(time.Now().Add(l.cfg.HandshakeTimeout))
	nc := raw
	if l.cfg.TLS != nil {
		tc := tls.Server(raw, l.cfg.TLS)
		if err := tc.Handshake(); err != nil {
			untrack()
			raw.Close()
			if !l.closed() {
				l.refused(addr, "TLS handshake: "+err.Error())
			}
			return
		}
		nc = tc
	}
	rank, role, seg, err := serverHandshake(nc, l.cfg, l.cfg.sharesMemory(tcp))
	untrack()
	if err != nil {
		if l.closed() {
			nc.Close()
			return
		}
		var r *refusal
		if errors.As(err, &r) && r.tell {
			sendRefusal(nc, r.reason)
		}
		nc.Close()
		if r != nil && r.probe {
			l.cfg.Logger.Debug("transport: probed", "remote", addr, "listener", l.Addr().String())
			return
		}
		l.refused(addr, err.Error())
		return
	}
	raw.SetDeadline(time.Time{})
	c := newConn(nc, tcp, l.cfg, rank, role, seg, 1)
	select {
	case l.conns <- c:
	case <-l.done:
		c.Close()
	}
}
