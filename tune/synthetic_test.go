package tune_test

import (
	"reflect"
	"testing"

	"github.com/autobyte/autobyte/tune"
)

// TestSyntheticProfile: synthetic profiles are valid, equal seeds give
// equal profiles, and different seeds give models of different shapes
// within the documented ranges.
func TestSyntheticProfile(t *testing.T) {
	sizes := map[int64]bool{}
	layers := map[int]bool{}
	for seed := uint64(1); seed <= 50; seed++ {
		p := tune.SyntheticProfile(seed)
		if err := p.Validate(); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if !reflect.DeepEqual(p, tune.SyntheticProfile(seed)) {
			t.Fatalf("seed %d: two calls differ", seed)
		}
		q, err := tune.MetaProfile(tune.SyntheticName(seed))
		if err != nil || !reflect.DeepEqual(p, q) {
			t.Fatalf("seed %d: MetaProfile(%q) = %v, %v", seed, tune.SyntheticName(seed), q, err)
		}
		if n := len(p.Layers); n < 6 || n > 160 {
			t.Errorf("seed %d: %d layers, want 6-160", seed, n)
		}
		if b := p.TotalBytes(); b < 19e6 || b > 610e6 {
			t.Errorf("seed %d: %d bytes, want 20-600 MB", seed, b)
		}
		if c := p.ForwardS() + p.BackwardS(); c < 4.9e-3 || c > 401e-3 {
			t.Errorf("seed %d: compute %v s, want 5-400 ms", seed, c)
		}
		sizes[p.TotalBytes()] = true
		layers[len(p.Layers)] = true
	}
	if len(sizes) < 45 || len(layers) < 20 {
		t.Errorf("50 seeds gave %d distinct sizes and %d distinct layer counts", len(sizes), len(layers))
	}
	if _, err := tune.MetaProfile("resnet50"); err != nil {
		t.Errorf("zoo model: %v", err)
	}
	if _, err := tune.MetaProfile("synthetic-x"); err == nil {
		t.Error("synthetic-x: no error")
	}
}
