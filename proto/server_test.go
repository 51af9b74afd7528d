package proto

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// sumOrder drives a ShardSum through an arrival order and returns the
// order in which it had the pushes added, and the iteration of the order
// at which it said complete (-1: never).
func sumOrder(t *testing.T, workers int, arrivals []int) (added []int, completeAt int) {
	t.Helper()
	s, err := NewShardSum(workers)
	if err != nil {
		t.Fatal(err)
	}
	completeAt = -1
	for i, r := range arrivals {
		from, to, complete, err := s.Push(r)
		if err != nil {
			t.Fatalf("arrivals %v: push of %d: %v", arrivals, r, err)
		}
		for q := from; q < to; q++ {
			added = append(added, q)
		}
		if complete {
			if completeAt >= 0 {
				t.Fatalf("arrivals %v: complete twice", arrivals)
			}
			completeAt = i
		}
	}
	return added, completeAt
}

// TestShardSumRankOrder: whatever the arrival order, pushes are added in
// rank order, each once, and the shard completes with its last push.
func TestShardSumRankOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for workers := 1; workers <= 8; workers++ {
		want := make([]int, workers)
		for i := range want {
			want[i] = i
		}
		for range 50 {
			arrivals := rng.Perm(workers)
			added, at := sumOrder(t, workers, arrivals)
			if !slices.Equal(added, want) || at != workers-1 {
				t.Fatalf("arrivals %v: added %v, complete at %d; want %v, complete at the last push", arrivals, added, at, want)
			}
		}
	}
}

// TestShardSumHolds: a push ahead of a lower rank is held (nothing to
// add), and the missing one releases it.
func TestShardSumHolds(t *testing.T) {
	s, _ := NewShardSum(3)
	for _, c := range []struct {
		rank, from, to int
		complete       bool
	}{{2, 0, 0, false}, {0, 0, 1, false}, {1, 1, 3, true}} {
		from, to, complete, err := s.Push(c.rank)
		if err != nil || from != c.from || to != c.to || complete != c.complete {
			t.Errorf("push of %d: [%d,%d) complete=%v err=%v; want [%d,%d) complete=%v", c.rank, from, to, complete, err, c.from, c.to, c.complete)
		}
	}
}

func TestShardSumBadInput(t *testing.T) {
	if _, err := NewShardSum(0); err == nil || !strings.Contains(err.Error(), "got 0") {
		t.Errorf("0 workers: %v", err)
	}
	s, _ := NewShardSum(2)
	for _, c := range []struct {
		rank int
		want string
	}{{-1, "worker -1"}, {2, "worker 2, outside the 2"}} {
		if _, _, _, err := s.Push(c.rank); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("push of %d: %v, want it to name %q", c.rank, err, c.want)
		}
	}
	if _, _, _, err := s.Push(1); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := s.Push(1); err == nil || !strings.Contains(err.Error(), "worker 1 pushed the same shard twice") {
		t.Errorf("second push: %v", err)
	}
	if s.Count() != 1 || s.Next() != 0 || !s.Pushed(1) || s.Pushed(0) {
		t.Errorf("after refused pushes: count %d next %d, pushed(1)=%v pushed(0)=%v", s.Count(), s.Next(), s.Pushed(1), s.Pushed(0))
	}
}
