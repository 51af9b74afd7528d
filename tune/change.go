package tune

import (
	"fmt"
	"math"
)

// ChangeOptions configure a ChangeDetector. Zero fields take the defaults
// of DefaultChangeOptions.
type ChangeOptions struct {
	// Window is how many samples after a reset form a channel's baseline
	// (their mean, in log).
	Window int
	// Confirm is how many consecutive samples must differ from the
	// baseline by more than the threshold to declare a change.
	Confirm int
	// Threshold is the relative change of the bandwidth and of the compute
	// time (forward + backward) that counts: 0.15 = 15% up or down.
	Threshold float64
	// TimeThreshold is the relative change of the iteration time that
	// counts; the iteration time is watched only while the configuration
	// stays the same (the tuner calls ConfigChanged).
	TimeThreshold float64
}

// DefaultChangeOptions: a 3-sample baseline, 2 consecutive samples beyond
// 15% (bandwidth, compute) or 20% (iteration time).
var DefaultChangeOptions = ChangeOptions{Window: 3, Confirm: 2, Threshold: 0.15, TimeThreshold: 0.20}

func (o ChangeOptions) withDefaults() ChangeOptions {
	d := DefaultChangeOptions
	if o.Window > 0 {
		d.Window = o.Window
	}
	if o.Confirm > 0 {
		d.Confirm = o.Confirm
	}
	if o.Threshold > 0 {
		d.Threshold = o.Threshold
	}
	if o.TimeThreshold > 0 {
		d.TimeThreshold = o.TimeThreshold
	}
	return d
}

func (o ChangeOptions) validate() error {
	switch {
	case o.Window < 0:
		return fmt.Errorf("tune: change detector window must be >= 1 sample (0 = default), got %d", o.Window)
	case o.Confirm < 0:
		return fmt.Errorf("tune: change detector confirmation must be >= 1 sample (0 = default), got %d", o.Confirm)
	case o.Threshold < 0 || math.IsNaN(o.Threshold) || math.IsInf(o.Threshold, 0):
		return fmt.Errorf("tune: change detector threshold must be > 0 (0 = default), got %v", o.Threshold)
	case o.TimeThreshold < 0 || math.IsNaN(o.TimeThreshold) || math.IsInf(o.TimeThreshold, 0):
		return fmt.Errorf("tune: change detector iteration-time threshold must be > 0 (0 = default), got %v", o.TimeThreshold)
	}
	return nil
}

// ChangeDetector is a relative-change test on three channels of the
// statistics: the bandwidth, the compute time (forward + backward) and the
// iteration time. Each channel takes the mean log of its first Window
// samples after a reset as its baseline; a change is declared when Confirm
// consecutive samples then differ from the baseline by more than the
// threshold (in either direction), and every channel restarts from the
// next sample. The iteration time depends on the configuration, so it is
// watched only between configuration changes (ConfigChanged restarts it).
// Samples that are not positive (a runtime that does not measure the
// bandwidth) are ignored. It is deterministic and costs O(1) per sample.
type ChangeDetector struct {
	o  ChangeOptions
	ch [3]changeChannel
}

// changeChannel is one watched quantity.
type changeChannel struct {
	n      int     // baseline samples so far
	sum    float64 // of their logs
	beyond int     // consecutive samples beyond the threshold
}

// changeNames name the channels in Observe's answer.
var changeNames = [3]string{"bandwidth", "compute", "iteration time"}

// NewChangeDetector returns a detector; zero options take the defaults.
func NewChangeDetector(o ChangeOptions) (*ChangeDetector, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	return &ChangeDetector{o: o.withDefaults()}, nil
}

// Observe adds one iteration's statistics and reports whether conditions
// changed, and in which channel.
func (d *ChangeDetector) Observe(s Stats) (bool, string) {
	xs := [3]float64{s.BandwidthBps, s.ForwardS + s.BackwardS, s.IterationTimeS}
	thr := [3]float64{d.o.Threshold, d.o.Threshold, d.o.TimeThreshold}
	for i, x := range xs {
		if !(x > 0) || math.IsInf(x, 0) {
			continue
		}
		c := &d.ch[i]
		lx := math.Log(x)
		if c.n < d.o.Window {
			c.n++
			c.sum += lx
			continue
		}
		if math.Abs(lx-c.sum/float64(c.n)) > math.Log1p(thr[i]) {
			c.beyond++
		} else {
			c.beyond = 0
		}
		if c.beyond >= d.o.Confirm {
			d.Reset()
			return true, changeNames[i]
		}
	}
	return false, ""
}

// Reset restarts every channel.
func (d *ChangeDetector) Reset() { d.ch = [3]changeChannel{} }

// ConfigChanged restarts the iteration-time channel: call it for the first
// iteration under a new configuration.
func (d *ChangeDetector) ConfigChanged() { d.ch[2] = changeChannel{} }
