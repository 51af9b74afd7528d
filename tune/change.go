package tune

import (
	"fmt"
	"math"
	"slices"
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
	// NoiseK raises each channel's threshold to NoiseK standard deviations
	// of its own sample-to-sample noise (in log, estimated robustly from
	// recent successive differences) when that is larger, so that a noisy
	// host does not declare a change at every other iteration (default 3;
	// a noiseless run, like the simulator's, keeps the fixed thresholds).
	NoiseK float64
}

// DefaultChangeOptions: a 3-sample baseline, 2 consecutive samples beyond
// 15% (bandwidth, compute) or 20% (iteration time), or beyond 3 standard
// deviations of the channel's noise if that is more.
var DefaultChangeOptions = ChangeOptions{Window: 3, Confirm: 2, Threshold: 0.15, TimeThreshold: 0.20, NoiseK: 3}

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
	if o.NoiseK > 0 {
		d.NoiseK = o.NoiseK
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
	case o.NoiseK < 0 || math.IsNaN(o.NoiseK) || math.IsInf(o.NoiseK, 0):
		return fmt.Errorf("tune: change detector noise factor must be > 0 standard deviations (0 = default), got %v", o.NoiseK)
	}
	return nil
}

// ChangeDetector is a relative-change test on three channels of the
// statistics: the bandwidth, the compute time (forward + backward) and the
// iteration time. Each channel takes the mean log of its first Window
// samples after a reset as its baseline; a change is declared when Confirm
// consecutive samples then differ from the baseline by more than the
// threshold, on the same side, and every channel restarts from the
// next sample. A channel's threshold is the larger of the fixed one and
// NoiseK standard deviations of its noise, estimated from the median of its
// last noiseSamples absolute differences between successive samples (a
// step counts once there, so it barely moves the median); the estimate
// survives resets, since the noise belongs to the host, not to the
// conditions. While the noise sets the threshold, samples within it join
// the baseline (up to maxBaseline), so that the baseline's own error
// shrinks. The iteration time depends on the configuration, so it is
// watched only between configuration changes (ConfigChanged restarts it).
// A channel declares nothing before it has seen minNoiseSamples
// successive differences. Samples that are not positive (a runtime that
// does not measure the bandwidth) are ignored. It is deterministic and costs O(noiseSamples)
// per sample.
type ChangeDetector struct {
	o  ChangeOptions
	ch [3]changeChannel
}

// noiseSamples is how many successive differences a channel's noise
// estimate keeps; minNoiseSamples are needed before it is used. A noisy
// channel's baseline grows to maxBaseline samples.
const (
	noiseSamples    = 64
	minNoiseSamples = 5
	maxBaseline     = 16
)

// changeChannel is one watched quantity.
type changeChannel struct {
	n      int     // baseline samples so far
	sum    float64 // of their logs
	beyond int     // consecutive samples beyond the threshold
	side   int     // on which side of the baseline (+1 or -1)
	// The noise estimate: the last log sample (valid while hasLast) and a
	// ring of the latest absolute successive differences.
	last    float64
	hasLast bool
	diffs   [noiseSamples]float64
	nDiffs  int // differences recorded so far (the ring holds min(nDiffs, noiseSamples))
}

// restart forgets the baseline and the last sample, keeping the noise.
func (c *changeChannel) restart() { c.n, c.sum, c.beyond, c.hasLast = 0, 0, 0, false }

// addDiff records the successive difference to lx.
func (c *changeChannel) addDiff(lx float64) {
	if c.hasLast {
		c.diffs[c.nDiffs%noiseSamples] = math.Abs(lx - c.last)
		c.nDiffs++
	}
	c.last, c.hasLast = lx, true
}

// noise is the channel's estimated standard deviation in log per sample,
// 0 until minNoiseSamples differences were seen. For Gaussian noise of
// deviation s, a successive difference has deviation s·√2 and its absolute
// value a median of 0.6745·s·√2.
func (c *changeChannel) noise() float64 {
	n := min(c.nDiffs, noiseSamples)
	if n < minNoiseSamples {
		return 0
	}
	var buf [noiseSamples]float64
	d := buf[:n]
	copy(d, c.diffs[:n])
	slices.Sort(d)
	med := d[n/2]
	if n%2 == 0 {
		med = (d[n/2-1] + d[n/2]) / 2
	}
	return med / (0.6745 * math.Sqrt2)
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
		c.addDiff(lx)
		// Until the noise is known a change cannot be told from it (the
		// tuner measures at the start anyway).
		if c.n < d.o.Window || c.nDiffs < minNoiseSamples {
			if c.n < d.o.Window {
				c.n++
				c.sum += lx
			}
			continue
		}
		// The baseline is a mean of n samples: a sample's distance from it
		// has deviation noise·√(1 + 1/n).
		fixed := math.Log1p(thr[i])
		noisy := d.o.NoiseK * c.noise() * math.Sqrt(1+1/float64(c.n))
		// Consecutive samples count only on the same side of the
		// baseline: a change moves it one way, noise both ways.
		if dev := lx - c.sum/float64(c.n); math.Abs(dev) > max(fixed, noisy) {
			side := 1
			if dev < 0 {
				side = -1
			}
			if c.beyond > 0 && side != c.side {
				c.beyond = 0
			}
			c.beyond++
			c.side = side
		} else {
			c.beyond = 0
			// On a noisy channel a 3-sample baseline is itself off by
			// a good part of the noise: keep averaging samples in line
			// with it, up to maxBaseline.
			if noisy > fixed && c.n < maxBaseline {
				c.n++
				c.sum += lx
			}
		}
		if c.beyond >= d.o.Confirm {
			d.Reset()
			return true, changeNames[i]
		}
	}
	return false, ""
}

// Reset restarts every channel's baseline; the noise estimates stay.
func (d *ChangeDetector) Reset() {
	for i := range d.ch {
		d.ch[i].restart()
	}
}

// ConfigChanged restarts the iteration-time channel: call it for the first
// iteration under a new configuration. The difference across the change is
// not counted as noise.
func (d *ChangeDetector) ConfigChanged() { d.ch[2].restart() }

// IterationNoise is the estimated standard deviation of the log iteration
// time from one iteration to the next under an unchanged configuration (0
// until enough iterations were seen): 0.05 means about 5% noise.
func (d *ChangeDetector) IterationNoise() float64 { return d.ch[2].noise() }
