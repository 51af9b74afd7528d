package cluster

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// FreePort returns a TCP port that nothing listens on right now, for a
// rendezvous that is set up before rank 0 listens (launch, tests). It is
// drawn below the kernel's ephemeral range, so outgoing connections, which
// take their ports from that range, cannot have taken it in the meantime;
// only another explicit bind could.
func FreePort() (int, error) {
	lo, hi := 20000, ephemeralStart()
	if hi-lo < 1000 {
		lo, hi = 10000, 20000
	}
	var last error
	for range 50 {
		port := lo + rand.IntN(hi-lo)
		l, err := net.Listen("tcp", ":"+strconv.Itoa(port))
		if err != nil {
			last = err
			continue
		}
		l.Close()
		return port, nil
	}
	return 0, fmt.Errorf("cluster: no free port in [%d, %d) after 50 tries: %w", lo, hi, last)
}

// ephemeralStart is the first port of the kernel's ephemeral range (32768
// when it cannot be read).
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n <= 1024 {
		return 32768
	}
	return n
}
