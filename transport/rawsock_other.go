//go:build !linux

package transport

import (
	"errors"
	"net"
)

// rawSocket: see rawsock_linux.go; elsewhere connections use the net
// package's calls.
type rawSocket struct{ *net.TCPConn }

func newRawSocket(*net.TCPConn) (*rawSocket, error) {
	return nil, errors.New("transport: raw socket calls are implemented on Linux only")
}

func (s *rawSocket) writev(bufs [][]byte) (int64, error) {
	b := net.Buffers(bufs)
	return b.WriteTo(s.TCPConn)
}
