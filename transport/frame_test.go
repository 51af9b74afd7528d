package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestHeaderRoundTripEveryField(t *testing.T) {
	full := Header{
		Kind: KindRing, Rank: 0x01020304, Epoch: 0x05060708, Iteration: 0x090a0b0c,
		Key: 0x0d0e0f10, Piece: 0x11121314, Aux: 0x15161718,
		Priority: 0x191a1b1c1d1e1f20, Offset: 0x2122232425262728, Length: 0x20000000,
		Elem: 0x29, Scale: -0x2a,
	}
	// Each field alone at an extreme value, so that a field encoded into
	// another's bytes (or dropped) is caught.
	cases := []Header{
		full,
		{Kind: KindPush},
		{Kind: KindClose},
		{Kind: KindAggregate, Rank: math.MaxUint32},
		{Kind: KindPull, Epoch: math.MaxUint32},
		{Kind: KindPull, Iteration: math.MaxUint32},
		{Kind: KindPull, Key: math.MaxUint32},
		{Kind: KindPull, Piece: math.MaxUint32},
		{Kind: KindPull, Aux: math.MaxUint32},
		{Kind: KindPull, Priority: math.MaxUint64},
		{Kind: KindPull, Offset: math.MaxUint64},
		{Kind: KindPull, Length: MaxPayload},
		{Kind: KindPush, Elem: math.MaxUint8},
		{Kind: KindPush, Scale: math.MinInt8},
		{Kind: KindPush, Scale: math.MaxInt8},
	}
	for _, h := range cases {
		b := h.Append([]byte("prefix"))
		if len(b) != len("prefix")+HeaderSize {
			t.Fatalf("Append wrote %d bytes, want %d", len(b)-len("prefix"), HeaderSize)
		}
		if string(b[:6]) != "prefix" {
			t.Fatalf("Append clobbered dst: %q", b[:6])
		}
		got, err := DecodeHeader(b[6:])
		if err != nil {
			t.Fatalf("DecodeHeader(%+v): %v", h, err)
		}
		if got != h {
			t.Fatalf("round trip: got %+v, want %+v", got, h)
		}
	}
	// The layout is fixed: check a few offsets against the documented table.
	b := full.Append(nil)
	le := binary.LittleEndian
	if le.Uint16(b[0:]) != Magic || b[2] != Version || Kind(b[3]) != KindRing ||
		le.Uint32(b[4:]) != full.Rank || le.Uint32(b[28:]) != full.Length ||
		le.Uint64(b[32:]) != full.Priority || le.Uint64(b[40:]) != full.Offset {
		t.Fatalf("layout differs from docs/transport.md: % x", b)
	}
}

func TestDecodeHeaderRejectsEachBadField(t *testing.T) {
	good := Header{Kind: KindPush, Length: 10}.Append(nil)
	mod := func(f func(b []byte)) []byte {
		b := bytes.Clone(good)
		f(b)
		return b
	}
	cases := []struct {
		name  string
		b     []byte
		field string
		value uint64
		want  string
	}{
		{"empty", nil, "buffer", 0, "short header buffer: 0 bytes, need 52"},
		{"short", good[:HeaderSize-1], "buffer", 51, "short header buffer: 51 bytes, need 52"},
		{"magic", mod(func(b []byte) { b[0], b[1] = 0xef, 0xbe }), "magic", 0xbeef, "bad header magic 0xbeef"},
		{"version", mod(func(b []byte) { b[2] = 1 }), "version", 1, "unsupported header version 1"},
		{"reserved", mod(func(b []byte) { b[51] = 1 }), "reserved", 0x100, "reserved header bytes are 0x0100, want 0"},
		{"kind 0", mod(func(b []byte) { b[3] = 0 }), "kind", 0, "unknown header kind 0"},
		{"kind 8", mod(func(b []byte) { b[3] = 8 }), "kind", 8, "unknown header kind 8"},
		{"kind 255", mod(func(b []byte) { b[3] = 255 }), "kind", 255, "unknown header kind 255"},
		{"length", mod(func(b []byte) { binary.LittleEndian.PutUint32(b[28:], MaxPayload+1) }), "length", MaxPayload + 1, "header length 1073741825 exceeds MaxPayload 1073741824"},
		{"length max", mod(func(b []byte) { binary.LittleEndian.PutUint32(b[28:], math.MaxUint32) }), "length", math.MaxUint32, "header length 4294967295 exceeds"},
	}
	for _, tc := range cases {
		_, err := DecodeHeader(tc.b)
		if err == nil {
			t.Errorf("%s: DecodeHeader accepted % x", tc.name, tc.b)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %q does not contain %q", tc.name, err, tc.want)
		}
		var he *HeaderError
		if !errors.As(err, &he) || he.Field != tc.field || he.Value != tc.value {
			t.Errorf("%s: error %#v, want a HeaderError with field %s value %d", tc.name, err, tc.field, tc.value)
		}
	}
	// Extra bytes after the header are ignored.
	if _, err := DecodeHeader(append(bytes.Clone(good), 1, 2, 3)); err != nil {
		t.Fatalf("DecodeHeader with trailing bytes: %v", err)
	}
}

func FuzzDecodeHeader(f *testing.F) {
	f.Add(Header{Kind: KindPush, Rank: 3, Length: 4096, Priority: 7}.Append(nil))
	f.Add(Header{Kind: KindClose, Length: MaxPayload}.Append(nil))
	f.Add([]byte{})
	f.Add([]byte{0x1e, 0xab, 1})
	f.Add(bytes.Repeat([]byte{0xff}, HeaderSize+3))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHeader(b)
		if err != nil {
			if h != (Header{}) {
				t.Fatalf("DecodeHeader returned %+v with error %v", h, err)
			}
			return
		}
		if !h.Kind.Valid() || h.Length > MaxPayload {
			t.Fatalf("DecodeHeader accepted invalid header %+v", h)
		}
		if enc := h.Append(nil); !bytes.Equal(enc, b[:HeaderSize]) {
			t.Fatalf("re-encoding differs:\n in % x\nout % x", b[:HeaderSize], enc)
		}
	})
}

func specialFloats(r *rand.Rand, n int) []float32 {
	s := []float32{0, float32(math.Copysign(0, -1)), 1, -1, math.MaxFloat32, math.SmallestNonzeroFloat32,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 1e-42}
	for len(s) < n {
		s = append(s, math.Float32frombits(r.Uint32()))
	}
	return s[:n]
}

func TestFloat32sRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 7, 8, 9, 100, 1023} {
		src := specialFloats(r, n)
		buf := make([]byte, 4*n+3)
		PutFloat32s(buf, src)
		for i, v := range src {
			if got := binary.LittleEndian.Uint32(buf[4*i:]); got != math.Float32bits(v) {
				t.Fatalf("n=%d: element %d encoded as %08x, want little-endian %08x", n, i, got, math.Float32bits(v))
			}
		}
		dst := make([]float32, n)
		Float32s(dst, buf)
		for i := range src {
			if math.Float32bits(dst[i]) != math.Float32bits(src[i]) {
				t.Fatalf("n=%d: element %d decoded as %v, want %v", n, i, dst[i], src[i])
			}
		}
	}
}

func naiveAdd(dst []float32, src []byte) {
	for i := range dst {
		dst[i] += math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

func TestAddFloat32sMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for n := 0; n < 70; n++ {
		for _, scale := range []float64{1, 1e30} {
			a := make([]float32, n)
			b := make([]float32, n)
			for i := range a {
				a[i] = float32(r.NormFloat64() * scale)
				b[i] = float32(r.NormFloat64() * scale)
			}
			if n > 3 {
				a[1] = float32(math.Inf(1))
				b[2] = float32(math.NaN())
			}
			src := make([]byte, 4*n)
			PutFloat32s(src, b)
			want := append([]float32(nil), a...)
			naiveAdd(want, src)
			// Aligned (the vectorised loop) and one byte off (the scalar one).
			unaligned := make([]byte, 4*n+1)[1:]
			copy(unaligned, src)
			for _, s := range [][]byte{src, unaligned} {
				got := append([]float32(nil), a...)
				AddFloat32s(got, s)
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("n=%d: element %d = %v, want %v", n, i, got[i], want[i])
					}
				}
			}
		}
	}
}

func TestFloatHelpersPanicOnShortBuffers(t *testing.T) {
	for name, f := range map[string]func(){
		"PutFloat32s": func() { PutFloat32s(make([]byte, 7), make([]float32, 2)) },
		"Float32s":    func() { Float32s(make([]float32, 2), make([]byte, 7)) },
		"AddFloat32s": func() { AddFloat32s(make([]float32, 9), make([]byte, 35)) },
	} {
		func() {
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(r.(string), "need") {
					t.Errorf("%s: recovered %v, want a panic naming the sizes", name, r)
				}
			}()
			f()
		}()
	}
}

func BenchmarkAddFloat32s(b *testing.B) {
	const n = 1 << 20
	dst := make([]float32, n)
	src := make([]byte, 4*n)
	vals := make([]float32, n)
	for i := range vals {
		vals[i] = float32(i%1000) * 0.001
	}
	PutFloat32s(src, vals)
	b.SetBytes(4 * n)
	for b.Loop() {
		AddFloat32s(dst, src)
	}
}

func BenchmarkAddFloat32sNaive(b *testing.B) {
	const n = 1 << 20
	dst := make([]float32, n)
	src := make([]byte, 4*n)
	b.SetBytes(4 * n)
	for b.Loop() {
		naiveAdd(dst, src)
	}
}
