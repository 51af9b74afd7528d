package sched

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func newFollower(t *testing.T, cfg Config) *Follower {
	t.Helper()
	f, err := NewFollower(cfg)
	if err != nil {
		t.Fatalf("NewFollower(%+v): %v", cfg, err)
	}
	return f
}

// piece builds a leader piece as the Scheduler would hand it out.
func piece(iter, tensor, index, count int, bytes int64) Piece {
	return Piece{PieceID: pid(iter, tensor, index), Count: count, Bytes: bytes}
}

// TestFollowerAnnounceOrder: pieces start in the leader's order, not in
// post order nor priority order, which is what keeps all workers on one
// global sequence.
func TestFollowerAnnounceOrder(t *testing.T) {
	f := newFollower(t, Config{Order: OrderPriority})
	// Posted in production order (last layer first) ...
	post(t, f,
		Task{Iteration: 0, Tensor: 2, Layer: 2, Bytes: 4},
		Task{Iteration: 0, Tensor: 1, Layer: 1, Bytes: 4},
		Task{Iteration: 0, Tensor: 0, Layer: 0, Bytes: 8})
	// ... announced in an order that is neither.
	for _, p := range []Piece{piece(0, 1, 0, 1, 4), piece(0, 0, 1, 2, 4), piece(0, 2, 0, 1, 4), piece(0, 0, 0, 2, 4)} {
		f.Announce(p)
	}
	wantIDs(t, "announced", startAll(f), pid(0, 1, 0), pid(0, 0, 1), pid(0, 2, 0), pid(0, 0, 0))
}

// TestFollowerHeadOfLine: the follower never starts a piece of a task not
// posted here, and by design does not skip past it either: a later ready
// piece waits for the head, so every worker keeps the leader's sequence.
func TestFollowerHeadOfLine(t *testing.T) {
	f := newFollower(t, Config{})
	f.Announce(piece(0, 5, 0, 1, 4))
	f.Announce(piece(0, 3, 0, 1, 4))
	if got := startAll(f); len(got) != 0 {
		t.Fatalf("started %v before any task was posted", ids(got))
	}
	post(t, f, Task{Iteration: 0, Tensor: 3, Bytes: 4})
	if got := startAll(f); len(got) != 0 {
		t.Fatalf("started %v past the unposted head (tensor 5)", ids(got))
	}
	post(t, f, Task{Iteration: 0, Tensor: 5, Bytes: 4})
	wantIDs(t, "after the head was posted", startAll(f), pid(0, 5, 0), pid(0, 3, 0))
	// A piece announced later still starts once its task is posted.
	f.Announce(piece(0, 7, 0, 1, 4))
	post(t, f, Task{Iteration: 0, Tensor: 7, Bytes: 4})
	wantIDs(t, "late announce", startAll(f), pid(0, 7, 0))
}

// TestFollowerAdmitPositive: pieces start while credit remains (> 0), so
// the window overshoots by less than one piece and an oversize piece runs.
func TestFollowerAdmitPositive(t *testing.T) {
	f := newFollower(t, Config{CreditBytes: 10})
	post(t, f, Task{Iteration: 0, Tensor: 0, Bytes: 24}, Task{Iteration: 0, Tensor: 1, Bytes: 40})
	for i := range 4 {
		f.Announce(piece(0, 0, i, 4, 6))
	}
	f.Announce(piece(0, 1, 0, 1, 40))
	// Credit 10: 6 leaves 4 > 0, 6 more leaves -2.
	wantIDs(t, "first window", startAll(f), pid(0, 0, 0), pid(0, 0, 1))
	if got := f.InFlightBytes(); got != 12 {
		t.Errorf("InFlightBytes = %d, want 12", got)
	}
	done(t, f, pid(0, 0, 0))
	wantIDs(t, "after one done", startAll(f), pid(0, 0, 2))
	done(t, f, pid(0, 0, 1))
	done(t, f, pid(0, 0, 2))
	// Available 4: the last 6-byte piece and then the 40-byte one start.
	wantIDs(t, "drained", startAll(f), pid(0, 0, 3), pid(0, 1, 0))

	// Credit used up exactly (0 left) admits nothing more.
	f = newFollower(t, Config{CreditBytes: 12})
	post(t, f, Task{Iteration: 0, Tensor: 0, Bytes: 18})
	for i := range 3 {
		f.Announce(piece(0, 0, i, 3, 6))
	}
	wantIDs(t, "exact window", startAll(f), pid(0, 0, 0), pid(0, 0, 1))
}

// TestFollowerAdmitStrict: a piece waits until it fits while others are in
// flight, starts alone if it is bigger than the whole credit, and a smaller
// piece behind it never overtakes it (unlike the leader's strict rule).
func TestFollowerAdmitStrict(t *testing.T) {
	f := newFollower(t, Config{CreditBytes: 10, Admission: AdmitStrict})
	post(t, f,
		Task{Iteration: 0, Tensor: 0, Bytes: 12},
		Task{Iteration: 0, Tensor: 1, Bytes: 2},
		Task{Iteration: 0, Tensor: 2, Bytes: 15},
		Task{Iteration: 0, Tensor: 3, Bytes: 1})
	f.Announce(piece(0, 0, 0, 2, 6))
	f.Announce(piece(0, 0, 1, 2, 6))
	f.Announce(piece(0, 1, 0, 1, 2))
	f.Announce(piece(0, 2, 0, 1, 15))
	f.Announce(piece(0, 3, 0, 1, 1))
	// 6 fits; the next 6 does not (4 left) and the 2 behind it must wait.
	wantIDs(t, "first window", startAll(f), pid(0, 0, 0))
	done(t, f, pid(0, 0, 0))
	// 6 then 2 fit exactly; the 15-byte piece waits for an empty window.
	wantIDs(t, "second window", startAll(f), pid(0, 0, 1), pid(0, 1, 0))
	done(t, f, pid(0, 0, 1))
	if got := startAll(f); len(got) != 0 {
		t.Fatalf("started %v with the oversize head and 2 bytes in flight", ids(got))
	}
	done(t, f, pid(0, 1, 0))
	// Alone, the oversize piece starts; the 1-byte piece must wait for it.
	wantIDs(t, "oversize alone", startAll(f), pid(0, 2, 0))
	done(t, f, pid(0, 2, 0))
	wantIDs(t, "last", startAll(f), pid(0, 3, 0))
}

// TestFollowerNoWindow: credit 0 means every announced, posted piece starts.
func TestFollowerNoWindow(t *testing.T) {
	f := newFollower(t, Config{Admission: AdmitStrict})
	post(t, f, Task{Iteration: 0, Tensor: 0, Bytes: 1 << 40})
	for i := range 3 {
		f.Announce(piece(0, 0, i, 3, 1<<40/3))
	}
	if got := startAll(f); len(got) != 3 {
		t.Fatalf("started %v, want all 3 pieces", ids(got))
	}
}

// TestFollowerTaskDone: Done reports the task finished exactly when the
// last of its Count pieces finishes, in whatever order they finish.
func TestFollowerTaskDone(t *testing.T) {
	f := newFollower(t, Config{})
	post(t, f, Task{Iteration: 1, Tensor: 4, Bytes: 12}, Task{Iteration: 1, Tensor: 5, Bytes: 4})
	for i := range 3 {
		f.Announce(piece(1, 4, i, 3, 4))
	}
	f.Announce(piece(1, 5, 0, 1, 4))
	startAll(f)
	for _, c := range []struct {
		id   PieceID
		want bool
	}{{pid(1, 4, 2), false}, {pid(1, 5, 0), true}, {pid(1, 4, 0), false}, {pid(1, 4, 1), true}} {
		if got := done(t, f, c.id); got != c.want {
			t.Errorf("Done(%+v) taskDone = %v, want %v", c.id, got, c.want)
		}
	}
	if got := f.InFlightBytes(); got != 0 {
		t.Errorf("InFlightBytes = %d after everything finished", got)
	}
}

// TestFollowerTaskDoneBeforeAllStarted: a task whose first piece finishes
// before its last starts is done only after the last.
func TestFollowerTaskDoneBeforeAllStarted(t *testing.T) {
	f := newFollower(t, Config{CreditBytes: 4, Admission: AdmitStrict})
	post(t, f, Task{Iteration: 0, Tensor: 0, Bytes: 8})
	f.Announce(piece(0, 0, 0, 2, 4))
	f.Announce(piece(0, 0, 1, 2, 4))
	wantIDs(t, "window of one piece", startAll(f), pid(0, 0, 0))
	if done(t, f, pid(0, 0, 0)) {
		t.Fatal("taskDone after the first of two pieces")
	}
	wantIDs(t, "second piece", startAll(f), pid(0, 0, 1))
	if !done(t, f, pid(0, 0, 1)) {
		t.Fatal("taskDone = false after the last piece")
	}
}

func TestFollowerErrors(t *testing.T) {
	_, err := NewFollower(Config{CreditBytes: -3})
	wantErr(t, err, "credit", "-3")

	f := newFollower(t, Config{})
	wantErr(t, f.Post(Task{Iteration: 0, Tensor: 1, Bytes: 0}), "tensor 1", "got 0")
	wantErr(t, f.Post(Task{Iteration: 0, Tensor: 1, Bytes: -4}), "tensor 1", "got -4")

	post(t, f, Task{Iteration: 2, Tensor: 1, Bytes: 8})
	wantErr(t, f.Post(Task{Iteration: 2, Tensor: 1, Bytes: 8}), "tensor 1 iteration 2 posted twice")
	wantErr(t, f.Post(Task{Iteration: 1, Tensor: 9, Bytes: 8}), "iteration 1 after iteration 2")

	// Unknown, announced but not started, and already finished pieces.
	f.Announce(piece(2, 1, 0, 2, 4))
	f.Announce(piece(2, 1, 1, 2, 4))
	p, _ := f.Next()
	for _, id := range []PieceID{pid(9, 8, 7), pid(2, 1, 1)} {
		_, err := f.Done(id)
		wantErr(t, err, "not in flight", fmt.Sprintf("piece %d of tensor %d iteration %d", id.Index, id.Tensor, id.Iteration))
	}
	done(t, f, p.PieceID)
	_, err = f.Done(p.PieceID)
	wantErr(t, err, "not in flight")
	// Still posted (one piece left): a duplicate is refused mid-task too.
	wantErr(t, f.Post(Task{Iteration: 2, Tensor: 1, Bytes: 8}), "posted twice")
}

// TestFollowerPostSameTaskAfterItFinished: as for Scheduler
// (TestPostSameTaskAfterItFinished), a task may be posted once, not once at
// a time; a follower must not forget a task once its pieces are done, or a
// worker that posts a gradient twice goes unnoticed on every rank but 0.
func TestFollowerPostSameTaskAfterItFinished(t *testing.T) {
	f := newFollower(t, Config{})
	task := Task{Iteration: 2, Tensor: 6, Bytes: 8}
	post(t, f, task)
	f.Announce(piece(2, 6, 0, 1, 8))
	p, _ := f.Next()
	if !done(t, f, p.PieceID) {
		t.Fatal("taskDone = false for a single-piece task")
	}
	wantErr(t, f.Post(task), "tensor 6 iteration 2 posted twice")
}

// TestFollowerReconfigure: a new credit window applies when the first task
// of its iteration is posted, counting the bytes still in flight.
func TestFollowerReconfigure(t *testing.T) {
	f := newFollower(t, Config{CreditBytes: 4, Admission: AdmitStrict})
	if err := f.Reconfigure(Config{CreditBytes: 12, Admission: AdmitStrict}, 1); err != nil {
		t.Fatal(err)
	}
	post(t, f, Task{Iteration: 0, Tensor: 0, Bytes: 16})
	for i := range 4 {
		f.Announce(piece(0, 0, i, 4, 4))
	}
	wantIDs(t, "old window", startAll(f), pid(0, 0, 0))
	// Posting iteration 1 applies credit 12, of which 4 are in flight.
	post(t, f, Task{Iteration: 1, Tensor: 0, Bytes: 4})
	wantIDs(t, "new window", startAll(f), pid(0, 0, 1), pid(0, 0, 2))

	wantErr(t, f.Reconfigure(Config{}, 1), "iteration 1 comes too late", "iteration 1 already posted")
	wantErr(t, f.Reconfigure(Config{}, 0), "iteration 0 comes too late")
	if err := f.Reconfigure(Config{}, 5); err != nil {
		t.Fatal(err)
	}
	wantErr(t, f.Reconfigure(Config{}, 5), "iteration 5 must come after the pending one from iteration 5")
	wantErr(t, f.Reconfigure(Config{}, 3), "iteration 3 must come after")
	wantErr(t, f.Reconfigure(Config{Order: 7}, 9), "order 7")
}

// ---- property test: a leader and followers behind parameter servers ----

// core is what a worker needs of its scheduling core; Scheduler and
// Follower both provide it.
type core interface {
	Post(Task) error
	Next() (Piece, bool)
	Done(PieceID) (bool, error)
}

// rank is one simulated worker.
type rank struct {
	core     core
	follower *Follower // nil for the leader
	cfg      Config
	pace     int // relative speed of its backward pass
	iter     int // iteration being posted
	posted   int // tasks of iter posted
	left     int // tasks of iter not yet synchronised here
	isPosted map[taskID]bool
	started  []PieceID
}

type answer struct {
	to int
	id PieceID
}

// psJob is a parameter-server job driven in a random interleaving: workers
// post their gradients, the leader's starts reach each follower through an
// in-order channel, pushes and answers arrive in any order, and a server
// answers a piece only once every worker pushed it.
type psJob struct {
	t       *testing.T
	r       *rand.Rand
	tasks   []Task // one iteration, in production order
	iters   int
	ranks   []*rank
	inbox   [][]Piece // announcements on their way to each rank
	pushes  []Piece
	pushed  map[PieceID]int
	answers []answer
}

// newPSJob builds a job of 4 workers: rank 0 leads with a Scheduler and the
// others follow it, each with its own random credit window. With follow
// false every rank schedules on its own instead, which can deadlock.
func newPSJob(t *testing.T, seed uint64, follow bool) *psJob {
	r := rand.New(rand.NewPCG(seed, 7))
	j := &psJob{t: t, r: r, iters: 1 + r.IntN(3), pushed: map[PieceID]int{}}
	layers := 1 + r.IntN(5)
	for l := layers - 1; l >= 0; l-- {
		for range 1 + r.IntN(2) {
			j.tasks = append(j.tasks, Task{Tensor: len(j.tasks), Layer: l, Bytes: 4 * (1 + r.Int64N(10))})
		}
	}
	part := []int64{0, 4, 8, 12}[r.IntN(4)]
	for i := range 4 {
		cfg := Config{PartitionBytes: part, CreditBytes: []int64{0, 4, 8, 20}[r.IntN(4)],
			Order: OrderPriority, Admission: Admission(r.IntN(2))}
		rk := &rank{cfg: cfg, pace: 1 + r.IntN(8), isPosted: map[taskID]bool{}, left: len(j.tasks)}
		var err error
		if i == 0 || !follow {
			rk.core, err = New(cfg)
		} else {
			rk.follower, err = NewFollower(cfg)
			rk.core = rk.follower
		}
		if err != nil {
			t.Fatal(err)
		}
		j.ranks = append(j.ranks, rk)
	}
	j.inbox = make([][]Piece, len(j.ranks))
	return j
}

// run plays random enabled actions until none is left and reports whether
// every rank synchronised every iteration. Each rank posts at its own
// random pace, so some fall far behind the leader's announcements and
// others run ahead of them.
func (j *psJob) run() bool {
	type action struct {
		weight int
		do     func()
	}
	for {
		var acts []action
		total := 0
		add := func(w int, do func()) {
			acts = append(acts, action{w, do})
			total += w
		}
		for i, rk := range j.ranks {
			if rk.iter < j.iters && rk.posted < len(j.tasks) {
				// The next gradient of the backward pass; rk.iter moves
				// on only once the previous iteration is synchronised
				// here.
				add(rk.pace, func() { j.post(i) })
			}
			if len(j.inbox[i]) > 0 {
				add(4, func() { j.announce(i) })
			}
		}
		if len(j.pushes) > 0 {
			add(4, j.push)
		}
		if len(j.answers) > 0 {
			add(4, j.answer)
		}
		if total == 0 {
			break
		}
		pick := j.r.IntN(total)
		for _, a := range acts {
			if pick -= a.weight; pick < 0 {
				a.do()
				break
			}
		}
		if j.t.Failed() {
			return false
		}
	}
	for _, rk := range j.ranks {
		if rk.iter < j.iters {
			return false
		}
	}
	return true
}

func (j *psJob) post(i int) {
	rk := j.ranks[i]
	task := j.tasks[rk.posted]
	task.Iteration = rk.iter
	if err := rk.core.Post(task); err != nil {
		j.t.Fatalf("rank %d: Post(%+v): %v", i, task, err)
	}
	rk.isPosted[taskID{task.Iteration, task.Tensor}] = true
	rk.posted++
	j.drain(i)
}

func (j *psJob) announce(i int) {
	p := j.inbox[i][0]
	j.inbox[i] = j.inbox[i][1:]
	j.ranks[i].follower.Announce(p)
	j.drain(i)
}

// push delivers a random push to its server, which answers every worker
// once all of them pushed the piece.
func (j *psJob) push() {
	k := j.r.IntN(len(j.pushes))
	p := j.pushes[k]
	j.pushes = slices.Delete(j.pushes, k, k+1)
	if j.pushed[p.PieceID]++; j.pushed[p.PieceID] == len(j.ranks) {
		delete(j.pushed, p.PieceID)
		for to := range j.ranks {
			j.answers = append(j.answers, answer{to, p.PieceID})
		}
	}
}

func (j *psJob) answer() {
	k := j.r.IntN(len(j.answers))
	a := j.answers[k]
	j.answers = slices.Delete(j.answers, k, k+1)
	rk := j.ranks[a.to]
	taskDone, err := rk.core.Done(a.id)
	if err != nil {
		j.t.Fatalf("rank %d: Done(%+v): %v", a.to, a.id, err)
	}
	if taskDone {
		if rk.left--; rk.left == 0 {
			rk.iter, rk.posted, rk.left = rk.iter+1, 0, len(j.tasks)
		}
	}
	j.drain(a.to)
}

// drain starts what rank i's core admits, checking the follower's rules on
// each start, and sends the leader's starts to the followers.
func (j *psJob) drain(i int) {
	rk := j.ranks[i]
	for {
		var inflight int64
		if rk.follower != nil {
			inflight = rk.follower.InFlightBytes()
		}
		p, ok := rk.core.Next()
		if !ok {
			return
		}
		if !rk.isPosted[taskID{p.Iteration, p.Tensor}] {
			j.t.Fatalf("rank %d started %+v of a task it never posted", i, p.PieceID)
		}
		if rk.follower != nil {
			j.checkFollowerStart(i, p, inflight)
		}
		rk.started = append(rk.started, p.PieceID)
		j.pushes = append(j.pushes, p)
		if i == 0 && rk.follower == nil && j.ranks[1].follower != nil {
			for f := 1; f < len(j.ranks); f++ {
				j.inbox[f] = append(j.inbox[f], p)
			}
		}
	}
}

func (j *psJob) checkFollowerStart(i int, p Piece, inflight int64) {
	rk := j.ranks[i]
	n := len(rk.started)
	if lead := j.ranks[0].started; n >= len(lead) || lead[n] != p.PieceID {
		j.t.Fatalf("rank %d started %+v as its piece %d; the leader started %v", i, p.PieceID, n, lead)
	}
	c := rk.cfg.CreditBytes
	switch {
	case c == 0:
	case rk.cfg.Admission == AdmitPositive && inflight >= c:
		j.t.Fatalf("rank %d started %+v with %d of %d credit bytes in flight", i, p.PieceID, inflight, c)
	case rk.cfg.Admission == AdmitStrict && inflight > 0 && inflight+p.Bytes > c:
		j.t.Fatalf("rank %d started %d-byte %+v with %d of %d credit bytes in flight", i, p.Bytes, p.PieceID, inflight, c)
	}
}

// state describes where a stuck job stopped.
func (j *psJob) state() string {
	s := fmt.Sprintf("%d iterations of %v; pushes %d, answers %d\n", j.iters, j.tasks, len(j.pushes), len(j.answers))
	for i, rk := range j.ranks {
		s += fmt.Sprintf("rank %d cfg %+v: iteration %d, posted %d, started %v\n", i, rk.cfg, rk.iter, rk.posted, rk.started)
	}
	return s
}

// TestFollowersNeverDeadlock is why Follower exists: whatever the credit
// windows and the interleaving of posts, announcements, pushes and answers,
// a leader and its followers drain every iteration.
func TestFollowersNeverDeadlock(t *testing.T) {
	seeds := uint64(3000)
	if testing.Short() {
		seeds = 300
	}
	for seed := range seeds {
		j := newPSJob(t, seed, true)
		if !j.run() {
			t.Fatalf("seed %d: deadlock\n%s", seed, j.state())
		}
		if s := j.ranks[0].core.(*Scheduler); s.InFlight() != 0 || s.Queued() != 0 {
			t.Fatalf("seed %d: leader left %d in flight, %d queued", seed, s.InFlight(), s.Queued())
		}
		for i, rk := range j.ranks[1:] {
			if b := rk.follower.InFlightBytes(); b != 0 {
				t.Fatalf("seed %d: rank %d left %d bytes in flight", seed, i+1, b)
			}
			if !slices.Equal(rk.started, j.ranks[0].started) {
				t.Fatalf("seed %d: rank %d started %v, leader %v", seed, i+1, rk.started, j.ranks[0].started)
			}
		}
	}
}

// TestIndependentSchedulersCanDeadlock checks that the harness above can
// fail: with every worker ordering its own ready pieces, some interleaving
// leaves two workers each holding credit on a piece the other has not
// pushed.
func TestIndependentSchedulersCanDeadlock(t *testing.T) {
	for seed := range uint64(3000) {
		if !newPSJob(t, seed, false).run() {
			return
		}
	}
	t.Fatal("independent schedulers never deadlocked; the deadlock check would not catch one")
}

// TestFollowLate: a change the follower learns after posting its
// iteration applies from its next one, and after a change still pending.
func TestFollowLate(t *testing.T) {
	f, err := NewFollower(Config{CreditBytes: 8})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{CreditBytes: 16}
	if from, err := f.Follow(cfg, 0); err != nil || from != 0 {
		t.Fatalf("before any post: from %d, %v; want 0", from, err)
	}
	if err := f.Post(Task{Iteration: 3, Tensor: 0, Bytes: 4}); err != nil {
		t.Fatal(err)
	}
	if from, err := f.Follow(cfg, 2); err != nil || from != 4 {
		t.Errorf("from 2 after posting 3: applies from %d, %v; want 4", from, err)
	}
	if from, err := f.Follow(cfg, 4); err != nil || from != 5 {
		t.Errorf("from 4 behind a change pending from 4: applies from %d, %v; want 5", from, err)
	}
	if from, err := f.Follow(cfg, 9); err != nil || from != 9 {
		t.Errorf("from 9: applies from %d, %v; want 9", from, err)
	}
	if _, err := f.Follow(Config{CreditBytes: -1}, 12); err == nil {
		t.Error("an invalid configuration was followed")
	}
}
