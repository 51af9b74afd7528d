package allreduce

import (
	"testing"

	"github.com/autobyte/autobyte/transport"
)

func BenchmarkTmpFused(b *testing.B) {
	d := make([]float32, 1<<16)
	p := make([]byte, 4<<16)
	b.SetBytes(4 << 16)
	for b.Loop() {
		addPut(d, p)
	}
}
func BenchmarkTmpTwoPass(b *testing.B) {
	d := make([]float32, 1<<16)
	p := make([]byte, 4<<16)
	b.SetBytes(4 << 16)
	for b.Loop() {
		transport.AddFloat32s(d, p)
		transport.PutFloat32s(p, d)
	}
}
