package transport

import (
	"runtime"
	"sync"
	"testing"
)

func TestBufferPoolSizes(t *testing.T) {
	var p BufferPool
	for _, n := range []int{0, 1, 4095, 4096, 4097, 5000, 65536, 1<<20 + 3, 4 << 20, 3*(1<<20) + 1} {
		b := p.Get(n)
		if len(b) != n || cap(b) < n {
			t.Fatalf("Get(%d): len %d cap %d", n, len(b), cap(b))
		}
		if n >= minPooled && float64(cap(b)) > 1.25*float64(n) {
			t.Errorf("Get(%d): capacity %d is more than 25%% over", n, cap(b))
		}
		p.Put(b)
	}
}

// The property a sync.Pool lacks: an idle buffer outlives garbage
// collections, so that the next frame of its size does not fault in fresh
// pages.
func TestBufferPoolKeepsBuffersAcrossCollections(t *testing.T) {
	var p BufferPool
	b := p.Get(1 << 20)
	b[0] = 42
	p.Put(b)
	runtime.GC()
	runtime.GC()
	c := p.Get(1<<20 - 100) // same class
	if &c[:1][0] != &b[:1][0] {
		t.Fatal("a buffer of the same class after two collections is not the one put back")
	}
	// Negative control: a different class is never handed the same array.
	d := p.Get(2 << 20)
	if &d[0] == &b[:1][0] {
		t.Fatal("a 2 MiB Get returned the 1 MiB buffer")
	}
	if p.Held() != 0 {
		t.Fatalf("holds %d bytes with every buffer handed out", p.Held())
	}
}

func TestBufferPoolLimitEvictsStalestClass(t *testing.T) {
	p := BufferPool{Limit: 3 << 20}
	old := [][]byte{p.Get(1 << 20), p.Get(1 << 20)}
	newer := p.Get(512 << 10)
	for _, b := range old {
		p.Put(b)
	}
	p.Put(newer)
	if got := p.Held(); got != 2<<20+512<<10 {
		t.Fatalf("held %d, want %d", got, 2<<20+512<<10)
	}
	// A 2 MiB buffer does not fit beside them: the 1 MiB class, used least
	// recently, makes room; the 512 KiB buffer stays.
	big := p.Get(2 << 20)
	p.Put(big)
	if got := p.Held(); got > p.Limit {
		t.Fatalf("held %d over the limit %d", got, p.Limit)
	}
	if got := p.Get(512 << 10); &got[0] != &newer[:1][0] {
		t.Error("the most recently used small class was evicted")
	}
	if got := p.Get(2 << 20); &got[0] != &big[:1][0] {
		t.Error("the buffer just put back was not kept")
	}
	// Over the limit on its own: never kept.
	p.Put(make([]byte, 4<<20))
	if p.Held() > p.Limit {
		t.Fatalf("held %d over the limit %d", p.Held(), p.Limit)
	}
}

func TestBufferPoolRefusesForeignCapacities(t *testing.T) {
	var p BufferPool
	p.Put(make([]byte, 5000)) // 5000 is no class's capacity
	if p.Held() != 0 {
		t.Fatalf("kept a buffer of capacity 5000 (held %d)", p.Held())
	}
	if b := p.Get(5000); cap(b) < 5000 {
		t.Fatalf("cap %d", cap(b))
	}
}

// No buffer is handed to two users at once (run with -race).
func TestBufferPoolConcurrent(t *testing.T) {
	p := BufferPool{Limit: 8 << 20}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				n := 4096 + (g*977+i*131)%(300<<10)
				b := p.Get(n)
				mark := byte(g*31 + i)
				for j := range b {
					b[j] = mark
				}
				runtime.Gosched()
				for j := 0; j < len(b); j += 1024 {
					if b[j] != mark {
						t.Errorf("goroutine %d: buffer changed under it", g)
						return
					}
				}
				p.Put(b)
			}
		}()
	}
	wg.Wait()
	if p.Held() > p.Limit {
		t.Fatalf("held %d over the limit %d", p.Held(), p.Limit)
	}
}

func TestPoolOfFloats(t *testing.T) {
	p := Pool[float32]{Limit: 1 << 20}
	a := p.Get(100_000) // 400,000 bytes
	if len(a) != 100_000 || float64(cap(a)) > 1.25*100_000 {
		t.Fatalf("len %d cap %d", len(a), cap(a))
	}
	p.Put(a)
	if got := p.Held(); got != int64(4*cap(a)) {
		t.Fatalf("held %d bytes, want %d", got, 4*cap(a))
	}
	if b := p.Get(99_000); &b[0] != &a[0] {
		t.Fatal("a float buffer of the same class was not reused")
	}
	small := p.Get(1000) // 4,000 bytes: below minPooled, not kept
	p.Put(small)
	if p.Held() != 0 {
		t.Fatalf("kept a buffer of %d bytes", 4*cap(small))
	}
}

func TestPoolDestBoundsEagerAllocation(t *testing.T) {
	var p BufferPool
	dest := PoolDest(&p)
	if b := dest(Header{Length: 1 << 20}); len(b) != 1<<20 {
		t.Fatalf("1 MiB frame: buffer of %d", len(b))
	}
	if b := dest(Header{Length: eagerAlloc + 1}); b != nil {
		t.Fatalf("a frame over %d bytes got a buffer of %d up front", eagerAlloc, cap(b))
	}
}
