package job

import (
	"math"
	"testing"
	"time"

	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/tune"
	"github.com/autobyte/autobyte/worker"
)

// TestTuningMarks: a Go-API worker's marks become the tuner's statistics;
// time blocked on layer gates during the forward pass is not compute.
func TestTuningMarks(t *testing.T) {
	spec := Spec{Profile: testProfile(), Arch: worker.PS, Workers: 2, Servers: 1,
		Sched: sched.Config{PartitionBytes: 4096, CreditBytes: 16384, Order: sched.OrderPriority}}
	var got []tune.Stats
	tn := NewTuning(spec, TuningOptions{Collect: true, OnStats: func(s tune.Stats) { got = append(got, s) }}, nil)
	base := time.Unix(1000, 0)
	clock := base
	tn.now = func() time.Time { return clock }
	tn.collector.now = tn.now
	at := func(ms int) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	step := func(k, start int) {
		clock = at(start)
		if err := tn.ForwardBegin(k); err != nil {
			t.Fatal(err)
		}
		tn.Waited(at(start+10), at(start+30)) // 20 ms blocked on a gate
		clock = at(start + 50)
		if err := tn.ForwardEnd(k); err != nil {
			t.Fatal(err)
		}
		clock = at(start + 100)
		if err := tn.BackwardEnd(k); err != nil {
			t.Fatal(err)
		}
	}
	for k := 0; k < 3; k++ {
		step(k, 100*k)
	}
	if len(got) != 2 {
		t.Fatalf("got statistics for %d iterations, want 2 (iterations 0 and 1 end with forwards 1 and 2)", len(got))
	}
	for _, s := range got {
		if math.Abs(s.ForwardS-0.030) > 1e-9 || math.Abs(s.BackwardS-0.050) > 1e-9 || math.Abs(s.IterationTimeS-0.100) > 1e-9 {
			t.Errorf("iteration %d: forward %v s, backward %v s, iteration %v s; want 0.03, 0.05, 0.1", s.Iteration, s.ForwardS, s.BackwardS, s.IterationTimeS)
		}
	}
	if err := tn.ForwardEnd(7); err == nil {
		t.Error("a forward end without its begin was accepted")
	}
	if err := tn.BackwardEnd(9); err == nil {
		t.Error("a backward end of another iteration was accepted")
	}
}
