package tune

import (
	"strings"
	"testing"

	"github.com/autobyte/autobyte/sched"
)

func TestNew(t *testing.T) {
	base := sched.Config{PartitionBytes: 4 << 20, CreditBytes: 16 << 20, Order: sched.OrderPriority}
	o := NewOptions{Arch: "ps", Base: base, GridPartitions: []int64{1 << 20}, GridCredits: []int64{4 << 20, 8 << 20}, GridTrial: 3, Seed: 1}
	for _, name := range Names {
		tn, err := New(name, o)
		if err != nil {
			t.Fatalf("New(%q): %v", name, err)
		}
		if tn.Name() != name {
			t.Errorf("New(%q) built a tuner named %q", name, tn.Name())
		}
	}
	if _, err := New("nope", o); err == nil || !strings.Contains(err.Error(), `unknown tuner "nope"`) {
		t.Errorf("New(nope) = %v, want an error naming it", err)
	}
	o.BOTrial = 2
	if _, err := New("bo", o); err == nil || !strings.Contains(err.Error(), "tuner bo: ") || !strings.Contains(err.Error(), "got 2") {
		t.Errorf("New(bo) with 2-iteration trials = %v, want an error naming the tuner and the value", err)
	}
}
