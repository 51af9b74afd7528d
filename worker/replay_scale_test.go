package worker

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/autobyte/autobyte/sched"
)

// soloEngine is a started one-rank all-reduce engine (no connections).
func soloEngine(t *testing.T, ctx context.Context) *Engine {
	t.Helper()
	ts, err := TensorsOf(tinyProfile())
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{Rank: 0, Workers: 1, Arch: AllReduce, Tensors: ts, Sched: sched.Config{PartitionBytes: 400, CreditBytes: 800, Order: sched.OrderPriority}})
	if err != nil {
		t.Fatal(err)
	}
	e.Start(ctx)
	t.Cleanup(func() { e.Stop(nil); e.Wait() })
	return e
}

// TestReplayComputeScale: the replay asks the compute scale of every
// iteration once, in order, before its forward pass, and its compute takes
// at least the scaled profile's time (a lower bound: sleeps never end
// early; nothing asserts an upper bound).
func TestReplayComputeScale(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e := soloEngine(t, ctx)
	var asked []int
	scale := func(it int) float64 {
		asked = append(asked, it)
		if it == 0 {
			return 1
		}
		return 3
	}
	const k = 3
	res, err := ReplayWith(ctx, e, tinyProfile(), ReplayOptions{Iterations: k, Verify: VerifyFull, ComputeScale: scale})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(asked, []int{0, 1, 2, 3}) {
		t.Errorf("compute scale asked for iterations %v, want 0..%d once each", asked, k)
	}
	// Iteration 0: 2 ms forward + 2 ms backward; 1 and 2: 3 × 4 ms; the
	// final forward pass 3: 3 × 2 ms.
	if min := 0.004 + 2*0.012 + 0.006; res.ForwardEnds[k] < min {
		t.Errorf("the scaled replay's forward passes ended at %v s, before its compute alone (%v s) could", res.ForwardEnds[k], min)
	}
}

// TestReplayComputeScaleBad: a scale that is not a positive number ends the
// replay with an error naming it and the iteration.
func TestReplayComputeScaleBad(t *testing.T) {
	for _, bad := range []float64{0, -1, math.NaN(), math.Inf(1)} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		e := soloEngine(t, ctx)
		_, err := ReplayWith(ctx, e, tinyProfile(), ReplayOptions{Iterations: 3, ComputeScale: func(it int) float64 {
			if it == 2 {
				return bad
			}
			return 1
		}})
		cancel()
		if err == nil || !strings.Contains(err.Error(), "iteration 2") || !strings.Contains(err.Error(), fmt.Sprint(bad)) {
			t.Errorf("scale %v: err = %v, want it and iteration 2 named", bad, err)
		}
	}
}
