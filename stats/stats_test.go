package stats

import (
	"math"
	"slices"
	"testing"
)

func TestSteadyState(t *testing.T) {
	cases := []struct {
		in   []float64
		want float64
	}{
		{[]float64{5}, 5},
		{[]float64{9, 1}, 1},                           // the first is warm-up
		{[]float64{100, 2, 2, 2, 2}, 2},                // one fifth dropped
		{[]float64{50, 50, 1, 1, 1, 1, 1, 1, 1, 1}, 1}, // two of ten dropped
	}
	for _, c := range cases {
		if got := SteadyState(c.in); got != c.want {
			t.Errorf("SteadyState(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	if !math.IsNaN(SteadyState(nil)) {
		t.Error("SteadyState(nil) should be NaN")
	}
}

func TestIntervals(t *testing.T) {
	got := Intervals([]float64{3, 12, 21, 31})
	want := []float64{9, 9, 10}
	if len(got) != len(want) {
		t.Fatalf("Intervals = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("Intervals = %v, want %v", got, want)
		}
	}
	if len(Intervals([]float64{1})) != 0 {
		t.Error("one forward end gives no interval")
	}
}

func TestJobIterationTimes(t *testing.T) {
	got := JobIterationTimes([][]float64{{1, 5, 2}, {3, 4}, {}})
	if want := []float64{3, 5, 2}; !slices.Equal(got, want) {
		t.Errorf("JobIterationTimes = %v, want %v (the slowest worker's, per iteration)", got, want)
	}
	if got := JobIterationTimes(nil); len(got) != 0 {
		t.Errorf("no workers: %v", got)
	}
}

// TestCollectorByHand: backward 0 runs [0, 1] and posts a 100-byte piece at
// 1 that starts at 1.5 and is done at 4; forward 1 computes [3, 5] and ends
// iteration 0 at 5. The span is [0, 5], communication [1.5, 4] (2.5 s), of
// which [3, 4] overlaps compute: overlap 0.4, 100 B x 2.5 s / 5 s = 50 B in
// flight, queueing 0.5 s, goodput 100 B x 0.5 (a ring share) / 5 s.
func TestCollectorByHand(t *testing.T) {
	c := NewCollector(0.5)
	c.Compute(false, 0, 0, 1)
	c.PieceStarted(0, 100, 1, 1.5, 100)
	c.PieceDone(4, 0)
	c.Compute(true, 1, 3, 5) // reported at its end, after the piece finished
	got := c.IterationEnded(0, 5, 5)
	want := Iteration{Iteration: 0, IterationS: 5, ForwardS: 2, BackwardS: 1, SentBytes: 50, GoodputBps: 10,
		QueueDelayS: 0.5, Overlap: 0.4, InFlightBytes: 50, CommS: 2.5, Pieces: 1}
	if got != want {
		t.Errorf("measured %+v\nwant     %+v", got, want)
	}
}
