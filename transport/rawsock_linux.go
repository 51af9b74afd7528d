package transport

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// rawSocket reads and writes a plain TCP connection with raw system calls
// (syscall.RawSyscall), which do not tell the Go scheduler that the
// goroutine entered the kernel. The socket is non-blocking, so a call
// never waits there: when it would, the goroutine parks in the poller as
// the net package's own calls do (RawConn.Read/Write), deadlines
// included.
//
// Why: the scheduled form (syscall.Syscall) wakes Go's system monitor out
// of its sleep whenever the process's processors were all idle, and the
// monitor then polls every 20 us for a millisecond or more. An engine that
// goes idle between frames makes thousands of such calls a second; on a
// host whose cores the training computation needs, each wake-up preempts
// it (about 2,250 wake-ups a second per plugin worker on ResNet-18,
// loopback, docs/pytorch.md). What it costs: a long copy in the kernel
// holds the goroutine's processor (it would run on it anyway), and a
// garbage collection's stop waits for the call to return.
type rawSocket struct {
	*net.TCPConn
	rc syscall.RawConn
}

func newRawSocket(tcp *net.TCPConn) (*rawSocket, error) {
	rc, err := tcp.SyscallConn()
	if err != nil {
		return nil, err
	}
	return &rawSocket{TCPConn: tcp, rc: rc}, nil
}

func (s *rawSocket) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	var n int
	var errno syscall.Errno
	err := s.rc.Read(func(fd uintptr) bool {
		r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		if e == syscall.EAGAIN {
			return false // wait in the poller
		}
		if e == syscall.EINTR {
			return false // try again after the poller says it is readable
		}
		n, errno = int(r), e
		return true
	})
	switch {
	case err != nil:
		return 0, s.opError("read", err)
	case errno != 0:
		return 0, s.opError("read", errno)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

func (s *rawSocket) Write(b []byte) (int, error) {
	n, err := s.writev([][]byte{b})
	return int(n), err
}

// writev writes every byte of bufs, in as few system calls as the socket's
// buffer allows.
func (s *rawSocket) writev(bufs [][]byte) (int64, error) {
	var iov []syscall.Iovec
	for _, b := range bufs {
		if len(b) > 0 {
			v := syscall.Iovec{Base: &b[0]}
			v.SetLen(len(b))
			iov = append(iov, v)
		}
	}
	var total int64
	for len(iov) > 0 {
		var n int
		var errno syscall.Errno
		err := s.rc.Write(func(fd uintptr) bool {
			r, _, e := syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
			if e == syscall.EAGAIN || e == syscall.EINTR {
				return false
			}
			n, errno = int(r), e
			return true
		})
		if err != nil {
			return total, s.opError("write", err)
		}
		if errno != 0 {
			return total, s.opError("write", errno)
		}
		total += int64(n)
		// Drop what was written.
		for n > 0 {
			if l := int(iov[0].Len); n >= l {
				n -= l
				iov = iov[1:]
				continue
			}
			iov[0].Base = (*byte)(unsafe.Add(unsafe.Pointer(iov[0].Base), n))
			iov[0].SetLen(int(iov[0].Len) - n)
			n = 0
		}
	}
	return total, nil
}

// opError wraps err as the net package would, so that callers see the
// same errors (errors.Is with os.ErrDeadlineExceeded, net.ErrClosed,
// syscall.ECONNRESET) whichever way the socket was read.
func (s *rawSocket) opError(op string, err error) error {
	if errno, ok := err.(syscall.Errno); ok {
		err = os.NewSyscallError(op, errno)
	}
	return &net.OpError{Op: op, Net: "tcp", Source: s.LocalAddr(), Addr: s.RemoteAddr(), Err: err}
}
