// Package dtype owns the element types gradients travel in (float32,
// bfloat16, float16): their names and sizes, and encoding float32 values
// into them, decoding them and adding them into float32 sums.
//
// Sums are always kept in float32; a 16-bit type is only the wire format,
// so a sum is rounded to 16 bits where it is sent, not at every addition.
// float16 has a narrow range (its largest value is 65504, its smallest
// normal 2^-14), so every float16 payload carries a power-of-two scale
// exponent: Scale picks it from the values so that the largest one lands
// in [2^14, 2^15) — no overflow, and small gradients keep their bits
// instead of flushing to zero. Powers of two scale exactly, so decoding
// recovers the rounded values exactly. bfloat16 has float32's range and
// needs no scale (its exponent is always 0).
//
// Infinities and NaNs pass through as themselves (NaN stays NaN, ±Inf
// stays ±Inf), so a sum that overflowed reaches every worker as an
// overflow, where a loss scaler sees it.
//
// It knows nothing of frames, pieces or scheduling.
package dtype

import (
	"fmt"
	"math"
	"strings"
	"unsafe"

	"github.com/autobyte/autobyte/transport"
	"github.com/x448/float16"
)

// DType is an element type on the wire. The zero value is F32.
type DType uint8

const (
	F32  DType = iota // IEEE float32, little-endian
	BF16              // bfloat16: float32's upper 16 bits, rounded to nearest even
	F16               // IEEE float16 (binary16), with a per-payload power-of-two scale
)

// Size is the bytes per element.
func (d DType) Size() int {
	if d == F32 {
		return 4
	}
	return 2
}

// Valid reports whether d is one of the defined types.
func (d DType) Valid() bool { return d <= F16 }

func (d DType) String() string {
	switch d {
	case F32:
		return "float32"
	case BF16:
		return "bfloat16"
	case F16:
		return "float16"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// Parse reads a type by name: float32 (f32, fp32, none: no compression),
// bfloat16 (bf16) or float16 (f16, fp16, half).
func Parse(s string) (DType, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "float32", "f32", "fp32", "none", "":
		return F32, nil
	case "bfloat16", "bf16":
		return BF16, nil
	case "float16", "f16", "fp16", "half":
		return F16, nil
	}
	return F32, fmt.Errorf("dtype: unknown element type %q (want none/float32, bf16/bfloat16 or fp16/float16)", s)
}

// WireOf is the wire type of a model's parameters of bytesPerParam bytes
// under compression: float32 parameters (4 bytes) travel as compression
// says (F32: uncompressed), 2-byte parameters as bfloat16 (a model profile
// does not say which 16-bit type; both have its size).
func WireOf(bytesPerParam int, compression DType) (DType, error) {
	if !compression.Valid() {
		return F32, fmt.Errorf("dtype: unknown compression %v", compression)
	}
	switch bytesPerParam {
	case 4:
		return compression, nil
	case 2:
		return BF16, nil
	}
	return F32, fmt.Errorf("dtype: %d-byte parameters; gradients travel as float32 (4 bytes) or 16-bit types (2)", bytesPerParam)
}

// Scale is the scale exponent for encoding src as d: for F16, e such that
// the largest finite |x| times 2^e is in [2^14, 2^15) (e at most 127;
// lower only for data below 2^-112); 0 for other types,
// for all-zero data and for data with no finite nonzero value.
func (d DType) Scale(src []float32) int {
	if d != F16 {
		return 0
	}
	var m float32
	for _, v := range src {
		a := float32(math.Abs(float64(v)))
		if a > m && a <= math.MaxFloat32 { // skips NaN and Inf
			m = a
		}
	}
	return scaleOf(m)
}

// scaleOf is Scale's exponent for data whose largest finite magnitude is m.
func scaleOf(m float32) int {
	if m == 0 {
		return 0
	}
	_, k := math.Frexp(float64(m)) // m = f * 2^k, f in [0.5, 1)
	// At most 127, so that the exponent fits a signed byte: data whose
	// largest value is below 2^-112 then keeps its top bits down to
	// 2^-151, under float32's smallest value anyway.
	return min(15-k, 127)
}

// Encode writes src into dst as d (d.Size()*len(src) bytes), each value
// times 2^exp, rounded to nearest even.
func (d DType) Encode(dst []byte, src []float32, exp int) {
	d.check("Encode", len(dst), len(src))
	switch d {
	case F32:
		transport.PutFloat32s(dst, src)
	case BF16:
		if u, ok := u16s(dst); ok {
			u = u[:len(src)]
			for i, v := range src {
				u[i] = bf16(v)
			}
			return
		}
		for i, v := range src {
			put16(dst, i, bf16(v))
		}
	case F16:
		if !float32Scale(exp) { // 2^exp beyond float32's range (tiny data): scale in float64
			s := math.Ldexp(1, exp)
			for i, v := range src {
				put16(dst, i, f32to16(float32(float64(v)*s)))
			}
			return
		}
		s := float32(math.Ldexp(1, exp))
		if u, ok := u16s(dst); ok {
			u = u[:len(src)]
			for i, v := range src {
				u[i] = f32to16(v * s)
			}
			return
		}
		for i, v := range src {
			put16(dst, i, f32to16(v*s))
		}
	}
}

// Decode overwrites dst with the values encoded in src as d, divided by
// 2^exp.
func (d DType) Decode(dst []float32, src []byte, exp int) {
	d.check("Decode", len(src), len(dst))
	switch d {
	case F32:
		transport.Float32s(dst, src)
	case BF16:
		if u, ok := u16s(src); ok {
			u = u[:len(dst)]
			for i, h := range u {
				dst[i] = bf16to32(h)
			}
			return
		}
		for i := range dst {
			dst[i] = bf16to32(get16(src, i))
		}
	case F16:
		s := math.Ldexp(1, -exp)
		if u, ok := u16s(src); ok && float32Scale(exp) {
			sf := float32(s) // see Add
			u = u[:len(dst)]
			for i, h := range u {
				dst[i] = f16[h] * sf
			}
			return
		}
		for i := range dst {
			dst[i] = float32(float64(f16[get16(src, i)]) * s)
		}
	}
}

// Add adds the values encoded in src as d, divided by 2^exp, to dst.
func (d DType) Add(dst []float32, src []byte, exp int) {
	d.check("Add", len(src), len(dst))
	switch d {
	case F32:
		transport.AddFloat32s(dst, src)
	case BF16:
		if u, ok := u16s(src); ok {
			u = u[:len(dst)]
			for i, h := range u {
				dst[i] += bf16to32(h)
			}
			return
		}
		for i := range dst {
			dst[i] += bf16to32(get16(src, i))
		}
	case F16:
		s := math.Ldexp(1, -exp)
		if u, ok := u16s(src); ok && float32Scale(exp) {
			// The scale is a float32 power of two: multiplying in float32
			// is exact unless the product is subnormal, where float64's
			// product rounded to float32 gives the same value.
			sf := float32(s)
			u = u[:len(dst)]
			for i, h := range u {
				dst[i] += f16[h] * sf
			}
			return
		}
		for i := range dst {
			dst[i] += float32(float64(f16[get16(src, i)]) * s)
		}
	}
}

// Round encodes vals as d with the scale Scale picks, into dst, and
// overwrites vals with what dst holds decoded, so that a sender keeps
// exactly the values its peers will receive. It returns the exponent.
func (d DType) Round(dst []byte, vals []float32) (exp int) {
	exp = d.Scale(vals)
	d.Encode(dst, vals, exp)
	if d != F32 {
		d.Decode(vals, dst, exp)
	}
	return exp
}

// AddRound is Add followed by Round, in fewer passes over the data (the
// ring's hot loop): it adds the values encoded in b (exponent exp) to
// vals, encodes the sums back into b with the scale Scale picks for them,
// leaves in vals what b now holds, and returns the new exponent. For F32
// the sums are exact float32 and b holds them.
func (d DType) AddRound(vals []float32, b []byte, exp int) int {
	d.check("AddRound", len(b), len(vals))
	switch d {
	case F32:
		d.Add(vals, b, exp)
		d.Encode(b, vals, 0)
		return 0
	case BF16:
		if u, ok := u16s(b); ok {
			u = u[:len(vals)]
			for i, h := range u {
				r := bf16(vals[i] + bf16to32(h))
				u[i] = r
				vals[i] = bf16to32(r)
			}
			return 0
		}
	case F16:
		if u, ok := u16s(b); ok && float32Scale(exp) {
			// Pass 1 adds and finds the largest magnitude (Scale's rule),
			// pass 2 encodes and keeps the encoded values.
			in := float32(math.Ldexp(1, -exp))
			u = u[:len(vals)]
			var m float32
			for i, h := range u {
				v := vals[i] + f16[h]*in
				vals[i] = v
				if a := float32(math.Abs(float64(v))); a > m && a <= math.MaxFloat32 {
					m = a
				}
			}
			out := scaleOf(m) // in [-113, 127]: float32 powers of two
			if !float32Scale(out) {
				return d.Round(b, vals) // vals hold the sums already
			}
			sc, back := float32(math.Ldexp(1, out)), float32(math.Ldexp(1, -out))
			for i, v := range vals {
				h := f32to16(v * sc)
				u[i] = h
				vals[i] = f16[h] * back
			}
			return out
		}
	}
	d.Add(vals, b, exp)
	return d.Round(b, vals)
}

func (d DType) check(op string, bytes, elems int) {
	if !d.Valid() {
		panic(fmt.Sprintf("dtype: %s with unknown type %d", op, uint8(d)))
	}
	if bytes != d.Size()*elems {
		panic(fmt.Sprintf("dtype: %s: %d bytes for %d %v values, want %d", op, bytes, elems, d, d.Size()*elems))
	}
}

// bf16 rounds v to bfloat16, to nearest even; NaN stays a (quiet) NaN.
func bf16(v float32) uint16 {
	b := math.Float32bits(v)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// bf16to32 is the float32 value of bfloat16 bits h, exactly (bfloat16 is
// float32's upper half).
func bf16to32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// float32Scale reports whether scaling by 2^exp or 2^-exp may be done in
// float32: for exp in [-126, 127] both are float32 powers of two (2^-127 a
// subnormal, still exact). Outside that range the loops scale in float64.
func float32Scale(exp int) bool { return exp >= -126 && exp <= 127 }

// f32to16 rounds v to float16, to nearest even (overflow to ±Inf, NaN to a
// quiet NaN), with integer arithmetic on the bits: several times faster
// than float16.Fromfloat32, which the tests check it against.
func f32to16(v float32) uint16 {
	x := math.Float32bits(v)
	sign := uint16(x>>16) & 0x8000
	x &= 0x7fffffff
	switch {
	case x >= 0x47800000: // |v| >= 65536, Inf or NaN
		if x > 0x7f800000 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case x < 0x38800000: // |v| < 2^-14: a float16 subnormal or zero
		// Adding 0.5 aligns the bits float16 keeps at the bottom of the
		// float32 mantissa, and the FPU rounds to nearest even.
		r := math.Float32frombits(x) + 0.5
		return sign | uint16(math.Float32bits(r)-0x3f000000)
	default:
		// Rebias the exponent (127 -> 15) and round the 13 dropped bits to
		// nearest even; a carry out of the mantissa bumps the exponent,
		// up to Inf for values in [65520, 65536).
		x += 0xc8000fff + (x>>13)&1
		return sign | uint16(x>>13)
	}
}

// u16s views b as little-endian uint16s where this machine's are (and b
// is aligned), so the loops above skip the byte shuffling.
func u16s(b []byte) ([]uint16, bool) {
	if !littleEndian || len(b) == 0 || uintptr(unsafe.Pointer(unsafe.SliceData(b)))%2 != 0 {
		return nil, false
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/2), true
}

var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

func put16(b []byte, i int, v uint16) { b[2*i], b[2*i+1] = byte(v), byte(v>>8) }
func get16(b []byte, i int) uint16    { return uint16(b[2*i]) | uint16(b[2*i+1])<<8 }

// f16 decodes every float16 bit pattern (256 KiB, built once): a lookup is
// several times faster than converting.
var f16 = func() []float32 {
	t := make([]float32, 1<<16)
	for i := range t {
		t[i] = float16.Frombits(uint16(i)).Float32()
	}
	return t
}()
