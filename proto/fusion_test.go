package proto

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/sched"
)

func unitTensors(units []Unit) [][]int {
	var out [][]int
	for _, u := range units {
		out = append(out, u.Tensors)
	}
	return out
}

// TestFuseGroups: runs of neighbouring small tensors of one kind fuse up
// to the limit; a large tensor, another kind, another posting schedule or
// a layer further than the next one starts a unit of its own.
func TestFuseGroups(t *testing.T) {
	ts := []Tensor{
		{Layer: 0, Bytes: 40}, {Layer: 0, Bytes: 40}, {Layer: 1, Bytes: 20}, // 100 bytes: fuse
		{Layer: 1, Bytes: 8},   // would exceed 100
		{Layer: 2, Bytes: 400}, // large: alone
		{Layer: 2, Bytes: 8},   // after a large one: a new unit
		{Layer: 3, Bytes: 8, Wire: dtype.BF16, ElemBytes: 2}, // another type
		{Layer: 3, Bytes: 8, Wire: dtype.F16, ElemBytes: 2},  // same size, another type
		{Layer: 3, Bytes: 8, Wire: dtype.F16, ElemBytes: 2},
		{Layer: 5, Bytes: 8, Wire: dtype.F16, ElemBytes: 2}, // two layers on
		{Layer: 5, Bytes: 8, Wire: dtype.F16, ElemBytes: 2, Posted: FirstOnly},
		{Layer: 5, Bytes: 8, Wire: dtype.F16, ElemBytes: 2, Compressible: true},
	}
	units, unitOf := fuse(ts, 100)
	want := [][]int{{0, 1, 2}, {3}, {4}, {5}, {6}, {7, 8}, {9}, {10}, {11}}
	if got := unitTensors(units); !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("units %v, want %v", got, want)
	}
	for u, unit := range units {
		var bytes int64
		for i, m := range unit.Tensors {
			if unitOf[m] != u {
				t.Errorf("unitOf[%d] = %d, want %d", m, unitOf[m], u)
			}
			if unit.Offsets[i] != bytes {
				t.Errorf("unit %d: tensor %d at offset %d, want %d", u, m, unit.Offsets[i], bytes)
			}
			bytes += ts[m].Bytes
		}
		if unit.Bytes != bytes || unit.Layer != ts[unit.Tensors[0]].Layer {
			t.Errorf("unit %d: %d bytes in layer %d, want %d in layer %d", u, unit.Bytes, unit.Layer, bytes, ts[unit.Tensors[0]].Layer)
		}
	}
	// Off: one unit per tensor, numbered as the tensors.
	units, _ = fuse(ts, 0)
	for i, u := range units {
		if !slices.Equal(u.Tensors, []int{i}) || u.Tensor != ts[i] {
			t.Fatalf("no fusion: unit %d is %v (%+v), want tensor %d as it is", i, u.Tensors, u.Tensor, i)
		}
	}
}

// TestFusedUnitTravelsWhole: a fused unit starts only when its last tensor
// is posted, travels as one task under its first layer's priority, and its
// sum marks every member synced and opens each member's layer.
func TestFusedUnitTravelsWhole(t *testing.T) {
	ts := []Tensor{{Layer: 0, Bytes: 40}, {Layer: 1, Bytes: 20}, {Layer: 1, Bytes: 400}, {Layer: 2, Bytes: 12}}
	w := newWorker(t, Config{Workers: 1, Arch: PS, Servers: 1, Tensors: ts,
		Sched: sched.Config{Order: sched.OrderPriority, FusionBytes: 100}})
	if got := unitTensors(w.Units(0)); !slices.EqualFunc(got, [][]int{{0, 1}, {2}, {3}}, slices.Equal) {
		t.Fatalf("units %v", got)
	}
	// Backward: layer 2, then 1, then 0.
	must(t, w.Post(3, 0))
	must(t, w.Post(2, 0))
	must(t, w.Post(1, 0))
	r := w.Ready()
	for _, m := range pushes(r) {
		if m.Piece.Tensor == w.layoutAt(0).unitOf[1] {
			t.Fatalf("unit of tensors 0 and 1 started before tensor 0 was posted: %+v", m.Piece)
		}
	}
	gates := answerAll(t, w, r)
	if !slices.Equal(gates, []Gate{{2, 0}}) {
		t.Fatalf("gates %v before the fused unit, want layer 2's only (layer 1 waits for its fused tensor)", gates)
	}
	must(t, w.Post(0, 0))
	r = w.Ready()
	ps := pushes(r)
	if len(ps) != 1 || ps[0].Piece.Tensor != 0 || ps[0].Piece.Bytes != 60 || ps[0].Piece.Layer != 0 {
		t.Fatalf("pushes %+v, want one 60-byte piece of unit 0 in layer 0", ps)
	}
	must(t, w.Answered(ps[0].Piece.PieceID))
	r = w.Ready()
	var synced []int
	for _, s := range r.Synced {
		synced = append(synced, s.Tensor)
	}
	if !slices.Equal(synced, []int{0, 1}) || !slices.Equal(r.Opened, []Gate{{0, 0}, {1, 0}}) {
		t.Fatalf("synced %v, opened %v; want tensors 0 and 1, layers 0 and 1", synced, r.Opened)
	}
	if err := w.Post(0, 1); err != nil {
		t.Fatal(err)
	}
	if err := w.Post(0, 1); err == nil {
		t.Fatal("a fused tensor posted twice in one iteration was accepted")
	}
	if _, err := New(Config{Workers: 1, Arch: PS, Servers: 1, Tensors: ts, Sched: sched.Config{FusionBytes: -1}}); err == nil {
		t.Fatal("a negative fusion size was accepted")
	}
}

// TestFusedFollowers: followers fuse alike, so they accept the leader's
// announcements of fused units whatever order tensors are posted and
// messages delivered in, start them in the leader's order, and every
// iteration completes on every rank.
func TestFusedFollowers(t *testing.T) {
	ts := []Tensor{{Layer: 0, Bytes: 40}, {Layer: 0, Bytes: 44}, {Layer: 1, Bytes: 900}, {Layer: 2, Bytes: 12}, {Layer: 2, Bytes: 16}}
	for seed := range uint64(20) {
		c := newCluster(t, 3, Config{Arch: PS, Servers: 2, Tensors: ts,
			Sched: sched.Config{PartitionBytes: 64, CreditBytes: 128, Order: sched.OrderPriority, FusionBytes: 128}}, seed)
		for it := range 3 {
			c.postIteration(it, len(ts))
		}
		for r, w := range c.ws {
			if got := unitTensors(w.Units(0)); !slices.EqualFunc(got, [][]int{{0, 1}, {2}, {3, 4}}, slices.Equal) {
				t.Fatalf("rank %d: units %v", r, got)
			}
			if !slices.Equal(c.starts[r], c.starts[0]) {
				t.Fatalf("seed %d: worker %d started %v, the leader %v", seed, r, c.starts[r], c.starts[0])
			}
			if w.InFlightBytes() != 0 || len(w.layerLeft) != 0 || len(w.fusedPosted) != 0 {
				t.Fatalf("seed %d: worker %d ends with %d bytes in flight, %d iterations unsynced, %d fused units half posted",
					seed, r, w.InFlightBytes(), len(w.layerLeft), len(w.fusedPosted))
			}
			if !slices.Equal(w.synced, []int{2, 2, 2}) {
				t.Errorf("seed %d: worker %d layers synced up to %v, want iteration 2 everywhere", seed, r, w.synced)
			}
		}
	}
}

// TestFusionMismatchRefused: a follower that fuses otherwise than the
// leader refuses the leader's announcement instead of mixing data.
func TestFusionMismatchRefused(t *testing.T) {
	ts := []Tensor{{Layer: 0, Bytes: 40}, {Layer: 0, Bytes: 20}}
	cfg := Config{Workers: 2, Arch: PS, Servers: 1, Tensors: ts, Sched: sched.Config{Order: sched.OrderPriority}}
	leaderCfg := cfg
	leaderCfg.Sched.FusionBytes = 100
	leader := newWorker(t, leaderCfg)
	cfg.Rank = 1
	follower := newWorker(t, cfg)
	must(t, leader.Post(1, 0))
	must(t, leader.Post(0, 0))
	var announced []Message
	for _, m := range leader.Ready().Messages {
		if m.Kind == Announce {
			announced = append(announced, m)
		}
	}
	if len(announced) != 1 || announced[0].Piece.Bytes != 60 {
		t.Fatalf("leader announced %+v, want one 60-byte fused piece", announced)
	}
	if err := follower.Announced(announced[0].Piece); err == nil {
		t.Fatal("a follower without fusion accepted the leader's fused piece")
	}
}

// TestFusionChangesWithEpochs: a configuration change may change the
// fusion size from an iteration on, and back: every worker groups each
// iteration's tensors as the leader does, whatever the delivery and
// posting orders, and every iteration completes everywhere.
// (TestFollowerHoldsBackUnsettledIterations covers a follower that posts
// before it learns of the change.)
func TestFusionChangesWithEpochs(t *testing.T) {
	ts := []Tensor{{Layer: 0, Bytes: 40}, {Layer: 0, Bytes: 44}, {Layer: 1, Bytes: 900}, {Layer: 2, Bytes: 12}, {Layer: 2, Bytes: 16}}
	base := sched.Config{PartitionBytes: 64, CreditBytes: 128, Order: sched.OrderPriority}
	fused := base
	fused.FusionBytes = 128
	// Units per iteration: unfused in 0-1, fused from 2, unfused again from 4.
	wantUnits := []int{5, 5, 3, 3, 5}
	for seed := range uint64(30) {
		c := newCluster(t, 3, Config{Arch: PS, Servers: 2, Tensors: ts, Sched: base}, seed)
		for it := range len(wantUnits) {
			switch it {
			case 1:
				if _, err := c.ws[0].Reconfigure(fused, 2); err != nil {
					t.Fatal(err)
				}
				c.collect(0)
			case 3:
				if _, err := c.ws[0].Reconfigure(base, 4); err != nil {
					t.Fatal(err)
				}
				c.collect(0)
			}
			c.postIteration(it, len(ts))
		}
		for r, w := range c.ws {
			if !slices.Equal(c.starts[r], c.starts[0]) {
				t.Fatalf("seed %d: worker %d started %v, the leader %v", seed, r, c.starts[r], c.starts[0])
			}
			if w.InFlightBytes() != 0 || len(w.layerLeft) != 0 || len(w.fusedPosted) != 0 || len(w.early) != 0 {
				t.Fatalf("seed %d: worker %d ends with %d bytes in flight, %d iterations unsynced, %d fused units half posted, %d iterations held back",
					seed, r, w.InFlightBytes(), len(w.layerLeft), len(w.fusedPosted), len(w.early))
			}
			if !slices.Equal(w.synced, []int{4, 4, 4}) {
				t.Errorf("seed %d: worker %d layers synced up to %v, want iteration 4 everywhere", seed, r, w.synced)
			}
		}
		units := make([]map[int]bool, len(wantUnits))
		for _, id := range c.starts[0] {
			if units[id.Iteration] == nil {
				units[id.Iteration] = map[int]bool{}
			}
			units[id.Iteration][id.Tensor] = true
		}
		for it, want := range wantUnits {
			if len(units[it]) != want {
				t.Fatalf("seed %d: iteration %d travelled in %d units, want %d", seed, it, len(units[it]), want)
			}
		}
	}
}

// TestFollowerHoldsBackUnsettledIterations: a follower that posts two
// iterations before hearing from the leader, the second under a fusion
// change it has not learned of yet, groups each as the leader does.
func TestFollowerHoldsBackUnsettledIterations(t *testing.T) {
	ts := []Tensor{{Layer: 0, Bytes: 40}, {Layer: 0, Bytes: 20}}
	cfg := Config{Workers: 2, Arch: AllReduce, Tensors: ts, Sched: sched.Config{Order: sched.OrderPriority}}
	leader := newWorker(t, cfg)
	cfg.Rank = 1
	follower := newWorker(t, cfg)
	fused := cfg.Sched
	fused.FusionBytes = 100
	for it := range 2 {
		for tensor := range ts {
			must(t, follower.Post(tensor, it))
		}
	}
	if r := follower.Ready(); !r.Empty() {
		t.Fatalf("a follower with no announcement produced %+v", r)
	}
	if err := follower.Post(1, 1); err == nil || !strings.Contains(err.Error(), "posted twice") {
		t.Fatalf("a held-back tensor posted twice: got %v", err)
	}
	if err := follower.Post(0, 0); err == nil || !strings.Contains(err.Error(), "after iteration 1") {
		t.Fatalf("a post for an older iteration: got %v", err)
	}
	var toFollower []Message
	var leaderRing, followerRing []sched.Piece
	for it := range 2 {
		if it == 1 {
			if _, err := leader.Reconfigure(fused, 1); err != nil {
				t.Fatal(err)
			}
		}
		for tensor := range ts {
			must(t, leader.Post(tensor, it))
		}
		r := leader.Ready()
		for _, m := range r.Messages {
			switch m.Kind {
			case Announce, AnnounceEpoch:
				toFollower = append(toFollower, m)
			case RingStart:
				leaderRing = append(leaderRing, m.Piece)
			}
		}
	}
	for _, m := range toFollower {
		if m.Kind == AnnounceEpoch {
			must(t, follower.EpochAnnounced(m.Epoch))
		} else {
			must(t, follower.Announced(m.Piece))
		}
		for _, m := range follower.Ready().Messages {
			followerRing = append(followerRing, m.Piece)
		}
	}
	if len(leaderRing) != 3 || fmt.Sprint(followerRing) != fmt.Sprint(leaderRing) {
		t.Fatalf("follower started %v, the leader %v (want 2 unfused pieces of iteration 0, then 1 fused)", followerRing, leaderRing)
	}
	if p := leaderRing[2]; p.Iteration != 1 || p.Bytes != 60 || p.Epoch != 1 {
		t.Fatalf("iteration 1's piece %+v, want the fused 60 bytes of epoch 1", p)
	}
}
