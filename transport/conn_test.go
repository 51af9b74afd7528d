package transport

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/autobyte/autobyte/internal/syncbuf"
)

const testToken = "cluster-secret"

// logBuf collects log output for assertions.
type logBuf struct{ syncbuf.Buffer }

// waitFor waits until the log contains all of subs.
func (l *logBuf) waitFor(t *testing.T, timeout time.Duration, subs ...string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		s := l.String()
		ok := true
		for _, sub := range subs {
			if !strings.Contains(s, sub) {
				ok = false
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("log does not contain %q within %v; log:\n%s", subs, timeout, s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func testConfig(role string, rank int) Config {
	return Config{
		Token:  testToken,
		Rank:   rank,
		Role:   role,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// checkLeaks fails the test if goroutines started during it are still
// running shortly after its other cleanups ran. Call it first.
func checkLeaks(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(3 * time.Second)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				n := runtime.Stack(buf, true)
				t.Errorf("goroutine leak: %d before, %d after:\n%s", before, runtime.NumGoroutine(), buf[:n])
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

func listen(t *testing.T, cfg Config) *Listener {
	t.Helper()
	l, err := Listen("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// dial dials l and accepts the connection.
func dial(t *testing.T, l *Listener, cfg Config) (srv, cli *Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ch := dialAsync(ctx, l.Addr().String(), cfg)
	srv, err := l.Accept(ctx)
	r := <-ch
	if r.err != nil {
		t.Fatalf("Dial: %v", r.err)
	}
	if err != nil {
		t.Fatalf("Accept: %v", err)
	}
	t.Cleanup(func() { srv.Close(); r.c.Close() })
	return srv, r.c
}

// dialResult is what a Dial run by dialAsync returned.
type dialResult struct {
	c   *Conn
	err error
}

// dialAsync runs Dial(ctx, addr, cfg) in the background, so that the caller
// can listen or accept meanwhile, and returns where its result will come.
func dialAsync(ctx context.Context, addr string, cfg Config) <-chan dialResult {
	ch := make(chan dialResult, 1)
	go func() {
		c, err := Dial(ctx, addr, cfg)
		ch <- dialResult{c, err}
	}()
	return ch
}

// wires runs f over both same-host wires: shared memory (the default on
// loopback) and plain TCP (SharedMemoryRing -1).
func wires(t *testing.T, f func(t *testing.T, ring int)) {
	for _, w := range []struct {
		name string
		ring int
	}{{"shm", 0}, {"tcp", -1}} {
		t.Run(w.name, func(t *testing.T) { f(t, w.ring) })
	}
}

func ringConfig(role string, rank, ring int) Config {
	c := testConfig(role, rank)
	c.SharedMemoryRing = ring
	return c
}

func pair(t *testing.T, sc, cc Config) (srv, cli *Conn) {
	t.Helper()
	return dial(t, listen(t, sc), cc)
}

// rawClient connects to addr and runs the client handshake by hand,
// returning the raw socket so a test can write anything.
func rawClient(t *testing.T, addr string, cfg Config) net.Conn {
	t.Helper()
	cfg, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(5 * time.Second))
	if _, _, _, err := clientHandshake(nc, cfg, addr, false); err != nil {
		t.Fatal(err)
	}
	nc.SetDeadline(time.Time{})
	return nc
}

// halfClose ends what a raw client sends (FIN) without closing it: a full
// close with unread bytes in its receive buffer (a heartbeat the listener
// sent meanwhile) resets the connection, and the receiver would see a reset
// instead of the truncation a test expects. rawClient's cleanup closes it.
func halfClose(nc net.Conn) { nc.(*net.TCPConn).CloseWrite() }

func accept(t *testing.T, l *Listener) *Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func mustContain(t *testing.T, err error, subs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one containing %q", subs)
	}
	for _, s := range subs {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("error %q does not contain %q", err, s)
		}
	}
}

func TestHandshakeAndRoundTrip(t *testing.T) {
	wires(t, func(t *testing.T, ring int) {
		checkLeaks(t)
		srv, cli := pair(t, ringConfig("server", 2, ring), ringConfig("worker", 5, ring))
		if want := ring == 0 && runtime.GOOS == "linux"; srv.SharedMemory() != want || cli.SharedMemory() != want {
			t.Fatalf("shared memory: server %v, client %v; want %v", srv.SharedMemory(), cli.SharedMemory(), want)
		}
		if srv.PeerRank() != 5 || srv.PeerRole() != "worker" {
			t.Fatalf("server sees peer %d %q, want worker 5", srv.PeerRank(), srv.PeerRole())
		}
		if cli.PeerRank() != 2 || cli.PeerRole() != "server" {
			t.Fatalf("client sees peer %d %q, want server 2", cli.PeerRank(), cli.PeerRole())
		}
		payload := make([]byte, 100000)
		rand.Read(payload)
		h := Header{Kind: KindPush, Rank: 999, Epoch: 1, Iteration: 2, Key: 3, Piece: 4, Aux: 5, Priority: 6, Offset: 7, Length: 1}
		if err := cli.Send(Frame{Header: h, Payload: payload}); err != nil {
			t.Fatal(err)
		}
		f, err := srv.Recv()
		if err != nil {
			t.Fatal(err)
		}
		want := h
		want.Rank, want.Length = 5, uint32(len(payload)) // stamped by the connection
		if f.Header != want || !bytes.Equal(f.Payload, payload) {
			t.Fatalf("got header %+v (%d bytes), want %+v", f.Header, len(f.Payload), want)
		}
		// And back, with an empty payload.
		if err := srv.Send(Frame{Header: Header{Kind: KindAggregate, Key: 3}}); err != nil {
			t.Fatal(err)
		}
		f, err = cli.Recv()
		if err != nil || f.Kind != KindAggregate || f.Rank != 2 || len(f.Payload) != 0 {
			t.Fatalf("got %+v, %v", f, err)
		}
		// The sender goroutine counts a write once writev returns, which may
		// be just after the peer already read it: allow it a moment.
		var sent, recvd int64
		for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(time.Millisecond) {
			sent, _ = cli.Stats()
			_, recvd = srv.Stats()
			if sent >= int64(HeaderSize+len(payload)) && recvd >= int64(HeaderSize+len(payload)) || time.Now().After(deadline) {
				break
			}
		}
		if sent < int64(HeaderSize+len(payload)) || recvd < int64(HeaderSize+len(payload)) {
			t.Fatalf("stats: client sent %d, server received %d, want >= %d", sent, recvd, HeaderSize+len(payload))
		}
	})
}

func TestWrongTokenRefusedBothSidesAndListenerKeepsAccepting(t *testing.T) {
	checkLeaks(t)
	var logs logBuf
	sc := testConfig("server", 0)
	sc.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	l := listen(t, sc)

	bad := testConfig("worker", 1)
	bad.Token = "wrong"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := Dial(ctx, l.Addr().String(), bad)
	mustContain(t, err, "server "+l.Addr().String()+" refused the connection: bad cluster token")
	var re *RefusedError
	if !errors.As(err, &re) || re.Reason != "bad cluster token" {
		t.Fatalf("error %v is not a RefusedError with the reason", err)
	}
	logs.waitFor(t, 2*time.Second, "level=WARN", "refused peer 127.0.0.1:", ": bad cluster token")

	srv, cli := dial(t, l, testConfig("worker", 2))
	if srv.PeerRank() != 2 {
		t.Fatalf("accepted rank %d, want 2", srv.PeerRank())
	}
	if err := cli.Send(Frame{Header: Header{Kind: KindControl}, Payload: []byte("hi")}); err != nil {
		t.Fatal(err)
	}
	if f, err := srv.Recv(); err != nil || string(f.Payload) != "hi" {
		t.Fatalf("got %q, %v", f.Payload, err)
	}
}

func TestBadPeersDoNotBlockGoodOne(t *testing.T) {
	checkLeaks(t)
	var logs logBuf
	sc := testConfig("server", 0)
	sc.HandshakeTimeout = 1500 * time.Millisecond
	sc.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	l := listen(t, sc)
	addr := l.Addr().String()

	// A client that connects and says nothing.
	silent, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	// A client that sends garbage.
	garbage, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer garbage.Close()
	junk := make([]byte, 300)
	rand.Read(junk)
	junk[0], junk[1] = 0xad, 0xde
	garbage.Write(junk)
	// A client of another protocol version.
	other, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	hello := make([]byte, helloSize)
	other.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(other, hello); err != nil {
		t.Fatal(err)
	}
	other.Write([]byte{0x1e, 0xab, 9, msgAuth})

	start := time.Now()
	srv, _ := dial(t, l, testConfig("worker", 4))
	if el := time.Since(start); el > time.Second || srv.PeerRank() != 4 {
		t.Fatalf("good client accepted after %v (rank %d): bad peers blocked it", el, srv.PeerRank())
	}
	// The other-version client is told why.
	refusal, _ := io.ReadAll(other)
	if !bytes.Contains(refusal, []byte("unsupported protocol version 9")) {
		t.Fatalf("other-version client got %q, want a refusal naming version 9", refusal)
	}
	logs.waitFor(t, 3*time.Second,
		"refused peer "+other.LocalAddr().String()+": handshake: unsupported protocol version 9",
		"refused peer "+garbage.LocalAddr().String()+": handshake: bad auth magic 0xdead",
		"refused peer "+silent.LocalAddr().String()+": handshake: handshake timed out after 1.5s: got 0 of 4 auth bytes")
}

func TestClientRejectsFakeServer(t *testing.T) {
	checkLeaks(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		nc.Write(append(msgPrefix(msgHello), make([]byte, nonceSize)...))
		auth := make([]byte, authFixed+len("worker"))
		io.ReadFull(nc, auth)
		// Accept anyone, but cannot prove the token.
		ok := append(msgPrefix(msgOK), 0, 0, 0, 0, 6)
		ok = append(ok, make([]byte, macSize)...)
		nc.Write(append(ok, "server"...))
		io.ReadAll(nc)
	}()
	_, err = Dial(context.Background(), ln.Addr().String(), testConfig("worker", 1))
	mustContain(t, err, "handshake with "+ln.Addr().String(), "server failed to prove the cluster token")
	<-done
}

func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "autobyte test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(parsed)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

func TestTLSRoundTrip(t *testing.T) {
	checkLeaks(t)
	cert, pool := selfSigned(t)
	sc := testConfig("server", 0)
	sc.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	cc := testConfig("worker", 1)
	cc.TLS = &tls.Config{RootCAs: pool}
	l := listen(t, sc)
	srv, cli := dial(t, l, cc)
	if _, ok := cli.nc.(*tls.Conn); !ok {
		t.Fatalf("client connection is %T, want *tls.Conn", cli.nc)
	}
	payload := make([]byte, 1<<20)
	rand.Read(payload)
	for _, p := range []struct{ from, to *Conn }{{cli, srv}, {srv, cli}} {
		if err := p.from.Send(Frame{Header: Header{Kind: KindRing, Aux: 3}, Payload: payload}); err != nil {
			t.Fatal(err)
		}
		f, err := p.to.Recv()
		if err != nil || f.Aux != 3 || !bytes.Equal(f.Payload, payload) {
			t.Fatalf("TLS round trip: aux %d, %d bytes, %v", f.Aux, len(f.Payload), err)
		}
	}
	// A client that does not trust the certificate fails, naming TLS.
	untrusting := testConfig("worker", 2)
	untrusting.TLS = &tls.Config{}
	_, err := Dial(context.Background(), l.Addr().String(), untrusting)
	mustContain(t, err, "TLS handshake with "+l.Addr().String(), "certificate")
}

func TestPriorityOrderWhileSenderBlocked(t *testing.T) {
	checkLeaks(t)
	// Default SO_SNDBUF (256 KiB). Do not go much below 64 KiB here: on
	// loopback (64 KiB MSS) a tiny send buffer collapses throughput.
	srv, cli := pair(t, testConfig("server", 0), testConfig("worker", 1))

	// The first frame is far larger than the socket buffers (the receive
	// buffer does not grow while nobody reads), so the sender stays blocked
	// in it until the server starts reading.
	big := make([]byte, 16<<20)
	bigDone := make(chan error, 1)
	if err := cli.SendNotify(Frame{Header: Header{Kind: KindPush, Key: 100000, Priority: 1 << 40}, Payload: big}, func(err error) { bigDone <- err }); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Second); cli.Queued() > 0; {
		if time.Now().After(deadline) {
			t.Fatal("sender did not pick up the first frame")
		}
		time.Sleep(time.Millisecond)
	}
	type item struct {
		prio uint64
		key  uint32
	}
	r := mrand.New(mrand.NewPCG(7, 8))
	var want []item
	for i := range 300 {
		it := item{prio: uint64(r.IntN(40)), key: uint32(i)} // many ties: they must stay FIFO
		want = append(want, it)
		if err := cli.Send(Frame{Header: Header{Kind: KindPush, Key: it.key, Priority: it.prio}, Payload: make([]byte, 512)}); err != nil {
			t.Fatal(err)
		}
	}
	slices.SortStableFunc(want, func(a, b item) int { return cmp.Compare(a.prio, b.prio) })
	select {
	case err := <-bigDone:
		t.Fatalf("the first frame was written (%v) before the others were queued: the test cannot check the order", err)
	default:
	}

	f, err := srv.Recv()
	if err != nil || f.Key != 100000 || len(f.Payload) != len(big) {
		t.Fatalf("first frame: key %d, %d bytes, %v; want the big frame", f.Key, len(f.Payload), err)
	}
	for i, w := range want {
		f, err := srv.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if f.Key != w.key || f.Priority != w.prio {
			t.Fatalf("frame %d after the first: key %d priority %d, want key %d priority %d", i, f.Key, f.Priority, w.key, w.prio)
		}
	}
}

func TestShaping(t *testing.T) {
	const total = 4_000_000
	for _, dir := range []string{"egress", "ingress"} {
		t.Run(dir, func(t *testing.T) {
			checkLeaks(t)
			sc, cc := testConfig("server", 0), testConfig("worker", 1)
			lim := rate.NewLimiter(20e6, 64<<10) // 20 MB/s
			if dir == "egress" {
				cc.Egress = lim
			} else {
				sc.Ingress = lim
			}
			srv, cli := pair(t, sc, cc)
			payload := make([]byte, total/4)
			start := time.Now()
			for range 4 {
				if err := cli.Send(Frame{Header: Header{Kind: KindPush}, Payload: payload}); err != nil {
					t.Fatal(err)
				}
			}
			for range 4 {
				if _, err := srv.Recv(); err != nil {
					t.Fatal(err)
				}
			}
			el := time.Since(start)
			t.Logf("%s: 4 MB through a 20 MB/s limiter in %v", dir, el)
			if el < 150*time.Millisecond || el > 600*time.Millisecond {
				t.Fatalf("4 MB through a 20 MB/s %s limiter took %v, want about 0.2 s (0.15-0.6 s)", dir, el)
			}
		})
	}
}

// heartbeatPair connects a server that gives up on a peer silent for
// peerTimeout with worker 7, which heartbeats every heartbeat when idle.
func heartbeatPair(t *testing.T, ring int, peerTimeout, heartbeat time.Duration) (srv, cli *Conn) {
	t.Helper()
	sc := ringConfig("server", 0, ring)
	sc.PeerTimeout = peerTimeout
	cc := ringConfig("worker", 7, ring)
	cc.HeartbeatInterval = heartbeat
	return pair(t, sc, cc)
}

func TestPeerTimeout(t *testing.T) {
	wires(t, func(t *testing.T, ring int) {
		checkLeaks(t)
		srv, _ := heartbeatPair(t, ring, 500*time.Millisecond, time.Hour) // the worker never heartbeats
		start := time.Now()
		_, err := srv.Recv()
		el := time.Since(start)
		mustContain(t, err, "transport: lost peer worker 7 (127.0.0.1:", "no data for 500ms")
		mustLose(t, err, Peer{Role: "worker", Rank: 7, Silent: true})
		if el < 450*time.Millisecond || el > 1500*time.Millisecond {
			t.Fatalf("Recv failed after %v, want within PeerTimeout (500ms) + 1s", el)
		}
		// The error sticks.
		_, err2 := srv.Recv()
		if err2 == nil || err2.Error() != err.Error() {
			t.Fatalf("second Recv: %v, want %v", err2, err)
		}
	})
}

func TestHeartbeatsKeepIdlePeerAlive(t *testing.T) {
	wires(t, func(t *testing.T, ring int) {
		checkLeaks(t)
		srv, cli := heartbeatPair(t, ring, 400*time.Millisecond, 50*time.Millisecond)
		go func() {
			time.Sleep(1200 * time.Millisecond)
			cli.Send(Frame{Header: Header{Kind: KindControl, Aux: 42}})
		}()
		start := time.Now()
		f, err := srv.Recv()
		if err != nil || f.Aux != 42 {
			t.Fatalf("Recv after %v: %+v, %v; heartbeats should have kept the peer alive", time.Since(start), f, err)
		}
		_, recvd := srv.Stats()
		if recvd < 5*HeaderSize {
			t.Fatalf("received only %d bytes: no heartbeats?", recvd)
		}
	})
}

func TestKilledPeer(t *testing.T) {
	wires(t, func(t *testing.T, ring int) {
		checkLeaks(t)
		srv, cli := pair(t, ringConfig("server", 0, ring), ringConfig("worker", 3, ring))
		// Abort: RST, no close frame.
		cli.tcp.SetLinger(0)
		cli.nc.Close()
		start := time.Now()
		_, err := srv.Recv()
		if el := time.Since(start); el > time.Second {
			t.Fatalf("Recv took %v to notice a killed peer", el)
		}
		mustContain(t, err, "lost peer worker 3 (127.0.0.1:", "connection reset by peer")
		mustLose(t, err, Peer{Role: "worker", Rank: 3})
	})
}

func TestPeerHangsUpWithoutCloseFrame(t *testing.T) {
	checkLeaks(t)
	l := listen(t, testConfig("server", 0))
	nc := rawClient(t, l.Addr().String(), testConfig("worker", 8))
	srv := accept(t, l)
	nc.Close()
	_, err := srv.Recv()
	mustContain(t, err, "lost peer worker 8 (127.0.0.1:", "connection closed without a close frame")
	mustLose(t, err, Peer{Role: "worker", Rank: 8})
}

// mustLose checks that err names the peer it lost, as a supervisor reads
// it through LostPeer.
func mustLose(t *testing.T, err error, want Peer) {
	t.Helper()
	got, ok := LostPeer(fmt.Errorf("wrapped: %w", err))
	if !ok || got != want {
		t.Fatalf("LostPeer(%v) = %+v, %v; want %+v", err, got, ok, want)
	}
}

func TestTruncatedFrame(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(nc net.Conn)
		want  string
	}{
		{"payload", func(nc net.Conn) {
			nc.Write(Header{Kind: KindPush, Key: 11, Piece: 2, Length: 100}.Append(nil))
			nc.Write(make([]byte, 10))
		}, "sent a truncated frame: got 10 of 100 payload bytes (push frame, iteration 0, key 11, piece 2)"},
		{"header", func(nc net.Conn) {
			nc.Write(Header{Kind: KindPush}.Append(nil)[:20])
		}, "sent a truncated frame: got 20 of 52 header bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkLeaks(t)
			l := listen(t, testConfig("server", 0))
			nc := rawClient(t, l.Addr().String(), testConfig("worker", 5))
			srv := accept(t, l)
			tc.write(nc)
			halfClose(nc)
			_, err := srv.Recv()
			mustContain(t, err, "peer worker 5 (127.0.0.1:", tc.want)
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("error %v does not wrap io.ErrUnexpectedEOF", err)
			}
			mustLose(t, err, Peer{Role: "worker", Rank: 5})
		})
	}
}

func TestGarbageHeaderClosesOnlyThatConnection(t *testing.T) {
	for _, tc := range []struct {
		name string
		hdr  func() []byte
		want string
	}{
		{"magic", func() []byte { b := Header{Kind: KindPush}.Append(nil); b[0], b[1] = 0xef, 0xbe; return b }, "bad header magic 0xbeef"},
		{"kind", func() []byte { b := Header{Kind: KindPush}.Append(nil); b[3] = 9; return b }, "unknown header kind 9"},
		{"length", func() []byte {
			b := Header{Kind: KindPush}.Append(nil)
			binary.LittleEndian.PutUint32(b[28:], MaxPayload+1)
			return b
		}, "header length 1073741825 exceeds MaxPayload"},
		{"heartbeat payload", func() []byte { return Header{Kind: KindHeartbeat, Length: 5}.Append(nil) }, "heartbeat with length 5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkLeaks(t)
			l := listen(t, testConfig("server", 0))
			good, goodCli := dial(t, l, testConfig("worker", 1))
			nc := rawClient(t, l.Addr().String(), testConfig("worker", 5))
			bad := accept(t, l)
			nc.Write(tc.hdr())
			_, err := bad.Recv()
			mustContain(t, err, "bad frame from worker 5 (127.0.0.1:", tc.want)
			// A peer that sends garbage is at fault, not lost.
			if p, ok := LostPeer(err); ok {
				t.Fatalf("LostPeer(%v) = %+v: a bad frame is not a lost peer", err, p)
			}
			// The bad connection is closed ...
			nc.SetReadDeadline(time.Now().Add(2 * time.Second))
			if _, err := io.ReadAll(nc); err != nil {
				t.Fatalf("bad peer's socket was not closed: %v", err)
			}
			// ... the other one still works, and the listener still accepts.
			if err := goodCli.Send(Frame{Header: Header{Kind: KindPush, Key: 77}}); err != nil {
				t.Fatal(err)
			}
			if f, err := good.Recv(); err != nil || f.Key != 77 {
				t.Fatalf("other connection: %+v, %v", f, err)
			}
			dial(t, l, testConfig("worker", 2))
		})
	}
}

func TestCloseReasonSurfaces(t *testing.T) {
	wires(t, func(t *testing.T, ring int) {
		checkLeaks(t)
		srv, cli := pair(t, ringConfig("server", 0, ring), ringConfig("worker", 1, ring))
		if err := cli.CloseWithReason("worker 1: out of memory"); err != nil {
			t.Fatal(err)
		}
		_, err := srv.Recv()
		mustContain(t, err, "peer worker 1 (127.0.0.1:", "closed the connection: worker 1: out of memory")
		var pc *PeerClosedError
		if !errors.As(err, &pc) || pc.Reason != "worker 1: out of memory" {
			t.Fatalf("error %v is not a PeerClosedError with the reason", err)
		}
		mustLose(t, err, Peer{Role: "worker", Rank: 1, Closed: true})
		if err := cli.Send(Frame{Header: Header{Kind: KindPush}}); !errors.Is(err, ErrClosed) {
			t.Fatalf("Send after CloseWithReason: %v, want ErrClosed", err)
		}
		if err := srv.Send(Frame{Header: Header{Kind: KindPush}}); err == nil {
			t.Fatal("Send on a connection the peer closed succeeded")
		}
	})
}

func TestCloseUnblocksRecvAndFailsQueuedFrames(t *testing.T) {
	wires(t, func(t *testing.T, ring int) {
		checkLeaks(t)
		_, cli := pair(t, ringConfig("server", 0, ring), ringConfig("worker", 1, ring))
		// Block the sender with a big frame nobody reads, queue more behind it.
		var mu sync.Mutex
		var results []error
		done := func(err error) {
			mu.Lock()
			results = append(results, err)
			mu.Unlock()
		}
		for i := range 5 {
			size := 512
			if i == 0 {
				size = 16 << 20
			}
			if err := cli.SendNotify(Frame{Header: Header{Kind: KindPush}, Payload: make([]byte, size)}, done); err != nil {
				t.Fatal(err)
			}
		}
		recvErr := make(chan error, 1)
		go func() {
			_, err := cli.Recv()
			recvErr <- err
		}()
		time.Sleep(50 * time.Millisecond)
		cli.Close()
		select {
		case err := <-recvErr:
			if !errors.Is(err, ErrClosed) {
				t.Fatalf("Recv after Close: %v, want ErrClosed", err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("Close did not unblock Recv")
		}
		mu.Lock()
		defer mu.Unlock()
		if len(results) != 5 {
			t.Fatalf("%d done callbacks ran, want 5", len(results))
		}
		for _, err := range results {
			if !errors.Is(err, ErrClosed) {
				t.Fatalf("done callback got %v, want ErrClosed", err)
			}
		}
		if err := cli.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	})
}

func TestSendNotifyReportsWritten(t *testing.T) {
	wires(t, func(t *testing.T, ring int) {
		checkLeaks(t)
		srv, cli := pair(t, ringConfig("server", 0, ring), ringConfig("worker", 1, ring))
		written := make(chan error, 1)
		if err := cli.SendNotify(Frame{Header: Header{Kind: KindPush}, Payload: make([]byte, 1000)}, func(err error) { written <- err }); err != nil {
			t.Fatal(err)
		}
		if _, err := srv.Recv(); err != nil {
			t.Fatal(err)
		}
		if err := <-written; err != nil {
			t.Fatalf("done callback: %v", err)
		}
		mustContain(t, cli.Send(Frame{Header: Header{Kind: KindHeartbeat}}), "kind heartbeat cannot be sent as data")
		mustContain(t, cli.Send(Frame{Header: Header{Kind: 0}}), "kind Kind(0) cannot be sent as data")
	})
}

func TestDialRetriesUntilListening(t *testing.T) {
	checkLeaks(t)
	tmp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := tmp.Addr().String()
	tmp.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ch := dialAsync(ctx, addr, testConfig("worker", 1))
	time.Sleep(300 * time.Millisecond)
	l, err := Listen(addr, testConfig("server", 0))
	if err != nil {
		t.Skipf("port %s taken meanwhile: %v", addr, err)
	}
	defer l.Close()
	srv, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	r := <-ch
	if r.err != nil {
		t.Fatalf("Dial: %v", r.err)
	}
	r.c.Close()

	// Nobody listening: Dial gives up when ctx is done, naming addr.
	l.Close()
	short, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	_, err = Dial(short, addr, testConfig("worker", 1))
	mustContain(t, err, "transport: dial "+addr+": gave up after", "connection refused")
}

func TestConfigErrors(t *testing.T) {
	checkLeaks(t)
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Token = "" }, "config: Token is empty"},
		{func(c *Config) { c.Role = strings.Repeat("r", 33) }, "is 33 bytes, max 32"},
		{func(c *Config) { c.Rank = -1 }, "config: Rank -1 out of range"},
		{func(c *Config) { c.PeerTimeout = -time.Second }, "config: PeerTimeout -1s is negative"},
		{func(c *Config) { c.Egress = rate.NewLimiter(100, 0) }, "config: Egress limiter has burst 0"},
	} {
		c := testConfig("worker", 1)
		tc.mod(&c)
		_, err := Dial(context.Background(), "127.0.0.1:1", c)
		mustContain(t, err, "transport: dial 127.0.0.1:1: ", tc.want)
		_, err = Listen("127.0.0.1:0", c)
		mustContain(t, err, "transport: listen 127.0.0.1:0: ", tc.want)
	}
}

func TestAcceptAfterCloseAndCancel(t *testing.T) {
	checkLeaks(t)
	l, err := Listen("127.0.0.1:0", testConfig("server", 0))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = l.Accept(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Accept with expired ctx: %v", err)
	}
	// A handshake in progress is aborted by Close.
	nc, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	time.Sleep(20 * time.Millisecond)
	l.Close()
	_, err = l.Accept(context.Background())
	if !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
}

func TestErrorsNameThePeer(t *testing.T) {
	c := &Conn{peer: describePeer("", 4, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 9})}
	if got := fmt.Sprint(c.Peer()); got != "rank 4 (10.0.0.1:9)" {
		t.Fatalf("peer without role described as %q", got)
	}
}

func TestLargePayloadAndRecvInto(t *testing.T) {
	wires(t, func(t *testing.T, ring int) {
		checkLeaks(t)
		srv, cli := pair(t, ringConfig("server", 0, ring), ringConfig("worker", 1, ring))
		// Above eagerAlloc, the payload grows as it arrives.
		big := make([]byte, eagerAlloc+eagerAlloc/2+3)
		rand.Read(big)
		small := []byte("0123456789")
		for _, p := range [][]byte{big, small, small} {
			if err := cli.Send(Frame{Header: Header{Kind: KindAggregate}, Payload: p}); err != nil {
				t.Fatal(err)
			}
		}
		f, err := srv.Recv()
		if err != nil || !bytes.Equal(f.Payload, big) {
			t.Fatalf("large payload: %d bytes, %v", len(f.Payload), err)
		}
		buf := make([]byte, 64)
		f, err = srv.RecvInto(buf)
		if err != nil || string(f.Payload) != string(small) || &f.Payload[0] != &buf[0] {
			t.Fatalf("RecvInto with room: %q, %v (reused buffer: %v)", f.Payload, err, err == nil && &f.Payload[0] == &buf[0])
		}
		f, err = srv.RecvInto(buf[:0:4])
		if err != nil || string(f.Payload) != string(small) {
			t.Fatalf("RecvInto without room: %q, %v", f.Payload, err)
		}
	})
}

func TestTruncatedLargePayloadCountsFromStart(t *testing.T) {
	checkLeaks(t)
	l := listen(t, testConfig("server", 0))
	nc := rawClient(t, l.Addr().String(), testConfig("worker", 5))
	srv := accept(t, l)
	const want, sent = 20 << 20, 17 << 20
	go func() {
		nc.Write(Header{Kind: KindRing, Length: want}.Append(nil))
		nc.Write(make([]byte, sent))
		halfClose(nc)
	}()
	_, err := srv.Recv()
	mustContain(t, err, fmt.Sprintf("got %d of %d payload bytes (ring frame", sent, want))
}

// TestProbe: Probe tells an autobyte listener from nothing and from a
// program that waits for its client to speak; the listener logs a probe
// at debug level only and keeps accepting.
func TestProbe(t *testing.T) {
	checkLeaks(t)
	var log logBuf
	cfg := testConfig("worker", 0)
	cfg.Logger = slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	l := listen(t, cfg)
	if err := Probe(context.Background(), l.Addr().String(), time.Second); err != nil {
		t.Fatalf("Probe of an autobyte listener: %v", err)
	}
	log.waitFor(t, 2*time.Second, "level=DEBUG", "transport: probed")
	if s := log.String(); strings.Contains(s, "refused peer") {
		t.Errorf("a probe was logged as a refused peer:\n%s", s)
	}
	dial(t, l, testConfig("worker", 1)) // still accepting

	// A listener that never speaks first (as a TCP store does).
	quiet, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer quiet.Close()
	go func() {
		for {
			c, err := quiet.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	start := time.Now()
	err = Probe(context.Background(), quiet.Addr().String(), 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "not an autobyte listener") {
		t.Errorf("Probe of a silent listener: %v, want not an autobyte listener", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("Probe took %v with a 300ms timeout", el)
	}
	addr := quiet.Addr().String()
	quiet.Close()
	if err := Probe(context.Background(), addr, 300*time.Millisecond); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("Probe of a closed port: %v, want connection refused", err)
	}
}
