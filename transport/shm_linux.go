package transport

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Same-host connections carry their bytes through shared memory.
//
// Why: on one host a TCP connection costs the kernel's whole protocol path
// for every byte, about 0.5 ms of CPU per MiB on loopback here, where two
// copies through shared memory cost about 0.14 ms (docs/transport.md). On
// a host whose cores the training computation needs, that difference is
// step time.
//
// How: after the handshake, a client whose connection is same-host (its
// local and remote IP are equal, e.g. loopback) creates a file in
// /dev/shm holding two single-producer single-consumer byte rings, one per
// direction, and offers its name and a random tag over the authenticated
// TCP connection; the server opens it, checks the tag and the size, and
// accepts, and the client unlinks the file (the mappings stay). Frames are
// then copied into and out of the rings exactly as they were written to
// and read from the socket. The TCP connection stays open and carries one
// byte per wake-up of a reader ("doorbell" 'D', sent when a consumer that
// said it waits, readerWaiting, has new bytes). A waiting reader parks in
// the poller on that socket, so read deadlines, a peer that dies (EOF,
// reset) and a peer that goes silent (no heartbeat within PeerTimeout) are
// noticed as they are on plain TCP. A producer waiting for space
// (writerWaiting) sleeps on a futex on that word in the shared mapping,
// which the consumer wakes: it needs no reader of its own connection,
// which may be busy elsewhere or absent (a one-way stream).
//
// The peer is authenticated but its memory is not trusted: a head or tail
// position that would put more than a ring's size between them fails the
// connection, and every copy is bounded by the size agreed here, never by
// a value read from shared memory.

const (
	// DefaultSharedMemoryRing is the size of each direction's ring.
	// Bytes in a ring are sent in the order written, as in a socket's send
	// buffer, so it is kept small for priority order; the consumer drains
	// it at memory speed.
	DefaultSharedMemoryRing = 2 << 20
	minSharedMemoryRing     = 64 << 10
	maxSharedMemoryRing     = 256 << 20

	shmDir    = "/dev/shm"
	shmPrefix = "autobyte-"
	shmMagic  = "autobyte shm v1\x00"
	shmTagLen = 16

	// Segment layout: a header page, then ring 0 (client -> server), then
	// ring 1 (server -> client).
	shmHeaderSize = 4096
	shmCtrl0      = 128 // ring 0's control block; ring 1's is at shmCtrl0+shmCtrlSize
	shmCtrlSize   = 256

	doorbellData = 'D'

	// spaceWait bounds one wait of a producer for free space on the
	// futex; it looks again after it whatever woke it (the consumer and
	// Close wake it at once, so this is only a safety net).
	spaceWait = 100 * time.Millisecond

	// futex(2) operations on a word two processes share (no
	// FUTEX_PRIVATE_FLAG).
	futexWait = 0
	futexWake = 1
)

// ringCtrl is a ring's control block in shared memory. The producer owns
// head and clears readerWaiting; the consumer owns tail and clears
// writerWaiting. Fields are on separate cache lines.
type ringCtrl struct {
	head          atomic.Uint64 // bytes ever written
	_             [56]byte
	readerWaiting atomic.Uint32 // set by a consumer about to block
	_             [60]byte
	tail          atomic.Uint64 // bytes ever consumed
	_             [56]byte
	writerWaiting atomic.Uint32 // set by a producer about to block
	_             [60]byte
}

// shmSegment is one connection's mapped file.
type shmSegment struct {
	mem  []byte
	size int // bytes per ring
	path string
}

func (s *shmSegment) ctrl(ring int) *ringCtrl {
	return (*ringCtrl)(unsafe.Pointer(&s.mem[shmCtrl0+ring*shmCtrlSize]))
}

func (s *shmSegment) data(ring int) []byte {
	off := shmHeaderSize + ring*s.size
	return s.mem[off : off+s.size : off+s.size]
}

func shmSegmentSize(ring int) int { return shmHeaderSize + 2*ring }

func checkRingSize(n int) error {
	if n < minSharedMemoryRing || n > maxSharedMemoryRing {
		return fmt.Errorf("shared-memory ring of %d bytes out of range [%d, %d]", n, minSharedMemoryRing, maxSharedMemoryRing)
	}
	return nil
}

// sweepOnce removes, before a process creates its first segment, the
// segments of processes that died between creating theirs and unlinking it
// (a segment is unlinked as soon as the handshake is answered, so only a
// kill inside a handshake leaves one).
var sweepOnce sync.Once

// sweepStaleSegments removes the /dev/shm/autobyte-PID-* files whose PID
// names no running process. A file of a live process in another PID
// namespace that shares /dev/shm may go too; that handshake then falls back
// to TCP (the server cannot open it), so nothing is lost.
func sweepStaleSegments() (removed int) {
	entries, err := os.ReadDir(shmDir)
	if err != nil {
		return 0
	}
	for _, e := range entries {
		pid, ok := segmentPID(e.Name())
		if !ok || !e.Type().IsRegular() {
			continue
		}
		if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
			if unix.Unlink(filepath.Join(shmDir, e.Name())) == nil {
				removed++
			}
		}
	}
	return removed
}

// segmentPID parses the PID out of a name createSegment makes.
func segmentPID(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, shmPrefix)
	if !ok {
		return 0, false
	}
	digits, _, ok := strings.Cut(rest, "-")
	if !ok || digits == "" || len(digits) > 9 {
		return 0, false
	}
	pid := 0
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
		pid = pid*10 + int(c-'0')
	}
	return pid, pid > 0
}

// createSegment creates, sizes (allocating every page now, so that a full
// /dev/shm fails here rather than with SIGBUS later) and maps a segment.
func createSegment(ring int) (*shmSegment, []byte, error) {
	if err := checkRingSize(ring); err != nil {
		return nil, nil, err
	}
	sweepOnce.Do(func() { sweepStaleSegments() })
	var rnd [8]byte
	rand.Read(rnd[:])
	path := filepath.Join(shmDir, fmt.Sprintf("%s%d-%s", shmPrefix, os.Getpid(), hex.EncodeToString(rnd[:])))
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("creating %s: %w", path, err)
	}
	defer unix.Close(fd)
	size := shmSegmentSize(ring)
	if err := unix.Fallocate(fd, 0, 0, int64(size)); err != nil {
		unix.Unlink(path)
		return nil, nil, fmt.Errorf("allocating %d bytes for %s: %w", size, path, err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Unlink(path)
		return nil, nil, fmt.Errorf("mapping %s: %w", path, err)
	}
	tag := make([]byte, shmTagLen)
	rand.Read(tag)
	copy(mem, shmMagic)
	copy(mem[len(shmMagic):], tag)
	return &shmSegment{mem: mem, size: ring, path: path}, tag, nil
}

// openSegment maps the segment a peer offered, checking that its name is
// one createSegment makes, that it is a regular file of the offered size
// and that it carries the offered tag.
func openSegment(path string, ring int, tag []byte) (*shmSegment, error) {
	if err := checkRingSize(ring); err != nil {
		return nil, err
	}
	if filepath.Dir(path) != shmDir || !strings.HasPrefix(filepath.Base(path), shmPrefix) || strings.ContainsAny(filepath.Base(path), "/\x00") {
		return nil, fmt.Errorf("offered segment %q is not a %s/%s* file", path, shmDir, shmPrefix)
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	size := shmSegmentSize(ring)
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != int64(size) {
		return nil, fmt.Errorf("%s: mode %o, %d bytes; want a regular file of %d bytes", path, st.Mode, st.Size, size)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mapping %s: %w", path, err)
	}
	if string(mem[:len(shmMagic)]) != shmMagic || string(mem[len(shmMagic):len(shmMagic)+shmTagLen]) != string(tag) {
		unix.Munmap(mem)
		return nil, fmt.Errorf("%s does not carry the offered tag", path)
	}
	return &shmSegment{mem: mem, size: ring, path: path}, nil
}

func (s *shmSegment) unlink() { unix.Unlink(s.path) }
func (s *shmSegment) unmap()  { unix.Munmap(s.mem) }

// sameHost reports whether a TCP connection joins two sockets of one host:
// its local and remote IP are the same address (loopback, or the host's
// own address). Hosts in separate network namespaces, as on the testbed,
// have different addresses and keep TCP, and its shaping.
func sameHost(tcp *net.TCPConn) bool {
	l, lok := tcp.LocalAddr().(*net.TCPAddr)
	r, rok := tcp.RemoteAddr().(*net.TCPAddr)
	return lok && rok && l.IP.Equal(r.IP)
}

// shmConn is a net.Conn whose bytes go through a segment's rings and whose
// wake-ups, deadlines and liveness go through the TCP connection.
type shmConn struct {
	*rawSocket
	seg       *shmSegment
	out, in   *ringCtrl
	outData   []byte
	inData    []byte
	peer      string
	closed    chan struct{}
	closeOnce sync.Once
	eof       bool // consumer only: the TCP side reached EOF

	writeDeadline atomic.Int64 // unix nanoseconds; 0 = none

	// Users of the mapping: the segment is unmapped when the connection
	// is closed and the last Read or Write using it has returned.
	mu     sync.Mutex
	users  int
	isDone bool

	doorbells [64]byte // consumer only
}

// sharedConn wraps sock; ring is the index of the ring we write.
func sharedConn(sock *rawSocket, seg *shmSegment, ring int, peer string) (*shmConn, error) {
	return &shmConn{
		rawSocket: sock, seg: seg,
		out: seg.ctrl(ring), in: seg.ctrl(1 - ring),
		outData: seg.data(ring), inData: seg.data(1 - ring),
		peer:   peer,
		closed: make(chan struct{}),
	}, nil
}

func (c *shmConn) acquire() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.isDone {
		return false
	}
	c.users++
	return true
}

func (c *shmConn) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.users--
	if c.isDone && c.users == 0 && c.seg != nil {
		c.seg.unmap()
		c.seg = nil
	}
}

// Close closes the TCP connection, which wakes a blocked reader, stops a
// producer waiting for space, and unmaps the segment once neither uses it.
func (c *shmConn) Close() error {
	var err error
	c.closeOnce.Do(func() {
		close(c.closed)
		// A producer of ours waiting for space holds the mapping (it is a
		// user), and one about to wait finds the word changed.
		c.out.writerWaiting.Store(0)
		wakeFutex(&c.out.writerWaiting)
		err = c.rawSocket.Close()
		c.mu.Lock()
		c.isDone = true
		if c.users == 0 && c.seg != nil {
			c.seg.unmap()
			c.seg = nil
		}
		c.mu.Unlock()
	})
	return err
}

func (c *shmConn) SetWriteDeadline(t time.Time) error {
	if t.IsZero() {
		c.writeDeadline.Store(0)
	} else {
		c.writeDeadline.Store(t.UnixNano())
	}
	return nil
}

func (c *shmConn) SetDeadline(t time.Time) error {
	c.SetWriteDeadline(t)
	return c.rawSocket.SetReadDeadline(t)
}

func (c *shmConn) closedErr(op string) error {
	return c.opError(op, net.ErrClosed)
}

func (c *shmConn) corrupt(what string, a, b uint64) error {
	return c.opError("read", fmt.Errorf("shared-memory ring shared with %s is corrupt: %s (head %d, tail %d, ring %d bytes)", c.peer, what, a, b, len(c.inData)))
}

// ring returns the bytes between positions from and from+n of data,
// which may wrap, as one or two slices.
func ringSpan(data []byte, from uint64, n int) ([]byte, []byte) {
	off := int(from % uint64(len(data)))
	if off+n <= len(data) {
		return data[off : off+n], nil
	}
	return data[off:], data[:n-(len(data)-off)]
}

// ring's doorbell: one byte on the TCP connection.
func (c *shmConn) ring(b byte) error {
	_, err := c.rawSocket.Write([]byte{b})
	return err
}

func (c *shmConn) Write(b []byte) (int, error) {
	n, err := c.writev([][]byte{b})
	return int(n), err
}

// writev copies every byte of bufs into the outgoing ring, waiting for
// space as needed, and wakes the consumer if it waits.
func (c *shmConn) writev(bufs [][]byte) (int64, error) {
	if !c.acquire() {
		return 0, c.closedErr("write")
	}
	defer c.release()
	size := uint64(len(c.outData))
	var total int64
	head := c.out.head.Load()
	for len(bufs) > 0 {
		tail := c.out.tail.Load()
		if head-tail > size || tail > head {
			return total, c.opError("write", fmt.Errorf("shared-memory ring shared with %s is corrupt: tail %d beyond head %d (ring %d bytes)", c.peer, tail, head, size))
		}
		free := int(size - (head - tail))
		if free == 0 {
			if err := c.waitSpace(head, size); err != nil {
				return total, err
			}
			continue
		}
		wrote := 0
		for len(bufs) > 0 && wrote < free {
			n := min(free-wrote, len(bufs[0]))
			a, z := ringSpan(c.outData, head+uint64(wrote), n)
			copy(a, bufs[0])
			copy(z, bufs[0][len(a):n])
			wrote += n
			if bufs[0] = bufs[0][n:]; len(bufs[0]) == 0 {
				bufs = bufs[1:]
			}
		}
		head += uint64(wrote)
		total += int64(wrote)
		raceReleaseRing()
		c.out.head.Store(head)
		if c.out.readerWaiting.CompareAndSwap(1, 0) {
			if err := c.ring(doorbellData); err != nil {
				return total, err
			}
		}
	}
	return total, nil
}

// waitSpace waits until the consumer has freed space in the outgoing ring,
// the connection closes or the write deadline passes. It sleeps on the
// futex of the ring's writerWaiting word, which the consumer clears and
// wakes after freeing space: a wake-up that needs no reader on our side.
func (c *shmConn) waitSpace(head, size uint64) error {
	c.out.writerWaiting.Store(1)
	if head-c.out.tail.Load() < size {
		c.out.writerWaiting.CompareAndSwap(1, 0)
		return nil
	}
	select {
	case <-c.closed:
		return c.closedErr("write")
	default:
	}
	wait := spaceWait
	if dl := c.writeDeadline.Load(); dl != 0 {
		left := time.Until(time.Unix(0, dl))
		if left <= 0 {
			return c.opError("write", os.ErrDeadlineExceeded)
		}
		wait = min(wait, left)
	}
	// Returns at once if the consumer (or Close) cleared the word since.
	sleepFutex(&c.out.writerWaiting, 1, wait)
	return nil
}

// sleepFutex sleeps while *word == val, at most d, or until woken. A
// blocking system call: the Go scheduler moves other goroutines off this
// thread meanwhile.
func sleepFutex(word *atomic.Uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(word)), futexWait, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// wakeFutex wakes the one sleeper on word, if any; it never blocks.
func wakeFutex(word *atomic.Uint32) {
	unix.RawSyscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(word)), futexWake, 1, 0, 0, 0)
}

// Read copies what the incoming ring holds into b, blocking on the TCP
// connection for a doorbell while it is empty.
func (c *shmConn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	if !c.acquire() {
		return 0, c.closedErr("read")
	}
	defer c.release()
	size := uint64(len(c.inData))
	tail := c.in.tail.Load()
	for {
		head := c.in.head.Load()
		if head < tail || head-tail > size {
			return 0, c.corrupt("head and tail more than a ring apart", head, tail)
		}
		if avail := int(head - tail); avail > 0 {
			raceAcquireRing()
			n := min(avail, len(b))
			a, z := ringSpan(c.inData, tail, n)
			copy(b, a)
			copy(b[len(a):n], z)
			c.in.tail.Store(tail + uint64(n))
			if c.in.writerWaiting.CompareAndSwap(1, 0) {
				wakeFutex(&c.in.writerWaiting)
			}
			return n, nil
		}
		if c.eof {
			return 0, io.EOF
		}
		c.in.readerWaiting.Store(1)
		if c.in.head.Load() != tail {
			c.in.readerWaiting.CompareAndSwap(1, 0) // a stray 'D' may follow; harmless
			continue
		}
		if err := c.waitDoorbell(); err != nil {
			return 0, err
		}
	}
}

// waitDoorbell reads doorbells from the TCP connection ('D': bytes for us,
// look again). EOF is remembered: bytes the
// peer wrote before hanging up are still in the ring, so Read looks once
// more before it reports EOF.
func (c *shmConn) waitDoorbell() error {
	n, err := c.rawSocket.Read(c.doorbells[:])
	for _, d := range c.doorbells[:n] {
		switch d {
		case doorbellData:
		default:
			return c.opError("read", fmt.Errorf("%s sent byte 0x%02x on a shared-memory connection's doorbell socket, want 'D'", c.peer, d))
		}
	}
	if errors.Is(err, io.EOF) {
		c.eof = true
		return nil
	}
	return err
}

// CloseWrite half-closes the TCP connection after the bytes already in the
// ring: the peer reads them before it sees EOF.
func (c *shmConn) CloseWrite() error { return c.rawSocket.CloseWrite() }

var _ net.Conn = (*shmConn)(nil)
