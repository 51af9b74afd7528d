package transport

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"time"

	"golang.org/x/time/rate"
)

// Defaults applied to zero Config fields.
const (
	DefaultSendBuffer        = 256 << 10
	DefaultHandshakeTimeout  = 5 * time.Second
	DefaultHeartbeatInterval = 1 * time.Second
	DefaultPeerTimeout       = 5 * time.Second
	// MaxRoleLen is the longest role a peer may announce, in bytes.
	MaxRoleLen = 32
	// MaxCloseReason is the longest close reason sent or accepted, in bytes.
	MaxCloseReason = 4096
)

// Config configures Dial and Listen. Only Token is required.
type Config struct {
	// Token is the shared cluster token both sides prove knowledge of in
	// the handshake; required.
	Token string
	// Rank is our rank, announced to the peer and stamped into every frame
	// we send (0 .. 2^32-1).
	Rank int
	// Role is our role ("worker", "server", "agent", ...), at most
	// MaxRoleLen bytes.
	Role string
	// TLS, if set, wraps the TCP connection in TLS. A client needs
	// ServerName and RootCAs (or InsecureSkipVerify in tests); a server
	// needs Certificates.
	TLS *tls.Config
	// Egress and Ingress shape the bytes written and read by every
	// connection that shares them (bytes/s); nil = unshaped. Bytes are taken
	// in chunks of at most the limiter's burst, so the burst must be > 0
	// unless the limit is rate.Inf.
	Egress, Ingress *rate.Limiter
	// SendBuffer is SO_SNDBUF in bytes; default 256 KiB. Keep it small:
	// whatever sits in the kernel queue is sent in FIFO order, undoing
	// priority order.
	SendBuffer int
	// HandshakeTimeout bounds the whole handshake (TLS included); default 5 s.
	HandshakeTimeout time.Duration
	// HeartbeatInterval: a KindHeartbeat frame is sent when nothing was sent
	// for this long; default 1 s.
	HeartbeatInterval time.Duration
	// PeerTimeout: Recv fails, naming the peer, when nothing (not even a
	// heartbeat) arrived for this long while it was waiting; default 5 s.
	// It should be several HeartbeatIntervals of the peer.
	PeerTimeout time.Duration
	// SharedMemoryRing is the size in bytes of each direction's ring when
	// a connection joins two processes of one host (its local and remote
	// IP are equal) and is plain, unshaped TCP: its bytes then go through
	// shared memory, and the socket carries only wake-ups (shm_linux.go).
	// 0 picks DefaultSharedMemoryRing; -1 keeps every connection on TCP.
	// Linux only. The client's size is used; -1 on either side refuses.
	SharedMemoryRing int
	// Logger receives refused handshakes and accept errors; default
	// slog.Default().
	Logger *slog.Logger
}

// withDefaults validates c and fills in defaults.
func (c Config) withDefaults() (Config, error) {
	if c.Token == "" {
		return c, errors.New("config: Token is empty: a shared cluster token is required")
	}
	if c.Rank < 0 || int64(c.Rank) > math.MaxUint32 {
		return c, fmt.Errorf("config: Rank %d out of range [0, %d]", c.Rank, uint32(math.MaxUint32))
	}
	if len(c.Role) > MaxRoleLen {
		return c, fmt.Errorf("config: Role %q is %d bytes, max %d", c.Role, len(c.Role), MaxRoleLen)
	}
	if c.SendBuffer < 0 {
		return c, fmt.Errorf("config: SendBuffer %d is negative", c.SendBuffer)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"HandshakeTimeout", c.HandshakeTimeout}, {"HeartbeatInterval", c.HeartbeatInterval}, {"PeerTimeout", c.PeerTimeout}} {
		if d.v < 0 {
			return c, fmt.Errorf("config: %s %v is negative", d.name, d.v)
		}
	}
	for _, l := range []struct {
		name string
		v    *rate.Limiter
	}{{"Egress", c.Egress}, {"Ingress", c.Ingress}} {
		if l.v != nil && l.v.Limit() != rate.Inf && l.v.Burst() <= 0 {
			return c, fmt.Errorf("config: %s limiter has burst %d at %v bytes/s: it would admit nothing", l.name, l.v.Burst(), float64(l.v.Limit()))
		}
	}
	if c.SharedMemoryRing != -1 && c.SharedMemoryRing != 0 && (c.SharedMemoryRing < minSharedMemoryRing || c.SharedMemoryRing > maxSharedMemoryRing) {
		return c, fmt.Errorf("config: SharedMemoryRing %d out of range: want -1 (off), 0 (default %d) or %d .. %d bytes", c.SharedMemoryRing, DefaultSharedMemoryRing, minSharedMemoryRing, maxSharedMemoryRing)
	}
	if c.SharedMemoryRing == 0 {
		c.SharedMemoryRing = DefaultSharedMemoryRing
	}
	if c.SendBuffer == 0 {
		c.SendBuffer = DefaultSendBuffer
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.PeerTimeout == 0 {
		c.PeerTimeout = DefaultPeerTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// sharesMemory reports whether a connection on tcp may carry its bytes
// through shared memory: plain TCP between two sockets of one host, not
// shaped, and not turned off.
func (c Config) sharesMemory(tcp *net.TCPConn) bool {
	return c.SharedMemoryRing > 0 && c.TLS == nil && c.Egress == nil && c.Ingress == nil && tcp != nil && sameHost(tcp)
}

// chunkLimit is the largest chunk taken from l at once (and the largest
// chunk written or read between two limiter calls): its burst, capped at
// maxShapedChunk so that shaping stays smooth; 0 means unshaped.
func chunkLimit(l *rate.Limiter) int {
	if l == nil || l.Limit() == rate.Inf {
		return 0
	}
	b := l.Burst()
	if b > maxShapedChunk {
		b = maxShapedChunk
	}
	if b < 1 {
		b = 1 // SetBurst(0) after Dial: WaitN fails and names the limiter
	}
	return b
}

const maxShapedChunk = 256 << 10
