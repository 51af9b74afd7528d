package tune

import (
	"testing"

	"github.com/autobyte/autobyte/sched"
)

// TestNearTabu: after server weights were reverted, weights whose shares
// are all within nearWeights of theirs count as tried (autobyte demo
// retried 1000:213 after 1000:209 was measured slower); weights further
// off, or the same weights with another partition, do not. The control
// rows (further off, another partition) show the check can say no.
func TestNearTabu(t *testing.T) {
	a, err := NewAutoByte(AutoByteOptions{Base: sched.Config{Order: sched.OrderPriority}, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	base := sched.Config{PartitionBytes: 4_000_000, CreditBytes: 16_000_000, Order: sched.OrderPriority}
	weighed := func(c sched.Config, w ...float64) sched.Config {
		sw, err := sched.Weigh(w)
		if err != nil {
			t.Fatal(err)
		}
		c.ServerWeights = sw
		return c
	}
	a.tabu[weighed(base, 1000, 209)] = true
	other := base
	other.PartitionBytes = 262_144
	for _, tc := range []struct {
		c    sched.Config
		want bool
	}{
		{weighed(base, 1000, 209), true},
		{weighed(base, 1000, 213), true},
		{weighed(base, 1000, 190), true},
		{weighed(base, 1000, 257), false},
		{weighed(base, 1000, 160), false},
		{weighed(other, 1000, 213), false},
		{weighed(base, 1000, 209, 1000), false}, // three servers: shares of another job
	} {
		if got := a.nearTabu(tc.c, tc.c.ServerWeights.Len()); got != tc.want {
			t.Errorf("weights %v, partition %d, after 1000:209 at partition 4 MB was reverted: near a reverted configuration %v, want %v",
				tc.c.ServerWeights, tc.c.PartitionBytes, got, tc.want)
		}
	}
}

// TestRecoveryNotChargedToWeights: a server whose response time halves
// right after its share shrank (the pace moved to the other server, as in
// autobyte demo after 1000:209 was reverted to 1000:250) is not taken for
// a recovered link; the same halving under unchanged weights is (the
// control: the check can say yes).
func TestRecoveryNotChargedToWeights(t *testing.T) {
	weighed := func(w ...float64) sched.Config {
		sw, err := sched.Weigh(w)
		if err != nil {
			t.Fatal(err)
		}
		return sched.Config{PartitionBytes: 4_000_000, CreditBytes: 16_000_000, Order: sched.OrderPriority, ServerWeights: sw}
	}
	before, after := weighed(1000, 209), weighed(1000, 250)
	for _, tc := range []struct {
		now  sched.Config
		want bool
	}{{after, false}, {before, true}} {
		a, err := NewAutoByte(AutoByteOptions{Base: sched.Config{Order: sched.OrderPriority}, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		for k := range 3 {
			a.window = append(a.window, Stats{Iteration: k, Config: before, ServerResponseS: []float64{0.065, 0.02}})
		}
		a.current = tc.now
		_, srv, recovered, changed := a.serverChanged(Stats{Iteration: 3, Config: tc.now, ServerResponseS: []float64{0.01, 0.03}})
		if got := changed && recovered && srv == 0; got != tc.want {
			t.Errorf("weights %v after %v, server 0 answering in 10 ms instead of 65: recovery seen %v (server %d, recovered %v, changed %v), want %v",
				tc.now.ServerWeights, before.ServerWeights, got, srv, recovered, changed, tc.want)
		}
	}
}
