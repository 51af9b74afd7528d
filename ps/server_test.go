package ps

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/autobyte/autobyte/cluster"
	"github.com/autobyte/autobyte/transport"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// quietTime is how long a test waits to be sure that no frame arrives.
const quietTime = 150 * time.Millisecond

// rig is one server with n hand-driven workers on loopback.
type rig struct {
	t       *testing.T
	mode    Mode
	srv     *Server
	workers []*transport.Conn // the workers' ends, by rank
	server  []*transport.Conn // the server's ends, by rank
	frames  []chan transport.Frame
	recvErr []chan error // the error that ended each worker's Recv loop
	serve   chan error   // Serve's result
}

// newRig starts a server for n workers and connects them.
func newRig(t *testing.T, n int, mode Mode) *rig {
	t.Helper()
	return newRigCtx(t, context.Background(), n, mode)
}

// newRigCtx is newRig with Serve's context.
func newRigCtx(t *testing.T, serveCtx context.Context, n int, mode Mode) *rig {
	t.Helper()
	return newRigWith(t, serveCtx, n, mode, nil)
}

// newRigWith is newRigCtx with setup, if not nil, applied to the server
// before it serves.
func newRigWith(t *testing.T, serveCtx context.Context, n int, mode Mode, setup func(*Server)) *rig {
	t.Helper()
	srv, err := New(Options{Workers: n, Mode: mode, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if setup != nil {
		setup(srv)
	}
	r := &rig{t: t, mode: mode, srv: srv, serve: make(chan error, 1)}
	r.workers, r.server = connectWorkers(t, n)
	for rank := range n {
		fr, errc := make(chan transport.Frame, 1000), make(chan error, 1)
		r.frames, r.recvErr = append(r.frames, fr), append(r.recvErr, errc)
		go func() {
			for {
				f, err := r.workers[rank].Recv()
				if err != nil {
					errc <- err
					return
				}
				fr <- f
			}
		}()
	}
	go func() { r.serve <- srv.Serve(serveCtx, r.server) }()
	return r
}

// connectWorkers connects n workers to a listener on loopback and returns
// the workers' ends and the server's ends, both by rank; they are closed
// at the end of the test.
func connectWorkers(tb testing.TB, n int) (workers, server []*transport.Conn) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := transport.Listen("127.0.0.1:0", transport.Config{Token: "t", Role: "server", Logger: quiet})
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	workers, server = make([]*transport.Conn, n), make([]*transport.Conn, n)
	for rank := range n {
		c, err := transport.Dial(ctx, l.Addr().String(), transport.Config{Token: "t", Rank: rank, Role: "worker", Logger: quiet})
		if err != nil {
			tb.Fatal(err)
		}
		workers[rank] = c
		sc, err := l.Accept(ctx)
		if err != nil {
			tb.Fatal(err)
		}
		server[sc.PeerRank()] = sc
	}
	tb.Cleanup(func() {
		for _, c := range append(slices.Clone(workers), server...) {
			c.Close()
		}
	})
	return workers, server
}

// piece is one piece as pushed: its header identity and its size.
type piece struct {
	epoch, iter, key, piece, aux uint32
	offset                       uint64
	elems                        int
	prio                         uint64
}

func (p piece) String() string {
	return fmt.Sprintf("epoch %d iteration %d tensor %d piece %d shard %d", p.epoch, p.iter, p.key, p.piece, p.aux)
}

func (p piece) header(kind transport.Kind) transport.Header {
	return transport.Header{Kind: kind, Epoch: p.epoch, Iteration: p.iter, Key: p.key, Piece: p.piece, Aux: p.aux, Offset: p.offset, Priority: p.prio}
}

// value is worker rank's integer gradient at element i of piece p: sums
// of a few of them are exact in float32.
func value(rank int, p piece, i int) float32 {
	return float32((rank+1)*(i%97+1) + int(p.key)*3 + int(p.iter)*5 + int(p.epoch)*11 - 40)
}

func payload(rank int, p piece) []byte {
	v := make([]float32, p.elems)
	for i := range v {
		v[i] = value(rank, p, i)
	}
	b := make([]byte, 4*len(v))
	transport.PutFloat32s(b, v)
	return b
}

func wantSum(n int, p piece) []float32 {
	s := make([]float32, p.elems)
	for i := range s {
		for r := range n {
			s[i] += value(r, p, i)
		}
	}
	return s
}

func (r *rig) push(rank int, p piece) {
	r.t.Helper()
	if err := r.workers[rank].Send(transport.Frame{Header: p.header(transport.KindPush), Payload: payload(rank, p)}); err != nil {
		r.t.Fatalf("worker %d push %v: %v", rank, p, err)
	}
}

func (r *rig) pull(rank int, p piece) {
	r.t.Helper()
	if err := r.workers[rank].Send(transport.Frame{Header: p.header(transport.KindPull)}); err != nil {
		r.t.Fatalf("worker %d pull %v: %v", rank, p, err)
	}
}

// barrier has every worker push (and pull) piece b and waits for its
// answers: every frame a worker sent before was handled by then.
func (r *rig) barrier(b piece) {
	r.t.Helper()
	for rank := range r.workers {
		r.push(rank, b)
		if r.mode == SeparatePull {
			r.pull(rank, b)
		}
	}
	r.answered(b)
}

// pushThenConflict has worker first push p and worker second push q, a
// push of the same piece that disagrees with p. The barrier between them
// makes sure the server took p first, so that it is q the server blames.
func (r *rig) pushThenConflict(first int, p piece, second int, q piece) {
	r.t.Helper()
	r.push(first, p)
	r.barrier(piece{key: 99, elems: 1})
	r.push(second, q)
}

// answered checks that every worker's next answer is the sum of p.
func (r *rig) answered(p piece) {
	r.t.Helper()
	for rank := range r.workers {
		checkAnswer(r.t, rank, len(r.workers), p, r.next(rank))
	}
}

// next returns worker rank's next answer, failing after a few seconds.
func (r *rig) next(rank int) transport.Frame {
	r.t.Helper()
	select {
	case f := <-r.frames[rank]:
		return f
	case err := <-r.recvErr[rank]:
		r.t.Fatalf("worker %d: waiting for an answer: %v", rank, err)
	case <-time.After(5 * time.Second):
		r.t.Fatalf("worker %d: no answer within 5 s", rank)
	}
	return transport.Frame{}
}

// noAnswer checks that worker rank receives nothing for a while.
func (r *rig) noAnswer(rank int, why string) {
	r.t.Helper()
	select {
	case f := <-r.frames[rank]:
		r.t.Fatalf("worker %d got an answer (%v frame, tensor %d piece %d) %s", rank, f.Kind, f.Key, f.Piece, why)
	case <-time.After(quietTime):
	}
}

// checkAnswer checks that f is the exact sum of p over n workers, with p's
// header identity and priority.
func checkAnswer(t *testing.T, rank, n int, p piece, f transport.Frame) {
	t.Helper()
	got := f.Header
	want := p.header(transport.KindAggregate)
	want.Rank, want.Length = 0, uint32(4*p.elems)
	if got != want {
		t.Fatalf("worker %d: answer header\n got %+v\nwant %+v", rank, got, want)
	}
	sum := make([]float32, p.elems)
	transport.Float32s(sum, f.Payload)
	for i, w := range wantSum(n, p) {
		if math.Float32bits(sum[i]) != math.Float32bits(w) {
			t.Fatalf("worker %d: %v element %d is %v, exact sum is %v", rank, p, i, sum[i], w)
		}
	}
}

// bye says every worker's goodbye and returns Serve's result.
func (r *rig) bye() error {
	r.t.Helper()
	for rank, c := range r.workers {
		if err := c.Send(cluster.ByeFrame(rank)); err != nil {
			r.t.Fatal(err)
		}
	}
	return r.wait(2 * time.Second)
}

// wait returns Serve's result, failing if it does not return within d.
func (r *rig) wait(d time.Duration) error {
	r.t.Helper()
	select {
	case err := <-r.serve:
		return err
	case <-time.After(d):
		r.t.Fatalf("Serve did not return within %v", d)
	}
	return nil
}

// testPieces are pieces with every header field varied, including the same
// tensor and piece index under another epoch or iteration with another size
// (a re-partitioning), and an empty piece.
func testPieces() []piece {
	return []piece{
		{key: 0, piece: 0, elems: 300, prio: 7},
		{key: 0, piece: 1, offset: 1200, elems: 17, prio: 8},
		{key: 1, piece: 0, aux: 1, offset: 64, elems: 9, prio: 1},
		{key: 2, piece: 3, aux: 2, offset: 4096, elems: 1, prio: math.MaxUint64 - 1},
		{epoch: 1, key: 0, piece: 0, elems: 150, prio: 3},
		{iter: 1, key: 0, piece: 0, elems: 40, offset: 8, prio: 2},
		{epoch: 2, iter: 3, key: 0, piece: 0, elems: 5, prio: 1 << 40},
	}
}

// TestExactSums: every worker gets one answer per piece, with the exact sum,
// whatever order the workers push in.
func TestExactSums(t *testing.T) {
	for n := 1; n <= 5; n++ {
		for _, mode := range []Mode{AnswerPush, SeparatePull} {
			t.Run(fmt.Sprintf("workers%d/mode%d", n, mode), func(t *testing.T) {
				r := newRig(t, n, mode)
				pieces := testPieces()
				var wg sync.WaitGroup
				for rank := range n {
					order := rand.Perm(len(pieces))
					wg.Add(1)
					go func() {
						defer wg.Done()
						for _, i := range order {
							// Send never blocks; errors fail below as missing answers.
							_ = r.workers[rank].Send(transport.Frame{Header: pieces[i].header(transport.KindPush), Payload: payload(rank, pieces[i])})
							if mode == SeparatePull {
								_ = r.workers[rank].Send(transport.Frame{Header: pieces[i].header(transport.KindPull)})
							}
						}
					}()
				}
				wg.Wait()
				for rank := range n {
					seen := map[string]bool{}
					for range pieces {
						f := r.next(rank)
						p := findPiece(t, pieces, f.Header)
						if seen[p.String()] {
							t.Fatalf("worker %d: %v answered twice", rank, p)
						}
						seen[p.String()] = true
						checkAnswer(t, rank, n, p, f)
					}
				}
				r.noAnswer(0, "after every piece was answered")
				if err := r.bye(); err != nil {
					t.Fatalf("Serve after every goodbye: %v", err)
				}
				var bytes int64
				for _, p := range pieces {
					bytes += int64(4 * p.elems * n)
				}
				if pc, b := r.srv.Stats(); pc != int64(len(pieces)) || b != bytes {
					t.Errorf("Stats = %d pieces, %d bytes; want %d pieces, %d bytes", pc, b, len(pieces), bytes)
				}
			})
		}
	}
}

func findPiece(t *testing.T, pieces []piece, h transport.Header) piece {
	t.Helper()
	for _, p := range pieces {
		if p.epoch == h.Epoch && p.iter == h.Iteration && p.key == h.Key && p.piece == h.Piece && p.aux == h.Aux {
			return p
		}
	}
	t.Fatalf("answer for a piece nobody pushed: %+v", h)
	return piece{}
}

// TestAnswersAfterLastPush: no worker hears about a piece before the last
// worker pushed it.
func TestAnswersAfterLastPush(t *testing.T) {
	const n = 3
	r := newRig(t, n, AnswerPush)
	p := piece{key: 4, piece: 2, elems: 64, prio: 5}
	for _, rank := range []int{2, 0} {
		r.push(rank, p)
	}
	for rank := range n {
		r.noAnswer(rank, "before worker 1 pushed")
	}
	r.push(1, p)
	r.answered(p)
	if err := r.bye(); err != nil {
		t.Fatal(err)
	}
}

// TestSeparatePull: answers go only to workers that asked, whether they
// asked before or after the last push, and a piece counts as answered only
// once every worker got it.
func TestSeparatePull(t *testing.T) {
	const n = 3
	r := newRig(t, n, SeparatePull)
	p := piece{key: 1, piece: 0, offset: 40, elems: 10, prio: 9}
	r.pull(0, p) // before any push
	r.push(0, p)
	r.push(1, p)
	r.noAnswer(0, "before worker 2 pushed")
	r.push(2, p)
	checkAnswer(t, 0, n, p, r.next(0))
	r.noAnswer(1, "without a pull")
	r.noAnswer(2, "without a pull")
	if pc, _ := r.srv.Stats(); pc != 0 {
		t.Errorf("Stats counts %d answered pieces while 2 workers still wait for it", pc)
	}
	r.pull(1, p) // after the last push
	checkAnswer(t, 1, n, p, r.next(1))
	r.noAnswer(2, "without a pull")
	r.pull(2, p)
	checkAnswer(t, 2, n, p, r.next(2))
	if err := r.bye(); err != nil {
		t.Fatal(err)
	}
	if pc, b := r.srv.Stats(); pc != 1 || b != 3*40 {
		t.Errorf("Stats = %d pieces, %d bytes; want 1, 120", pc, b)
	}
}

// TestRepartitionedPiecesAreSeparate: the same tensor and piece index in
// another epoch or iteration, with another size, is another sum.
func TestRepartitionedPiecesAreSeparate(t *testing.T) {
	const n = 2
	r := newRig(t, n, AnswerPush)
	old := piece{key: 3, piece: 1, offset: 400, elems: 100, prio: 1}
	newEpoch := piece{epoch: 1, key: 3, piece: 1, offset: 200, elems: 50, prio: 2}
	newIter := piece{iter: 1, key: 3, piece: 1, offset: 400, elems: 100, prio: 3}
	// Worker 0 runs ahead into the next epoch and iteration before worker
	// 1 pushed the old piece.
	for _, p := range []piece{old, newEpoch, newIter} {
		r.push(0, p)
	}
	r.noAnswer(0, "before worker 1 pushed anything")
	for _, p := range []piece{newIter, newEpoch, old} {
		r.push(1, p)
		r.answered(p)
	}
	if err := r.bye(); err != nil {
		t.Fatal(err)
	}
}

func TestOrderlyEnd(t *testing.T) {
	for n := 1; n <= 3; n++ {
		r := newRig(t, n, AnswerPush)
		for rank := range n - 1 {
			if err := r.workers[rank].Send(cluster.ByeFrame(rank)); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case err := <-r.serve:
			t.Fatalf("%d workers: Serve returned %v before the last goodbye", n, err)
		case <-time.After(quietTime):
		}
		if err := r.workers[n-1].Send(cluster.ByeFrame(n - 1)); err != nil {
			t.Fatal(err)
		}
		if err := r.wait(2 * time.Second); err != nil {
			t.Fatalf("%d workers: Serve after every goodbye: %v", n, err)
		}
		if pc, b := r.srv.Stats(); pc != 0 || b != 0 {
			t.Errorf("Stats = %d, %d with nothing pushed", pc, b)
		}
	}
}

// TestLostWorker: a worker's connection dying ends Serve with an error
// naming it, and the other workers are told why.
func TestLostWorker(t *testing.T) {
	const n = 3
	r := newRig(t, n, AnswerPush)
	r.push(0, piece{elems: 4})
	r.workers[1].Close()
	err := r.wait(2 * time.Second)
	if err == nil || !strings.Contains(err.Error(), "worker 1") {
		t.Fatalf("Serve = %v, want an error naming worker 1", err)
	}
	for _, rank := range []int{0, 2} {
		select {
		case err := <-r.recvErr[rank]:
			var pc *transport.PeerClosedError
			if !errors.As(err, &pc) || !strings.Contains(pc.Reason, "worker 1") {
				t.Errorf("worker %d: Recv = %v, want the server closing with a reason naming worker 1", rank, err)
			}
		case f := <-r.frames[rank]:
			t.Errorf("worker %d got a %v frame after worker 1 was lost", rank, f.Kind)
		case <-time.After(2 * time.Second):
			t.Errorf("worker %d: connection still open 2 s after worker 1 was lost", rank)
		}
	}
}

// TestWorkerLeftEarly: a worker that says goodbye while the others still
// push (it ran fewer iterations, e.g. it had fewer batches) ends Serve with
// an error naming it and the piece it left open, whether the others pushed
// that piece before its goodbye or after, and the others are told why
// instead of waiting for ever. The same goodbye after the last piece was
// answered ends Serve cleanly (the control).
func TestWorkerLeftEarly(t *testing.T) {
	const n = 3
	done := piece{key: 1, elems: 6}
	open := piece{iter: 1, key: 4, piece: 2, aux: 1, elems: 5}
	for _, mode := range []Mode{AnswerPush, SeparatePull} {
		for _, pushedFirst := range []bool{true, false} {
			name := fmt.Sprintf("mode %d, push before goodbye %v", mode, pushedFirst)
			r := newRig(t, n, mode)
			r.barrier(done)
			if pushedFirst {
				r.push(0, open)
				r.barrier(piece{key: 9, elems: 1}) // the push is in before the goodbye
			}
			if err := r.workers[2].Send(cluster.ByeFrame(2)); err != nil {
				t.Fatal(err)
			}
			if !pushedFirst {
				time.Sleep(quietTime) // the goodbye is in first
				r.push(0, open)
			}
			err := r.wait(2 * time.Second)
			if err == nil || !strings.Contains(err.Error(), "worker 2 finished and left the job without pushing tensor 4 piece 2 shard 1 of iteration 1") {
				t.Fatalf("%s: Serve = %v, want an error naming worker 2 and the open piece", name, err)
			}
			var pc *transport.PeerClosedError
			if err := <-r.recvErr[0]; !errors.As(err, &pc) || !strings.Contains(pc.Reason, "worker 2 finished and left") {
				t.Errorf("%s: worker 0: Recv = %v, want the server closing with the reason", name, err)
			}
		}
		r := newRig(t, n, mode)
		r.barrier(done)
		if err := r.workers[2].Send(cluster.ByeFrame(2)); err != nil {
			t.Fatal(err)
		}
		if err := r.bye(); err != nil {
			t.Fatalf("mode %d: goodbyes after every piece was answered: Serve = %v", mode, err)
		}
	}
}

// TestBadPushes: each protocol violation ends Serve with an error naming
// the worker and the offending value.
func TestBadPushes(t *testing.T) {
	p := piece{key: 5, piece: 2, aux: 1, offset: 64, elems: 8}
	shorter, moved := p, p // p's identity with another length, another offset
	shorter.elems = 4
	moved.offset = 68
	cases := []struct {
		name string
		// do has the workers of a 2-worker server misbehave.
		do   func(r *rig)
		want []string
	}{
		{"partial float", func(r *rig) {
			h := p.header(transport.KindPush)
			_ = r.workers[1].Send(transport.Frame{Header: h, Payload: make([]byte, 6)})
		}, []string{"worker 1", "6 bytes"}},
		{"other length", func(r *rig) { r.pushThenConflict(0, p, 1, shorter) },
			[]string{"worker 1", "16 bytes", "32 bytes"}},
		{"other offset", func(r *rig) { r.pushThenConflict(1, p, 0, moved) },
			[]string{"worker 0", "offset 68", "offset 64"}},
		{"ring frame", func(r *rig) {
			_ = r.workers[0].Send(transport.Frame{Header: transport.Header{Kind: transport.KindRing}})
		}, []string{"worker 0", "ring"}},
		{"aggregate frame", func(r *rig) {
			_ = r.workers[1].Send(transport.Frame{Header: p.header(transport.KindAggregate), Payload: payload(1, p)})
		}, []string{"worker 1", "aggregate"}},
		{"control frame other than goodbye", func(r *rig) {
			_ = r.workers[1].Send(transport.Frame{Header: transport.Header{Kind: transport.KindControl, Aux: cluster.CtlAnnounce}})
		}, []string{"worker 1", "control"}},
	}
	for _, c := range cases {
		for _, mode := range []Mode{AnswerPush, SeparatePull} {
			t.Run(fmt.Sprintf("%s/mode%d", c.name, mode), func(t *testing.T) {
				r := newRig(t, 2, mode)
				c.do(r)
				err := r.wait(2 * time.Second)
				if err == nil {
					t.Fatal("Serve returned nil")
				}
				for _, w := range c.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("Serve = %q, want it to name %q", err, w)
					}
				}
			})
		}
	}
}

// TestDuplicatePush: a worker pushing the same piece twice is a protocol
// violation: it must not be summed as if it were another worker's push.
func TestDuplicatePush(t *testing.T) {
	p := piece{key: 1, piece: 0, elems: 4, prio: 1}
	for _, mode := range []Mode{AnswerPush, SeparatePull} {
		t.Run(fmt.Sprintf("beforeOthers/mode%d", mode), func(t *testing.T) {
			r := newRig(t, 2, mode)
			r.push(0, p)
			r.push(0, p)
			if mode == SeparatePull {
				// The server may have stopped on the second push already,
				// and then this send fails: the error below is the check.
				_ = r.workers[0].Send(transport.Frame{Header: p.header(transport.KindPull)})
			}
			select {
			case err := <-r.serve:
				if err == nil || !strings.Contains(err.Error(), "worker 0") {
					t.Fatalf("Serve = %v, want an error naming worker 0", err)
				}
			case f := <-r.frames[0]:
				sum := make([]float32, p.elems)
				transport.Float32s(sum, f.Payload)
				t.Fatalf("worker 0 pushed tensor 1 piece 0 twice and worker 1 never pushed it: got an answer %v (twice worker 0's gradient %v) instead of an error naming worker 0",
					sum, wantSum(1, p))
			case <-time.After(2 * time.Second):
				t.Fatal("Serve still running 2 s after worker 0 pushed a piece twice")
			}
		})
		t.Run(fmt.Sprintf("afterAll/mode%d", mode), func(t *testing.T) {
			r := newRig(t, 2, mode)
			r.push(0, p)
			r.push(1, p)
			// Both pushes are handled before the third.
			if mode == AnswerPush {
				checkAnswer(t, 0, 2, p, r.next(0))
				checkAnswer(t, 1, 2, p, r.next(1))
			} else {
				r.barrier(piece{key: 99, elems: 1})
			}
			r.push(1, p) // a third push by 2 workers
			select {
			case err := <-r.serve:
				// The server's own message for this case is "pushed 3 times
				// by 2 workers (worker 1 pushed twice?)".
				if err == nil || !strings.Contains(err.Error(), "worker 1") || !strings.Contains(err.Error(), "twice") {
					t.Fatalf("Serve = %v, want an error naming worker 1 pushing twice", err)
				}
			case <-time.After(2 * time.Second):
				t.Fatal("Serve still running 2 s after worker 1 pushed a piece every worker had already pushed (3 pushes by 2 workers)")
			}
		})
	}
}

func TestCancel(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	r := newRigCtx(t, ctx, 2, AnswerPush)
	r.push(0, piece{elems: 3})
	cancel(errors.New("operator pulled the plug"))
	if err := r.wait(2 * time.Second); err == nil || !strings.Contains(err.Error(), "pulled the plug") {
		t.Fatalf("Serve = %v, want the cancel cause", err)
	}
	for rank := range 2 {
		select {
		case err := <-r.recvErr[rank]:
			if !strings.Contains(err.Error(), "pulled the plug") {
				t.Errorf("worker %d: Recv = %v, want the reason", rank, err)
			}
		case <-time.After(2 * time.Second):
			t.Errorf("worker %d: connection still open after Serve returned", rank)
		}
	}
}

func TestNew(t *testing.T) {
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{Workers: 0}, "got 0"},
		{Options{Workers: -3}, "got -3"},
		{Options{Workers: 2, Mode: 7}, "mode 7"},
		{Options{Workers: 2, Mode: -1}, "mode -1"},
	} {
		s, err := New(c.o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v, %v; want an error naming %q", c.o, s, err, c.want)
		}
	}
	s, err := New(Options{Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(context.Background(), nil); err == nil || !strings.Contains(err.Error(), "got 0") {
		t.Errorf("Serve of a 2-worker server on no connections = %v, want an error naming the count", err)
	}
}

// TestOnIteration: the server reports each iteration later than any
// before, once, whatever order the pushes of earlier iterations come in
// (a server host whose link follows a trace changes its rate there).
func TestOnIteration(t *testing.T) {
	var mu sync.Mutex
	var seen []int
	r := newRigWith(t, context.Background(), 2, AnswerPush, func(s *Server) {
		s.o.OnIteration = func(k int) {
			mu.Lock()
			seen = append(seen, k)
			mu.Unlock()
		}
	})
	for i, it := range []uint32{0, 0, 2, 1, 2, 5, 3} {
		r.barrier(piece{iter: it, key: uint32(i), elems: 8})
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(seen, []int{0, 2, 5}) {
		t.Errorf("OnIteration saw %v, want [0 2 5]", seen)
	}
}
