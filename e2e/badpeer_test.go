package e2e

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/autobyte/autobyte/cluster"
	"github.com/autobyte/autobyte/transport"
)

const token = "e2e-token"

// TestBadPeersLiveServer connects a wrong token, garbage bytes and a stalled
// half handshake to a parameter server's data port, before and while the
// job runs: the server refuses each one, logs why at warn level, keeps
// running, and the job completes with exit status 0.
func TestBadPeersLiveServer(t *testing.T) {
	dataAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	common := []string{"--workers=2", "--servers=1", "--model=toy3", "--compute-scale=0.05", "--iterations=8",
		"--master=127.0.0.1:" + strconv.Itoa(freePort(t)), "--token=" + token}
	srv := start(t, "server 0", nil, append([]string{"server", "--index=0", "--listen=" + dataAddr, "--log-level=warn"}, common...)...)

	// While the server waits for its workers.
	wrongToken(t, dataAddr)
	garbage(t, dataAddr)
	stalled := stallHandshake(t, dataAddr)
	select {
	case d := <-stalled:
		if d < 4*time.Second || d > 8*time.Second {
			t.Errorf("stalled handshake dropped after %v, want after the 5 s handshake timeout", d)
		}
		t.Logf("stalled half handshake dropped by the server after %.2f s", d.Seconds())
	case <-time.After(10 * time.Second):
		t.Fatal("server kept a stalled half handshake open for 10 s")
	}
	if srv.exited() {
		t.Fatalf("server exited after bad peers: %v\n%s", srv.err, srv.output())
	}

	var workers []*proc
	for r := 0; r < 2; r++ {
		workers = append(workers, start(t, "worker "+strconv.Itoa(r), nil, append([]string{"worker", "--rank=" + strconv.Itoa(r), "--listen=127.0.0.1:0"}, common...)...))
	}
	// While the job runs.
	workers[0].waitLine(t, "iteration 1/", 30*time.Second)
	wrongToken(t, dataAddr)
	garbage(t, dataAddr)

	for _, p := range append(workers, srv) {
		if !p.wait(30 * time.Second) {
			t.Fatalf("%s did not finish within 30 s\n%s", p.name, p.output())
		}
		if p.code() != 0 {
			t.Errorf("%s exited %d, want 0 (bad peers must not break the job)\n%s", p.name, p.code(), p.output())
		}
		noCrash(t, p.name, p.output())
	}
	var s struct{ Error string }
	if err := json.Unmarshal([]byte(lastLine(workers[0].stdout.String())), &s); err != nil || s.Error != "" {
		t.Errorf("worker 0's summary: %q (err %v)", workers[0].stdout.String(), err)
	}
	log := srv.stderr.String()
	for _, want := range []string{"bad cluster token", "bad auth magic", "handshake timed out"} {
		found := false
		for _, l := range strings.Split(log, "\n") {
			if strings.Contains(l, "level=WARN") && strings.Contains(l, "refused peer") && strings.Contains(l, want) {
				found = true
			}
		}
		if !found {
			t.Errorf("server log has no warn-level refusal mentioning %q:\n%s", want, log)
		}
	}
}

// wrongToken dials with another token: the server must refuse it, saying why.
func wrongToken(t *testing.T, addr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := transport.Dial(ctx, addr, transport.Config{Token: "not-the-token", Role: "worker", Rank: 1})
	if err == nil {
		c.Close()
		t.Fatal("a peer with the wrong token was accepted")
	}
	var re *transport.RefusedError
	if !errors.As(err, &re) || !strings.Contains(re.Reason, "bad cluster token") {
		t.Errorf("wrong token: got %v, want a *RefusedError saying \"bad cluster token\"", err)
	}
}

// dialRaw connects to addr, retrying while nothing listens yet.
func dialRaw(t *testing.T, addr string) net.Conn {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("dial %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// garbage sends an HTTP request instead of the auth message: the server
// must answer with a refusal and hang up.
func garbage(t *testing.T, addr string) {
	t.Helper()
	c := dialRaw(t, addr)
	defer c.Close()
	hello := make([]byte, 36)
	if _, err := io.ReadFull(c, hello); err != nil {
		t.Fatalf("garbage peer: reading hello: %v", err)
	}
	if _, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + strings.Repeat("\xff", 100))); err != nil {
		t.Fatalf("garbage peer: %v", err)
	}
	// The server reads only the 4-byte prefix, so closing with our other
	// bytes unread makes its kernel send a reset: both are hanging up.
	reply, err := io.ReadAll(c)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("garbage peer: server did not hang up: %v (got %q)", err, reply)
	}
	if len(reply) < 5 || reply[3] != 'R' || !bytes.Contains(reply, []byte("bad auth magic")) {
		t.Errorf("garbage peer: got %q, want a refusal ('R') naming the bad auth magic", reply)
	}
}

// stallHandshake reads the hello, sends 20 of the 73+ auth bytes and stalls;
// the channel yields how long until the server hung up.
func stallHandshake(t *testing.T, addr string) <-chan time.Duration {
	t.Helper()
	c := dialRaw(t, addr)
	hello := make([]byte, 36)
	if _, err := io.ReadFull(c, hello); err != nil {
		t.Fatalf("stalled peer: reading hello: %v", err)
	}
	auth := authMessage(hello[4:], token, 0, "worker")
	if _, err := c.Write(auth[:20]); err != nil {
		t.Fatalf("stalled peer: %v", err)
	}
	began := time.Now()
	out := make(chan time.Duration, 1)
	go func() {
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.ReadAll(c)
		out <- time.Since(began)
	}()
	return out
}

// authMessage is the client's auth message of the handshake (docs/transport.md).
func authMessage(nonceS []byte, tok string, rank uint32, role string) []byte {
	nonceC := make([]byte, 32)
	_, _ = rand.Read(nonceC)
	m := hmac.New(sha256.New, []byte(tok))
	m.Write([]byte("autobyte client v1"))
	m.Write(nonceS)
	m.Write(binary.LittleEndian.AppendUint32(nil, rank))
	m.Write([]byte(role))
	b := binary.LittleEndian.AppendUint16(nil, transport.Magic)
	b = append(b, transport.Version, 'A')
	b = binary.LittleEndian.AppendUint32(b, rank)
	b = append(b, byte(len(role)))
	b = append(b, nonceC...)
	b = append(b, m.Sum(nil)...)
	return append(b, role...)
}

// rawHandshake authenticates on c as role rank by hand, so that the test
// can then write arbitrary bytes on an authenticated connection.
func rawHandshake(t *testing.T, c net.Conn, rank uint32, role string) {
	t.Helper()
	hello := make([]byte, 36)
	if _, err := io.ReadFull(c, hello); err != nil {
		t.Fatalf("handshake: reading hello: %v", err)
	}
	if _, err := c.Write(authMessage(hello[4:], token, rank, role)); err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 4+4+1+32)
	if _, err := io.ReadFull(c, head); err != nil {
		t.Fatalf("handshake: reading the server's reply: %v", err)
	}
	if head[3] != 'K' {
		t.Fatalf("handshake refused: %q", head)
	}
	if _, err := io.ReadFull(c, make([]byte, head[8])); err != nil {
		t.Fatal(err)
	}
	confirm := binary.LittleEndian.AppendUint16(nil, transport.Magic)
	if _, err := c.Write(append(confirm, transport.Version, 'C')); err != nil {
		t.Fatal(err)
	}
}

// TestBadFrameFromAuthenticatedPeer plays worker 0 (and the rendezvous) of
// a one-worker job against a real server process, authenticates properly,
// then sends a bad data frame: the server must exit non-zero, naming the
// peer and what was wrong with the frame, without a panic.
func TestBadFrameFromAuthenticatedPeer(t *testing.T) {
	push := func(length uint32) []byte {
		return transport.Header{Kind: transport.KindPush, Key: 0, Piece: 0, Length: length}.Append(nil)
	}
	cases := []struct {
		name string
		send []byte
		want []string
	}{
		{"garbage-header", bytes.Repeat([]byte{0xEE}, 64), []string{"bad frame from worker 0", "magic 0xeeee"}},
		{"truncated-payload", append(push(4096), make([]byte, 100)...), []string{"worker 0", "truncated frame", "100 of 4096 payload bytes"}},
		{"unknown-kind", transport.Header{Kind: 99}.Append(nil), []string{"bad frame from worker 0", "kind 99"}},
		{"push-not-float32s", append(push(6), make([]byte, 6)...), []string{"worker 0", "not whole float32s"}},
		{"ring-frame-to-server", transport.Header{Kind: transport.KindRing}.Append(nil), []string{"worker 0", "unexpected ring frame"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			master := "127.0.0.1:" + strconv.Itoa(freePort(t))
			ln, err := transport.Listen(master, transport.Config{Token: token, Role: "worker", Rank: 0})
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			srv := start(t, "server 0", nil, "server", "--index=0", "--workers=1", "--servers=1", "--model=toy3",
				"--iterations=3", "--master="+master, "--token="+token, "--listen=127.0.0.1:0")

			// The rendezvous, as rank 0 runs it.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ctl, err := ln.Accept(ctx)
			if err != nil {
				t.Fatalf("server did not register: %v\n%s", err, srv.output())
			}
			defer ctl.Close()
			f, err := ctl.Recv()
			if err != nil || f.Kind != transport.KindControl || f.Aux != cluster.CtlHello {
				t.Fatalf("want the server's hello, got %v frame subtype %d, err %v", f.Kind, f.Aux, err)
			}
			var m cluster.Member
			if err := json.Unmarshal(f.Payload, &m); err != nil {
				t.Fatal(err)
			}
			table, _ := json.Marshal(cluster.Table{Workers: []cluster.Member{{Role: "worker", Rank: 0, Digest: m.Digest}}, Servers: []cluster.Member{m}})
			if err := ctl.Send(transport.Frame{Header: transport.Header{Kind: transport.KindControl, Aux: cluster.CtlTable}, Payload: table}); err != nil {
				t.Fatal(err)
			}

			// Worker 0's data connection: a proper handshake, then the bad frame.
			data := dialRaw(t, m.Addr)
			defer data.Close()
			rawHandshake(t, data, 0, "worker")
			if _, err := data.Write(c.send); err != nil {
				t.Fatal(err)
			}
			if c.name == "truncated-payload" {
				data.Close()
			}
			sent := time.Now()
			if !srv.wait(10 * time.Second) {
				t.Fatalf("server still running 10 s after a bad frame\n%s", srv.output())
			}
			t.Logf("server exited %d after %.3f s: %s", srv.code(), srv.exit.Sub(sent).Seconds(), lastLine(srv.stderr.String()))
			if srv.code() == 0 {
				t.Errorf("server exited 0 after a bad frame\n%s", srv.output())
			}
			for _, w := range c.want {
				if !strings.Contains(srv.stderr.String(), w) {
					t.Errorf("server's error does not say %q:\n%s", w, srv.output())
				}
			}
			noCrash(t, "server", srv.output())
		})
	}
}
