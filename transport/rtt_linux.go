package transport

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// RoundTrip asks the kernel for the connection's round-trip times. It
// fails on a closed connection, naming the peer.
func (c *Conn) RoundTrip() (RoundTrip, error) {
	if c.tcp == nil {
		return RoundTrip{}, fmt.Errorf("transport: round trip to %s: not a TCP connection", c.peer)
	}
	raw, err := c.tcp.SyscallConn()
	if err != nil {
		return RoundTrip{}, fmt.Errorf("transport: round trip to %s: %w", c.peer, err)
	}
	var info *unix.TCPInfo
	var serr error
	if err := raw.Control(func(fd uintptr) { info, serr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil {
		return RoundTrip{}, fmt.Errorf("transport: round trip to %s: %w", c.peer, err)
	}
	if serr != nil {
		return RoundTrip{}, fmt.Errorf("transport: round trip to %s: TCP_INFO: %w", c.peer, serr)
	}
	return RoundTrip{Smoothed: time.Duration(info.Rtt) * time.Microsecond, Min: time.Duration(info.Min_rtt) * time.Microsecond}, nil
}
