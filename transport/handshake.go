package transport

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"
	"unicode/utf8"
)

// Handshake messages. Each starts with the frame magic, the protocol
// version and a type byte:
//
//	hello   server->client  'H' nonceS[32]                                  36 bytes
//	auth    client->server  'A' rank[4] roleLen[1] nonceC[32] macC[32] role  73+roleLen bytes
//	ok      server->client  'K' rank[4] roleLen[1] macS[32] role             41+roleLen bytes
//	refuse  server->client  'R' reasonLen[1] reason                          5+reasonLen bytes
//	confirm client->server  'C'                                             4 bytes
//	probe   client->server  'P' (instead of auth: only checking who listens) 4 bytes
//
// macC = HMAC-SHA256(token, "autobyte client v1" || nonceS || rankC || roleC)
// macS = HMAC-SHA256(token, "autobyte server v1" || nonceC || nonceS || rankS || roleS)
const (
	msgHello   = 'H'
	msgAuth    = 'A'
	msgOK      = 'K'
	msgRefuse  = 'R'
	msgConfirm = 'C'
	msgProbe   = 'P'

	nonceSize    = 32
	macSize      = sha256.Size
	helloSize    = 4 + nonceSize
	authFixed    = 4 + 4 + 1 + nonceSize + macSize
	okFixed      = 4 + 4 + 1 + macSize
	maxRefuseLen = 255

	labelClient = "autobyte client v1"
	labelServer = "autobyte server v1"
)

// RefusedError is returned by Dial when the server refused the handshake.
type RefusedError struct {
	Addr   string // the server's address
	Reason string // the server's reason, e.g. "bad cluster token"
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("transport: server %s refused the connection: %s", e.Addr, e.Reason)
}

func clientMAC(token string, nonceS []byte, rank uint32, role string) []byte {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte(labelClient))
	m.Write(nonceS)
	m.Write(binary.LittleEndian.AppendUint32(nil, rank))
	m.Write([]byte(role))
	return m.Sum(nil)
}

func serverMAC(token string, nonceC, nonceS []byte, rank uint32, role string) []byte {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte(labelServer))
	m.Write(nonceC)
	m.Write(nonceS)
	m.Write(binary.LittleEndian.AppendUint32(nil, rank))
	m.Write([]byte(role))
	return m.Sum(nil)
}

func msgPrefix(typ byte) []byte {
	b := binary.LittleEndian.AppendUint16(nil, Magic)
	return append(b, Version, typ)
}

// readMsg reads exactly len(b) bytes of the named handshake message,
// describing a short read precisely.
func readMsg(r io.Reader, b []byte, what string, timeout time.Duration) error {
	n, err := io.ReadFull(r, b)
	if err == nil {
		return nil
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("handshake timed out after %v: got %d of %d %s bytes", timeout, n, len(b), what)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("peer hung up after %d of %d %s bytes", n, len(b), what)
	}
	return fmt.Errorf("reading %s (%d of %d bytes): %w", what, n, len(b), err)
}

// checkPrefix checks the magic, version and type of a handshake message.
func checkPrefix(b []byte, what string, typ byte) error {
	if m := binary.LittleEndian.Uint16(b); m != Magic {
		return fmt.Errorf("bad %s magic 0x%04x, want 0x%04x (not an autobyte peer)", what, m, Magic)
	}
	if b[2] != Version {
		return fmt.Errorf("unsupported protocol version %d (we speak %d)", b[2], Version)
	}
	if b[3] != typ {
		return fmt.Errorf("bad %s message type 0x%02x, want 0x%02x (%q)", what, b[3], typ, typ)
	}
	return nil
}

// clientHandshake runs the client side on nc, whose deadline the caller has
// set. It returns the server's rank and role.
func clientHandshake(nc net.Conn, cfg Config, addr string) (int, string, error) {
	fail := func(format string, args ...any) (int, string, error) {
		return 0, "", fmt.Errorf("transport: handshake with %s: %s", addr, fmt.Sprintf(format, args...))
	}
	hello := make([]byte, helloSize)
	if err := readMsg(nc, hello, "hello", cfg.HandshakeTimeout); err != nil {
		return fail("%v", err)
	}
	if m := binary.LittleEndian.Uint16(hello); m != Magic {
		return fail("bad hello magic 0x%04x, want 0x%04x (not an autobyte server)", m, Magic)
	}
	if hello[2] != Version {
		return fail("server speaks protocol version %d, we speak %d", hello[2], Version)
	}
	if hello[3] != msgHello {
		return fail("bad hello message type 0x%02x", hello[3])
	}
	nonceS := hello[4:]
	nonceC := make([]byte, nonceSize)
	rand.Read(nonceC)
	rank := uint32(cfg.Rank)

	auth := msgPrefix(msgAuth)
	auth = binary.LittleEndian.AppendUint32(auth, rank)
	auth = append(auth, byte(len(cfg.Role)))
	auth = append(auth, nonceC...)
	auth = append(auth, clientMAC(cfg.Token, nonceS, rank, cfg.Role)...)
	auth = append(auth, cfg.Role...)
	if _, err := nc.Write(auth); err != nil {
		return fail("sending auth: %v", err)
	}

	head := make([]byte, 4)
	if err := readMsg(nc, head, "reply", cfg.HandshakeTimeout); err != nil {
		return fail("%v", err)
	}
	if binary.LittleEndian.Uint16(head) == Magic && head[2] == Version && head[3] == msgRefuse {
		var n [1]byte
		if err := readMsg(nc, n[:], "refusal", cfg.HandshakeTimeout); err != nil {
			return fail("server refused us, then: %v", err)
		}
		reason := make([]byte, n[0])
		if err := readMsg(nc, reason, "refusal reason", cfg.HandshakeTimeout); err != nil {
			return fail("server refused us, then: %v", err)
		}
		return 0, "", &RefusedError{Addr: addr, Reason: string(reason)}
	}
	if err := checkPrefix(head, "reply", msgOK); err != nil {
		return fail("%v", err)
	}
	ok := make([]byte, okFixed-4)
	if err := readMsg(nc, ok, "reply", cfg.HandshakeTimeout); err != nil {
		return fail("%v", err)
	}
	srank := binary.LittleEndian.Uint32(ok)
	roleLen := int(ok[4])
	if roleLen > MaxRoleLen {
		return fail("server role length %d exceeds %d", roleLen, MaxRoleLen)
	}
	srole := make([]byte, roleLen)
	if err := readMsg(nc, srole, "server role", cfg.HandshakeTimeout); err != nil {
		return fail("%v", err)
	}
	want := serverMAC(cfg.Token, nonceC, nonceS, srank, string(srole))
	if !hmac.Equal(ok[5:5+macSize], want) {
		return fail("server failed to prove the cluster token (wrong token or an impostor)")
	}
	if _, err := nc.Write(msgPrefix(msgConfirm)); err != nil {
		return fail("sending confirmation: %v", err)
	}
	return int(srank), string(srole), nil
}

// refusal is a handshake failure on the server side; reason is logged and,
// if tell is set, sent to the peer.
type refusal struct {
	reason string
	tell   bool
	// probe: the peer only checked that we listen (Probe); not a refusal
	// worth a warning.
	probe bool
}

func (r *refusal) Error() string { return r.reason }

// serverHandshake runs the server side on nc, whose deadline the caller
// has set. It returns the client's rank and role, or a *refusal.
func serverHandshake(nc net.Conn, cfg Config) (int, string, error) {
	nonceS := make([]byte, nonceSize)
	rand.Read(nonceS)
	hello := append(msgPrefix(msgHello), nonceS...)
	if _, err := nc.Write(hello); err != nil {
		return 0, "", &refusal{reason: fmt.Sprintf("handshake: sending hello: %v", err)}
	}
	refuse := func(format string, args ...any) (int, string, error) {
		return 0, "", &refusal{reason: fmt.Sprintf(format, args...), tell: true}
	}
	auth := make([]byte, authFixed)
	// Read the prefix first so that a peer of another version or a garbage
	// peer is told why without waiting for bytes it will never send.
	if err := readMsg(nc, auth[:4], "auth", cfg.HandshakeTimeout); err != nil {
		return 0, "", &refusal{reason: "handshake: " + err.Error()}
	}
	if checkPrefix(auth[:4], "probe", msgProbe) == nil {
		return 0, "", &refusal{reason: "probed (the peer only checked that we listen)", probe: true}
	}
	if err := checkPrefix(auth[:4], "auth", msgAuth); err != nil {
		return refuse("handshake: %v", err)
	}
	if err := readMsg(nc, auth[4:], "auth", cfg.HandshakeTimeout); err != nil {
		return 0, "", &refusal{reason: "handshake: " + err.Error()}
	}
	rank := binary.LittleEndian.Uint32(auth[4:])
	roleLen := int(auth[8])
	nonceC := auth[9 : 9+nonceSize]
	macC := auth[9+nonceSize:]
	if roleLen > MaxRoleLen {
		return refuse("handshake: role length %d exceeds %d", roleLen, MaxRoleLen)
	}
	role := make([]byte, roleLen)
	if err := readMsg(nc, role, "role", cfg.HandshakeTimeout); err != nil {
		return 0, "", &refusal{reason: "handshake: " + err.Error()}
	}
	if !hmac.Equal(macC, clientMAC(cfg.Token, nonceS, rank, string(role))) {
		return refuse("bad cluster token")
	}
	if !utf8.Valid(role) {
		return refuse("handshake: role %q is not UTF-8", role)
	}
	srank := uint32(cfg.Rank)
	ok := msgPrefix(msgOK)
	ok = binary.LittleEndian.AppendUint32(ok, srank)
	ok = append(ok, byte(len(cfg.Role)))
	ok = append(ok, serverMAC(cfg.Token, nonceC, nonceS, srank, cfg.Role)...)
	ok = append(ok, cfg.Role...)
	if _, err := nc.Write(ok); err != nil {
		return 0, "", &refusal{reason: fmt.Sprintf("handshake: sending ok: %v", err)}
	}
	confirm := make([]byte, 4)
	if err := readMsg(nc, confirm, "confirmation", cfg.HandshakeTimeout); err != nil {
		return 0, "", &refusal{reason: "handshake: " + err.Error() + " (did the client reject our token proof?)"}
	}
	if err := checkPrefix(confirm, "confirmation", msgConfirm); err != nil {
		return refuse("handshake: %v", err)
	}
	return int(rank), string(role), nil
}

// sendRefusal tells the peer why it was refused (best effort).
func sendRefusal(nc net.Conn, reason string) {
	if len(reason) > maxRefuseLen {
		reason = reason[:maxRefuseLen]
	}
	msg := append(msgPrefix(msgRefuse), byte(len(reason)))
	msg = append(msg, reason...)
	nc.SetWriteDeadline(time.Now().Add(time.Second))
	nc.Write(msg)
}
