package sched

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

const (
	kib = int64(1) << 10
	mib = int64(1) << 20
)

// newSched returns a scheduler for cfg, failing the test if cfg is rejected.
func newSched(t *testing.T, cfg Config) *Scheduler {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	return s
}

// post posts every task, failing the test on the first error.
func post(t *testing.T, s core, tasks ...Task) {
	t.Helper()
	for _, task := range tasks {
		if err := s.Post(task); err != nil {
			t.Fatalf("Post(%+v): %v", task, err)
		}
	}
}

// startAll calls Next until it declines and returns the pieces started.
func startAll(s core) []Piece {
	var out []Piece
	for {
		p, ok := s.Next()
		if !ok {
			return out
		}
		out = append(out, p)
	}
}

// done reports piece id finished, failing the test on error.
func done(t *testing.T, s core, id PieceID) bool {
	t.Helper()
	taskDone, err := s.Done(id)
	if err != nil {
		t.Fatalf("Done(%+v): %v", id, err)
	}
	return taskDone
}

// wantErr fails unless err is non-nil and its message contains every want
// (typically the offending value, so the message is actionable).
func wantErr(t *testing.T, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got nil error, want one mentioning %q", want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
}

// ids and sizes project pieces for compact comparisons.
func ids(ps []Piece) []PieceID {
	out := make([]PieceID, len(ps))
	for i, p := range ps {
		out[i] = p.PieceID
	}
	return out
}

func sizes(ps []Piece) []int64 {
	out := make([]int64, len(ps))
	for i, p := range ps {
		out[i] = p.Bytes
	}
	return out
}

// wantIDs fails unless got names exactly the pieces in want, in order.
func wantIDs(t *testing.T, what string, got []Piece, want ...PieceID) {
	t.Helper()
	if g := ids(got); !slices.Equal(g, want) {
		t.Fatalf("%s: started %v, want %v", what, g, want)
	}
}

func pid(iter, tensor, index int) PieceID {
	return PieceID{Iteration: iter, Tensor: tensor, Index: index}
}

// checkPieces verifies the partitioning contract for the pieces of task
// under partition size part, in index order: ceil(bytes/part) pieces capped
// at the element count, whole elements, sizes within one element of each
// other, contiguous offsets from 0 summing to the tensor size.
func checkPieces(t *testing.T, task Task, part int64, pieces []Piece) {
	t.Helper()
	elem := int64(task.ElemBytes)
	if elem == 0 {
		elem = DefaultElemBytes
	}
	elems := task.Bytes / elem
	want := int64(1)
	if part > 0 && task.Bytes > part {
		// (b-1)/p+1 is ceil(b/p) without overflowing for huge b.
		want = min((task.Bytes-1)/part+1, elems)
	}
	if int64(len(pieces)) != want {
		t.Fatalf("%+v partition %d: %d pieces, want %d", task, part, len(pieces), want)
	}
	var off, lo, hi int64 = 0, math.MaxInt64, 0
	for i, p := range pieces {
		if p.Iteration != task.Iteration || p.Tensor != task.Tensor || p.Index != i || p.Layer != task.Layer {
			t.Fatalf("piece %d is %+v, want iteration %d tensor %d index %d layer %d",
				i, p, task.Iteration, task.Tensor, i, task.Layer)
		}
		if p.Count != len(pieces) {
			t.Errorf("piece %d: Count %d, want %d", i, p.Count, len(pieces))
		}
		if p.Offset != off {
			t.Errorf("piece %d: offset %d, want %d (contiguous)", i, p.Offset, off)
		}
		if p.Bytes <= 0 || p.Bytes%elem != 0 {
			t.Errorf("piece %d: %d bytes is not a positive whole number of %d-byte elements", i, p.Bytes, elem)
		}
		off += p.Bytes
		lo, hi = min(lo, p.Bytes), max(hi, p.Bytes)
	}
	if off != task.Bytes {
		t.Errorf("pieces sum to %d bytes, want %d", off, task.Bytes)
	}
	if hi-lo > elem {
		t.Errorf("piece sizes range %d..%d, differ by more than one %d-byte element", lo, hi, elem)
	}
}

// partitionOf posts task alone under partition size part and returns its
// pieces; with no credit window and FIFO order Next yields them in index
// order.
func partitionOf(t *testing.T, task Task, part int64) []Piece {
	t.Helper()
	s := newSched(t, Config{PartitionBytes: part})
	post(t, s, task)
	return startAll(s)
}

func TestPartition(t *testing.T) {
	tests := []struct {
		name      string
		bytes     int64
		part      int64
		elem      int
		wantSizes []int64 // nil: check the count only
		wantCount int
	}{
		{name: "partition 0 disables splitting", bytes: 64 * mib, part: 0, elem: 4, wantCount: 1},
		{name: "partition larger than tensor", bytes: 1000, part: 4096, elem: 4, wantSizes: []int64{1000}},
		{name: "partition equal to tensor", bytes: 1024, part: 1024, elem: 4, wantSizes: []int64{1024}},
		{name: "one byte over the partition", bytes: 1028, part: 1024, elem: 4, wantSizes: []int64{516, 512}},
		{name: "divisible", bytes: 4 * mib, part: mib, elem: 4, wantSizes: []int64{mib, mib, mib, mib}},
		{name: "non-divisible", bytes: 1000, part: 300, elem: 4, wantSizes: []int64{252, 252, 248, 248}},
		// The near-equal split rounds to whole elements, so a partition that
		// is not a multiple of the element size can yield pieces above it.
		{name: "partition not a multiple of the element", bytes: 24, part: 6, elem: 4, wantSizes: []int64{8, 8, 4, 4}},
		{name: "partition smaller than an element", bytes: 40, part: 3, elem: 4, wantCount: 10},
		{name: "partition of one byte", bytes: 7, part: 1, elem: 1, wantCount: 7},
		{name: "single-element tensor", bytes: 8, part: 1, elem: 8, wantSizes: []int64{8}},
		{name: "default element size", bytes: 12, part: 5, elem: 0, wantSizes: []int64{4, 4, 4}},
		{name: "fp16", bytes: 2 * 999, part: 512, elem: 2, wantSizes: []int64{500, 500, 500, 498}},
		{name: "fp64", bytes: 8 * 1001, part: 1000, elem: 8, wantCount: 9},
		{name: "large tensor", bytes: 1<<30 + 4, part: 4 * mib, elem: 4, wantCount: 257},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			task := Task{Iteration: 3, Tensor: 7, Layer: 2, Bytes: tc.bytes, ElemBytes: tc.elem}
			pieces := partitionOf(t, task, tc.part)
			checkPieces(t, task, tc.part, pieces)
			if tc.wantSizes != nil && !reflect.DeepEqual(sizes(pieces), tc.wantSizes) {
				// Peers must agree on the layout, so the exact split (larger
				// pieces first) is part of the contract, not just its shape.
				t.Errorf("sizes %v, want %v", sizes(pieces), tc.wantSizes)
			}
			if tc.wantCount != 0 && len(pieces) != tc.wantCount {
				t.Errorf("%d pieces, want %d", len(pieces), tc.wantCount)
			}
		})
	}
}

// TestPartitionRandom checks the partitioning contract on many random
// tensor, element and partition sizes, skewed towards the edges.
func TestPartitionRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		elem := []int{0, 1, 2, 4, 8}[r.IntN(5)]
		e := int64(max(elem, 0))
		if e == 0 {
			e = DefaultElemBytes
		}
		bytes := e * (1 + r.Int64N(1<<r.IntN(13)))
		var part int64
		switch r.IntN(4) {
		case 0: // no partitioning
		case 1: // around an element
			part = 1 + r.Int64N(2*e)
		default:
			part = 1 + r.Int64N(2*bytes)
		}
		task := Task{Iteration: r.IntN(10), Tensor: r.IntN(100), Layer: r.IntN(10), Bytes: bytes, ElemBytes: elem}
		checkPieces(t, task, part, partitionOf(t, task, part))
		if t.Failed() {
			t.Fatalf("failing case: %+v partition %d", task, part)
		}
	}
}

// TestPartitionHugeTensor guards the piece count computation against
// int64 overflow: ceil(bytes/partition) must not be computed as
// (bytes+partition-1)/partition when that sum exceeds MaxInt64.
func TestPartitionHugeTensor(t *testing.T) {
	task := Task{Bytes: math.MaxInt64 - 3, ElemBytes: 4} // 2^61-1 elements
	pieces := partitionOf(t, task, 1<<62)
	checkPieces(t, task, 1<<62, pieces)
}

func TestOrderFIFO(t *testing.T) {
	// FIFO ignores layers: pieces start in the order their tasks were posted,
	// here the backward pass's last-layer-first order.
	s := newSched(t, Config{PartitionBytes: mib, Order: OrderFIFO})
	post(t, s,
		Task{Iteration: 0, Tensor: 2, Layer: 2, Bytes: 2 * mib},
		Task{Iteration: 0, Tensor: 1, Layer: 1, Bytes: mib},
		Task{Iteration: 0, Tensor: 0, Layer: 0, Bytes: 2 * mib},
		Task{Iteration: 1, Tensor: 2, Layer: 2, Bytes: mib},
	)
	wantIDs(t, "fifo", startAll(s),
		pid(0, 2, 0), pid(0, 2, 1), pid(0, 1, 0), pid(0, 0, 0), pid(0, 0, 1), pid(1, 2, 0))
}

func TestOrderPriority(t *testing.T) {
	// Tensor ids deliberately do not follow layers, so the layer must be
	// compared before the tensor.
	s := newSched(t, Config{PartitionBytes: mib, Order: OrderPriority})
	post(t, s,
		Task{Iteration: 0, Tensor: 1, Layer: 2, Bytes: 2 * mib},
		// Tensors 5 and 3 share layer 1, posted in reverse tensor order:
		// the tensor breaks the tie.
		Task{Iteration: 0, Tensor: 5, Layer: 1, Bytes: mib},
		Task{Iteration: 0, Tensor: 3, Layer: 1, Bytes: 2 * mib},
		Task{Iteration: 0, Tensor: 9, Layer: 0, Bytes: 3 * mib},
		// A later iteration's layer 0 waits for all of iteration 0.
		Task{Iteration: 1, Tensor: 9, Layer: 0, Bytes: mib},
	)
	wantIDs(t, "priority", startAll(s),
		pid(0, 9, 0), pid(0, 9, 1), pid(0, 9, 2),
		pid(0, 3, 0), pid(0, 3, 1), pid(0, 5, 0),
		pid(0, 1, 0), pid(0, 1, 1),
		pid(1, 9, 0))
}

// TestOrderPriorityPreempts checks that a more urgent task posted while
// others wait for credit overtakes them.
func TestOrderPriorityPreempts(t *testing.T) {
	s := newSched(t, Config{PartitionBytes: mib, CreditBytes: mib, Order: OrderPriority})
	post(t, s, Task{Iteration: 0, Tensor: 5, Layer: 5, Bytes: 3 * mib})
	wantIDs(t, "first", startAll(s), pid(0, 5, 0))
	post(t, s, Task{Iteration: 0, Tensor: 0, Layer: 0, Bytes: mib})
	done(t, s, pid(0, 5, 0))
	wantIDs(t, "after layer 0 was posted", startAll(s), pid(0, 0, 0))
	done(t, s, pid(0, 0, 0))
	wantIDs(t, "then", startAll(s), pid(0, 5, 1))
}

func TestAdmitPositiveCredit(t *testing.T) {
	// 1 MB of credit and 0.5 MB pieces: exactly two in flight at a time.
	s := newSched(t, Config{PartitionBytes: 512 * kib, CreditBytes: mib, Admission: AdmitPositive})
	post(t, s, Task{Bytes: 2 * mib})
	wantIDs(t, "initially", startAll(s), pid(0, 0, 0), pid(0, 0, 1))
	if got := s.InFlightBytes(); got != mib {
		t.Fatalf("InFlightBytes = %d, want %d", got, mib)
	}
	if s.InFlight() != 2 || s.Queued() != 2 {
		t.Fatalf("InFlight, Queued = %d, %d, want 2, 2", s.InFlight(), s.Queued())
	}
	if done(t, s, pid(0, 0, 1)) {
		t.Fatal("taskDone after the first of four pieces")
	}
	wantIDs(t, "after one Done", startAll(s), pid(0, 0, 2))
}

// TestAdmitPositiveOvershoot shows the "credit > 0" rule: a piece starts
// while any credit is left, so in-flight bytes may exceed the credit by
// less than one piece.
func TestAdmitPositiveOvershoot(t *testing.T) {
	s := newSched(t, Config{PartitionBytes: 768 * kib, CreditBytes: mib, Admission: AdmitPositive})
	post(t, s, Task{Bytes: 3 * 768 * kib})
	wantIDs(t, "initially", startAll(s), pid(0, 0, 0), pid(0, 0, 1))
	if got := s.InFlightBytes(); got != 1536*kib {
		t.Fatalf("InFlightBytes = %d, want %d", got, 1536*kib)
	}
	// Back to 768 KB in flight: 256 KB of credit left is enough to start.
	done(t, s, pid(0, 0, 0))
	wantIDs(t, "after one Done", startAll(s), pid(0, 0, 2))
}

func TestAdmitPositiveOversizePiece(t *testing.T) {
	// A piece larger than the whole credit starts (credit is > 0), and then
	// blocks the window until it finishes.
	s := newSched(t, Config{CreditBytes: mib, Admission: AdmitPositive})
	post(t, s, Task{Tensor: 0, Bytes: 4 * mib}, Task{Tensor: 1, Bytes: 4})
	wantIDs(t, "initially", startAll(s), pid(0, 0, 0))
	if !done(t, s, pid(0, 0, 0)) {
		t.Fatal("taskDone = false for a single-piece task")
	}
	wantIDs(t, "after Done", startAll(s), pid(0, 1, 0))
}

func TestNoWindow(t *testing.T) {
	// Credit 0 is no window under either rule: everything starts at once,
	// including pieces far larger than any sensible credit.
	for _, adm := range []Admission{AdmitPositive, AdmitStrict} {
		t.Run(adm.String(), func(t *testing.T) {
			s := newSched(t, Config{PartitionBytes: mib, Admission: adm})
			post(t, s, Task{Tensor: 0, Bytes: 4 * mib}, Task{Tensor: 1, Bytes: 8})
			if got := startAll(s); len(got) != 5 {
				t.Fatalf("started %v, want all 5 pieces", ids(got))
			}
			if got, want := s.InFlightBytes(), 4*mib+8; got != want {
				t.Fatalf("InFlightBytes = %d, want %d", got, want)
			}
			// Unpartitioned, a 1 TB tensor is one piece and starts at once.
			s = newSched(t, Config{Admission: adm})
			post(t, s, Task{Tensor: 0, Bytes: 1 << 40}, Task{Tensor: 1, Bytes: 1 << 40})
			if got := startAll(s); len(got) != 2 {
				t.Fatalf("started %v, want both 1 TB tensors", ids(got))
			}
		})
	}
}

func TestAdmitStrictSkipsLargeHead(t *testing.T) {
	s := newSched(t, Config{CreditBytes: mib, Order: OrderPriority, Admission: AdmitStrict})
	post(t, s, Task{Tensor: 0, Layer: 0, Bytes: 512 * kib})
	wantIDs(t, "first", startAll(s), pid(0, 0, 0))
	// 512 KB of credit left: the 768 KB layer-1 head does not fit, the
	// 256 KB layer-2 piece behind it does, and then nothing else fits.
	post(t, s,
		Task{Tensor: 1, Layer: 1, Bytes: 768 * kib},
		Task{Tensor: 2, Layer: 2, Bytes: 256 * kib},
		Task{Tensor: 3, Layer: 3, Bytes: 512 * kib},
	)
	wantIDs(t, "skipping the head", startAll(s), pid(0, 2, 0))
	if got := s.InFlightBytes(); got != 768*kib {
		t.Fatalf("InFlightBytes = %d, want %d", got, 768*kib)
	}
	// The skipped head keeps its place: it goes first once it fits, before
	// layer 3 which would have fitted earlier.
	done(t, s, pid(0, 0, 0))
	wantIDs(t, "after Done", startAll(s), pid(0, 1, 0))
	done(t, s, pid(0, 2, 0))
	done(t, s, pid(0, 1, 0))
	wantIDs(t, "last", startAll(s), pid(0, 3, 0))
}

func TestAdmitStrictOversizeHead(t *testing.T) {
	s := newSched(t, Config{CreditBytes: mib, Order: OrderFIFO, Admission: AdmitStrict})
	post(t, s, Task{Tensor: 0, Bytes: 256 * kib})
	wantIDs(t, "small", startAll(s), pid(0, 0, 0))
	// A 3 MB head never fits; while something is in flight it waits, and
	// smaller pieces behind it go instead.
	post(t, s, Task{Tensor: 1, Bytes: 3 * mib}, Task{Tensor: 2, Bytes: 256 * kib})
	wantIDs(t, "oversize head with a piece in flight", startAll(s), pid(0, 2, 0))
	done(t, s, pid(0, 0, 0))
	wantIDs(t, "oversize head with a piece still in flight", startAll(s))
	// Nothing in flight: the head starts alone rather than starve.
	done(t, s, pid(0, 2, 0))
	post(t, s, Task{Tensor: 3, Bytes: 4})
	wantIDs(t, "nothing in flight", startAll(s), pid(0, 1, 0))
	if got := s.InFlightBytes(); got != 3*mib {
		t.Fatalf("InFlightBytes = %d, want %d", got, 3*mib)
	}
	done(t, s, pid(0, 1, 0))
	wantIDs(t, "after the oversize piece", startAll(s), pid(0, 3, 0))
}

// TestAdmitStrictNeverExceedsCredit feeds mixed sizes through a strict
// window and checks the bound after every start.
func TestAdmitStrictNeverExceedsCredit(t *testing.T) {
	const credit = 1000
	s := newSched(t, Config{CreditBytes: credit, PartitionBytes: 400, Admission: AdmitStrict})
	for i, b := range []int64{1200, 40, 800, 2000, 4, 996, 600, 12} {
		post(t, s, Task{Tensor: i, Bytes: b})
	}
	want := s.Queued() // 18 pieces
	var started, inflight []Piece
	for s.Queued() > 0 || s.InFlight() > 0 {
		for _, p := range startAll(s) {
			started = append(started, p)
			inflight = append(inflight, p)
			if s.InFlightBytes() > credit && s.InFlight() > 1 {
				t.Fatalf("after starting %+v: %d bytes in flight in %d pieces, credit %d",
					p, s.InFlightBytes(), s.InFlight(), credit)
			}
		}
		if len(inflight) == 0 {
			t.Fatalf("%d pieces cored, none in flight and none started", s.Queued())
		}
		// Finish the oldest in-flight piece.
		done(t, s, inflight[0].PieceID)
		inflight = inflight[1:]
	}
	if len(started) != want || want != 18 {
		t.Fatalf("started %d of %d pieces, want 18", len(started), want)
	}
	// The window did bind: some piece was skipped for a smaller one.
	if slices.IsSortedFunc(started, func(a, b Piece) int { return int(a.seq - b.seq) }) {
		t.Fatalf("pieces started in FIFO order %v: the strict window never skipped", ids(started))
	}
}

func TestReconfigurePartitionAndEpoch(t *testing.T) {
	old := Config{PartitionBytes: mib, Order: OrderFIFO}
	s := newSched(t, old)
	next := Config{PartitionBytes: 256 * kib, Order: OrderFIFO}
	if err := s.Reconfigure(next, 5); err != nil {
		t.Fatal(err)
	}
	post(t, s, Task{Iteration: 4, Tensor: 0, Bytes: 2 * mib}, Task{Iteration: 4, Tensor: 1, Bytes: mib})
	if cfg, epoch := s.Config(); cfg != old || epoch != 0 {
		t.Fatalf("Config() during iteration 4 = %+v, %d, want %+v, 0", cfg, epoch, old)
	}
	post(t, s, Task{Iteration: 5, Tensor: 0, Bytes: 2 * mib})
	if cfg, epoch := s.Config(); cfg != next || epoch != 1 {
		t.Fatalf("Config() during iteration 5 = %+v, %d, want %+v, 1", cfg, epoch, next)
	}
	count := map[int]int{}
	for _, p := range startAll(s) {
		wantCount, wantEpoch := 2, 0
		if p.Iteration == 5 {
			wantCount, wantEpoch = 8, 1
		} else if p.Tensor == 1 {
			wantCount = 1
		}
		if p.Count != wantCount || p.Epoch != wantEpoch {
			t.Errorf("%+v: Count %d Epoch %d, want %d, %d", p.PieceID, p.Count, p.Epoch, wantCount, wantEpoch)
		}
		count[p.Iteration]++
	}
	if count[4] != 3 || count[5] != 8 {
		t.Fatalf("pieces per iteration %v, want 3 of iteration 4 and 8 of 5", count)
	}
}

// TestReconfigureSkippedIterations checks that pending changes all apply,
// in order, when the first task posted is past several of them.
func TestReconfigureSkippedIterations(t *testing.T) {
	s := newSched(t, Config{})
	a := Config{PartitionBytes: 100}
	b := Config{PartitionBytes: 200, Order: OrderPriority}
	if err := s.Reconfigure(a, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.Reconfigure(b, 3); err != nil {
		t.Fatal(err)
	}
	post(t, s, Task{Iteration: 1, Bytes: 400})
	if _, epoch := s.Config(); epoch != 0 {
		t.Fatalf("epoch %d at iteration 1, want 0", epoch)
	}
	post(t, s, Task{Iteration: 7, Bytes: 400})
	if cfg, epoch := s.Config(); cfg != b || epoch != 2 {
		t.Fatalf("Config() = %+v, %d, want %+v, 2", cfg, epoch, b)
	}
	got := startAll(s)
	if len(got) != 3 || got[2].Count != 2 || got[2].Epoch != 2 {
		t.Fatalf("started %+v, want iteration 1 whole then iteration 7 in 2 pieces of epoch 2", got)
	}
}

// TestReconfigureShrinkCredit shrinks the window while pieces are in
// flight: the bytes already in flight count against the new credit, so
// nothing starts until they drop below it.
func TestReconfigureShrinkCredit(t *testing.T) {
	s := newSched(t, Config{PartitionBytes: mib, CreditBytes: 4 * mib, Admission: AdmitPositive})
	post(t, s, Task{Iteration: 0, Bytes: 6 * mib})
	wantIDs(t, "iteration 0", startAll(s), pid(0, 0, 0), pid(0, 0, 1), pid(0, 0, 2), pid(0, 0, 3))
	if err := s.Reconfigure(Config{PartitionBytes: mib, CreditBytes: 1536 * kib}, 1); err != nil {
		t.Fatal(err)
	}
	post(t, s, Task{Iteration: 1, Bytes: 2 * mib})
	wantIDs(t, "4 MB in flight", startAll(s))
	done(t, s, pid(0, 0, 0))
	wantIDs(t, "3 MB in flight", startAll(s))
	done(t, s, pid(0, 0, 1))
	wantIDs(t, "2 MB in flight", startAll(s))
	done(t, s, pid(0, 0, 2))
	// 1 MB in flight < 1.5 MB: one piece starts, then 2 MB >= 1.5 MB.
	wantIDs(t, "1 MB in flight", startAll(s), pid(0, 0, 4))
}

// TestReconfigureGrowCredit widens a strict window: pieces that did not
// fit the old credit start as soon as the change applies.
func TestReconfigureGrowCredit(t *testing.T) {
	s := newSched(t, Config{PartitionBytes: mib, CreditBytes: 2 * mib, Admission: AdmitStrict})
	post(t, s, Task{Iteration: 0, Bytes: 4 * mib})
	wantIDs(t, "iteration 0", startAll(s), pid(0, 0, 0), pid(0, 0, 1))
	if err := s.Reconfigure(Config{PartitionBytes: mib, CreditBytes: 3 * mib, Admission: AdmitStrict}, 1); err != nil {
		t.Fatal(err)
	}
	wantIDs(t, "before iteration 1", startAll(s))
	post(t, s, Task{Iteration: 1, Bytes: mib})
	wantIDs(t, "after iteration 1", startAll(s), pid(0, 0, 2))
}

// TestReconfigureOrder switches FIFO to priority: pieces already queued are
// reordered when the change applies.
func TestReconfigureOrder(t *testing.T) {
	s := newSched(t, Config{CreditBytes: 1, Order: OrderFIFO})
	post(t, s,
		Task{Iteration: 0, Tensor: 3, Layer: 3, Bytes: 4},
		Task{Iteration: 0, Tensor: 2, Layer: 2, Bytes: 4},
		Task{Iteration: 0, Tensor: 1, Layer: 1, Bytes: 4},
	)
	wantIDs(t, "fifo", startAll(s), pid(0, 3, 0))
	if err := s.Reconfigure(Config{CreditBytes: 1, Order: OrderPriority}, 1); err != nil {
		t.Fatal(err)
	}
	post(t, s, Task{Iteration: 1, Tensor: 0, Layer: 0, Bytes: 4})
	var got []Piece
	for prev := pid(0, 3, 0); ; {
		done(t, s, prev)
		next := startAll(s)
		if len(next) == 0 {
			break
		}
		got = append(got, next...)
		prev = next[len(next)-1].PieceID
	}
	wantIDs(t, "priority", got, pid(0, 1, 0), pid(0, 2, 0), pid(1, 0, 0))
}

func TestReconfigureErrors(t *testing.T) {
	s := newSched(t, Config{})
	post(t, s, Task{Iteration: 7, Bytes: 4})
	for _, from := range []int{7, 3} {
		wantErr(t, s.Reconfigure(Config{}, from), "iteration 7 already posted")
	}
	if err := s.Reconfigure(Config{PartitionBytes: 8}, 10); err != nil {
		t.Fatal(err)
	}
	wantErr(t, s.Reconfigure(Config{}, 10), "from iteration 10", "pending one from iteration 10")
	wantErr(t, s.Reconfigure(Config{}, 9), "from iteration 9", "pending one from iteration 10")

	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{PartitionBytes: -12345}, "-12345"},
		{Config{CreditBytes: -678}, "-678"},
		{Config{Order: 42}, "order 42"},
		{Config{Admission: 9}, "admission rule 9"},
	} {
		wantErr(t, s.Reconfigure(tc.cfg, 20), tc.want)
	}
	// None of the rejected changes took effect: iteration 10 gets the one
	// accepted change only.
	post(t, s, Task{Iteration: 10, Bytes: 16})
	if cfg, epoch := s.Config(); cfg != (Config{PartitionBytes: 8}) || epoch != 1 {
		t.Fatalf("Config() = %+v, %d, want partition 8 at epoch 1", cfg, epoch)
	}
	if err := s.Reconfigure(Config{}, 11); err != nil {
		t.Fatalf("valid change after rejected ones: %v", err)
	}
}

func TestNewInvalidConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{PartitionBytes: -1}, "partition size must be >= 0 bytes (0 = no partitioning), got -1"},
		{Config{CreditBytes: -4096}, "credit size must be >= 0 bytes (0 = no window), got -4096"},
		{Config{Order: -1}, "unknown order -1"},
		{Config{Order: 2}, "unknown order 2"},
		{Config{Admission: 3}, "unknown admission rule 3"},
	} {
		s, err := New(tc.cfg)
		wantErr(t, err, tc.want)
		if s != nil {
			t.Errorf("New(%+v) returned a scheduler with its error", tc.cfg)
		}
	}
}

func TestPostErrors(t *testing.T) {
	tests := []struct {
		name string
		task Task
		want []string
	}{
		{"zero bytes", Task{Iteration: 5, Tensor: 3, Bytes: 0}, []string{"tensor 3", "iteration 5", "got 0"}},
		{"negative bytes", Task{Iteration: 5, Tensor: 3, Bytes: -64}, []string{"got -64"}},
		{"not whole elements", Task{Iteration: 5, Tensor: 3, Bytes: 10}, []string{"size 10 bytes", "4-byte elements"}},
		{"not whole fp64 elements", Task{Iteration: 5, Tensor: 3, Bytes: 12, ElemBytes: 8}, []string{"size 12", "8-byte"}},
		{"negative element size", Task{Iteration: 5, Tensor: 3, Bytes: 16, ElemBytes: -4}, []string{"-4-byte"}},
		{"iteration going backwards", Task{Iteration: 4, Tensor: 9, Bytes: 4}, []string{"tensor 9", "iteration 4 after iteration 5"}},
		{"same task twice", Task{Iteration: 5, Tensor: 1, Bytes: 8}, []string{"tensor 1 iteration 5 posted twice"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSched(t, Config{PartitionBytes: 4})
			post(t, s, Task{Iteration: 5, Tensor: 1, Bytes: 8})
			wantErr(t, s.Post(tc.task), tc.want...)
			// A rejected task leaves no trace.
			if s.Queued() != 2 || s.InFlight() != 0 {
				t.Fatalf("after the rejected Post: Queued %d, InFlight %d, want 2, 0", s.Queued(), s.InFlight())
			}
		})
	}
}

// TestPostSameTaskAfterItFinished: a task may be posted once, not once at
// a time; the duplicate check must not forget a task once its pieces are
// done.
func TestPostSameTaskAfterItFinished(t *testing.T) {
	s := newSched(t, Config{})
	task := Task{Iteration: 2, Tensor: 6, Bytes: 8}
	post(t, s, task)
	p, _ := s.Next()
	if !done(t, s, p.PieceID) {
		t.Fatal("taskDone = false for a single-piece task")
	}
	wantErr(t, s.Post(task), "tensor 6 iteration 2 posted twice")
}

func TestDoneErrors(t *testing.T) {
	s := newSched(t, Config{PartitionBytes: 4})
	post(t, s, Task{Iteration: 3, Tensor: 2, Bytes: 8})
	p, _ := s.Next()
	// Unknown piece, and a queued piece that was never started.
	for _, id := range []PieceID{pid(9, 8, 7), pid(3, 2, 1)} {
		_, err := s.Done(id)
		wantErr(t, err, "piece", "not in flight")
		if err != nil && !strings.Contains(err.Error(), fmt.Sprintf("tensor %d iteration %d", id.Tensor, id.Iteration)) {
			t.Errorf("error %q does not name %+v", err, id)
		}
	}
	if done(t, s, p.PieceID) {
		t.Fatal("taskDone after the first of two pieces")
	}
	_, err := s.Done(p.PieceID)
	wantErr(t, err, "piece 0 of tensor 2 iteration 3", "not in flight")
	// The failed Done changed nothing: the task finishes on its last piece.
	if s.InFlightBytes() != 0 || s.Queued() != 1 {
		t.Fatalf("InFlightBytes %d, Queued %d, want 0, 1", s.InFlightBytes(), s.Queued())
	}
	q, _ := s.Next()
	if !done(t, s, q.PieceID) {
		t.Fatal("taskDone = false on the last piece")
	}
}

func TestStrings(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{OrderFIFO.String(), "fifo"},
		{OrderPriority.String(), "priority"},
		{Order(5).String(), "Order(5)"},
		{AdmitPositive.String(), "positive"},
		{AdmitStrict.String(), "strict"},
		{Admission(-2).String(), "Admission(-2)"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}
