package worker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/autobyte/autobyte/cluster"
	"github.com/autobyte/autobyte/ps"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/transport"
)

// testTensors have awkward sizes and two layers with two tensors.
var testTensors = []Tensor{
	{Name: "l0.w", Layer: 0, Elems: 37}, {Name: "l0.b", Layer: 0, Elems: 5}, {Name: "l1.w", Layer: 1, Elems: 100}, {Name: "l2.w", Layer: 2, Elems: 1}, {Name: "l2.b", Layer: 2, Elems: 64},
}

func layersOf(ts []Tensor) int {
	n := 0
	for _, t := range ts {
		n = max(n, t.Layer+1)
	}
	return n
}

// sumRun has every rank post every tensor (last first) for iterations
// iterations, wait for every layer and check every sum bit for bit, and
// checks OnDone.
type sumRun struct {
	n, iterations int
	tensors       []Tensor
	grads         [][][]float32 // [rank][iteration*len(tensors)+tensor]
	done          *doneLog
	// afterPost, if set, runs on each rank once it posted iteration it
	// (reconfRun reconfigures there).
	afterPost func(rank, it int, e *Engine) error
}

func newSumRun(n, iterations int, tensors []Tensor) *sumRun {
	s := &sumRun{n: n, iterations: iterations, tensors: tensors, done: newDoneLog()}
	for r := range n {
		var gs [][]float32
		for it := range iterations {
			for k, t := range tensors {
				gs = append(gs, grad(r, it, k, t.Elems))
			}
		}
		s.grads = append(s.grads, gs)
	}
	return s
}

func (s *sumRun) grad(rank, tensor, it int) []float32 {
	return s.grads[rank][it*len(s.tensors)+tensor]
}

// onDone is rank's OnDone hook.
func (s *sumRun) onDone(rank int) func(int, int) {
	return s.done.hook(rank,
		func(k, it int) []float32 { return s.grad(rank, k, it) },
		func(k, it int) []float32 { return exactSum(s.n, it, k, s.tensors[k].Elems) })
}

func (s *sumRun) run(t *testing.T, es []*Engine) { s.runWithin(t, es, 10*time.Second) }

// runWithin runs every rank and fails the test if they take longer than
// limit, then checks OnDone.
func (s *sumRun) runWithin(t *testing.T, es []*Engine, limit time.Duration) {
	t.Helper()
	errs := make(chan error, len(es))
	var wg sync.WaitGroup
	for r, e := range es {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- s.runRank(r, e)
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(limit):
		for r, e := range es {
			t.Logf("worker %d: Err = %v", r, e.Err())
		}
		t.Fatalf("workers did not finish within %v", limit)
	}
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	s.done.check(t, s.n, len(s.tensors), s.iterations)
}

func (s *sumRun) runRank(r int, e *Engine) error {
	for it := range s.iterations {
		for k := len(s.tensors) - 1; k >= 0; k-- {
			if err := e.Post(k, it, s.grad(r, k, it)); err != nil {
				return fmt.Errorf("worker %d: Post(%d, %d): %w", r, k, it, err)
			}
		}
		if s.afterPost != nil {
			if err := s.afterPost(r, it, e); err != nil {
				return err
			}
		}
		for l := range layersOf(s.tensors) {
			if err := e.WaitLayer(l, it); err != nil {
				return fmt.Errorf("worker %d: WaitLayer(%d, %d): %w", r, l, it, err)
			}
			for k, ten := range s.tensors {
				if ten.Layer != l {
					continue
				}
				if i, ok := sameBits(s.grad(r, k, it), exactSum(s.n, it, k, ten.Elems)); !ok {
					return fmt.Errorf("worker %d: iteration %d tensor %d element %d is %v after WaitLayer(%d), exact sum is %v",
						r, it, k, i, s.grad(r, k, it)[i], l, exactSum(s.n, it, k, ten.Elems)[i])
				}
			}
		}
	}
	return nil
}

// TestPSExactSums: with real parameter servers, pieces and shards, every
// worker's gradients become the exact sums in place.
func TestPSExactSums(t *testing.T) {
	cases := []struct {
		workers, servers  int
		pull              bool
		partition, shards int64
		credit            int64
		fusion            int64
	}{
		{1, 1, false, 0, 0, 0, 0},
		{2, 1, true, 64, 0, 128, 0},
		{2, 2, false, 100, 48, 200, 0},
		{3, 2, true, 96, 40, 1, 0},
		{3, 3, false, 0, 64, 0, 0},
		// Fused: tensors 0+1 and 3+4 travel as one unit each.
		{1, 1, false, 0, 0, 0, 300},
		{3, 2, false, 96, 40, 200, 300},
		{2, 2, true, 0, 0, 0, 300},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("w%d/s%d/pull%v/part%d/shard%d/credit%d/fusion%d", c.workers, c.servers, c.pull, c.partition, c.shards, c.credit, c.fusion), func(t *testing.T) {
			mode := ps.AnswerPush
			if c.pull {
				mode = ps.SeparatePull
			}
			tn := newNet(t, c.workers, c.servers, mode)
			run := newSumRun(c.workers, 3, testTensors)
			cfgs := tn.configs(testTensors, func(r int, cfg *Config) {
				cfg.PullMode = c.pull
				cfg.ShardBytes = c.shards
				cfg.Sched = sched.Config{PartitionBytes: c.partition, CreditBytes: c.credit, Order: sched.OrderPriority, FusionBytes: c.fusion}
				cfg.OnDone = run.onDone(r)
			})
			es := start(t, tn, cfgs)
			checkFused(t, es[0], c.fusion)
			run.run(t, es)
			checkUnstaged(t, es)
		})
	}
}

// TestAllReduceExactSums: the same with an in-memory ring, including a
// single worker without one.
func TestAllReduceExactSums(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		for _, c := range []struct{ part, fusion int64 }{{0, 0}, {24, 0}, {0, 300}, {24, 300}} {
			part := c.part
			t.Run(fmt.Sprintf("w%d/part%d/fusion%d", n, part, c.fusion), func(t *testing.T) {
				tn := newNet(t, n, 0, ps.AnswerPush)
				ring := newFakeRing(n)
				run := newSumRun(n, 3, testTensors)
				cfgs := tn.configs(testTensors, func(r int, cfg *Config) {
					cfg.Arch = AllReduce
					if n > 1 {
						cfg.Ring = ring.member(r)
					}
					cfg.Sched = sched.Config{PartitionBytes: part, CreditBytes: 2 * part, Order: sched.OrderPriority}
					cfg.Sched.FusionBytes = c.fusion
					cfg.OnDone = run.onDone(r)
				})
				es := start(t, tn, cfgs)
				checkFused(t, es[0], c.fusion)
				run.run(t, es)
				checkUnstaged(t, es)
				ring.check(t)
			})
		}
	}
}

// checkFused asserts that fusion 300 fuses testTensors into 0+1, 2, 3+4
// (so that the exact-sum runs above cover fused units) and 0 fuses nothing.
func checkFused(t *testing.T, e *Engine, fusion int64) {
	t.Helper()
	var got [][]int
	for _, u := range e.m.Units(0) {
		got = append(got, u.Tensors)
	}
	want := [][]int{{0}, {1}, {2}, {3}, {4}}
	if fusion == 300 {
		want = [][]int{{0, 1}, {2}, {3, 4}}
	}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("fusion %d: units %v, want %v", fusion, got, want)
	}
}

// checkUnstaged asserts that the engines hold no gradient or fused-unit
// buffer once every iteration is synced.
func checkUnstaged(t *testing.T, es []*Engine) {
	t.Helper()
	for r, e := range es {
		e.gradsMu.RLock()
		n := len(e.grads)
		e.gradsMu.RUnlock()
		if n != 0 {
			t.Errorf("rank %d still holds %d gradients after the run", r, n)
		}
	}
}

// TestRingFailureFailsEngine: a ring error stops the engine and is what
// WaitLayer returns.
func TestRingFailureFailsEngine(t *testing.T) {
	tn := newNet(t, 2, 0, ps.AnswerPush)
	ring := newFakeRing(2)
	ring.fail = errors.New("ring: lost rank 1")
	cfgs := tn.configs(testTensors, func(r int, cfg *Config) { cfg.Arch, cfg.Ring = AllReduce, ring.member(r) })
	es := start(t, tn, cfgs)
	if err := es[0].Post(2, 0, grad(0, 0, 2, 100)); err != nil {
		t.Fatal(err)
	}
	err := within(t, waitLayerAsync(es[0], 1, 0), 2*time.Second, "WaitLayer after a ring failure")
	if !errors.Is(err, ring.fail) {
		t.Fatalf("WaitLayer = %v, want the ring's error", err)
	}
	if !errors.Is(es[0].Err(), ring.fail) {
		t.Errorf("Err = %v, want the ring's error", es[0].Err())
	}
}

// TestGateWaitsForEveryTensorOfLayer: a layer's gate opens only when all of
// its tensors are summed, and only for the iterations summed.
func TestGateWaitsForEveryTensorOfLayer(t *testing.T) {
	// Layer 0 has tensors 0 and 1, layer 1 has tensor 2.
	tensors := []Tensor{{Name: "a", Layer: 0, Elems: 10}, {Name: "b", Layer: 0, Elems: 20}, {Name: "c", Layer: 1, Elems: 30}}
	const n = 2
	tn := newNet(t, n, 1, ps.AnswerPush)
	run := newSumRun(n, 1, tensors)
	cfgs := tn.configs(tensors, func(r int, cfg *Config) {
		cfg.Sched.Order = sched.OrderPriority // per-layer gates (fifo has a global barrier)
		cfg.OnDone = run.onDone(r)
	})
	es := start(t, tn, cfgs)
	post := func(k int) {
		t.Helper()
		for r, e := range es {
			if err := e.Post(k, 0, run.grad(r, k, 0)); err != nil {
				t.Fatal(err)
			}
		}
	}
	post(2)
	post(0)
	for r, e := range es {
		if err := within(t, waitLayerAsync(e, 1, 0), 5*time.Second, "WaitLayer(1, 0)"); err != nil {
			t.Fatalf("worker %d: WaitLayer(1, 0): %v", r, err)
		}
	}
	// Tensor 0 is summed on both workers, tensor 1 not even posted.
	for range 2 * n {
		select {
		case <-run.done.ch:
		case <-time.After(5 * time.Second):
			t.Fatal("tensor 0 and 2 not done within 5 s")
		}
	}
	var gates []<-chan error
	for r, e := range es {
		gates = append(gates, waitLayerAsync(e, 0, 0))
		blocked(t, gates[r], fmt.Sprintf("worker %d: WaitLayer(0, 0) with tensor 1 not summed", r))
		blocked(t, waitLayerAsync(e, 1, 1), fmt.Sprintf("worker %d: WaitLayer(1, 1) with nothing of iteration 1 posted", r))
	}
	post(1)
	for r := range es {
		if err := within(t, gates[r], 5*time.Second, "WaitLayer(0, 0)"); err != nil {
			t.Fatalf("worker %d: WaitLayer(0, 0): %v", r, err)
		}
		if i, ok := sameBits(run.grad(r, 1, 0), exactSum(n, 0, 1, 20)); !ok {
			t.Errorf("worker %d: tensor 1 element %d is not the sum after its gate opened", r, i)
		}
	}
	run.done.check(t, n, len(tensors), 1)
}

// TestWaitLayerOutOfRange: a layer the engine does not have is an error,
// not a wait forever.
func TestWaitLayerOutOfRange(t *testing.T) {
	es := start(t, nil, []Config{{Workers: 1, Arch: AllReduce, Tensors: testTensors, Logger: quiet}})
	for _, l := range []int{-1, 3} {
		err := within(t, waitLayerAsync(es[0], l, 0), time.Second, "WaitLayer")
		if err == nil || !strings.Contains(err.Error(), fmt.Sprint(l)) {
			t.Errorf("WaitLayer(%d, 0) = %v, want an error naming the layer", l, err)
		}
	}
}

// TestWaitLayerWithoutTensors: a layer between others that has no tensors
// of its own (a pooling layer) must not block the forward pass forever.
// New accepts such tensors, and WaitLayer takes the layer as in range.
func TestWaitLayerWithoutTensors(t *testing.T) {
	// A gate for a layer without tensors would never open: New refuses it.
	tensors := []Tensor{{Name: "conv", Layer: 0, Elems: 8}, {Name: "fc", Layer: 2, Elems: 4}}
	_, err := New(Config{Workers: 1, Arch: AllReduce, Tensors: tensors, Logger: quiet})
	if err == nil || !strings.Contains(err.Error(), "layer 1 has no tensors") {
		t.Fatalf("New with tensors in layers 0 and 2 only: %v, want an error naming layer 1", err)
	}
}

// orderRun posts three one-tensor layers, each cut into 4 pieces, on 2
// workers with a credit of one piece, and returns the order pieces started
// in on each worker. Rank 1 posts only after rank 0 posted everything, so
// rank 0's first piece cannot finish before all its tensors are ready.
func orderRun(t *testing.T, order sched.Order) [][]sched.PieceID {
	t.Helper()
	tensors := []Tensor{{Name: "l0", Layer: 0, Elems: 16}, {Name: "l1", Layer: 1, Elems: 16}, {Name: "l2", Layer: 2, Elems: 16}}
	const n = 2
	tn := newNet(t, n, 1, ps.AnswerPush)
	logs := []*orderLog{{}, {}}
	cfgs := tn.configs(tensors, func(r int, cfg *Config) {
		cfg.Sched = sched.Config{PartitionBytes: 16, CreditBytes: 1, Order: order}
		cfg.Observer = logs[r]
	})
	es := start(t, tn, cfgs)
	for r, e := range es {
		for k := 2; k >= 0; k-- {
			if err := e.Post(k, 0, grad(r, 0, k, 16)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for r, e := range es {
		for l := range 3 {
			if err := within(t, waitLayerAsync(e, l, 0), 5*time.Second, "WaitLayer"); err != nil {
				t.Fatalf("worker %d: %v", r, err)
			}
		}
	}
	var got [][]sched.PieceID
	for r, l := range logs {
		started, done := l.snapshot()
		if len(started) != 12 || done != 12 {
			t.Fatalf("worker %d: observer saw %d pieces start and %d finish, want 12 each", r, len(started), done)
		}
		got = append(got, started)
	}
	if !slices.Equal(got[0], got[1]) {
		t.Errorf("worker 1 started pieces in another order than the leader:\nleader %v\nworker %v", got[0], got[1])
	}
	return got
}

func pieces(spec ...[2]int) []sched.PieceID {
	var ids []sched.PieceID
	for _, s := range spec {
		for i := s[1]; i < 4; i++ {
			ids = append(ids, sched.PieceID{Tensor: s[0], Index: i})
		}
	}
	return ids
}

// TestPriorityOrder: with a credit of one piece, the pieces of layer 0
// start before those of layer 2, except the very first piece, which started
// while it was alone.
func TestPriorityOrder(t *testing.T) {
	got := orderRun(t, sched.OrderPriority)
	want := append([]sched.PieceID{{Tensor: 2}}, pieces([2]int{0, 0}, [2]int{1, 0}, [2]int{2, 1})...)
	if !slices.Equal(got[0], want) {
		t.Errorf("priority order: pieces started in order\n got %v\nwant %v", got[0], want)
	}
}

// TestFIFOOrder: under FIFO pieces start in the order tensors were posted.
func TestFIFOOrder(t *testing.T) {
	got := orderRun(t, sched.OrderFIFO)
	want := pieces([2]int{2, 0}, [2]int{1, 0}, [2]int{0, 0})
	if !slices.Equal(got[0], want) {
		t.Errorf("FIFO order: pieces started in order\n got %v\nwant %v", got[0], want)
	}
}

// TestNewRejects: each invalid configuration is refused with an error
// naming the value.
func TestNewRejects(t *testing.T) {
	conn := &transport.Conn{} // never used: New only checks it is there
	good := func() Config {
		return Config{Rank: 0, Workers: 1, Arch: PS, Tensors: testTensors, Servers: []*transport.Conn{conn}, Logger: quiet}
	}
	cases := []struct {
		name string
		edit func(*Config)
		want []string
	}{
		{"rank too big", func(c *Config) { c.Rank = 2; c.Workers = 2 }, []string{"rank 2", "2 workers"}},
		{"negative rank", func(c *Config) { c.Rank = -1 }, []string{"rank -1"}},
		{"no workers", func(c *Config) { c.Workers = 0 }, []string{"0 workers"}},
		{"no tensors", func(c *Config) { c.Tensors = nil }, []string{"no tensors"}},
		{"no servers", func(c *Config) { c.Servers = nil }, []string{"server"}},
		{"no ring", func(c *Config) {
			c.Arch, c.Workers, c.Followers = AllReduce, 2, []*transport.Conn{conn}
		}, []string{"ring"}},
		{"leader without followers", func(c *Config) { c.Workers = 3; c.Followers = []*transport.Conn{conn} }, []string{"2 followers", "got 1"}},
		{"follower without leader", func(c *Config) { c.Rank, c.Workers = 1, 2 }, []string{"rank 1", "rank 0"}},
		{"empty tensor", func(c *Config) {
			c.Tensors = []Tensor{{Name: "a", Layer: 0, Elems: 3}, {Name: "b", Layer: 0, Elems: 0}}
		}, []string{"tensor 1", `"b"`, "0 elements"}},
		{"negative layer", func(c *Config) {
			c.Tensors = []Tensor{{Name: "a", Layer: -2, Elems: 3}}
		}, []string{"tensor 0", "layer -2"}},
		{"bad schedule", func(c *Config) { c.Sched.CreditBytes = -5 }, []string{"-5"}},
	}
	for _, c := range cases {
		cfg := good()
		c.edit(&cfg)
		e, err := New(cfg)
		if err == nil {
			t.Errorf("%s: New = %v, nil; want an error", c.name, e)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: New = %q, want it to name %s", c.name, err, w)
			}
		}
	}
	if _, err := New(good()); err != nil {
		t.Errorf("New(valid config) = %v", err)
	}
	// A single all-reduce worker needs no ring.
	if _, err := New(Config{Workers: 1, Arch: AllReduce, Tensors: testTensors}); err != nil {
		t.Errorf("New(one all-reduce worker without a ring) = %v", err)
	}
}

func TestPostRejects(t *testing.T) {
	es := start(t, nil, []Config{{Workers: 1, Arch: AllReduce, Tensors: testTensors, Logger: quiet}})
	cases := []struct {
		tensor, elems int
		want          []string
	}{
		{-1, 5, []string{"tensor -1", "have 5"}},
		{5, 5, []string{"tensor 5", "have 5"}},
		{1, 4, []string{"tensor 1", `"l0.b"`, "4 elements", "want 5"}},
		{2, 101, []string{"tensor 2", "101 elements", "want 100"}},
	}
	for _, c := range cases {
		err := es[0].Post(c.tensor, 0, make([]float32, c.elems))
		if err == nil {
			t.Errorf("Post(%d, 0, %d elements) = nil, want an error", c.tensor, c.elems)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("Post(%d, 0, %d elements) = %q, want it to name %s", c.tensor, c.elems, err, w)
			}
		}
	}
	// The engine still works after refusing them.
	run := newSumRun(1, 1, testTensors)
	if err := run.runRank(0, es[0]); err != nil {
		t.Fatal(err)
	}
}

// TestLostServer: closing a server's connection fails the engine, and
// WaitLayer and Post report which server was lost.
func TestLostServer(t *testing.T) {
	tn := newNet(t, 1, 2, ps.AnswerPush)
	es := start(t, tn, []Config{tn.config(0, testTensors)})
	gate := waitLayerAsync(es[0], 0, 0)
	blocked(t, gate, "WaitLayer(0, 0) with nothing posted")
	tn.serverEnds[1][0].Close()
	err := within(t, gate, 2*time.Second, "WaitLayer after losing server 1")
	if err == nil || !strings.Contains(err.Error(), "server 1") {
		t.Fatalf("WaitLayer = %v, want an error naming server 1", err)
	}
	if err := es[0].Err(); err == nil || !strings.Contains(err.Error(), "server 1") {
		t.Errorf("Err after losing server 1 = %v, want an error naming it", err)
	}
}

// TestLostLeader: a follower whose control connection to rank 0 dies fails.
func TestLostLeader(t *testing.T) {
	tn := newNet(t, 2, 1, ps.AnswerPush)
	es := start(t, tn, []Config{tn.config(0, testTensors), tn.config(1, testTensors)})
	tn.followers[0].Close() // rank 0's end of rank 1's control connection
	for r, want := range []string{"worker 1", "rank 0"} {
		err := within(t, waitLayerAsync(es[r], 0, 0), 2*time.Second, fmt.Sprintf("worker %d: WaitLayer after the control connection died", r))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("worker %d: WaitLayer = %v, want an error naming %s", r, err, want)
		}
	}
}

// TestStopUnblocksWaitLayer: Stop wakes every WaitLayer with its cause.
func TestStopUnblocksWaitLayer(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		es := start(t, nil, []Config{{Workers: 1, Arch: AllReduce, Tensors: testTensors, Logger: quiet}})
		gates := []<-chan error{waitLayerAsync(es[0], 0, 0), waitLayerAsync(es[0], 2, 5)}
		blocked(t, gates[0], "WaitLayer(0, 0) with nothing posted")
		cause := errors.New("training diverged")
		es[0].Stop(cause)
		for _, g := range gates {
			if err := within(t, g, time.Second, "WaitLayer after Stop"); !errors.Is(err, cause) {
				t.Errorf("WaitLayer after Stop(cause) = %v, want the cause", err)
			}
		}
		if err := es[0].Err(); !errors.Is(err, cause) {
			t.Errorf("Err after Stop = %v, want the cause", err)
		}
	})
	t.Run("ps", func(t *testing.T) {
		tn := newNet(t, 1, 1, ps.AnswerPush)
		es := start(t, tn, []Config{tn.config(0, testTensors)})
		gate := waitLayerAsync(es[0], 1, 0)
		blocked(t, gate, "WaitLayer(1, 0) with nothing posted")
		go es[0].Stop(nil) // see TestStopReturns
		if err := within(t, gate, time.Second, "WaitLayer after Stop"); err == nil {
			t.Error("WaitLayer after Stop(nil) = nil, want an error saying the engine stopped")
		}
	})
}

// TestOnStopBeforeStopReturns: a binding that reuses its state for the next
// session (libautobyte) must not hear the last session's OnStop after Stop
// returned. The hook sleeps so that a Stop that does not wait for it loses
// the race every time.
func TestOnStopBeforeStopReturns(t *testing.T) {
	for i := range 20 {
		var heard atomic.Bool
		cfg := Config{Workers: 1, Arch: AllReduce, Tensors: testTensors, Logger: quiet,
			OnStop: func(error) { time.Sleep(time.Millisecond); heard.Store(true) }}
		es := start(t, nil, []Config{cfg})
		es[0].Stop(nil)
		if !heard.Load() {
			t.Fatalf("round %d: Stop returned before OnStop was called", i)
		}
	}
}

// TestStopReturns: Stop "ends the engine and waits for its goroutines";
// it must not wait for the peers to close the connections.
func TestStopReturns(t *testing.T) {
	tn := newNet(t, 2, 1, ps.AnswerPush)
	es := start(t, tn, []Config{tn.config(0, testTensors), tn.config(1, testTensors)})
	stopped := make(chan error, 1)
	go func() { es[0].Stop(errors.New("giving up")); stopped <- nil }()
	select {
	case <-stopped:
	case <-time.After(2 * time.Second):
		t.Fatal("worker 0: Stop(err) still blocked 2 s later: its server and control connection readers wait in Recv on connections that stay open (heartbeats keep them alive)")
	}
}

// TestOrderlyEndOfServers: after a PS run, every worker's goodbye ends the
// servers cleanly (the engine pushes nothing a server would refuse).
func TestOrderlyEndOfServers(t *testing.T) {
	tn := newNet(t, 2, 2, ps.SeparatePull)
	run := newSumRun(2, 2, testTensors)
	cfgs := tn.configs(testTensors, func(r int, cfg *Config) {
		cfg.PullMode, cfg.ShardBytes = true, 40
		cfg.Sched = sched.Config{PartitionBytes: 64, CreditBytes: 256, Order: sched.OrderPriority, Admission: sched.AdmitStrict}
		cfg.OnDone = run.onDone(r)
	})
	run.run(t, start(t, tn, cfgs))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for r := range 2 {
		for _, c := range tn.servers[r] {
			done := make(chan error, 1)
			if err := c.SendNotify(cluster.ByeFrame(r), func(err error) { done <- err }); err != nil {
				t.Fatal(err)
			}
			select {
			case <-done:
			case <-ctx.Done():
				t.Fatal("goodbye not written")
			}
		}
	}
	for m, done := range tn.serve {
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("server %d: Serve = %v after every goodbye", m, err)
			}
			tn.serve[m] = make(chan error, 1)
			tn.serve[m] <- err
		case <-ctx.Done():
			t.Fatalf("server %d: Serve still running after every goodbye", m)
		}
	}
}

// fakeServers are m hand-written parameter servers for one worker: they
// record every frame and answer each piece with the pushed values + 1000.
type fakeServers struct {
	tn     *testNet
	mu     sync.Mutex
	frames [][]transport.Header // [server]
	errs   []string
}

func newFakeServers(t *testing.T, m int, pull bool) *fakeServers {
	t.Helper()
	fs := &fakeServers{tn: &testNet{n: 1, servers: [][]*transport.Conn{nil}, leaders: []*transport.Conn{nil}}, frames: make([][]transport.Header, m)}
	for s := range m {
		dialed, accepted := link(t, "server", s, "worker", []int{0})
		fs.tn.servers[0] = append(fs.tn.servers[0], dialed[0])
		fs.tn.all = append(fs.tn.all, dialed[0], accepted[0])
		go fs.serve(s, accepted[0], pull)
	}
	t.Cleanup(func() {
		for _, c := range fs.tn.all {
			c.Close()
		}
	})
	return fs
}

func (fs *fakeServers) serve(s int, c *transport.Conn, pull bool) {
	pushed := map[transport.Header][]byte{}
	for {
		f, err := c.Recv()
		if err != nil {
			return
		}
		fs.mu.Lock()
		fs.frames[s] = append(fs.frames[s], f.Header)
		fs.mu.Unlock()
		id := f.Header
		id.Kind, id.Length = 0, 0
		if f.Kind == transport.KindPush {
			vals := make([]float32, len(f.Payload)/4)
			transport.Float32s(vals, f.Payload)
			for i := range vals {
				vals[i] += 1000
			}
			answer := make([]byte, len(f.Payload))
			transport.PutFloat32s(answer, vals)
			pushed[id] = answer
			if pull {
				continue
			}
		}
		answer, ok := pushed[id]
		if !ok {
			fs.mu.Lock()
			fs.errs = append(fs.errs, fmt.Sprintf("server %d: %v frame %+v for nothing pushed", s, f.Kind, f.Header))
			fs.mu.Unlock()
			return
		}
		h := f.Header
		h.Kind = transport.KindAggregate
		_ = c.Send(transport.Frame{Header: h, Payload: answer})
	}
}

// TestPushFrames checks the frames an engine sends to its servers: every
// tensor's bytes pushed exactly once in shards on distinct servers, the
// header identity of each piece, pulls in pull mode, and the priority each
// piece carries (by layer, tensor and piece; or by start order in FIFO).
func TestPushFrames(t *testing.T) {
	for _, pull := range []bool{false, true} {
		for _, order := range []sched.Order{sched.OrderPriority, sched.OrderFIFO} {
			t.Run(fmt.Sprintf("pull%v/%v", pull, order), func(t *testing.T) {
				const servers = 3
				fs := newFakeServers(t, servers, pull)
				obs := &orderLog{}
				cfg := fs.tn.config(0, testTensors)
				cfg.PullMode, cfg.ShardBytes, cfg.Observer = pull, 40, obs
				cfg.Sched = sched.Config{PartitionBytes: 100, Order: order}
				es := start(t, fs.tn, []Config{cfg})
				var grads [][]float32
				for k, ten := range testTensors {
					grads = append(grads, grad(0, 0, k, ten.Elems))
				}
				for k := len(testTensors) - 1; k >= 0; k-- {
					if err := es[0].Post(k, 0, grads[k]); err != nil {
						t.Fatal(err)
					}
				}
				for l := range 3 {
					if err := within(t, waitLayerAsync(es[0], l, 0), 5*time.Second, "WaitLayer"); err != nil {
						t.Fatal(err)
					}
				}
				for k, ten := range testTensors {
					want := grad(0, 0, k, ten.Elems)
					for i := range want {
						want[i] += 1000
					}
					if i, ok := sameBits(grads[k], want); !ok {
						t.Errorf("tensor %d element %d is %v, the server answered %v", k, i, grads[k][i], want[i])
					}
				}
				started, _ := obs.snapshot()
				fs.check(t, order, pull, started)
			})
		}
	}
}

func (fs *fakeServers) check(t *testing.T, order sched.Order, pull bool, started []sched.PieceID) {
	t.Helper()
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for _, e := range fs.errs {
		t.Error(e)
	}
	startIdx := map[sched.PieceID]int{}
	for i, id := range started {
		startIdx[id] = i
	}
	type shardAt struct {
		server int
		h      transport.Header
	}
	byPiece := map[sched.PieceID][]shardAt{}
	covered := make([][]int, len(testTensors))
	for k, ten := range testTensors {
		covered[k] = make([]int, ten.Elems)
	}
	for s, hs := range fs.frames {
		// In pull mode each push is followed, on its connection, by one
		// pull of the same shard (a more urgent push may come in between).
		unpulled := map[transport.Header]bool{}
		for i, h := range hs {
			id := h
			id.Kind, id.Length = 0, 0
			if pull && h.Kind == transport.KindPull {
				if !unpulled[id] || h.Length != 0 {
					t.Errorf("server %d: frame %d is a pull %+v of nothing pushed before and not pulled yet", s, i, h)
				}
				delete(unpulled, id)
				continue
			}
			if h.Kind != transport.KindPush || h.Rank != 0 || h.Iteration != 0 || h.Epoch != 0 || h.Length%4 != 0 {
				t.Errorf("server %d: frame %d: %+v, want a push of iteration 0 by rank 0", s, i, h)
				continue
			}
			unpulled[id] = true
			pid := sched.PieceID{Tensor: int(h.Key), Index: int(h.Piece)}
			byPiece[pid] = append(byPiece[pid], shardAt{s, h})
			for e := h.Offset / 4; e < (h.Offset+uint64(h.Length))/4; e++ {
				covered[h.Key][e]++
			}
		}
		if pull && len(unpulled) > 0 {
			t.Errorf("server %d: %d pushes never pulled", s, len(unpulled))
		}
	}
	for k := range covered {
		for e, n := range covered[k] {
			if n != 1 {
				t.Fatalf("tensor %d element %d pushed %d times, want once", k, e, n)
			}
		}
	}
	ids := slices.SortedFunc(maps.Keys(byPiece), func(a, b sched.PieceID) int {
		if c := testTensors[a.Tensor].Layer - testTensors[b.Tensor].Layer; c != 0 {
			return c
		}
		if a.Tensor != b.Tensor {
			return a.Tensor - b.Tensor
		}
		return a.Index - b.Index
	})
	if len(ids) != len(started) {
		t.Errorf("%d pieces pushed, %d started", len(ids), len(started))
	}
	sharded := false
	for _, id := range ids {
		sh := byPiece[id]
		servers := map[int]bool{}
		var aux []int
		for _, s := range sh {
			servers[s.server] = true
			aux = append(aux, int(s.h.Aux))
			if s.h.Priority != sh[0].h.Priority {
				t.Errorf("piece %+v: shards %+v: want one priority", id, sh)
			}
		}
		slices.Sort(aux)
		for i, a := range aux {
			if a != i {
				t.Errorf("piece %+v: shard indexes %v, want 0..%d", id, aux, len(sh)-1)
				break
			}
		}
		sharded = sharded || len(sh) > 1
		if len(servers) != len(sh) {
			t.Errorf("piece %+v: %d shards on %d servers, want distinct servers", id, len(sh), len(servers))
		}
	}
	if !sharded {
		t.Error("no piece was sharded: the test does not cover shards")
	}
	// Priorities follow (layer, tensor, piece), or the start order in FIFO.
	if order == sched.OrderFIFO {
		slices.SortFunc(ids, func(a, b sched.PieceID) int { return startIdx[a] - startIdx[b] })
	}
	for i := 1; i < len(ids); i++ {
		if a, b := byPiece[ids[i-1]][0].h.Priority, byPiece[ids[i]][0].h.Priority; a >= b {
			t.Errorf("%v order: piece %+v has priority %d, not more urgent than the next piece %+v's %d", order, ids[i-1], a, ids[i], b)
		}
	}
}
