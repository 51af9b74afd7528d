// Package transport owns autobyte's wire: framing, connections, the
// per-connection priority-ordered sender, traffic shaping and the
// authenticated handshake.
//
// It knows nothing of layers, models, servers or scheduling policy: a frame
// carries a Priority number in its header (smaller = more urgent) and each
// connection's single sender goroutine always writes the most urgent queued
// frame next. Who computes priorities, what a Key or Aux means and when to
// send is decided by the packages above.
//
// Wire format, handshake, shaping and timeouts are described in
// docs/transport.md.
package transport

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	gonumblas "gonum.org/v1/gonum/blas/gonum"
)

// Kind is the type of a frame.
type Kind uint8

// Frame kinds.
const (
	KindPush      Kind = 1 // worker -> server: a piece of gradient
	KindAggregate Kind = 2 // server -> worker: the summed piece
	KindPull      Kind = 3 // worker -> server: ask for the summed piece (pull mode; no payload)
	KindRing      Kind = 4 // all-reduce step data, rank -> next rank
	KindControl   Kind = 5 // small control messages; payload opaque bytes
	KindHeartbeat Kind = 6 // keep-alive, no payload; never surfaced by Recv
	KindClose     Kind = 7 // orderly close or error: payload is a UTF-8 reason; Recv returns an error naming the peer and the reason
)

const maxKind = KindClose

func (k Kind) String() string {
	switch k {
	case KindPush:
		return "push"
	case KindAggregate:
		return "aggregate"
	case KindPull:
		return "pull"
	case KindRing:
		return "ring"
	case KindControl:
		return "control"
	case KindHeartbeat:
		return "heartbeat"
	case KindClose:
		return "close"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Valid reports whether k is a known kind.
func (k Kind) Valid() bool { return k >= KindPush && k <= maxKind }

// Header is the fixed-size prefix of every frame.
type Header struct {
	Kind      Kind
	Rank      uint32 // sender's rank
	Epoch     uint32 // configuration epoch
	Iteration uint32
	Key       uint32 // tensor id
	Piece     uint32 // piece index within the tensor
	Aux       uint32 // shard index, ring step, or control subtype
	Priority  uint64 // smaller = more urgent
	Offset    uint64 // byte offset of the payload within the tensor
	Length    uint32 // payload bytes
	// Elem is the payload's element type (a dtype.DType: 0 float32, 1
	// bfloat16, 2 float16), Scale its power-of-two scale exponent
	// (float16); both 0 for frames that carry no gradient values.
	Elem  uint8
	Scale int8
}

// Wire constants. The header is little-endian:
//
//	offset size field
//	     0    2 magic (0xAB1E, bytes 1E AB)
//	     2    1 version
//	     3    1 kind
//	     4    4 rank
//	     8    4 epoch
//	    12    4 iteration
//	    16    4 key
//	    20    4 piece
//	    24    4 aux
//	    28    4 length
//	    32    8 priority
//	    40    8 offset
//	    48    1 elem (element type of the payload)
//	    49    1 scale (signed exponent)
//	    50    2 reserved, zero
//	    52      (end)
const (
	Magic      uint16 = 0xAB1E
	Version    uint8  = 2
	HeaderSize        = 52
	MaxPayload        = 1 << 30
)

// Append appends the encoded header to dst and returns the extended slice.
// It encodes the fields as they are; DecodeHeader validates them.
func (h Header) Append(dst []byte) []byte {
	var b [HeaderSize]byte
	h.put(b[:])
	return append(dst, b[:]...)
}

// put encodes h into b, which must hold HeaderSize bytes.
func (h Header) put(b []byte) {
	_ = b[HeaderSize-1]
	le := binary.LittleEndian
	le.PutUint16(b[0:], Magic)
	b[2] = Version
	b[3] = byte(h.Kind)
	le.PutUint32(b[4:], h.Rank)
	le.PutUint32(b[8:], h.Epoch)
	le.PutUint32(b[12:], h.Iteration)
	le.PutUint32(b[16:], h.Key)
	le.PutUint32(b[20:], h.Piece)
	le.PutUint32(b[24:], h.Aux)
	le.PutUint32(b[28:], h.Length)
	le.PutUint64(b[32:], h.Priority)
	le.PutUint64(b[40:], h.Offset)
	b[48] = h.Elem
	b[49] = byte(h.Scale)
	b[50], b[51] = 0, 0
}

// HeaderError is returned by DecodeHeader: Field ("buffer", "magic",
// "version", "kind", "reserved" or "length") is the offending field and Value its value.
type HeaderError struct {
	Field string
	Value uint64
	msg   string
}

func (e *HeaderError) Error() string { return "transport: " + e.msg }

func headerErr(field string, v uint64, format string, args ...any) error {
	return &HeaderError{Field: field, Value: v, msg: fmt.Sprintf(format, args...)}
}

// DecodeHeader decodes the first HeaderSize bytes of b. It rejects a short
// buffer, a bad magic, an unsupported version, an unknown kind, nonzero
// reserved bytes and a length above MaxPayload with a *HeaderError naming the field and its value. It
// never panics.
func DecodeHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, headerErr("buffer", uint64(len(b)), "short header buffer: %d bytes, need %d", len(b), HeaderSize)
	}
	le := binary.LittleEndian
	if m := le.Uint16(b[0:]); m != Magic {
		return Header{}, headerErr("magic", uint64(m), "bad header magic 0x%04x, want 0x%04x", m, Magic)
	}
	if v := b[2]; v != Version {
		return Header{}, headerErr("version", uint64(v), "unsupported header version %d (this build speaks %d)", v, Version)
	}
	h := Header{
		Kind:      Kind(b[3]),
		Rank:      le.Uint32(b[4:]),
		Epoch:     le.Uint32(b[8:]),
		Iteration: le.Uint32(b[12:]),
		Key:       le.Uint32(b[16:]),
		Piece:     le.Uint32(b[20:]),
		Aux:       le.Uint32(b[24:]),
		Length:    le.Uint32(b[28:]),
		Priority:  le.Uint64(b[32:]),
		Offset:    le.Uint64(b[40:]),
		Elem:      b[48],
		Scale:     int8(b[49]),
	}
	if r := le.Uint16(b[50:]); r != 0 {
		return Header{}, headerErr("reserved", uint64(r), "reserved header bytes are 0x%04x, want 0", r)
	}
	if !h.Kind.Valid() {
		return Header{}, headerErr("kind", uint64(h.Kind), "unknown header kind %d", uint8(h.Kind))
	}
	if h.Length > MaxPayload {
		return Header{}, headerErr("length", uint64(h.Length), "header length %d exceeds MaxPayload %d", h.Length, MaxPayload)
	}
	return h, nil
}

// Frame is a header and its payload. On Send, Header.Length and Header.Rank
// are filled in by the connection.
type Frame struct {
	Header
	Payload []byte
}

// PutFloat32s encodes src into dst as little-endian IEEE 754 values.
// len(dst) must be at least 4*len(src).
func PutFloat32s(dst []byte, src []float32) {
	if len(dst) < 4*len(src) {
		panic(fmt.Sprintf("transport: PutFloat32s: dst holds %d bytes, need %d for %d floats", len(dst), 4*len(src), len(src)))
	}
	dst = dst[:4*len(src)]
	if littleEndian {
		copy(dst, floatBytes(src))
		return
	}
	for i, v := range src {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
	}
}

// Float32s decodes len(dst) little-endian float32 values from src.
// len(src) must be at least 4*len(dst).
func Float32s(dst []float32, src []byte) {
	if len(src) < 4*len(dst) {
		panic(fmt.Sprintf("transport: Float32s: src holds %d bytes, need %d for %d floats", len(src), 4*len(dst), len(dst)))
	}
	src = src[:4*len(dst)]
	if littleEndian {
		copy(floatBytes(dst), src)
		return
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

// littleEndian is true where float32s in memory already are the wire
// format, so encoding and decoding are plain copies (a memmove instead of a
// loop: they were over a third of a parameter server's CPU).
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// FloatView returns b's wire-format float32s as a []float32 sharing b's
// memory, when this machine's float32s are the wire format and b is
// aligned for them; ok is false otherwise (decode with Float32s instead).
// Summing into the view sums into b, which can then be sent as it is.
func FloatView(b []byte) (fs []float32, ok bool) {
	if !littleEndian || len(b)%4 != 0 || uintptr(unsafe.Pointer(unsafe.SliceData(b)))%4 != 0 {
		return nil, false
	}
	if len(b) == 0 {
		return []float32{}, true
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4), true
}

// WireBytes returns fs as wire-format bytes sharing fs's memory, when this
// machine's float32s are the wire format; ok is false otherwise (encode
// with PutFloat32s instead). Sending the view sends fs without a copy, so
// fs must not change until the frame is written.
func WireBytes(fs []float32) (b []byte, ok bool) {
	if !littleEndian {
		return nil, false
	}
	return floatBytes(fs), true
}

// floatBytes views fs as bytes, without copying.
func floatBytes(fs []float32) []byte {
	if len(fs) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&fs[0])), 4*len(fs))
}

// AddFloat32s adds the len(dst) little-endian float32 values encoded in src
// to dst: dst[i] += value i of src. len(src) must be at least 4*len(dst).
// It is the parameter server's summation loop.
func AddFloat32s(dst []float32, src []byte) {
	if len(src) < 4*len(dst) {
		panic(fmt.Sprintf("transport: AddFloat32s: src holds %d bytes, need %d for %d floats", len(src), 4*len(dst), len(dst)))
	}
	if xs, ok := FloatView(src[:4*len(dst)]); ok {
		AddFloats(dst, xs)
		return
	}
	le := binary.LittleEndian
	// Blocks of 8 with full slice expressions let the compiler drop the
	// bounds checks inside the block.
	for len(dst) >= 8 {
		d := dst[:8:8]
		s := src[:32:32]
		d[0] += math.Float32frombits(le.Uint32(s[0:4]))
		d[1] += math.Float32frombits(le.Uint32(s[4:8]))
		d[2] += math.Float32frombits(le.Uint32(s[8:12]))
		d[3] += math.Float32frombits(le.Uint32(s[12:16]))
		d[4] += math.Float32frombits(le.Uint32(s[16:20]))
		d[5] += math.Float32frombits(le.Uint32(s[20:24]))
		d[6] += math.Float32frombits(le.Uint32(s[24:28]))
		d[7] += math.Float32frombits(le.Uint32(s[28:32]))
		dst = dst[8:]
		src = src[32:]
	}
	for i := range dst {
		dst[i] += math.Float32frombits(le.Uint32(src[4*i:]))
	}
}

// AddFloats adds src to dst element by element: dst[i] += src[i]. gonum's
// vectorised loop computes 1*src[i] + dst[i]: multiplying by 1 is exact,
// so the sums are the scalar loop's, bit for bit. len(src) must be at
// least len(dst).
func AddFloats(dst, src []float32) {
	if len(src) < len(dst) {
		panic(fmt.Sprintf("transport: AddFloats: src holds %d floats, need %d", len(src), len(dst)))
	}
	saxpy.Saxpy(len(dst), 1, src, 1, dst, 1)
}

// saxpy is gonum's BLAS, whose float32 loops are vectorised (SSE on amd64).
var saxpy gonumblas.Implementation
