package worker

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/model"
	"github.com/autobyte/autobyte/ps"
	"github.com/autobyte/autobyte/sched"
)

// tinyProfile has 2 layers of 1 ms forward and backward compute.
func tinyProfile() *model.Profile {
	return &model.Profile{Name: "tiny", BatchSize: 1, Device: "none", BytesPerParam: 4, Layers: []model.Layer{
		{Name: "conv", ForwardS: 0.001, BackwardS: 0.001, Tensors: []model.Tensor{{Name: "conv.w", Params: 300}, {Name: "conv.b", Params: 7}}},
		{Name: "fc", ForwardS: 0.001, BackwardS: 0.001, Tensors: []model.Tensor{{Name: "fc.w", Params: 1000}}},
	}}
}

// replayAll runs Replay on every engine and returns the results. A rank
// that fails closes every connection of tn, so that the others do not wait
// for it forever (WaitLayer does not watch Replay's context).
func replayAll(t *testing.T, tn *testNet, es []*Engine, p *model.Profile, iterations int, verify Verify) ([]*ReplayResult, []error, [][]int) {
	t.Helper()
	res, errs, ks := make([]*ReplayResult, len(es)), make([]error, len(es)), make([][]int, len(es))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for r, e := range es {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[r], errs[r] = Replay(ctx, e, p, iterations, verify, func(k int, d time.Duration) { ks[r] = append(ks[r], k) })
			if errs[r] != nil && tn != nil {
				for _, c := range tn.all {
					c.Close()
				}
			}
		}()
	}
	wg.Wait()
	return res, errs, ks
}

// TestReplay: with 2 workers and a server, Replay returns K+1 increasing
// forward ends, at least one forward pass of compute apart, and checks the
// elements its Verify level says.
func TestReplay(t *testing.T) {
	const k = 3
	p := tinyProfile()
	for _, c := range []struct {
		name   string
		verify Verify
		// checked is how many elements one iteration checks.
		checked int64
	}{
		{"full", VerifyFull, 301 + 8 + 1001},
		// Elements 0, 61, ... and the last of each tensor.
		{"sample", VerifySample, (5 + 1) + (1 + 1) + (17 + 1)},
		{"none", VerifyNone, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			tn := newNet(t, 2, 1, ps.AnswerPush)
			tensors, err := TensorsOf(p)
			if err != nil {
				t.Fatal(err)
			}
			obs := []*orderLog{{}, {}}
			cfgs := tn.configs(tensors, func(r int, cfg *Config) {
				cfg.Sched = sched.Config{PartitionBytes: 1024, CreditBytes: 2048, Order: sched.OrderPriority}
				cfg.Observer = obs[r]
			})
			res, errs, ks := replayAll(t, tn, start(t, tn, cfgs), p, k, c.verify)
			for r := range 2 {
				if errs[r] != nil {
					t.Fatalf("worker %d: %v", r, errs[r])
				}
				ends := res[r].ForwardEnds
				if len(ends) != k+1 {
					t.Fatalf("worker %d: %d forward ends, want %d", r, len(ends), k+1)
				}
				if ends[0] < 0.002 {
					t.Errorf("worker %d: first forward pass ended at %.4f s, before its 2 ms of compute", r, ends[0])
				}
				for i := 1; i < len(ends); i++ {
					// A forward pass and a backward pass: 4 ms.
					if ends[i]-ends[i-1] < 0.004 {
						t.Errorf("worker %d: forward ends %v: iteration %d took less than its 4 ms of compute", r, ends, i-1)
					}
				}
				if got := res[r].Checked; got != k*c.checked {
					t.Errorf("worker %d: Checked = %d, want %d", r, got, k*c.checked)
				}
				if !slices.Equal(ks[r], []int{0, 1, 2}) {
					t.Errorf("worker %d: onIteration called for %v, want [0 1 2]", r, ks[r])
				}
				o := obs[r]
				o.mu.Lock()
				if !slices.Equal(o.iters, []int{0, 1, 2}) {
					t.Errorf("worker %d: Observer.Iteration called for %v, want [0 1 2]", r, o.iters)
				}
				// Forward passes of both layers K+1 times, backward K times.
				if want := 2*(k+1) + 2*k; len(o.compute) != want {
					t.Errorf("worker %d: Observer.Compute called %d times, want %d: %v", r, len(o.compute), want, o.compute)
				}
				// conv.w, conv.b and fc.w are cut into 2, 1 and 4 pieces.
				if want := 7 * k; len(o.started) != want || o.done != want {
					t.Errorf("worker %d: %d pieces started and %d done, want %d", r, len(o.started), o.done, want)
				}
				o.mu.Unlock()
			}
		})
	}
}

// TestReplayDetectsWrongSums: a ring that gets a sum wrong fails the
// replay with an error naming the element and the exact sum.
func TestReplayDetectsWrongSums(t *testing.T) {
	p := tinyProfile()
	tensors, _ := TensorsOf(p)
	tn := newNet(t, 2, 0, ps.AnswerPush)
	ring := newFakeRing(2)
	ring.corrupt = 1
	cfgs := tn.configs(tensors, func(r int, cfg *Config) { cfg.Arch, cfg.Ring = AllReduce, ring.member(r) })
	_, errs, _ := replayAll(t, tn, start(t, tn, cfgs), p, 2, VerifySample)
	// The first rank to see the wrong sum closes the connections, so the
	// other may fail for that reason instead.
	named := false
	for r, err := range errs {
		if err == nil {
			t.Errorf("worker %d: Replay succeeded on wrong sums", r)
			continue
		}
		named = named || strings.Contains(err.Error(), "element 0 is") && strings.Contains(err.Error(), "exact sum is")
	}
	if !named {
		t.Errorf("Replay errors %v: none names element 0 and its exact sum", errs)
	}
}

// TestReplayWaitsForEachLayer: each forward layer waits for its own
// layer's sums, however late they come, before it checks them.
func TestReplayWaitsForEachLayer(t *testing.T) {
	const late = 30 * time.Millisecond
	p := tinyProfile()
	tensors, _ := TensorsOf(p)
	tn := newNet(t, 2, 0, ps.AnswerPush)
	ring := newFakeRing(2)
	ring.delay = func(p sched.Piece) time.Duration {
		if p.Layer == 1 {
			return late
		}
		return 0
	}
	cfgs := tn.configs(tensors, func(r int, cfg *Config) { cfg.Arch, cfg.Ring = AllReduce, ring.member(r) })
	res, errs, _ := replayAll(t, tn, start(t, tn, cfgs), p, 2, VerifyFull)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("worker %d: %v", r, err)
		}
		ends := res[r].ForwardEnds
		for i := 1; i < len(ends); i++ {
			if d := time.Duration((ends[i] - ends[i-1]) * float64(time.Second)); d < late {
				t.Errorf("worker %d: iteration %d took %v, less than the %v its last layer's sums took", r, i-1, d, late)
			}
		}
	}
}

// TestReplaySingleWorker: one all-reduce worker sums nothing but still
// checks that its gradients are its own.
func TestReplaySingleWorker(t *testing.T) {
	p := tinyProfile()
	tensors, _ := TensorsOf(p)
	es := start(t, nil, []Config{{Workers: 1, Arch: AllReduce, Tensors: tensors, Logger: quiet}})
	res, errs, _ := replayAll(t, nil, es, p, 2, VerifyFull)
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	if len(res[0].ForwardEnds) != 3 || res[0].Checked != 2*(301+8+1001) {
		t.Errorf("ForwardEnds %v, Checked %d; want 3 ends and %d checked", res[0].ForwardEnds, res[0].Checked, 2*(301+8+1001))
	}
}

// TestReplayCancel: cancelling the context ends a replay with its cause.
func TestReplayCancel(t *testing.T) {
	p := tinyProfile()
	p.Layers[0].ForwardS = 10
	tensors, _ := TensorsOf(p)
	es := start(t, nil, []Config{{Workers: 1, Arch: AllReduce, Tensors: tensors, Logger: quiet}})
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := Replay(ctx, es[0], p, 1, VerifyNone, nil)
		done <- err
	}()
	cause := fmt.Errorf("job cancelled")
	cancel(cause)
	if err := within(t, done, 2*time.Second, "Replay after cancel"); err != cause {
		t.Errorf("Replay = %v, want the cancel cause", err)
	}
}

func TestTensorsOf(t *testing.T) {
	got, err := TensorsOf(tinyProfile())
	if err != nil {
		t.Fatal(err)
	}
	want := []Tensor{{Name: "conv.w", Layer: 0, Elems: 300}, {Name: "conv.b", Layer: 0, Elems: 7}, {Name: "fc.w", Layer: 1, Elems: 1000}}
	if !slices.Equal(got, want) {
		t.Errorf("TensorsOf = %v, want %v", got, want)
	}
	for _, b := range []int{3, 8} {
		p := tinyProfile()
		p.BytesPerParam = b
		if _, err := TensorsOf(p); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%d-byte", b)) || !strings.Contains(err.Error(), `"tiny"`) {
			t.Errorf("TensorsOf(%d-byte profile) = %v, want an error naming the profile and the size", b, err)
		}
		if _, err := Replay(context.Background(), nil, p, 1, VerifyNone, nil); err == nil {
			t.Errorf("Replay of a %d-byte profile = nil error", b)
		}
	}
	p := tinyProfile()
	p.Layers[1].Tensors[0].Params = 1 << 31
	if _, err := TensorsOf(p); err == nil || !strings.Contains(err.Error(), "2147483648") {
		t.Errorf("TensorsOf(tensor of 2^31 params) = %v, want an error naming the count", err)
	}
}

// TestVerifiableLimit: 16-bit replays verify exactly up to the worker
// count whose sums stay exact (171 for bfloat16, 1365 for float16), and
// refuse beyond it, naming the type, the count and the limit; float32 and
// unverified replays have no such limit.
func TestVerifiableLimit(t *testing.T) {
	ts := func(d dtype.DType) []dtype.DType { return []dtype.DType{d} }
	for _, c := range []struct {
		d        dtype.DType
		ok, over int
	}{{dtype.BF16, 171, 172}, {dtype.F16, 1365, 1366}} {
		if err := verifiable(ts(c.d), c.ok, VerifyFull); err != nil {
			t.Errorf("%v, %d workers: %v", c.d, c.ok, err)
		}
		err := verifiable(ts(c.d), c.over, VerifySample)
		if err == nil || !strings.Contains(err.Error(), c.d.String()) || !strings.Contains(err.Error(), fmt.Sprintf("%d workers", c.over)) || !strings.Contains(err.Error(), fmt.Sprintf("at most %d", c.ok)) {
			t.Errorf("%v, %d workers: %v, want a refusal naming the type, the count and %d", c.d, c.over, err, c.ok)
		}
		if err := verifiable(ts(c.d), c.over, VerifyNone); err != nil {
			t.Errorf("%v unverified: %v", c.d, err)
		}
		// The limit is real: the sum of the largest count survives
		// rounding to the type, and the first integer above the bound
		// (an odd one) does not.
		for _, v := range []int{c.ok + c.ok/2, exactLimit(c.d) + 1} {
			x := []float32{float32(v)}
			c.d.Round(make([]byte, 2), x)
			if (x[0] == float32(v)) != (v <= exactLimit(c.d)) {
				t.Errorf("%v: %d rounds to %v", c.d, v, x[0])
			}
		}
	}
	if err := verifiable(ts(dtype.F32), 5000, VerifyFull); err != nil {
		t.Errorf("float32: %v", err)
	}
	// Which exactness each tensor's values must respect, and which limit
	// applies up front.
	tensors := []Tensor{{Name: "a", Wire: dtype.F32}, {Name: "b", Wire: dtype.F32, Exact: true}, {Name: "c", Wire: dtype.F16}}
	for _, c := range []struct {
		initial                dtype.DType
		wantPattern, wantLimit []dtype.DType
	}{
		{dtype.F32, []dtype.DType{dtype.BF16, dtype.F32, dtype.F16}, []dtype.DType{dtype.F32, dtype.F32, dtype.F16}},
		{dtype.F16, []dtype.DType{dtype.BF16, dtype.F32, dtype.F16}, []dtype.DType{dtype.F16, dtype.F32, dtype.F16}},
	} {
		p, l := patternWires(tensors, c.initial)
		if !slices.Equal(p, c.wantPattern) || !slices.Equal(l, c.wantLimit) {
			t.Errorf("patternWires(initial %v) = %v, %v; want %v, %v", c.initial, p, l, c.wantPattern, c.wantLimit)
		}
	}
}
