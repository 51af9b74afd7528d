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
//	offer   client->server  'M' ring[4] tag[16] pathLen[1] path (instead of confirm) 25+pathLen bytes
//	accept  server->client  'Y' (the offer's segment is mapped)              4 bytes
//	decline server->client  'N' (plain TCP)                                 4 bytes
//	probe   client->server  'P' (instead of auth: only checking who listens) 4 bytes
//
// An offer confirms like 'C' and proposes a shared-memory segment for a
// same-host connection (shm_linux.go); the server answers it.
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
	msgOffer   = 'M'
	msgAccept  = 'Y'
	msgDecline = 'N'

	nonceSize    = 32
	macSize      = sha256.Size
	helloSize    = 4 + nonceSize
	authFixed    = 4 + 4 + 1 + nonceSize + macSize
	okFixed      = 4 + 4 + 1 + macSize
	offerFixed   = 4 + 4 + shmTagLen + 1
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
// set. It returns the server's rank and role, and the shared-memory
// segment the server accepted when share is set (nil if it declined or
// one could not be made).
func clientHandshake(nc net.Conn, cfg Config, addr string, share bool) (int, string, *shmSegment, error) {
	rank, role, err := clientAuth(nc, cfg, addr)
	if err != nil {
		return 0, "", nil, err
	}
	if share {
		seg, tag, err := createSegment(cfg.SharedMemoryRing)
		if err == nil {
			seg, err = offerSegment(nc, cfg, seg, tag)
			if err != nil {
				return 0, "", nil, fmt.Errorf("transport: handshake with %s: %v", addr, err)
			}
			return rank, role, seg, nil
		}
		cfg.Logger.Debug("transport: same-host connection stays on TCP", "peer", addr, "err", err)
	}
	if _, err := nc.Write(msgPrefix(msgConfirm)); err != nil {
		return 0, "", nil, fmt.Errorf("transport: handshake with %s: sending confirmation: %v", addr, err)
	}
	return rank, role, nil, nil
}

// offerSegment offers seg to the server and returns it if the server
// mapped it, nil if it declined. The file is unlinked either way: from
// here on only the two mappings hold it.
func offerSegment(nc net.Conn, cfg Config, seg *shmSegment, tag []byte) (*shmSegment, error) {
	defer seg.unlink()
	offer := msgPrefix(msgOffer)
	offer = binary.LittleEndian.AppendUint32(offer, uint32(cfg.SharedMemoryRing))
	offer = append(offer, tag...)
	offer = append(offer, byte(len(seg.path)))
	offer = append(offer, seg.path...)
	if _, err := nc.Write(offer); err != nil {
		seg.unmap()
		return nil, fmt.Errorf("sending shared-memory offer: %v", err)
	}
	reply := make([]byte, 4)
	if err := readMsg(nc, reply, "shared-memory reply", cfg.HandshakeTimeout); err != nil {
		seg.unmap()
		return nil, err
	}
	if checkPrefix(reply, "shared-memory reply", msgAccept) == nil {
		return seg, nil
	}
	seg.unmap()
	if err := checkPrefix(reply, "shared-memory reply", msgDecline); err != nil {
		return nil, err
	}
	return nil, nil
}

// clientAuth runs the client side up to the server's proof.
func clientAuth(nc net.Conn, cfg Config, addr string) (int, string, error) {
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
// has set. It returns the client's rank and role, or a *refusal, and the
// client's shared-memory segment if it offered one and share is set.
func serverHandshake(nc net.Conn, cfg Config, share bool) (int, string, *shmSegment, error) {
	rank, role, err := serverAuth(nc, cfg)
	if err != nil {
		return 0, "", nil, err
	}
	confirm := make([]byte, 4)
	if err := readMsg(nc, confirm, "confirmation", cfg.HandshakeTimeout); err != nil {
		return 0, "", nil, &refusal{reason: "handshake: " + err.Error() + " (did the client reject our token proof?)"}
	}
	if checkPrefix(confirm, "offer", msgOffer) == nil {
		seg, err := answerOffer(nc, cfg, share)
		if err != nil {
			return 0, "", nil, err
		}
		return rank, role, seg, nil
	}
	if err := checkPrefix(confirm, "confirmation", msgConfirm); err != nil {
		return 0, "", nil, &refusal{reason: "handshake: " + err.Error(), tell: true}
	}
	return rank, role, nil, nil
}

// answerOffer reads a client's shared-memory offer and maps the segment
// when share is set and it checks out; it tells the client either way.
func answerOffer(nc net.Conn, cfg Config, share bool) (*shmSegment, error) {
	fixed := make([]byte, offerFixed-4)
	if err := readMsg(nc, fixed, "shared-memory offer", cfg.HandshakeTimeout); err != nil {
		return nil, &refusal{reason: "handshake: " + err.Error()}
	}
	ring := int(binary.LittleEndian.Uint32(fixed))
	tag := fixed[4 : 4+shmTagLen]
	path := make([]byte, fixed[4+shmTagLen])
	if err := readMsg(nc, path, "shared-memory path", cfg.HandshakeTimeout); err != nil {
		return nil, &refusal{reason: "handshake: " + err.Error()}
	}
	var seg *shmSegment
	answer := msgDecline
	if share {
		var err error
		if seg, err = openSegment(string(path), ring, tag); err == nil {
			answer = msgAccept
		} else {
			cfg.Logger.Debug("transport: declined a shared-memory offer", "remote", nc.RemoteAddr().String(), "err", err)
		}
	}
	if _, err := nc.Write(msgPrefix(byte(answer))); err != nil {
		if seg != nil {
			seg.unmap()
		}
		return nil, &refusal{reason: fmt.Sprintf("handshake: answering a shared-memory offer: %v", err)}
	}
	return seg, nil
}

// serverAuth runs the server side up to our proof.
func serverAuth(nc net.Conn, cfg Config) (int, string, error) {
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
