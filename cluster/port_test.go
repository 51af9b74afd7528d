package cluster

import (
	"net"
	"strconv"
	"testing"
)

func TestFreePort(t *testing.T) {
	seen := map[int]bool{}
	for range 20 {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if port < 10000 || port >= ephemeralStart() {
			t.Fatalf("FreePort() = %d, want a port below the ephemeral range (from %d)", port, ephemeralStart())
		}
		l, err := net.Listen("tcp", ":"+strconv.Itoa(port))
		if err != nil {
			t.Fatalf("port %d from FreePort cannot be bound: %v", port, err)
		}
		l.Close()
		seen[port] = true
	}
	if len(seen) < 10 {
		t.Errorf("FreePort returned only %d distinct ports in 20 calls", len(seen))
	}
}
