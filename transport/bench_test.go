package transport

import (
	"context"
	"io"
	"net"
	"runtime"
	"testing"
)

const benchFrame = 4 << 20

// BenchmarkLoopbackThroughput sends 4 MiB push frames over one Conn pair on
// 127.0.0.1 (default config: 256 KiB SO_SNDBUF, unshaped) with up to 4
// frames queued; the receiver allocates each payload, as Recv does. It
// runs over shared memory (the default on one host) and over TCP, and
// reports the process's CPU (both ends) per MiB moved.
func BenchmarkLoopbackThroughput(b *testing.B) { benchWires(b, false) }

// BenchmarkLoopbackRecvInto is BenchmarkLoopbackThroughput with the
// receiver reusing one payload buffer (RecvInto).
func BenchmarkLoopbackRecvInto(b *testing.B) { benchWires(b, true) }

func benchWires(b *testing.B, reuse bool) {
	for _, w := range []struct {
		name string
		ring int
	}{{"shm", 0}, {"tcp", -1}} {
		b.Run(w.name, func(b *testing.B) {
			cpu := processCPU()
			benchLoopback(b, reuse, w.ring)
			b.ReportMetric(float64((processCPU()-cpu).Microseconds())/1000/(float64(b.N)*benchFrame/(1<<20)), "cpu-ms/MiB")
		})
	}
}

func benchLoopback(b *testing.B, reuse bool, ring int) {
	l, err := Listen("127.0.0.1:0", ringConfig("server", 0, ring))
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ch := make(chan *Conn, 1)
	go func() {
		c, err := l.Accept(context.Background())
		if err != nil {
			b.Error(err)
		}
		ch <- c
	}()
	cli, err := Dial(context.Background(), l.Addr().String(), ringConfig("worker", 1, ring))
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	srv := <-ch
	if srv == nil {
		b.FailNow()
	}
	defer srv.Close()
	if want := ring == 0 && runtime.GOOS == "linux"; cli.SharedMemory() != want {
		b.Fatalf("shared memory: %v, want %v", cli.SharedMemory(), want)
	}

	var buf []byte
	if reuse {
		buf = make([]byte, benchFrame)
	}
	payload := make([]byte, benchFrame)
	window := make(chan struct{}, 4)
	benchFrames(b, func() error {
		f, err := srv.RecvInto(buf)
		if err == nil && len(f.Payload) != benchFrame {
			err = io.ErrShortBuffer
		}
		return err
	}, func(i int) error {
		window <- struct{}{}
		return cli.SendNotify(Frame{Header: Header{Kind: KindPush, Priority: uint64(i)}, Payload: payload}, func(error) { <-window })
	})
}

// BenchmarkRawTCP moves the same bytes (52-byte header + 4 MiB payload per
// frame, written with writev) over a plain TCP pair with default kernel
// buffers and TCP_NODELAY, the receiver reusing one buffer: the ceiling
// BenchmarkLoopbackThroughput is compared with.
func BenchmarkRawTCP(b *testing.B) {
	cli, srv := tcpLoopbackPair(b)
	cli.SetNoDelay(true)

	hdr := Header{Kind: KindPush, Length: benchFrame}.Append(nil)
	payload := make([]byte, benchFrame)
	h := make([]byte, HeaderSize)
	buf := make([]byte, benchFrame)
	benchFrames(b, func() error {
		if _, err := io.ReadFull(srv, h); err != nil {
			return err
		}
		_, err := io.ReadFull(srv, buf)
		return err
	}, func(int) error {
		bufs := net.Buffers{hdr, payload}
		_, err := bufs.WriteTo(cli)
		return err
	})
}

// benchFrames times b.N frames of benchFrame bytes: send(i) writes frame i
// while receive, in a goroutine of its own, takes one frame a call. The
// benchmarks compared with one another share it so that they time the
// same thing.
func benchFrames(b *testing.B, receive func() error, send func(i int) error) {
	b.SetBytes(benchFrame)
	b.ResetTimer()
	done := make(chan error, 1)
	n := b.N
	go func() {
		for range n {
			if err := receive(); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for i := range n {
		if err := send(i); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// tcpLoopbackPair is a connected pair of plain TCP connections on
// loopback, closed when the test ends.
func tcpLoopbackPair(tb testing.TB) (client, server *net.TCPConn) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	peer := <-accepted
	if peer == nil {
		c.Close()
		tb.Fatal("loopback accept failed")
	}
	tb.Cleanup(func() { c.Close(); peer.Close() })
	return c.(*net.TCPConn), peer.(*net.TCPConn)
}
