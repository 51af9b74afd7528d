//go:build !linux

package transport

import (
	"fmt"
	"runtime"
)

// RoundTrip needs Linux's TCP_INFO; elsewhere it reports that it cannot
// measure.
func (c *Conn) RoundTrip() (RoundTrip, error) {
	return RoundTrip{}, fmt.Errorf("transport: round trip to %s: not measured on %s (needs Linux TCP_INFO)", c.peer, runtime.GOOS)
}
