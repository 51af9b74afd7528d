package dtype

import (
	"math"
	"math/rand"
	"testing"

	"github.com/x448/float16"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]DType{"none": F32, "float32": F32, "": F32, "BF16": BF16, "bfloat16": BF16, "fp16": F16, "float16": F16, "half": F16} {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := Parse("int8"); err == nil {
		t.Error(`Parse("int8") succeeded`)
	}
}

// The bfloat16 rounding against float32's own bits: round to nearest, ties
// to even, checked on values at and around every tie.
func TestBF16RoundsToNearestEven(t *testing.T) {
	cases := []struct {
		in   uint32
		want uint16
	}{
		{0x3f808000, 0x3f80}, // tie, even below: stays
		{0x3f818000, 0x3f82}, // tie, odd below: up to even
		{0x3f808001, 0x3f81}, // just above the tie: up
		{0x3f807fff, 0x3f80}, // just below: down
		{0x7f7fffff, 0x7f80}, // largest float32 rounds to +Inf
		{0x7f800000, 0x7f80}, // +Inf
		{0xff800000, 0xff80}, // -Inf
	}
	for _, c := range cases {
		if got := bf16(math.Float32frombits(c.in)); got != c.want {
			t.Errorf("bf16(%#08x) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
	if got := bf16(float32(math.NaN())); got&0x7f80 != 0x7f80 || got&0x7f == 0 {
		t.Errorf("bf16(NaN) = %#04x, not a NaN", got)
	}
}

// Every 16-bit value decodes and re-encodes to itself (F16 at several
// scales), so a rounded sum forwarded again is not rounded twice.
func TestRoundTripIsExact(t *testing.T) {
	for _, d := range []DType{BF16, F16} {
		for _, exp := range []int{0, 7, -9, 100} {
			if d == BF16 && exp != 0 {
				continue
			}
			b := make([]byte, 2)
			out := make([]byte, 2)
			v := make([]float32, 1)
			for i := 0; i < 1<<16; i++ {
				b[0], b[1] = byte(i), byte(i>>8)
				d.Decode(v, b, exp)
				if v[0] != v[0] {
					continue // NaN payloads need not keep their bits
				}
				d.Encode(out, v, exp)
				if out[0] != b[0] || out[1] != b[1] {
					t.Fatalf("%v exp %d: %#04x decodes to %v, which encodes to %#04x", d, exp, i, v[0], uint16(out[0])|uint16(out[1])<<8)
				}
			}
		}
	}
}

// Scale keeps float16 payloads in range: the largest magnitude encodes to
// a finite value in [2^14, 2^15), whatever the data's own range.
func TestF16ScaleNeverOverflows(t *testing.T) {
	for _, m := range []float32{1e30, 65504, 65505, 1, 3e-5, 1e-20, 1e-33} {
		vals := []float32{m, -m / 3, 0}
		exp := F16.Scale(vals)
		b := make([]byte, 6)
		F16.Encode(b, vals, exp)
		got := float16.Frombits(get16(b, 0)).Float32()
		if got < 1<<14 || got >= 1<<15 {
			t.Errorf("max %g: scale 2^%d encodes it as %g, want [2^14, 2^15)", m, exp, got)
		}
		back := make([]float32, 3)
		F16.Decode(back, b, exp)
		if rel := math.Abs(float64(back[0]-m)) / float64(m); rel > 1.0/2048 {
			t.Errorf("max %g: decoded %g, relative error %g above float16's 2^-11", m, back[0], rel)
		}
	}
	// The exponent stops at 127 (a signed byte on the wire): float32's
	// smallest value still survives, as a float16 subnormal.
	tiny := []float32{math.SmallestNonzeroFloat32}
	if exp := F16.Round(make([]byte, 2), tiny); exp != 127 || tiny[0] != math.SmallestNonzeroFloat32 {
		t.Errorf("smallest float32: exponent %d, round trip %g; want 127 and itself", exp, tiny[0])
	}
	// Without the scale, 1e30 overflows and 1e-20 flushes to zero: the
	// negative control of the test above.
	if v := float16.Fromfloat32(1e30); !v.IsInf(0) {
		t.Errorf("float16(1e30) = %v, want Inf (the scale is what prevents it)", v)
	}
	if v := float16.Fromfloat32(1e-20).Float32(); v != 0 {
		t.Errorf("float16(1e-20) = %v, want 0", v)
	}
}

// f32to16 against the library's conversion, over a stride of every
// float32 bit pattern and every tie around float16's normal/subnormal
// boundaries.
func TestF32to16MatchesLibrary(t *testing.T) {
	check := func(x uint32) {
		v := math.Float32frombits(x)
		want := uint16(float16.Fromfloat32(v))
		got := f32to16(v)
		if v != v {
			if got&0x7c00 != 0x7c00 || got&0x3ff == 0 {
				t.Fatalf("f32to16(%#08x NaN) = %#04x, not a NaN", x, got)
			}
			return
		}
		if got != want {
			t.Fatalf("f32to16(%#08x = %g) = %#04x, library says %#04x", x, v, got, want)
		}
	}
	for x := uint64(0); x < 1<<32; x += 251 {
		check(uint32(x))
	}
	for h := 0; h < 1<<15; h++ { // every float16 and the ties just above it
		v := float16.Frombits(uint16(h)).Float32()
		b := math.Float32bits(v)
		for _, d := range []uint32{0, 1, 0x0fff, 0x1000, 0x1001} {
			check(b + d)
			check((b + d) | 1<<31)
		}
	}
}

func TestNonFinitePassThrough(t *testing.T) {
	for _, d := range []DType{F32, BF16, F16} {
		vals := []float32{float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 2.5}
		b := make([]byte, d.Size()*len(vals))
		exp := d.Round(b, vals)
		if !math.IsInf(float64(vals[0]), 1) || !math.IsInf(float64(vals[1]), -1) || vals[2] == vals[2] || vals[3] != 2.5 {
			t.Errorf("%v (exp %d): got %v, want [+Inf -Inf NaN 2.5]", d, exp, vals)
		}
	}
}

// A float32 sum of 16-bit values, rounded once: with values whose exact
// sum lies between two bfloat16 values, the result is the nearer (or even)
// one, where summing in bfloat16 step by step drifts.
func TestAddThenRoundOnce(t *testing.T) {
	// 1 + 8 * 2^-9: in bfloat16 (8 significant bits) each 2^-9 added to 1
	// is a tie that rounds to even, back to 1; in float32 the sum is
	// 1 + 2^-6, exactly representable in bfloat16.
	one := []float32{1}
	small := []float32{1.0 / 512}
	b1, bs := make([]byte, 2), make([]byte, 2)
	BF16.Encode(b1, one, 0)
	BF16.Encode(bs, small, 0)
	sum := make([]float32, 1)
	BF16.Decode(sum, b1, 0)
	stepwise := float32(1)
	for range 8 {
		BF16.Add(sum, bs, 0)
		v := []float32{stepwise + 1.0/512}
		BF16.Round(make([]byte, 2), v)
		stepwise = v[0]
	}
	out := make([]byte, 2)
	BF16.Round(out, sum)
	if want := float32(1 + 1.0/64); sum[0] != want {
		t.Errorf("float32 sum rounded once = %v, want %v", sum[0], want)
	}
	if stepwise != 1 {
		t.Errorf("negative control: bfloat16 step-by-step sum = %v, want 1 (the drift this test guards against)", stepwise)
	}
}

// The byte-wise loops (unaligned buffers, big-endian machines) and the
// uint16 views give the same bits, at scales inside and outside float32's
// exponent range.
func TestUnalignedMatchesAligned(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	src := make([]float32, 101)
	for i := range src {
		src[i] = float32(rng.NormFloat64() * math.Pow(2, float64(rng.Intn(40)-20)))
	}
	for _, d := range []DType{BF16, F16} {
		for _, exp := range []int{0, 9, -30, 127, 140} {
			if d == BF16 && exp != 0 {
				continue
			}
			aligned := make([]byte, 2*len(src))
			odd := make([]byte, 2*len(src)+1)[1:]
			d.Encode(aligned, src, exp)
			d.Encode(odd, src, exp)
			if string(aligned) != string(odd) {
				t.Fatalf("%v exp %d: Encode differs between aligned and unaligned buffers", d, exp)
			}
			a, b := make([]float32, len(src)), make([]float32, len(src))
			d.Decode(a, aligned, exp)
			d.Decode(b, odd, exp)
			d.Add(a, aligned, exp)
			d.Add(b, odd, exp)
			for i := range a {
				if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
					t.Fatalf("%v exp %d element %d: %v aligned, %v unaligned", d, exp, i, a[i], b[i])
				}
			}
		}
	}
}

// AddRound gives the bits of Add then Round, aligned or not.
func TestAddRoundMatchesAddThenRound(t *testing.T) {
	rng := rand.New(rand.NewSource(5))
	for _, d := range []DType{F32, BF16, F16} {
		for _, offset := range []int{0, 1} {
			vals := make([]float32, 77)
			in := make([]float32, 77)
			for i := range vals {
				vals[i] = float32(rng.NormFloat64() * math.Pow(2, float64(rng.Intn(30)-15)))
				in[i] = float32(rng.NormFloat64() * math.Pow(2, float64(rng.Intn(30)-15)))
			}
			b1 := make([]byte, d.Size()*len(in)+offset)[offset:]
			exp := d.Round(b1, in)
			b2 := append([]byte(nil), b1...)
			v1, v2 := append([]float32(nil), vals...), append([]float32(nil), vals...)
			d.Add(v1, b1, exp)
			e1 := d.Round(b1, v1)
			e2 := d.AddRound(v2, b2, exp)
			if e1 != e2 || string(b1) != string(b2) {
				t.Fatalf("%v offset %d: AddRound wrote other bytes (exponent %d, want %d)", d, offset, e2, e1)
			}
			for i := range v1 {
				if math.Float32bits(v1[i]) != math.Float32bits(v2[i]) {
					t.Fatalf("%v offset %d element %d: AddRound left %v, Add+Round %v", d, offset, i, v2[i], v1[i])
				}
			}
		}
	}
}

func TestSizesMismatchPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Encode with a short buffer did not panic")
		}
	}()
	BF16.Encode(make([]byte, 3), make([]float32, 2), 0)
}

func BenchmarkEncode(b *testing.B) {
	src := make([]float32, 1<<18)
	for i := range src {
		src[i] = rand.Float32() - 0.5
	}
	dst := make([]byte, 4*len(src))
	for _, d := range []DType{F32, BF16, F16} {
		b.Run(d.String(), func(b *testing.B) {
			b.SetBytes(int64(4 * len(src)))
			for b.Loop() {
				d.Encode(dst[:d.Size()*len(src)], src, d.Scale(src))
			}
		})
	}
}

func BenchmarkAddRound(b *testing.B) {
	benchAccumulate(b, func(d DType, acc []float32, src []byte) {
		for i := range acc {
			acc[i] = 0
		}
		d.AddRound(acc, src, 0)
	})
}

func BenchmarkAdd(b *testing.B) {
	benchAccumulate(b, func(d DType, acc []float32, src []byte) { d.Add(acc, src, 0) })
}

// benchAccumulate runs add once per iteration for each type, into 1<<18
// float32s from as many encoded elements.
func benchAccumulate(b *testing.B, add func(d DType, acc []float32, src []byte)) {
	acc := make([]float32, 1<<18)
	src := make([]byte, 4*len(acc))
	for _, d := range []DType{F32, BF16, F16} {
		b.Run(d.String(), func(b *testing.B) {
			b.SetBytes(int64(4 * len(acc)))
			for b.Loop() {
				add(d, acc, src[:d.Size()*len(acc)])
			}
		})
	}
}
