package transport

import (
	"math/bits"
	"sync"
	"unsafe"
)

// BufferPool recycles payload buffers.
type BufferPool = Pool[byte]

// Pool recycles slices of T, such as payload buffers or float32
// accumulators. A job sends and receives the same piece sizes every
// iteration, and a fresh megabyte buffer costs a page fault per 4 KiB (the
// kernel hands over zeroed pages) and garbage collection on every frame.
// Unlike a sync.Pool, which the collector empties every cycle (and a job's
// allocations of megabytes trigger a cycle every few frames), a Pool keeps
// its buffers until it holds more than its limit, so that in steady state
// no frame allocates.
//
// Buffers are kept in size classes of a quarter of a power of two, so a
// buffer has at most 25% more capacity than asked for and a Get finds one
// without a search. What the pool holds is bounded by what was in use at
// once (a buffer comes back only after its frame is done) and by Limit:
// over it, a Put drops the buffers of the class used least recently (those
// of an earlier configuration's piece sizes). Classes and limits count
// bytes. Safe for concurrent use; the zero value is ready, with
// DefaultPoolLimit.
type Pool[T any] struct {
	// Limit caps the bytes of idle buffers kept; 0 means DefaultPoolLimit.
	Limit int64

	mu      sync.Mutex
	classes map[int]*poolClass[T]
	held    int64  // capacity of the idle buffers kept
	clock   uint64 // counts Puts, to tell which class was used last
}

// DefaultPoolLimit is a Pool's limit unless it sets one: ample for the
// frames a credit window keeps in flight.
const DefaultPoolLimit = 512 << 20

// minPooled is the smallest buffer worth keeping: below a page, make is
// cheaper than the pool's lock.
const minPooled = 4096

type poolClass[T any] struct {
	free [][]T
	used uint64 // clock of the last Put into this class
}

// classOf returns the size class of a buffer of n bytes and its capacity
// in bytes: n rounded up to a quarter step of the power of two below it.
func classOf(n int) (class, capacity int) {
	e := bits.Len(uint(n-1)) - 1 // 2^e < n <= 2^(e+1)
	step := 1 << (e - 2)
	q := (n - 1<<e + step - 1) / step // 1..4 quarters above 2^e
	return e*4 + q, 1<<e + q*step
}

// elemSize is the size of one T in bytes.
func (b *Pool[T]) elemSize() int {
	var t T
	return max(1, int(unsafe.Sizeof(t)))
}

// Get returns a slice of n elements; its contents are arbitrary.
func (b *Pool[T]) Get(n int) []T {
	size := b.elemSize()
	if n*size < minPooled {
		return make([]T, n)
	}
	class, capacity := classOf(n * size) // capacity is a multiple of 512 bytes
	b.mu.Lock()
	if c := b.classes[class]; c != nil && len(c.free) > 0 {
		buf := c.free[len(c.free)-1]
		c.free[len(c.free)-1] = nil
		c.free = c.free[:len(c.free)-1]
		b.held -= int64(cap(buf) * size)
		b.mu.Unlock()
		return buf[:n]
	}
	b.mu.Unlock()
	return make([]T, n, capacity/size)
}

// Put gives buf back for a later Get; the caller must not use it again.
// Buffers the pool did not hand out are accepted where their capacity is a
// class's.
func (b *Pool[T]) Put(buf []T) {
	size := b.elemSize()
	if cap(buf)*size < minPooled {
		return
	}
	class, capacity := classOf(cap(buf) * size)
	if capacity != cap(buf)*size {
		return // not one of ours: a later Get of its class could be handed less than it asked for
	}
	limit := b.Limit
	if limit <= 0 {
		limit = DefaultPoolLimit
	}
	bytes := int64(capacity)
	if bytes > limit {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.classes == nil {
		b.classes = map[int]*poolClass[T]{}
	}
	c := b.classes[class]
	if c == nil {
		c = &poolClass[T]{}
		b.classes[class] = c
	}
	b.clock++
	c.used = b.clock
	for b.held+bytes > limit && b.evictStalest(c, size) {
	}
	if b.held+bytes > limit {
		return
	}
	c.free = append(c.free, buf[:0])
	b.held += bytes
}

// evictStalest drops one idle buffer of the least recently used class
// other than keep, or of keep itself if no other has any; false when there
// is nothing left to drop.
func (b *Pool[T]) evictStalest(keep *poolClass[T], size int) bool {
	var stalest *poolClass[T]
	for _, c := range b.classes {
		if c != keep && len(c.free) > 0 && (stalest == nil || c.used < stalest.used) {
			stalest = c
		}
	}
	if stalest == nil {
		if len(keep.free) == 0 {
			return false
		}
		stalest = keep
	}
	last := len(stalest.free) - 1
	b.held -= int64(cap(stalest.free[last]) * size)
	stalest.free[last] = nil
	stalest.free = stalest.free[:last]
	return true
}

// Held returns the bytes of idle buffers the pool keeps.
func (b *Pool[T]) Held() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held
}

// PoolDest returns a Conn.RecvTo destination that takes each payload's
// buffer from b. Payloads over eagerAlloc bytes get none: they grow as
// their bytes arrive, so that a lying header cannot make the receiver
// allocate a gigabyte up front.
func PoolDest(b *BufferPool) func(Header) []byte {
	return func(h Header) []byte {
		if h.Length > eagerAlloc {
			return nil
		}
		return b.Get(int(h.Length))
	}
}
