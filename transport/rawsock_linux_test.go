package transport

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// tcpPair is a connected loopback pair: the first end wrapped as a
// rawSocket, the second a plain TCP connection.
func tcpPair(t *testing.T) (*rawSocket, *net.TCPConn) {
	t.Helper()
	c, peer := tcpLoopbackPair(t)
	rs, err := newRawSocket(c)
	if err != nil {
		t.Fatal(err)
	}
	return rs, peer
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

// Several buffers, larger together than the socket's buffers, written
// while the peer reads in small pieces: the writes are partial and wait
// for room, and every byte arrives once, in order.
func TestRawSocketWritevPartial(t *testing.T) {
	rs, peer := tcpPair(t)
	bufs := [][]byte{pattern(13, 1), nil, pattern(5<<20, 2), pattern(3<<20+7, 3)}
	want := bytes.Join(bufs, nil)
	errc := make(chan error, 1)
	go func() {
		n, err := rs.writev(bufs)
		if err == nil && n != int64(len(want)) {
			err = errors.New("short count")
		}
		errc <- err
	}()
	got := make([]byte, 0, len(want))
	chunk := make([]byte, 4096)
	for len(got) < len(want) {
		n, err := peer.Read(chunk)
		if err != nil {
			t.Fatalf("peer read after %d bytes: %v", len(got), err)
		}
		got = append(got, chunk[:n]...)
	}
	if err := <-errc; err != nil {
		t.Fatalf("writev: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("bytes differ")
	}
	// The bufs themselves were not modified.
	if !bytes.Equal(bufs[2], pattern(5<<20, 2)) {
		t.Fatal("writev modified its input")
	}
}

// Reads return what is there, EOF at the peer's close, and the net
// package's errors for deadlines, local close and a reset.
func TestRawSocketReadErrors(t *testing.T) {
	rs, peer := tcpPair(t)
	if _, err := peer.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 64)
	n, err := rs.Read(b)
	if err != nil || string(b[:n]) != "hello" {
		t.Fatalf("Read = %q, %v", b[:n], err)
	}
	rs.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := rs.Read(b); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("past the deadline: %v, want os.ErrDeadlineExceeded", err)
	}
	rs.SetReadDeadline(time.Time{})
	peer.Close()
	if _, err := rs.Read(b); err != io.EOF {
		t.Fatalf("after the peer closed: %v, want io.EOF", err)
	}

	rs2, peer2 := tcpPair(t)
	rs2.Close()
	if _, err := rs2.Read(b); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("after a local close: %v, want net.ErrClosed", err)
	}
	_ = peer2

	rs3, peer3 := tcpPair(t)
	peer3.SetLinger(0) // close with a reset
	peer3.Close()
	_, err = rs3.Read(b)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("after a reset: %v, want ECONNRESET", err)
	}
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "read" {
		t.Fatalf("reset error %v is not a read *net.OpError", err)
	}
}

// A plain TCP connection is read and written raw; a TLS one is not.
func TestConnUsesRawSocketForPlainTCP(t *testing.T) {
	rs, _ := tcpPair(t)
	c := newConn(rs.TCPConn, rs.TCPConn, Config{}, 1, "rank", nil, 0)
	defer c.Close()
	if rs, ok := c.nc.(*rawSocket); !ok || c.vw != vecWriter(rs) {
		t.Fatal("plain TCP connection not read raw")
	}
}
