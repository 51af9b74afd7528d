package transport

import "sync"

// BufferPool recycles payload buffers. A job sends and receives the same
// piece sizes every iteration, and fresh megabyte buffers cost page faults,
// zeroing and garbage collection on every frame. Safe for concurrent use.
type BufferPool struct{ p sync.Pool }

// Get returns a buffer of n bytes; its contents are arbitrary.
func (b *BufferPool) Get(n int) []byte {
	if p, ok := b.p.Get().(*[]byte); ok {
		if cap(*p) >= n {
			return (*p)[:n]
		}
		b.p.Put(p) // too small for this frame; another may fit it
	}
	return make([]byte, n)
}

// Put gives buf back for a later Get; the caller must not use it again.
func (b *BufferPool) Put(buf []byte) {
	if cap(buf) > 0 {
		b.p.Put(&buf)
	}
}
