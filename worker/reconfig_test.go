package worker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/autobyte/autobyte/allreduce"
	"github.com/autobyte/autobyte/cluster"
	"github.com/autobyte/autobyte/ps"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/transport"
)

// bigTensors are large enough for partitions of 1 KB to 100 KB to matter:
// the largest is cut into 59 pieces at 4 KB, 3 at 100 KB, 1 whole.
var bigTensors = []Tensor{
	{Name: "l0.w", Layer: 0, Elems: 30000}, {Name: "l0.b", Layer: 0, Elems: 37}, {Name: "l1.w", Layer: 1, Elems: 5000}, {Name: "l2.w", Layer: 2, Elems: 60001}, {Name: "l2.b", Layer: 2, Elems: 3},
}

// change is a Reconfigure call rank 0 makes right after posting every
// tensor of iteration after (so pieces of that iteration are in flight).
type change struct {
	after, from int
	cfg         sched.Config
}

// epochLog is an Observer recording every piece a worker starts.
type epochLog struct {
	mu     sync.Mutex
	pieces []sched.Piece
}

func (o *epochLog) PieceStarted(p sched.Piece, posted, started time.Time, inflight int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.pieces = append(o.pieces, p)
}
func (o *epochLog) PieceDone(sched.Piece, time.Time, time.Time, int64) {}
func (o *epochLog) Compute(string, int, time.Time, time.Time)          {}
func (o *epochLog) Iteration(int, time.Duration)                       {}

func (o *epochLog) snapshot() []sched.Piece {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]sched.Piece(nil), o.pieces...)
}

// epochsOf is the configuration of each epoch.
func epochsOf(initial sched.Config, changes []change) []sched.Config {
	cfgs := []sched.Config{initial}
	for _, c := range changes {
		cfgs = append(cfgs, c.cfg)
	}
	return cfgs
}

// epochAt is the epoch of iteration it's tasks: that of the last change
// (in the order made, which is increasing from) whose from is <= it.
func epochAt(changes []change, it int) int {
	e := 0
	for i, c := range changes {
		if c.from <= it {
			e = i + 1
		}
	}
	return e
}

// reconfRun runs iterations on every rank, with rank 0 reconfiguring as
// changes say, and checks every element of every sum and that every rank
// started exactly the pieces each iteration's epoch cuts, tagged with it.
type reconfRun struct {
	*sumRun
	initial sched.Config
	changes []change
	logs    []*epochLog
}

func newReconfRun(n, iterations int, tensors []Tensor, initial sched.Config, changes []change) *reconfRun {
	r := &reconfRun{sumRun: newSumRun(n, iterations, tensors), initial: initial, changes: changes}
	r.afterPost = r.reconfigure
	for range n {
		r.logs = append(r.logs, &epochLog{})
	}
	return r
}

// config fills in rank's scheduling, hooks and observer.
func (rr *reconfRun) config(rank int, cfg Config) Config {
	cfg.Sched = rr.initial
	cfg.OnDone = rr.onDone(rank)
	cfg.Observer = rr.logs[rank]
	return cfg
}

func (rr *reconfRun) run(t *testing.T, es []*Engine) {
	t.Helper()
	rr.runWithin(t, es, 60*time.Second)
	rr.checkPieces(t)
}

// reconfigure makes rank 0's changes due after iteration it was posted.
func (rr *reconfRun) reconfigure(r, it int, e *Engine) error {
	if r != 0 {
		return nil
	}
	for _, c := range rr.changes {
		if c.after == it {
			if err := e.Reconfigure(c.cfg, c.from); err != nil {
				return fmt.Errorf("worker 0: Reconfigure(%+v, %d) after posting iteration %d: %w", c.cfg, c.from, it, err)
			}
		}
	}
	return nil
}

// checkPieces: on every rank, every task was cut as its iteration's epoch
// says (piece count, offsets and sizes), each piece started once, tagged
// with that epoch; and every rank started the same pieces in the same order.
func (rr *reconfRun) checkPieces(t *testing.T) {
	t.Helper()
	cfgs := epochsOf(rr.initial, rr.changes)
	var leader []sched.Piece
	for r, l := range rr.logs {
		got := l.snapshot()
		if r == 0 {
			leader = got
		} else if len(got) != len(leader) {
			t.Errorf("worker %d started %d pieces, the leader %d", r, len(got), len(leader))
		} else {
			for i := range got {
				if !samePiece(got[i], leader[i]) {
					t.Errorf("worker %d: piece %d started is %+v, the leader's is %+v", r, i, got[i], leader[i])
					break
				}
			}
		}
		seen := map[sched.PieceID]bool{}
		for _, p := range got {
			ep := epochAt(rr.changes, p.Iteration)
			size := 4 * int64(rr.tensors[p.Tensor].Elems)
			count := sched.PieceCount(size, 4, cfgs[ep].PartitionBytes)
			if p.Epoch != ep || int64(p.Count) != count || p.Bytes != sched.PieceBytes(size, 4, count, int64(p.Index)) {
				t.Errorf("worker %d: started %+v of the %d-byte tensor %d; iteration %d is epoch %d, partition %d bytes: want %d pieces",
					r, p, size, p.Tensor, p.Iteration, ep, cfgs[ep].PartitionBytes, count)
			}
			if seen[p.PieceID] {
				t.Errorf("worker %d: started %+v twice", r, p.PieceID)
			}
			seen[p.PieceID] = true
		}
		want := 0
		for it := range rr.iterations {
			for _, ten := range rr.tensors {
				want += int(sched.PieceCount(4*int64(ten.Elems), 4, cfgs[epochAt(rr.changes, it)].PartitionBytes))
			}
		}
		if len(seen) != want {
			t.Errorf("worker %d: started %d distinct pieces, want %d", r, len(seen), want)
		}
	}
}

// samePiece compares what the wire carries of two pieces (not the core's
// private sequence numbers).
func samePiece(a, b sched.Piece) bool {
	return a.PieceID == b.PieceID && a.Layer == b.Layer && a.Count == b.Count && a.Offset == b.Offset && a.Bytes == b.Bytes && a.Epoch == b.Epoch
}

// psChanges reconfigure a PS job five times while it runs: 4 KB pieces ->
// 100 KB -> whole tensors with no credit window -> 4 KB under FIFO and a
// strict credit -> 100 KB -> 1 KB under a credit of 4 KB. Two changes are
// pending at once (after iteration 2), and the one from iteration 8 is made
// before iteration 7's pieces finished.
var (
	psInitial = sched.Config{PartitionBytes: 4000, CreditBytes: 16000, Order: sched.OrderPriority}
	psChanges = []change{
		{after: 0, from: 1, cfg: sched.Config{PartitionBytes: 100_000, CreditBytes: 64_000, Order: sched.OrderPriority}},
		{after: 2, from: 3, cfg: sched.Config{}},
		{after: 2, from: 5, cfg: sched.Config{PartitionBytes: 4000, CreditBytes: 8000, Order: sched.OrderFIFO, Admission: sched.AdmitStrict}},
		{after: 5, from: 7, cfg: sched.Config{PartitionBytes: 100_000, CreditBytes: 300_000, Order: sched.OrderPriority}},
		{after: 7, from: 8, cfg: sched.Config{PartitionBytes: 1000, CreditBytes: 4000, Order: sched.OrderPriority, Admission: sched.AdmitStrict}},
	}
)

// TestPSReconfigureExactSums: a parameter-server job changes partition
// size, credit, order and admission five times while iterations run; every
// sum is exact, and every worker cuts every iteration as its epoch says.
func TestPSReconfigureExactSums(t *testing.T) {
	cases := []struct {
		workers, servers int
		pull             bool
		shards           int64
	}{
		{1, 1, false, 0},
		{2, 1, true, 0},
		{2, 2, false, 64_000},
		{3, 1, false, 0},
		{3, 2, true, 64_000},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("w%d/s%d/pull%v/shard%d", c.workers, c.servers, c.pull, c.shards), func(t *testing.T) {
			mode := ps.AnswerPush
			if c.pull {
				mode = ps.SeparatePull
			}
			tn := newNet(t, c.workers, c.servers, mode)
			run := newReconfRun(c.workers, 10, bigTensors, psInitial, psChanges)
			var cfgs []Config
			for r := range c.workers {
				cfg := run.config(r, tn.config(r, bigTensors))
				cfg.PullMode, cfg.ShardBytes = c.pull, c.shards
				cfgs = append(cfgs, cfg)
			}
			run.run(t, start(t, tn, cfgs))
		})
	}
}

// newRing connects n ranks in a real allreduce.Ring on loopback and runs
// it; at the end of the test the rings stop (after the engines: cleanups
// run last first).
func newRing(t *testing.T, n int) []Ring {
	t.Helper()
	next, prev := make([]*transport.Conn, n), make([]*transport.Conn, n)
	for r := range n {
		dialed, accepted := link(t, "worker", (r+1)%n, "worker", []int{r})
		next[r], prev[(r+1)%n] = dialed[0], accepted[0]
	}
	ctx, cancel := context.WithCancel(context.Background())
	var rings []Ring
	var wg sync.WaitGroup
	for r := range n {
		ring, err := allreduce.New(allreduce.Options{Rank: r, Size: n, Next: next[r], Prev: prev[r], Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		rings = append(rings, ring)
		wg.Add(1)
		go func() { defer wg.Done(); _ = ring.Run(ctx) }()
	}
	t.Cleanup(func() {
		cancel()
		stopped := make(chan struct{})
		go func() { wg.Wait(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			t.Error("rings still running 10 s after they were cancelled")
		}
	})
	return rings
}

// TestAllReduceReconfigureExactSums: the same changes with a real ring
// all-reduce: pieces of different sizes in different epochs go around the
// same ring, keyed by epoch, and every sum is exact.
func TestAllReduceReconfigureExactSums(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("w%d", n), func(t *testing.T) {
			var rings []Ring
			if n > 1 {
				rings = newRing(t, n)
			}
			tn := newNet(t, n, 0, ps.AnswerPush)
			run := newReconfRun(n, 10, bigTensors, psInitial, psChanges)
			var cfgs []Config
			for r := range n {
				cfg := tn.config(r, bigTensors)
				cfg.Arch = AllReduce
				if n > 1 {
					cfg.Ring = rings[r]
				}
				cfgs = append(cfgs, run.config(r, cfg))
			}
			run.run(t, start(t, tn, cfgs))
		})
	}
}

// TestReconfigureFollowerAhead: a follower that already posted the
// iteration a change applies from (it may run one iteration ahead of rank
// 0) takes the change too: the pieces of that iteration are cut as the new
// epoch says on both workers, and the sums are exact.
func TestReconfigureFollowerAhead(t *testing.T) {
	tn := newNet(t, 2, 2, ps.AnswerPush)
	changes := []change{{from: 1, cfg: sched.Config{PartitionBytes: 100_000, CreditBytes: 1, Admission: sched.AdmitStrict}}}
	run := newReconfRun(2, 2, bigTensors, psInitial, changes)
	es := start(t, tn, []Config{run.config(0, tn.config(0, bigTensors)), run.config(1, tn.config(1, bigTensors))})
	// Rank 1 posts iterations 0 and 1 before rank 0 does anything; its
	// posts reach its loop before the change can (Post queues in order).
	for it := range 2 {
		for k := range bigTensors {
			if err := es[1].Post(k, it, run.grad(1, k, it)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := es[0].Reconfigure(changes[0].cfg, 1); err != nil {
		t.Fatal(err)
	}
	for it := range 2 {
		for k := range bigTensors {
			if err := es[0].Post(k, it, run.grad(0, k, it)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for r, e := range es {
		for it := range 2 {
			for l := range layersOf(bigTensors) {
				if err := within(t, waitLayerAsync(e, l, it), 30*time.Second, fmt.Sprintf("worker %d: WaitLayer(%d, %d)", r, l, it)); err != nil {
					t.Fatalf("worker %d: WaitLayer(%d, %d): %v", r, l, it, err)
				}
			}
			for k, ten := range bigTensors {
				if i, ok := sameBits(run.grad(r, k, it), exactSum(2, it, k, ten.Elems)); !ok {
					t.Errorf("worker %d: iteration %d tensor %d element %d is %v, exact sum is %v", r, it, k, i, run.grad(r, k, it)[i], exactSum(2, it, k, ten.Elems)[i])
				}
			}
		}
	}
	run.done.check(t, 2, len(bigTensors), 2)
	run.checkPieces(t)
}

// TestReconfigureRejects: a follower cannot reconfigure, and a change that
// comes too late, out of order, before Start, after Stop or with an
// invalid configuration is refused with an error naming the values; the
// job goes on with the changes that were accepted.
func TestReconfigureRejects(t *testing.T) {
	tn := newNet(t, 2, 1, ps.AnswerPush)
	// The change from iteration 4 is accepted in the middle of the refusals.
	changes := []change{{from: 4, cfg: sched.Config{PartitionBytes: 400, CreditBytes: 800}}}
	run := newReconfRun(2, 6, testTensors, sched.Config{PartitionBytes: 64, CreditBytes: 128, Order: sched.OrderPriority}, changes)
	es := start(t, tn, []Config{run.config(0, tn.config(0, testTensors)), run.config(1, tn.config(1, testTensors))})

	good := sched.Config{PartitionBytes: 32, CreditBytes: 64}
	expect := func(what string, err error, want ...string) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: Reconfigure = nil, want an error naming %q", what, want)
			return
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: Reconfigure = %q, want it to name %q", what, err, w)
			}
		}
	}
	expect("on a follower", es[1].Reconfigure(good, 10), "worker 1", "iteration 10", "only rank 0")

	// Both ranks run iterations 0..2; rank 0 has then posted iteration 2.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r, e := range es {
		wg.Add(1)
		go func() { defer wg.Done(); errs[r] = run.runIterations(0, 3, r, e) }()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	expect("from a posted iteration", es[0].Reconfigure(good, 2), "iteration 2")
	expect("from an iteration before the posted one", es[0].Reconfigure(good, 1), "iteration 1", "iteration 2 already posted")
	expect("negative partition", es[0].Reconfigure(sched.Config{PartitionBytes: -5}, 9), "iteration 9", "-5")
	expect("negative credit", es[0].Reconfigure(sched.Config{CreditBytes: -7}, 9), "-7")
	expect("unknown order", es[0].Reconfigure(sched.Config{Order: 7}, 9), "unknown order 7")
	expect("unknown admission", es[0].Reconfigure(sched.Config{Admission: 3}, 9), "unknown admission rule 3")
	expect("negative iteration", es[0].Reconfigure(good, -1), "iteration -1")
	if math.MaxInt > math.MaxUint32 {
		big := math.MaxUint32 + 1
		expect("iteration beyond the header's range", es[0].Reconfigure(good, big), fmt.Sprint(big))
	}
	if err := es[0].Reconfigure(changes[0].cfg, 4); err != nil {
		t.Fatalf("Reconfigure from iteration 4 after iteration 2: %v", err)
	}
	expect("from the pending change's iteration", es[0].Reconfigure(good, 4), "iteration 4")
	expect("before the pending change", es[0].Reconfigure(good, 3), "iteration 3", "iteration 4")

	// Iterations 3..5 run, 4 and 5 in the new epoch, and every sum (and
	// piece) of the whole run checks.
	for r, e := range es {
		wg.Add(1)
		go func() { defer wg.Done(); errs[r] = run.runFrom(3, r, e) }()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	run.done.check(t, 2, len(testTensors), 6)
	run.checkPieces(t)

	// Before Start and after Stop.
	idle, err := New(Config{Workers: 1, Arch: AllReduce, Tensors: testTensors, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	expect("before Start", idle.Reconfigure(good, 1), "not started")
	single := start(t, nil, []Config{{Workers: 1, Arch: AllReduce, Tensors: testTensors, Logger: quiet}})[0]
	single.Stop(errors.New("enough"))
	expect("after Stop", single.Reconfigure(good, 1), "enough")
}

// runFrom runs iterations first.. on rank r (without making changes).
func (rr *reconfRun) runFrom(first, r int, e *Engine) error {
	return rr.runIterations(first, rr.iterations, r, e)
}

// runIterations runs iterations [first, end) on rank r and checks their
// sums (without making changes).
func (rr *reconfRun) runIterations(first, end, r int, e *Engine) error {
	for it := first; it < end; it++ {
		for k := len(rr.tensors) - 1; k >= 0; k-- {
			if err := e.Post(k, it, rr.grad(r, k, it)); err != nil {
				return fmt.Errorf("worker %d: Post(%d, %d): %w", r, k, it, err)
			}
		}
		for l := range layersOf(rr.tensors) {
			if err := e.WaitLayer(l, it); err != nil {
				return fmt.Errorf("worker %d: WaitLayer(%d, %d): %w", r, l, it, err)
			}
		}
		for k, ten := range rr.tensors {
			if i, ok := sameBits(rr.grad(r, k, it), exactSum(rr.n, it, k, ten.Elems)); !ok {
				return fmt.Errorf("worker %d: iteration %d tensor %d element %d is %v, exact sum is %v", r, it, k, i, rr.grad(r, k, it)[i], exactSum(rr.n, it, k, ten.Elems)[i])
			}
		}
	}
	return nil
}

// TestBadControlFromLeader: a garbage or inconsistent reconfiguration (or
// an announcement that does not fit its epoch) from rank 0 ends the
// follower with an error saying what was wrong, never a panic.
func TestBadControlFromLeader(t *testing.T) {
	reconf := func(epoch, from int, cfg sched.Config) transport.Frame {
		return cluster.ReconfigureFrame(cluster.Reconfiguration{Epoch: epoch, From: from, Config: cfg})
	}
	// testTensors[2] is 100 elements (400 bytes) in layer 1.
	piece := func(epoch, count, index int, off, bytes int64) transport.Frame {
		return cluster.AnnounceFrame(sched.Piece{PieceID: sched.PieceID{Iteration: 0, Tensor: 2, Index: index}, Layer: 1, Count: count, Offset: off, Bytes: bytes, Epoch: epoch})
	}
	cases := []struct {
		name   string
		frames []transport.Frame
		want   []string
	}{
		{"short payload", []transport.Frame{func() transport.Frame {
			f := reconf(1, 3, sched.Config{PartitionBytes: 64})
			f.Payload, f.Length = f.Payload[:5], 5
			return f
		}()}, []string{"worker 1", "rank 0", "bad reconfiguration", "5 payload bytes"}},
		{"invalid configuration", []transport.Frame{func() transport.Frame {
			f := reconf(1, 3, sched.Config{PartitionBytes: 64})
			f.Payload[16] = 9 // order
			return f
		}()}, []string{"epoch 1", "iteration 3", "unknown order 9"}},
		{"epoch skipped", []transport.Frame{reconf(3, 2, sched.Config{})}, []string{"epoch 3", "next epoch here is 1"}},
		{"epoch repeated", []transport.Frame{reconf(1, 2, sched.Config{}), reconf(1, 5, sched.Config{})}, []string{"epoch 1", "next epoch here is 2"}},
		{"piece of an unknown epoch", []transport.Frame{piece(1, 1, 0, 0, 400)}, []string{"epoch 1", "before announcing that epoch", "0..0"}},
		{"piece cut otherwise", []transport.Frame{reconf(1, 0, sched.Config{PartitionBytes: 100}), piece(1, 1, 0, 0, 400)},
			[]string{"piece 0 of 1", "epoch 1", "partition of 100 bytes", "4 pieces"}},
		{"piece at the wrong offset", []transport.Frame{reconf(1, 0, sched.Config{PartitionBytes: 100}), piece(1, 4, 1, 96, 100)},
			[]string{"bytes [96,196)", "want [100,200)"}},
		{"piece of an unknown tensor", []transport.Frame{cluster.AnnounceFrame(sched.Piece{PieceID: sched.PieceID{Tensor: 99}, Count: 1, Bytes: 4})},
			[]string{"tensor 99", "5 tensors"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tn := newNet(t, 2, 1, ps.AnswerPush)
			e := start(t, tn, []Config{tn.config(1, testTensors)})[0]
			for _, f := range c.frames {
				if err := tn.followers[0].Send(f); err != nil {
					t.Fatal(err)
				}
			}
			err := within(t, waitLayerAsync(e, 0, 0), 5*time.Second, "WaitLayer after a bad control frame")
			if err == nil {
				t.Fatal("WaitLayer = nil after a bad control frame, want an error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("WaitLayer = %q, want it to name %q", err, w)
				}
			}
			if e.Err() == nil {
				t.Error("Err = nil after a bad control frame")
			}
		})
	}
}
