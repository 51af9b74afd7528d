package transport

import (
	"encoding/binary"
	"math"
	"testing"
)

func add64(dst []float32, src []byte) {
	le := binary.LittleEndian
	for len(dst) >= 8 {
		d := dst[:8:8]
		s := src[:32:32]
		x0 := le.Uint64(s[0:8])
		x1 := le.Uint64(s[8:16])
		x2 := le.Uint64(s[16:24])
		x3 := le.Uint64(s[24:32])
		d[0] += math.Float32frombits(uint32(x0))
		d[1] += math.Float32frombits(uint32(x0 >> 32))
		d[2] += math.Float32frombits(uint32(x1))
		d[3] += math.Float32frombits(uint32(x1 >> 32))
		d[4] += math.Float32frombits(uint32(x2))
		d[5] += math.Float32frombits(uint32(x2 >> 32))
		d[6] += math.Float32frombits(uint32(x3))
		d[7] += math.Float32frombits(uint32(x3 >> 32))
		dst = dst[8:]
		src = src[32:]
	}
}
func add4(dst []float32, src []byte) {
	le := binary.LittleEndian
	for len(dst) >= 4 && len(src) >= 16 {
		d := dst[:4:4]
		s := src[:16:16]
		d[0] += math.Float32frombits(le.Uint32(s[0:4]))
		d[1] += math.Float32frombits(le.Uint32(s[4:8]))
		d[2] += math.Float32frombits(le.Uint32(s[8:12]))
		d[3] += math.Float32frombits(le.Uint32(s[12:16]))
		dst = dst[4:]
		src = src[16:]
	}
}
func BenchmarkV64(b *testing.B) {
	const n = 1 << 20
	dst := make([]float32, n); src := make([]byte, 4*n); b.SetBytes(4 * n)
	for b.Loop() { add64(dst, src) }
}
func BenchmarkV4(b *testing.B) {
	const n = 1 << 20
	dst := make([]float32, n); src := make([]byte, 4*n); b.SetBytes(4 * n)
	for b.Loop() { add4(dst, src) }
}
func BenchmarkSmall(b *testing.B) {
	const n = 1 << 12
	dst := make([]float32, n); src := make([]byte, 4*n); b.SetBytes(4 * n)
	for b.Loop() { AddFloat32s(dst, src) }
}
func BenchmarkSmall64(b *testing.B) {
	const n = 1 << 12
	dst := make([]float32, n); src := make([]byte, 4*n); b.SetBytes(4 * n)
	for b.Loop() { add64(dst, src) }
}
