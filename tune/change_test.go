package tune

import (
	"strings"
	"testing"
)

// changeStats are steady statistics at bandwidth bw, compute c and
// iteration time t.
func changeStats(k int, bw, c, t float64) Stats {
	return Stats{Iteration: k, BandwidthBps: bw, ForwardS: c / 3, BackwardS: 2 * c / 3, IterationTimeS: t}
}

func TestChangeDetectorBandwidthDrop(t *testing.T) {
	d, err := NewChangeDetector(ChangeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// ±5% noise on every channel: no change.
	noise := []float64{1, 1.05, 0.96, 1.03, 0.95, 1.04, 1}
	for k := range 40 {
		f := noise[k%len(noise)]
		if ch, what := d.Observe(changeStats(k, 1e9*f, 0.1*f, 0.2*f)); ch {
			t.Fatalf("false change at iteration %d (%s)", k, what)
		}
	}
	// The bandwidth drops to a fifth at 40: declared at 41 (two samples).
	for k := 40; k < 45; k++ {
		ch, what := d.Observe(changeStats(k, 0.2e9, 0.1, 0.5))
		if ch != (k == 41) {
			t.Fatalf("iteration %d: change %v (%s), want a change at 41 only", k, ch, what)
		}
		if ch && what != "bandwidth" {
			t.Errorf("channel %q, want bandwidth", what)
		}
	}
	// A single outlier is not a change.
	d.Reset()
	for k := range 10 {
		c := 0.1
		if k == 6 {
			c = 0.3
		}
		if ch, what := d.Observe(changeStats(k, 1e9, c, 0.2)); ch {
			t.Fatalf("outlier at %d declared a change (%s)", k, what)
		}
	}
}

func TestChangeDetectorIterationTime(t *testing.T) {
	d, _ := NewChangeDetector(ChangeOptions{})
	for k := range 5 {
		d.Observe(changeStats(k, 1e9, 0.1, 0.2))
	}
	// The configuration changes and the time with it: ConfigChanged
	// restarts the channel, so no change is declared.
	for k := 5; k < 15; k++ {
		if k == 5 {
			d.ConfigChanged()
		}
		if ch, what := d.Observe(changeStats(k, 1e9, 0.1, 0.4)); ch {
			t.Fatalf("iteration %d: change (%s) after a configuration change", k, what)
		}
	}
	// Same configuration, time up by half (a straggler): declared.
	var got string
	for k := 15; k < 20 && got == ""; k++ {
		if ch, what := d.Observe(changeStats(k, 1e9, 0.1, 0.6)); ch {
			got = what
		}
	}
	if got != "iteration time" {
		t.Errorf("changed channel %q, want iteration time", got)
	}
	// Unmeasured (zero) bandwidth is ignored.
	d.Reset()
	for k := range 10 {
		bw := 0.0
		if k < 3 {
			bw = 1e9
		}
		if ch, what := d.Observe(changeStats(k, bw, 0.1, 0.2)); ch {
			t.Fatalf("iteration %d: change (%s) on a missing bandwidth", k, what)
		}
	}
}

func TestChangeDetectorErrors(t *testing.T) {
	for _, c := range []struct {
		o    ChangeOptions
		want string
	}{
		{ChangeOptions{Window: -1}, "-1"},
		{ChangeOptions{Confirm: -2}, "-2"},
		{ChangeOptions{Threshold: -0.5}, "-0.5"},
		{ChangeOptions{TimeThreshold: -3}, "-3"},
	} {
		if _, err := NewChangeDetector(c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one naming %s", c.o, err, c.want)
		}
	}
}
