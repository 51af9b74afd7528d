package transport

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// ourSegments lists this process's segment files in /dev/shm.
func ourSegments(t *testing.T) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(shmDir, fmt.Sprintf("%s%d-*", shmPrefix, os.Getpid())))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestSharedMemoryOnlyForSameHostPlainConnections(t *testing.T) {
	checkLeaks(t)
	shaped := testConfig("worker", 1)
	shaped.Egress = rate.NewLimiter(rate.Inf, 0)
	for _, tc := range []struct {
		name   string
		sc, cc Config
		want   bool
	}{
		{"default", testConfig("server", 0), testConfig("worker", 1), true},
		{"small ring", testConfig("server", 0), ringConfig("worker", 1, minSharedMemoryRing), true},
		{"client off", testConfig("server", 0), ringConfig("worker", 1, -1), false},
		{"server off", ringConfig("server", 0, -1), testConfig("worker", 1), false},
		{"client has a limiter", testConfig("server", 0), shaped, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, cli := pair(t, tc.sc, tc.cc)
			if srv.SharedMemory() != tc.want || cli.SharedMemory() != tc.want {
				t.Fatalf("server shares memory: %v, client: %v; want %v", srv.SharedMemory(), cli.SharedMemory(), tc.want)
			}
			// Either way the connection works, both ways.
			if err := cli.Send(Frame{Header: Header{Kind: KindPush, Key: 1}, Payload: []byte("up")}); err != nil {
				t.Fatal(err)
			}
			if f, err := srv.Recv(); err != nil || string(f.Payload) != "up" {
				t.Fatalf("server received %q, %v", f.Payload, err)
			}
			if err := srv.Send(Frame{Header: Header{Kind: KindAggregate, Key: 1}, Payload: []byte("down")}); err != nil {
				t.Fatal(err)
			}
			if f, err := cli.Recv(); err != nil || string(f.Payload) != "down" {
				t.Fatalf("client received %q, %v", f.Payload, err)
			}
			if left := ourSegments(t); len(left) != 0 {
				t.Fatalf("segment files left in %s after the handshake: %v", shmDir, left)
			}
		})
	}
}

// Frames of every size, both ways at once, through rings much smaller
// than the frames: every byte arrives in order, and it went through the
// rings, not the socket.
func TestSharedMemoryStreamsThroughSmallRings(t *testing.T) {
	checkLeaks(t)
	srv, cli := pair(t, ringConfig("server", 0, minSharedMemoryRing), ringConfig("worker", 1, minSharedMemoryRing))
	if !srv.SharedMemory() || !cli.SharedMemory() {
		t.Fatal("loopback connection does not share memory")
	}
	const frames = 150
	payloads := func(seed uint64) [][]byte {
		r := mrand.New(mrand.NewPCG(seed, 1))
		out := make([][]byte, frames)
		for i := range out {
			n := r.IntN(300 << 10)
			if i%10 == 0 {
				n = 0
			}
			out[i] = make([]byte, n)
			for j := range out[i] {
				out[i][j] = byte(r.Uint32())
			}
		}
		return out
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	run := func(from, to *Conn, seed uint64) {
		want := payloads(seed)
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i, p := range want {
				if err := from.Send(Frame{Header: Header{Kind: KindRing, Key: uint32(i)}, Payload: p}); err != nil {
					errs <- err
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			for i, p := range want {
				f, err := to.Recv()
				if err != nil {
					errs <- err
					return
				}
				if f.Key != uint32(i) || !bytes.Equal(f.Payload, p) {
					errs <- fmt.Errorf("frame %d: got key %d, %d bytes; want %d bytes", i, f.Key, len(f.Payload), len(p))
					return
				}
			}
		}()
	}
	run(cli, srv, 1)
	run(srv, cli, 2)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// What the connection counted as sent is what went through its ring.
	for _, c := range []*Conn{cli, srv} {
		sent, _ := c.Stats()
		head := int64(c.nc.(*shmConn).out.head.Load())
		if head < sent || sent < frames*HeaderSize {
			t.Fatalf("%s: sent %d bytes but its ring carried %d", c.Peer(), sent, head)
		}
	}
}

// A producer waiting for space is woken by the consumer itself, not by a
// reader of its own connection (a one-way stream has none) and not by its
// safety-net timeout: 40 ring-fulls, each needing a wake-up, take far less
// than 40 timeouts. Waking only on the timeout takes 40 * spaceWait (4 s).
func TestSharedMemoryProducerWokenWithoutReader(t *testing.T) {
	checkLeaks(t)
	srv, cli := pair(t, ringConfig("server", 0, minSharedMemoryRing), ringConfig("worker", 1, minSharedMemoryRing))
	if !cli.SharedMemory() {
		t.Fatal("loopback connection does not share memory")
	}
	const frames = 40
	payload := make([]byte, minSharedMemoryRing)
	start := time.Now()
	go func() {
		for i := range frames {
			if err := cli.Send(Frame{Header: Header{Kind: KindPush, Key: uint32(i)}, Payload: payload}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	buf := make([]byte, len(payload))
	for i := range frames {
		f, err := srv.RecvInto(buf)
		if err != nil {
			t.Fatal(err)
		}
		if f.Key != uint32(i) {
			t.Fatalf("frame %d has key %d", i, f.Key)
		}
	}
	if d, limit := time.Since(start), frames*spaceWait/4; d > limit {
		t.Fatalf("%d ring-fulls one way took %v, want under %v: the producer waited for its timeout instead of being woken", frames, d, limit)
	}
}

// A producer waiting for space in a full ring stops when the connection
// fails: the peer dies, or we close.
func TestSharedMemoryFullRingDoesNotHang(t *testing.T) {
	checkLeaks(t)
	for _, how := range []string{"peer killed", "closed here"} {
		t.Run(how, func(t *testing.T) {
			srv, cli := pair(t, ringConfig("server", 0, minSharedMemoryRing), ringConfig("worker", 1, minSharedMemoryRing))
			done := make(chan error, 1)
			// The server never reads: 1 MiB cannot fit into 64 KiB.
			if err := cli.SendNotify(Frame{Header: Header{Kind: KindPush}, Payload: make([]byte, 1<<20)}, func(err error) { done <- err }); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				t.Fatalf("a 1 MiB frame was written into a 64 KiB ring nobody reads: %v", err)
			case <-time.After(100 * time.Millisecond):
			}
			go cli.Recv() // the reader notices a dead peer
			start := time.Now()
			if how == "peer killed" {
				srv.tcp.SetLinger(0)
				srv.nc.Close()
			} else {
				cli.Close()
			}
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("the frame was reported written")
				}
				if el := time.Since(start); el > time.Second {
					t.Fatalf("the blocked write ended %v after the connection failed", el)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the blocked write did not end within 5 s of the connection failing")
			}
		})
	}
}

// A peer that puts nonsense into the shared control block fails the
// connection with an error naming it; nothing panics.
func TestSharedMemoryCorruptRing(t *testing.T) {
	checkLeaks(t)
	srv, cli := pair(t, testConfig("server", 0), testConfig("worker", 4))
	if !cli.SharedMemory() {
		t.Fatal("loopback connection does not share memory")
	}
	sc := cli.nc.(*shmConn)
	sc.out.head.Store(sc.out.tail.Load() + uint64(len(sc.outData)) + 1)
	if err := sc.ring(doorbellData); err != nil {
		t.Fatal(err)
	}
	_, err := srv.Recv()
	mustContain(t, err, "shared-memory ring shared with worker 4 (127.0.0.1:", "is corrupt")
}

// rawOffer authenticates as a client on nc and sends a shared-memory
// offer, returning the server's answer ('Y' or 'N').
func rawOffer(t *testing.T, nc net.Conn, cfg Config, ring int, tag []byte, path string) byte {
	t.Helper()
	nc.SetDeadline(time.Now().Add(5 * time.Second))
	defer nc.SetDeadline(time.Time{})
	if _, _, err := clientAuth(nc, cfg, nc.RemoteAddr().String()); err != nil {
		t.Fatal(err)
	}
	offer := msgPrefix(msgOffer)
	offer = binary.LittleEndian.AppendUint32(offer, uint32(ring))
	offer = append(offer, tag...)
	offer = append(offer, byte(len(path)))
	offer = append(offer, path...)
	if _, err := nc.Write(offer); err != nil {
		t.Fatal(err)
	}
	reply := make([]byte, 4)
	if err := readMsg(nc, reply, "reply", time.Second); err != nil {
		t.Fatal(err)
	}
	return reply[3]
}

// Offers the server must decline: a file outside /dev/shm, a tag that is
// not the file's, a size that is not the file's, a ring size out of
// range. A declined connection goes on over TCP.
func TestSharedMemoryBadOffersDeclined(t *testing.T) {
	checkLeaks(t)
	seg, tag, err := createSegment(minSharedMemoryRing)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.unmap()
	defer seg.unlink()
	other := append([]byte(nil), tag...)
	other[0] ^= 1
	for _, tc := range []struct {
		name string
		ring int
		tag  []byte
		path string
		want byte
	}{
		{"good", minSharedMemoryRing, tag, seg.path, msgAccept},
		{"outside /dev/shm", minSharedMemoryRing, tag, "/etc/passwd", msgDecline},
		{"traversal", minSharedMemoryRing, tag, shmDir + "/" + shmPrefix + "x/../../etc/passwd", msgDecline},
		{"not ours", minSharedMemoryRing, tag, shmDir + "/" + shmPrefix + "missing", msgDecline},
		{"wrong tag", minSharedMemoryRing, other, seg.path, msgDecline},
		{"wrong size", 2 * minSharedMemoryRing, tag, seg.path, msgDecline},
		{"ring too small", 1024, tag, seg.path, msgDecline},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := listen(t, testConfig("server", 0))
			nc, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			if got := rawOffer(t, nc, testConfig("worker", 2), tc.ring, tc.tag, tc.path); got != tc.want {
				t.Fatalf("answer %q, want %q", got, tc.want)
			}
			srv := accept(t, l)
			if srv.SharedMemory() != (tc.want == msgAccept) {
				t.Fatalf("server shares memory: %v after answering %q", srv.SharedMemory(), tc.want)
			}
			if tc.want == msgDecline {
				// The connection goes on over TCP.
				nc.Write(Header{Kind: KindControl, Aux: 9}.Append(nil))
				if f, err := srv.Recv(); err != nil || f.Aux != 9 {
					t.Fatalf("after a declined offer: %+v, %v", f, err)
				}
			}
		})
	}
}

func TestSharedMemoryRingSizeChecked(t *testing.T) {
	for _, n := range []int{-2, 1, minSharedMemoryRing - 1, maxSharedMemoryRing + 1} {
		cfg := ringConfig("worker", 0, n)
		_, err := Dial(context.Background(), "127.0.0.1:1", cfg)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("SharedMemoryRing %d out of range", n)) {
			t.Fatalf("SharedMemoryRing %d: %v", n, err)
		}
	}
}

// A segment left by a process killed inside a handshake is removed by the
// next process that creates one; segments of live processes and files that
// are not segments stay.
func TestStaleSegmentsSwept(t *testing.T) {
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(shmDir, fmt.Sprintf("%s%d-%s", shmPrefix, dead.Process.Pid, "0123456789abcdef"))
	live := filepath.Join(shmDir, fmt.Sprintf("%s%d-%s", shmPrefix, os.Getpid(), "stale-test"))
	other := filepath.Join(shmDir, shmPrefix+"x1-not-a-pid")
	for _, p := range []string{stale, live, other} {
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(p) })
	}
	if n := sweepStaleSegments(); n < 1 {
		t.Errorf("sweep removed %d files, want at least the stale one", n)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("%s of dead process %d still there (stat: %v)", stale, dead.Process.Pid, err)
	}
	for _, p := range []string{live, other} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was removed: %v", p, err)
		}
	}
}

func TestSegmentPID(t *testing.T) {
	for name, want := range map[string]int{
		"autobyte-123-abcd": 123, "autobyte-1-x": 1,
		"autobyte--x": 0, "autobyte-12a-x": 0, "autobyte-123": 0, "autobyte-0-x": 0,
		"other-123-x": 0, "autobyte-1234567890-x": 0,
	} {
		got, ok := segmentPID(name)
		if ok != (want > 0) || got != want && ok {
			t.Errorf("segmentPID(%q) = %d, %v; want %d", name, got, ok, want)
		}
	}
}
