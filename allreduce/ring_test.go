package allreduce

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/transport"
	"golang.org/x/time/rate"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func tcfg(rank int) transport.Config {
	return transport.Config{Token: "test", Rank: rank, Role: "worker", Logger: quiet}
}

// ring is a test ring on loopback.
type ring struct {
	rings      []*Ring
	next, prev []*transport.Conn
	cancel     context.CancelFunc
	errs       []chan error // Run's result per rank
	lns        []*transport.Listener
}

// connect listens on 127.0.0.1:0 for every rank, then has every rank dial
// the next and accept from the previous.
func connect(t testing.TB, size int) (next, prev []*transport.Conn, lns []*transport.Listener) {
	t.Helper()
	return connectWith(t, size, tcfg)
}

// connectWith is connect with each rank's transport configuration from cfg.
func connectWith(t testing.TB, size int, cfg func(rank int) transport.Config) (next, prev []*transport.Conn, lns []*transport.Listener) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lns = make([]*transport.Listener, size)
	for r := range size {
		l, err := transport.Listen("127.0.0.1:0", cfg(r))
		if err != nil {
			t.Fatal(err)
		}
		lns[r] = l
	}
	t.Cleanup(func() {
		for _, l := range lns {
			l.Close()
		}
	})
	next, prev = make([]*transport.Conn, size), make([]*transport.Conn, size)
	var wg sync.WaitGroup
	errs := make(chan error, 2*size)
	for r := range size {
		wg.Add(2)
		go func() {
			defer wg.Done()
			c, err := transport.Dial(ctx, lns[(r+1)%size].Addr().String(), cfg(r))
			next[r] = c
			errs <- err
		}()
		go func() {
			defer wg.Done()
			c, err := lns[r].Accept(ctx)
			prev[r] = c
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, c := range append(next, prev...) {
			c.Close()
		}
	})
	return next, prev, lns
}

// newRing builds and runs a ring of size ranks; Run's errors arrive on
// errs. The ring is stopped at the end of the test.
func newRing(t testing.TB, size int) *ring {
	t.Helper()
	return newRingWith(t, size, tcfg)
}

// newRingWith is newRing with each rank's transport configuration from cfg.
func newRingWith(t testing.TB, size int, cfg func(rank int) transport.Config) *ring {
	t.Helper()
	tr := &ring{rings: make([]*Ring, size), errs: make([]chan error, size)}
	if size > 1 {
		tr.next, tr.prev, tr.lns = connectWith(t, size, cfg)
	} else {
		tr.next, tr.prev = make([]*transport.Conn, 1), make([]*transport.Conn, 1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tr.cancel = cancel
	for r := range size {
		rg, err := New(Options{Rank: r, Size: size, Next: tr.next[r], Prev: tr.prev[r], Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		tr.rings[r] = rg
		tr.errs[r] = make(chan error, 1)
		go func() { tr.errs[r] <- rg.Run(ctx) }()
	}
	t.Cleanup(tr.stop)
	return tr
}

// stop cancels the rings and waits for every Run.
func (tr *ring) stop() {
	tr.cancel()
	for _, ch := range tr.errs {
		if err, ok := <-ch; ok {
			ch <- err // keep it for other readers
		}
	}
}

// runErr waits up to d for rank's Run to return.
func (tr *ring) runErr(t *testing.T, rank int, d time.Duration) error {
	t.Helper()
	select {
	case err := <-tr.errs[rank]:
		tr.errs[rank] <- err
		return err
	case <-time.After(d):
		t.Fatalf("rank %d: Run did not return within %v", rank, d)
		return nil
	}
}

// input is rank's integer-valued data for piece k of n elements: exact in
// float32 and in any order of summation for up to a few ranks.
func input(rank, k, n int) []float32 {
	d := make([]float32, n)
	for i := range d {
		d[i] = float32((rank*7919+k*104729+i*31)%2001 - 1000)
	}
	return d
}

func wantSum(size, k, n int) []float32 {
	w := make([]float32, n)
	for r := range size {
		for i, v := range input(r, k, n) {
			w[i] += v
		}
	}
	return w
}

func pieceOf(k, n int) sched.Piece {
	return sched.Piece{PieceID: sched.PieceID{Iteration: k / 5, Tensor: k % 5, Index: k}, Count: 1, Bytes: 4 * int64(n)}
}

type result struct {
	rank, k int
	err     error
}

// checkExact compares every element's bits with the exact sum.
func checkExact(t *testing.T, rank, k int, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("rank %d piece %d (%d elements): element %d = %v, want %v", rank, k, len(want), i, got[i], want[i])
		}
	}
}

// awaitPieces waits up to timeout for the results of pieces pieces on
// each of size ranks, failing the test on the first error.
func awaitPieces(t *testing.T, res <-chan result, size, pieces int, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for range size * pieces {
		select {
		case x := <-res:
			if x.err != nil {
				t.Fatalf("rank %d piece %d: %v", x.rank, x.k, x.err)
			}
		case <-deadline:
			t.Fatalf("ring of %d: not all of %d pieces done on every rank within %v", size, pieces, timeout)
		}
	}
}

// allReduce starts the pieces of the given sizes on every rank (each rank
// in order, from its own goroutine, sleeping delay() before each), waits
// for all of them and checks exact sums on every rank.
func allReduce(t *testing.T, tr *ring, sizes []int, delay func(rank, k int) time.Duration, timeout time.Duration) {
	t.Helper()
	size := len(tr.rings)
	data := make([][][]float32, size)
	res := make(chan result, size*len(sizes))
	for r := range size {
		data[r] = make([][]float32, len(sizes))
		for k, n := range sizes {
			data[r][k] = input(r, k, n)
		}
		go func() {
			for k, n := range sizes {
				if delay != nil {
					time.Sleep(delay(r, k))
				}
				called := false
				var mu sync.Mutex
				tr.rings[r].Start(pieceOf(k, n), uint64(k), dtype.F32, data[r][k], func(err error) {
					mu.Lock()
					defer mu.Unlock()
					if called {
						panic(fmt.Sprintf("rank %d piece %d: done called twice", r, k))
					}
					called = true
					res <- result{r, k, err}
				})
			}
		}()
	}
	awaitPieces(t, res, size, len(sizes), timeout)
	for k, n := range sizes {
		want := wantSum(size, k, n)
		for r := range size {
			checkExact(t, r, k, data[r][k], want)
		}
	}
}

func TestChunks(t *testing.T) {
	for size := 1; size <= 7; size++ {
		for n := 0; n <= 3*size+1; n++ {
			end := 0
			for i := range size {
				lo, hi := chunk(n, size, i)
				if lo != end || hi < lo {
					t.Fatalf("n=%d size=%d: chunk %d = [%d,%d), want it to start at %d", n, size, i, lo, hi, end)
				}
				if l0, h0 := chunk(n, size, 0); hi-lo > h0-l0 || h0-l0-(hi-lo) > 1 {
					t.Fatalf("n=%d size=%d: chunk %d has %d elements, chunk 0 has %d: not near-equal, larger first", n, size, i, hi-lo, h0-l0)
				}
				end = hi
			}
			if end != n {
				t.Fatalf("n=%d size=%d: chunks end at %d", n, size, end)
			}
		}
	}
}

func TestExactSums(t *testing.T) {
	for size := 1; size <= 6; size++ {
		t.Run(fmt.Sprintf("ranks=%d", size), func(t *testing.T) {
			tr := newRing(t, size)
			// 1 element, fewer than, as many as and more than ranks, and
			// larger than ranks x chunks.
			sizes := []int{1, 2, max(size-1, 1), size, size + 1, 2*size + 1, 7, 1000, 4099, 100003}
			allReduce(t, tr, sizes, nil, 20*time.Second)
		})
	}
}

func TestSizeOneLeavesDataAlone(t *testing.T) {
	rg, err := New(Options{Rank: 0, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	data := []float32{1, 2, 3}
	got := make(chan error, 1)
	rg.Start(pieceOf(0, 3), 0, dtype.F32, data, func(err error) { got <- err })
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("size 1: done not called")
	}
	if data[0] != 1 || data[1] != 2 || data[2] != 3 {
		t.Fatalf("size 1 changed data to %v", data)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := rg.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("size 1 Run after cancel = %v, want context.Canceled", err)
	}
}

// TestRandomReadiness starts many pieces on every rank in the same order
// but after random per-rank sleeps, so frames often arrive for pieces a
// rank has not started, with many pieces in flight at once.
func TestRandomReadiness(t *testing.T) {
	for _, size := range []int{2, 3, 4, 5} {
		t.Run(fmt.Sprintf("ranks=%d", size), func(t *testing.T) {
			tr := newRing(t, size)
			rng := rand.New(rand.NewPCG(uint64(size), 7))
			sizes := make([]int, 60)
			for k := range sizes {
				sizes[k] = 1 + rng.IntN(20000)
				if k%7 == 0 {
					sizes[k] = 1 + rng.IntN(size)
				}
			}
			delays := make([][]time.Duration, size)
			for r := range delays {
				delays[r] = make([]time.Duration, len(sizes))
				for k := range sizes {
					delays[r][k] = time.Duration(rng.IntN(3000)) * time.Microsecond
				}
			}
			allReduce(t, tr, sizes, func(r, k int) time.Duration { return delays[r][k] }, 30*time.Second)
		})
	}
}

// TestDataGivenBackOnlyWhenWritten: float32 chunks are sent straight from
// the caller's data, so done must wait until every such frame is written.
// Each done checks its sums and at once overwrites the data with NaNs, as a
// training step reusing its gradient buffer would; slow, shaped links keep
// frames queued after a piece's last step arrives. A frame sent after its
// done would carry NaNs into another rank's sums.
func TestDataGivenBackOnlyWhenWritten(t *testing.T) {
	const size, pieces = 3, 24
	tr := newRingWith(t, size, func(r int) transport.Config {
		c := tcfg(r)
		c.Egress = rate.NewLimiter(40<<20, 64<<10) // 40 MiB/s: frames queue behind each other
		return c
	})
	sizes := make([]int, pieces)
	for k := range sizes {
		sizes[k] = 30000 + 7*k
	}
	res := make(chan result, size*pieces)
	for r := range size {
		go func() {
			for k, n := range sizes {
				data := input(r, k, n)
				want := wantSum(size, k, n)
				// Later pieces first in the queues: the earlier ones' last frames wait behind them.
				tr.rings[r].Start(pieceOf(k, n), uint64(pieces-k), dtype.F32, data, func(err error) {
					if err == nil {
						for i := range want {
							if math.Float32bits(data[i]) != math.Float32bits(want[i]) {
								err = fmt.Errorf("element %d = %v, want %v", i, data[i], want[i])
								break
							}
						}
					}
					for i := range data {
						data[i] = float32(math.NaN())
					}
					res <- result{r, k, err}
				})
			}
		}()
	}
	awaitPieces(t, res, size, pieces, 30*time.Second)
	held := 0
	for _, rg := range tr.rings {
		rg.mu.Lock()
		held += rg.heldBack
		rg.mu.Unlock()
	}
	// Otherwise the test proves nothing: every frame was written before
	// its piece's last step arrived.
	if held == 0 {
		t.Fatal("no piece's done waited for its frames: the scenario does not exercise the wait")
	}
	t.Logf("%d of %d pieces waited for their frames", held, size*pieces)
}

// TestLateRank has one rank start everything long after the others have
// sent all they can: its buffered frames must be processed, in order, once
// it starts.
func TestLateRank(t *testing.T) {
	const size = 4
	tr := newRing(t, size)
	sizes := []int{3, 4096, 1, 50000, 17}
	allReduce(t, tr, sizes, func(r, k int) time.Duration {
		if r == 2 && k == 0 {
			return 300 * time.Millisecond
		}
		return 0
	}, 20*time.Second)
}

// TestWaitsForEveryRank checks a piece is not done before every rank
// started it.
func TestWaitsForEveryRank(t *testing.T) {
	const size, n = 3, 100
	tr := newRing(t, size)
	done := make(chan result, size)
	data := make([][]float32, size)
	for r := range size {
		data[r] = input(r, 0, n)
	}
	for r := range size - 1 {
		tr.rings[r].Start(pieceOf(0, n), 0, dtype.F32, data[r], func(err error) { done <- result{r, 0, err} })
	}
	select {
	case x := <-done:
		t.Fatalf("rank %d's piece done (err %v) before rank %d started it", x.rank, x.err, size-1)
	case <-time.After(200 * time.Millisecond):
	}
	tr.rings[size-1].Start(pieceOf(0, n), 0, dtype.F32, data[size-1], func(err error) { done <- result{size - 1, 0, err} })
	for range size {
		select {
		case x := <-done:
			if x.err != nil {
				t.Fatal(x.err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("piece not done on every rank after all started it")
		}
	}
	want := wantSum(size, 0, n)
	for r := range size {
		checkExact(t, r, 0, data[r], want)
	}
}

// TestKilledRank kills rank 3 of 4 (closes its connections abruptly)
// while pieces wait for it: its neighbours' Run name it, and every
// in-flight done gets an error within a couple of seconds.
func TestKilledRank(t *testing.T) {
	const size, dead = 4, 3
	tr := newRing(t, size)
	done := make(chan result, 3*size)
	for k := range 3 {
		for r := range size {
			if r != dead {
				tr.rings[r].Start(pieceOf(k, 1000), uint64(k), dtype.F32, input(r, k, 1000), func(err error) { done <- result{r, k, err} })
			}
		}
	}
	time.Sleep(50 * time.Millisecond)
	tr.next[dead].Close()
	tr.prev[dead].Close()
	start := time.Now()
	for range 3 * (size - 1) {
		select {
		case x := <-done:
			if x.err == nil {
				t.Fatalf("rank %d piece %d done without error though rank %d never started it", x.rank, x.k, dead)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("in-flight pieces not failed within 3s of killing a rank")
		}
	}
	t.Logf("in-flight pieces failed after %v", time.Since(start))
	// Rank 0 reads from the dead rank and rank 2 writes to it; the failure
	// also travels around the ring in close reasons, so a rank may learn of
	// it from another neighbour first. Every rank's error names a lost
	// neighbour and, down the chain, rank 3; at least one names rank 3
	// directly.
	direct := 0
	for r := range dead {
		err := tr.runErr(t, r, 3*time.Second)
		prefix := fmt.Sprintf("allreduce: rank %d: lost ", r)
		if err == nil || !strings.HasPrefix(err.Error(), prefix) || !strings.Contains(err.Error(), "rank 3") {
			t.Errorf("rank %d: Run = %v, want an error starting %q and naming rank 3", r, err, prefix)
			continue
		}
		t.Logf("rank %d: %v", r, err)
		if strings.HasPrefix(err.Error(), "allreduce: rank 0: lost previous rank 3: ") || strings.HasPrefix(err.Error(), "allreduce: rank 2: lost next rank 3: ") {
			direct++
		}
	}
	if direct == 0 {
		t.Error("neither neighbour of the dead rank 3 named it as lost")
	}
	// A piece started after the failure fails at once.
	got := make(chan error, 1)
	tr.rings[0].Start(pieceOf(9, 10), 9, dtype.F32, make([]float32, 10), func(err error) { got <- err })
	select {
	case err := <-got:
		// Rank 0 may have learnt of the failure from either neighbour
		// first (see above); whichever it was is the ring's error.
		if err == nil || err.Error() != tr.rings[0].Err().Error() || !strings.Contains(err.Error(), "rank 3") {
			t.Errorf("Start after failure: done(%v), want the ring's error %v", err, tr.rings[0].Err())
		}
	case <-time.After(time.Second):
		t.Error("Start after failure: done not called")
	}
}

// TestLostNeighbour plays rank 1 of a ring of 2 by hand and kills one of
// its connections abruptly: rank 0's Run names the lost neighbour (its
// previous rank when the connection it reads dies, its next rank when the
// one it writes dies), and its in-flight piece gets the error.
func TestLostNeighbour(t *testing.T) {
	for _, c := range []struct {
		name string
		kill func(next, prev []*transport.Conn)
		want string
	}{
		{"prev", func(next, prev []*transport.Conn) { next[1].Close() }, "allreduce: rank 0: lost previous rank 1: "},
		{"next", func(next, prev []*transport.Conn) { prev[1].Close() }, "allreduce: rank 0: lost next rank 1: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			next, prev, _ := connect(t, 2)
			runErr, done := runRank0WithPiece(t, next, prev)
			c.kill(next, prev)
			select {
			case err := <-runErr:
				if err == nil || !strings.HasPrefix(err.Error(), c.want) {
					t.Fatalf("Run = %v, want an error starting %q", err, c.want)
				}
				t.Log(err)
			case <-time.After(3 * time.Second):
				t.Fatal("Run did not notice the lost neighbour within 3s")
			}
			select {
			case err := <-done:
				if err == nil || !strings.HasPrefix(err.Error(), c.want) {
					t.Fatalf("in-flight piece: done(%v), want the ring's error", err)
				}
			case <-time.After(time.Second):
				t.Fatal("in-flight piece not failed")
			}
		})
	}
}

// TestRankLeftEarly: a rank that says goodbye while the others still start
// pieces (it ran fewer iterations) makes the ring fail with an error naming
// it and the piece, on every other rank and within a bounded time, whether
// the others started the piece before its goodbye or after. Goodbyes after
// the last piece leave every ring without an error (the control).
func TestRankLeftEarly(t *testing.T) {
	const n = 10
	for _, size := range []int{2, 3} {
		for _, startedFirst := range []bool{true, false} {
			name := fmt.Sprintf("ring of %d, started before the goodbye %v", size, startedFirst)
			tr := newRing(t, size)
			allReduce(t, tr, []int{n}, nil, 5*time.Second)
			leaver := size - 1
			done := make(chan result, size)
			start := func() {
				for r := range size {
					if r != leaver {
						tr.rings[r].Start(pieceOf(1, n), 1, dtype.F32, input(r, 1, n), func(err error) { done <- result{r, 1, err} })
					}
				}
			}
			if startedFirst {
				start()
				time.Sleep(50 * time.Millisecond)
			}
			if err := tr.rings[leaver].Goodbye(2 * time.Second); err != nil {
				t.Fatal(err)
			}
			if !startedFirst {
				time.Sleep(100 * time.Millisecond) // the goodbyes are in first
				start()
			}
			want := fmt.Sprintf("rank %d finished and left the job before piece (epoch 0, iteration 0, tensor 1, index 1)", leaver)
			for range size - 1 {
				select {
				case x := <-done:
					if x.err == nil || !strings.Contains(x.err.Error(), want) {
						t.Errorf("%s: rank %d: done(%v), want an error containing %q", name, x.rank, x.err, want)
					}
				case <-time.After(3 * time.Second):
					t.Fatalf("%s: a piece still waits 3 s after rank %d left", name, leaver)
				}
			}
			for r := range size - 1 {
				if err := tr.runErr(t, r, 3*time.Second); err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("%s: rank %d: Run = %v, want an error containing %q", name, r, err, want)
				}
			}
		}
		tr := newRing(t, size)
		allReduce(t, tr, []int{n, n}, nil, 5*time.Second)
		for r := range size {
			if err := tr.rings[r].Goodbye(2 * time.Second); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(100 * time.Millisecond)
		for r := range size {
			if err := tr.rings[r].Err(); err != nil {
				t.Errorf("ring of %d: rank %d failed after goodbyes that followed the last piece: %v", size, r, err)
			}
		}
	}
}

// TestGoodbyeAfterNeighbourClosed: a goodbye that cannot be written because
// a neighbour already closed its connection with a reason is no failure of
// the rank saying it (the neighbour stopped and said why); a goodbye lost
// on a connection closed for any other reason still is (negative control).
func TestGoodbyeAfterNeighbourClosed(t *testing.T) {
	t.Run("neighbour closed with a reason", func(t *testing.T) {
		tr := newRing(t, 3)
		allReduce(t, tr, []int{10}, nil, 5*time.Second)
		// Rank 0 stops and tells both neighbours why; rank 1 (its next)
		// fails and closes its own connections, so both of rank 1's
		// goodbyes fail: one to a peer that closed, one on a connection
		// rank 1 closed in reaction.
		tr.next[0].CloseWithReason("rank 0: out of data")
		tr.prev[0].CloseWithReason("rank 0: out of data")
		if err := tr.runErr(t, 1, 3*time.Second); err == nil || !strings.Contains(err.Error(), "closed the connection") {
			t.Fatalf("rank 1: Run = %v, want the failure of a neighbour that closed the connection", err)
		}
		if err := tr.rings[1].Goodbye(2 * time.Second); err != nil {
			t.Errorf("rank 1: Goodbye after its neighbour closed = %v, want nil", err)
		}
	})
	t.Run("connection closed without a reason", func(t *testing.T) {
		// No ring runs here, so no failure can travel round a ring and come
		// back as a neighbour's close: the lost goodbye is the only event.
		next, prev, _ := connectWith(t, 2, tcfg)
		t.Cleanup(func() {
			for _, c := range append(next, prev...) {
				c.Close()
			}
		})
		rg, err := New(Options{Rank: 1, Size: 2, Next: next[1], Prev: prev[1], Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		next[1].Close() // nobody said why: the goodbye to rank 0 is lost
		err = rg.Goodbye(2 * time.Second)
		if err == nil || !strings.Contains(err.Error(), "rank 1: goodbye") {
			t.Errorf("rank 1: Goodbye on a connection closed without a reason = %v, want an error naming the goodbye", err)
		}
	})
}

// runRank0WithPiece runs rank 0 of a ring of 2 over next[0] and prev[0]
// until the test ends and starts one 10-element piece on it: Run's error
// and the piece's come back on the channels.
func runRank0WithPiece(t *testing.T, next, prev []*transport.Conn) (runErr, done chan error) {
	t.Helper()
	rg, err := New(Options{Rank: 0, Size: 2, Next: next[0], Prev: prev[0], Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	runErr, done = make(chan error, 1), make(chan error, 1)
	go func() { runErr <- rg.Run(ctx) }()
	rg.Start(pieceOf(0, 10), 0, dtype.F32, make([]float32, 10), func(err error) { done <- err })
	return runErr, done
}

// TestBadFrame plays rank 1 of a ring of 2 by hand and sends a chunk at
// the wrong offset: rank 0 must fail naming the offending bytes.
func TestBadFrame(t *testing.T) {
	next, prev, _ := connect(t, 2)
	runErr, done := runRank0WithPiece(t, next, prev)
	// Rank 1 must send chunk 1 = elements [5,10) = bytes [20,40) as step 0.
	bad := transport.Frame{Header: transport.Header{Kind: transport.KindRing, Key: 0, Piece: 0, Aux: 0, Offset: 8}, Payload: make([]byte, 20)}
	if err := next[1].Send(bad); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-runErr:
		if err == nil || !strings.Contains(err.Error(), "bytes [8,28) as step 0") || !strings.Contains(err.Error(), "want chunk 1 = bytes [20,40)") {
			t.Fatalf("Run = %v, want it to name the bad bytes [8,28) and the expected [20,40)", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Run did not fail on a bad frame")
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("in-flight piece done(nil) after a bad frame")
		}
	case <-time.After(time.Second):
		t.Fatal("in-flight piece not failed after a bad frame")
	}
}

func TestNewRejects(t *testing.T) {
	next, prev, _ := connect(t, 3)
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{Rank: 0, Size: 0}, "ring size must be >= 1, got 0"},
		{Options{Rank: 3, Size: 3, Next: next[0], Prev: prev[0]}, "rank 3 out of range for a ring of 3"},
		{Options{Rank: -1, Size: 3}, "rank -1 out of range"},
		{Options{Rank: 0, Size: 3, Prev: prev[0]}, "no connection to the next rank 1"},
		{Options{Rank: 0, Size: 3, Next: next[0]}, "no connection from the previous rank 2"},
		{Options{Rank: 0, Size: 3, Next: next[0], Prev: next[0]}, "same connection"},
		{Options{Rank: 0, Size: 3, Next: next[1], Prev: prev[0]}, "Next is connected to rank 2"},
		{Options{Rank: 0, Size: 3, Next: next[0], Prev: prev[1]}, "Prev is connected to rank 0"},
	} {
		_, err := New(c.o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(rank %d, size %d) = %v, want an error containing %q", c.o.Rank, c.o.Size, err, c.want)
		}
	}
}

// TestNoLeakAfterCancel checks Run returns promptly on cancel and leaves
// no goroutine behind (connections and listeners closed by the test).
func TestNoLeakAfterCancel(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Run("ring", func(t *testing.T) {
		tr := newRing(t, 4)
		allReduce(t, tr, []int{10, 1 << 16, 3}, nil, 10*time.Second)
		// Pieces in flight at cancel (rank 3 never starts them) fail.
		done := make(chan error, 3)
		for r := range 3 {
			tr.rings[r].Start(pieceOf(50, 100), 50, dtype.F32, make([]float32, 100), func(err error) { done <- err })
		}
		tr.cancel()
		for r := range 4 {
			err := tr.runErr(t, r, 6*time.Second)
			if !errors.Is(err, context.Canceled) {
				// A neighbour's close can win the race with our own cancel.
				if err == nil || !strings.Contains(err.Error(), "stopped: context canceled") {
					t.Errorf("rank %d: Run after cancel = %v, want it to say it stopped", r, err)
				}
			}
		}
		for range 3 {
			select {
			case err := <-done:
				if err == nil {
					t.Error("in-flight piece done(nil) after cancel")
				}
			case <-time.After(2 * time.Second):
				t.Fatal("in-flight piece not failed after cancel")
			}
		}
	})
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= before {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines before, %d after cancel:\n%s", before, n, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestAddPut(t *testing.T) {
	for n := range 20 {
		dst := make([]float32, n)
		b := make([]byte, 4*n)
		want := make([]float32, n)
		for i := range dst {
			dst[i] = float32(i) - 3.5
			x := make([]float32, 1)
			x[0] = float32(2*i) + 0.25
			transport.PutFloat32s(b[4*i:], x)
			want[i] = dst[i] + x[0]
		}
		addPut(dst, b)
		back := make([]float32, n)
		transport.Float32s(back, b)
		for i := range want {
			if dst[i] != want[i] || back[i] != want[i] {
				t.Fatalf("n=%d: element %d: dst %v, re-encoded %v, want %v", n, i, dst[i], back[i], want[i])
			}
		}
	}
}
