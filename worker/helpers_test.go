package worker

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/ps"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/transport"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// quietTime is how long a test waits to be sure that something does not
// happen.
const quietTime = 150 * time.Millisecond

func tcfg(role string, rank int) transport.Config {
	return transport.Config{Token: "t", Rank: rank, Role: role, Logger: quiet}
}

// link has each of ranks (in role drole) dial a listener of (lrole, lrank)
// and returns the dialers' ends and the listener's ends, both in the order
// of ranks.
func link(t *testing.T, lrole string, lrank int, drole string, ranks []int) (dialed, accepted []*transport.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := transport.Listen("127.0.0.1:0", tcfg(lrole, lrank))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dialed, accepted = make([]*transport.Conn, len(ranks)), make([]*transport.Conn, len(ranks))
	index := map[int]int{}
	for i, r := range ranks {
		index[r] = i
		if dialed[i], err = transport.Dial(ctx, l.Addr().String(), tcfg(drole, r)); err != nil {
			t.Fatal(err)
		}
		c, err := l.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		accepted[index[c.PeerRank()]] = c
	}
	return dialed, accepted
}

// testNet is the connections of n workers: to each of m parameter servers
// (each served by a real ps.Server) and rank 0's control connections.
type testNet struct {
	n          int
	servers    [][]*transport.Conn // [rank][server]: the workers' ends
	serverEnds [][]*transport.Conn // [server][rank]
	serve      []chan error        // each server's Serve result
	followers  []*transport.Conn   // rank 0's ends, for ranks 1..n-1
	leaders    []*transport.Conn   // [rank]: the follower's end (nil for rank 0)
	all        []*transport.Conn
}

func newNet(t *testing.T, n, servers int, mode ps.Mode) *testNet {
	t.Helper()
	tn := &testNet{n: n, servers: make([][]*transport.Conn, n), leaders: make([]*transport.Conn, n)}
	ranks := make([]int, n)
	for r := range ranks {
		ranks[r] = r
	}
	for m := range servers {
		dialed, accepted := link(t, "server", m, "worker", ranks)
		for r, c := range dialed {
			tn.servers[r] = append(tn.servers[r], c)
		}
		tn.serverEnds = append(tn.serverEnds, accepted)
		tn.all = append(append(tn.all, dialed...), accepted...)
		srv, err := ps.New(ps.Options{Workers: n, Mode: mode, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- srv.Serve(context.Background(), accepted) }()
		tn.serve = append(tn.serve, done)
	}
	if n > 1 {
		dialed, accepted := link(t, "worker", 0, "worker", ranks[1:])
		tn.followers = accepted
		copy(tn.leaders[1:], dialed)
		tn.all = append(append(tn.all, dialed...), accepted...)
	}
	t.Cleanup(func() {
		for _, c := range tn.all {
			c.Close()
		}
		for m, done := range tn.serve {
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Errorf("server %d: Serve still running 5 s after every connection closed", m)
			}
		}
	})
	return tn
}

// config is rank's engine configuration on tn in parameter-server mode.
func (tn *testNet) config(rank int, tensors []Tensor) Config {
	c := Config{Rank: rank, Workers: tn.n, Arch: PS, Tensors: tensors, Servers: tn.servers[rank], Leader: tn.leaders[rank], Logger: quiet}
	if rank == 0 {
		c.Followers = tn.followers
	}
	return c
}

// configs is every rank's config on tn for tensors, each then changed by
// set.
func (tn *testNet) configs(tensors []Tensor, set func(rank int, cfg *Config)) []Config {
	cfgs := make([]Config, tn.n)
	for r := range cfgs {
		cfgs[r] = tn.config(r, tensors)
		set(r, &cfgs[r])
	}
	return cfgs
}

// start creates and starts an engine per configuration. At the end of the
// test every connection is closed first (an engine's readers only return
// when their connections do) and then every engine stopped.
func start(t *testing.T, tn *testNet, cfgs []Config) []*Engine {
	t.Helper()
	var es []*Engine
	for _, c := range cfgs {
		e, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		e.Start(context.Background())
		es = append(es, e)
	}
	t.Cleanup(func() {
		if tn != nil {
			for _, c := range tn.all {
				c.Close()
			}
		}
		for r, e := range es {
			stopped := make(chan struct{})
			go func() { e.Stop(nil); close(stopped) }()
			select {
			case <-stopped:
			case <-time.After(5 * time.Second):
				t.Errorf("worker %d: Stop still blocked 5 s after every connection closed", r)
			}
		}
	})
	return es
}

// grad is rank's integer gradient of tensor in iteration it: sums over a
// few ranks are exact in float32.
func grad(rank, it, tensor, elems int) []float32 {
	g := make([]float32, elems)
	for i := range g {
		g[i] = float32((rank+1)*((i*7+tensor+it)%13+1) - 3)
	}
	return g
}

func exactSum(n, it, tensor, elems int) []float32 {
	s := make([]float32, elems)
	for r := range n {
		for i, v := range grad(r, it, tensor, elems) {
			s[i] += v
		}
	}
	return s
}

func sameBits(got, want []float32) (int, bool) {
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return i, false
		}
	}
	return 0, len(got) == len(want)
}

// doneLog records OnDone calls and checks that each tensor's sum is in
// place when it is called.
type doneLog struct {
	mu    sync.Mutex
	calls map[[3]int]int // (rank, tensor, iteration) -> calls
	errs  []string
	ch    chan [3]int
}

func newDoneLog() *doneLog { return &doneLog{calls: map[[3]int]int{}, ch: make(chan [3]int, 1000)} }

// hook is rank's OnDone; grads(tensor, it) returns the slice posted, and
// want its exact sum (nil: no check).
func (d *doneLog) hook(rank int, grads func(tensor, it int) []float32, want func(tensor, it int) []float32) func(int, int) {
	return func(tensor, it int) {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.calls[[3]int{rank, tensor, it}]++
		if want != nil {
			if i, ok := sameBits(grads(tensor, it), want(tensor, it)); !ok {
				d.errs = append(d.errs, fmt.Sprintf("worker %d: OnDone(%d, %d) before the sum was in place: element %d is %v, want %v",
					rank, tensor, it, i, grads(tensor, it)[i], want(tensor, it)[i]))
			}
		}
		d.ch <- [3]int{rank, tensor, it}
	}
}

// check fails unless OnDone was called exactly once for each rank, tensor
// and iteration below the given counts, and for nothing else.
func (d *doneLog) check(t *testing.T, ranks, tensors, iterations int) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, e := range d.errs {
		t.Error(e)
	}
	for r := range ranks {
		for k := range tensors {
			for it := range iterations {
				if n := d.calls[[3]int{r, k, it}]; n != 1 {
					t.Errorf("worker %d: OnDone(%d, %d) called %d times, want once", r, k, it, n)
				}
			}
		}
	}
	if len(d.calls) != ranks*tensors*iterations {
		t.Errorf("OnDone called for %d (rank, tensor, iteration) triples, want %d: %v", len(d.calls), ranks*tensors*iterations, d.calls)
	}
}

// orderLog is an Observer recording the order pieces start in.
type orderLog struct {
	mu      sync.Mutex
	started []sched.PieceID
	done    int
	compute []string
	iters   []int
}

func (o *orderLog) PieceStarted(p sched.Piece, posted, started time.Time, inflight int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.started = append(o.started, p.PieceID)
}

func (o *orderLog) PieceDone(p sched.Piece, started, done time.Time, inflight int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.done++
}

func (o *orderLog) Compute(name string, it int, start, end time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.compute = append(o.compute, fmt.Sprintf("%s/%d", name, it))
}

func (o *orderLog) Iteration(k int, d time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.iters = append(o.iters, k)
}

func (o *orderLog) snapshot() ([]sched.PieceID, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]sched.PieceID(nil), o.started...), o.done
}

// fakeRing all-reduces in memory: a piece's sum is computed once every
// rank started it, written into every rank's data, and each rank's done is
// called from a goroutine of its own.
type fakeRing struct {
	size int
	// corrupt, if set, is added to element 0 of every sum.
	corrupt float32
	// fail, if set, is passed to every done instead of summing.
	fail error
	// delay, if set, is how long a piece's sum takes to arrive.
	delay func(sched.Piece) time.Duration

	mu     sync.Mutex
	pieces map[sched.PieceID]*ringPiece
	errs   []string
}

type ringPiece struct {
	p     sched.Piece
	data  [][]float32
	dones []func(error)
}

func newFakeRing(size int) *fakeRing {
	return &fakeRing{size: size, pieces: map[sched.PieceID]*ringPiece{}}
}

// member is rank's view of the ring.
func (f *fakeRing) member(rank int) Ring { return ringMember{f, rank} }

type ringMember struct {
	f    *fakeRing
	rank int
}

func (m ringMember) Start(p sched.Piece, priority uint64, elem dtype.DType, data []float32, done func(error)) {
	f := m.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		go done(f.fail)
		return
	}
	rp := f.pieces[p.PieceID]
	if rp == nil {
		rp = &ringPiece{p: p}
		f.pieces[p.PieceID] = rp
	}
	if p.Offset != rp.p.Offset || p.Bytes != rp.p.Bytes || int64(len(data)) != p.Bytes/int64(elem.Size()) {
		f.errs = append(f.errs, fmt.Sprintf("rank %d started %+v with %d elements; another rank started %+v", m.rank, p, len(data), rp.p))
	}
	rp.data = append(rp.data, data)
	rp.dones = append(rp.dones, done)
	if len(rp.data) < f.size {
		return
	}
	delete(f.pieces, p.PieceID)
	sum := make([]float32, len(data))
	for _, d := range rp.data {
		for i, v := range d {
			sum[i] += v
		}
	}
	sum[0] += f.corrupt
	var wait time.Duration
	if f.delay != nil {
		wait = f.delay(p)
	}
	for i, d := range rp.data {
		go func() {
			time.Sleep(wait)
			copy(d, sum)
			rp.dones[i](nil)
		}()
	}
}

func (f *fakeRing) check(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range f.errs {
		t.Error(e)
	}
	if len(f.pieces) != 0 {
		t.Errorf("%d pieces started by some ranks only", len(f.pieces))
	}
}

// waitLayerAsync runs WaitLayer in a goroutine.
func waitLayerAsync(e *Engine, layer, it int) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- e.WaitLayer(layer, it) }()
	return ch
}

// within returns the value from ch, failing the test after d.
func within(t *testing.T, ch <-chan error, d time.Duration, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(d):
		t.Fatalf("%s: still blocked after %v", what, d)
	}
	return nil
}

// blocked checks that ch yields nothing for quietTime.
func blocked(t *testing.T, ch <-chan error, what string) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("%s returned (%v) too early", what, err)
	case <-time.After(quietTime):
	}
}
