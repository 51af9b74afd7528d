package stats

import (
	"math"
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
