package transport

import (
	"context"
	"io"
	"net"
	"testing"
)

const benchFrame = 4 << 20

// BenchmarkLoopbackThroughput sends 4 MiB push frames over one Conn pair on
// 127.0.0.1 (default config: 256 KiB SO_SNDBUF, unshaped) with up to 4
// frames queued; the receiver allocates each payload, as Recv does.
func BenchmarkLoopbackThroughput(b *testing.B) { benchLoopback(b, false) }

// BenchmarkLoopbackRecvInto is BenchmarkLoopbackThroughput with the
// receiver reusing one payload buffer (RecvInto).
func BenchmarkLoopbackRecvInto(b *testing.B) { benchLoopback(b, true) }

func benchLoopback(b *testing.B, reuse bool) {
	l, err := Listen("127.0.0.1:0", testConfig("server", 0))
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
	cli, err := Dial(context.Background(), l.Addr().String(), testConfig("worker", 1))
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	srv := <-ch
	if srv == nil {
		b.FailNow()
	}
	defer srv.Close()

	payload := make([]byte, benchFrame)
	b.SetBytes(benchFrame)
	b.ResetTimer()
	done := make(chan error, 1)
	n := b.N
	go func() {
		var buf []byte
		if reuse {
			buf = make([]byte, benchFrame)
		}
		for range n {
			f, err := srv.RecvInto(buf)
			if err == nil && len(f.Payload) != benchFrame {
				err = io.ErrShortBuffer
			}
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	window := make(chan struct{}, 4)
	for i := range n {
		window <- struct{}{}
		if err := cli.SendNotify(Frame{Header: Header{Kind: KindPush, Priority: uint64(i)}, Payload: payload}, func(error) { <-window }); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkRawTCP moves the same bytes (52-byte header + 4 MiB payload per
// frame, written with writev) over a plain TCP pair with default kernel
// buffers and TCP_NODELAY, the receiver reusing one buffer: the ceiling
// BenchmarkLoopbackThroughput is compared with.
func BenchmarkRawTCP(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			b.Error(err)
		}
		ch <- c
	}()
	cli, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	srv := <-ch
	if srv == nil {
		b.FailNow()
	}
	defer srv.Close()
	cli.(*net.TCPConn).SetNoDelay(true)

	hdr := Header{Kind: KindPush, Length: benchFrame}.Append(nil)
	payload := make([]byte, benchFrame)
	b.SetBytes(benchFrame)
	b.ResetTimer()
	done := make(chan error, 1)
	n := b.N
	go func() {
		h := make([]byte, HeaderSize)
		buf := make([]byte, benchFrame)
		for range n {
			if _, err := io.ReadFull(srv, h); err != nil {
				done <- err
				return
			}
			if _, err := io.ReadFull(srv, buf); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for range n {
		bufs := net.Buffers{hdr, payload}
		if _, err := bufs.WriteTo(cli); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
