package model

import (
	"math"
	"reflect"
	"strings"
	"testing"
)

func validProfile() *Profile {
	return &Profile{
		Name: "tiny", BatchSize: 8, Device: "test", BytesPerParam: 4,
		Layers: []Layer{
			{Name: "conv", ForwardS: 0.001, BackwardS: 0.002, Tensors: []Tensor{{"conv.weight", 100}, {"conv.bias", 10}}},
			{Name: "fc", ForwardS: 0.003, BackwardS: 0.006, Tensors: []Tensor{{"fc.weight", 1000}}},
		},
	}
}

func TestValidateErrors(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(p *Profile)
		want   []string
	}{
		{"empty name", func(p *Profile) { p.Name = "" }, []string{"name must be non-empty"}},
		{"zero batch", func(p *Profile) { p.BatchSize = 0 }, []string{"batch_size", "got 0"}},
		{"negative batch", func(p *Profile) { p.BatchSize = -3 }, []string{"batch_size", "got -3"}},
		{"bytes per param", func(p *Profile) { p.BytesPerParam = -1 }, []string{"bytes_per_param", "got -1"}},
		{"no layers", func(p *Profile) { p.Layers = nil }, []string{"at least one layer"}},
		{"empty layer", func(p *Profile) { p.Layers[1].Tensors = nil }, []string{`layer 1 "fc"`, "at least one tensor"}},
		{"layer name", func(p *Profile) { p.Layers[1].Name = "" }, []string{"layer 1", "name must be non-empty"}},
		{"tensor name", func(p *Profile) { p.Layers[0].Tensors[1].Name = "" }, []string{`layer 0 "conv"`, "tensor 1", "non-empty"}},
		{"negative params", func(p *Profile) { p.Layers[1].Tensors[0].Params = -5 },
			[]string{`layer 1 "fc": tensor "fc.weight": params must be > 0, got -5`}},
		{"zero params", func(p *Profile) { p.Layers[0].Tensors[0].Params = 0 }, []string{`"conv.weight"`, "got 0"}},
		{"NaN forward", func(p *Profile) { p.Layers[0].ForwardS = math.NaN() }, []string{`layer 0 "conv"`, "forward_s", "NaN"}},
		{"Inf backward", func(p *Profile) { p.Layers[1].BackwardS = math.Inf(1) }, []string{`layer 1 "fc"`, "backward_s", "+Inf"}},
		{"negative forward", func(p *Profile) { p.Layers[1].ForwardS = -0.5 }, []string{"forward_s", "-0.5"}},
		{"duplicate", func(p *Profile) { p.Layers[1].Tensors[0].Name = "conv.bias" },
			[]string{`layer 1 "fc"`, `tensor "conv.bias"`, "duplicate", `layer 0 "conv"`}},
		{"overflow", func(p *Profile) { p.Layers[1].Tensors[0].Params = math.MaxInt64 / 2 }, []string{"overflow"}},
		{"a day of compute", func(p *Profile) { p.Layers[1].BackwardS = MaxIterationComputeS }, []string{"one iteration's compute", "more than the 86400 s"}},
	}
	if err := validProfile().Validate(); err != nil {
		t.Fatalf("valid profile: %v", err)
	}
	for _, c := range cases {
		p := validProfile()
		c.mutate(p)
		err := p.Validate()
		if err == nil {
			t.Errorf("%s: Validate accepted %+v", c.name, p)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not contain %q", c.name, err, w)
			}
		}
	}
	var nilP *Profile
	if nilP.Validate() == nil {
		t.Error("nil profile validated")
	}
}

func TestTotals(t *testing.T) {
	p := validProfile()
	if p.TotalParams() != 1110 || p.TotalBytes() != 4440 || p.NumTensors() != 3 {
		t.Errorf("totals %d %d %d", p.TotalParams(), p.TotalBytes(), p.NumTensors())
	}
	if math.Abs(p.ForwardS()-0.004) > 1e-12 || math.Abs(p.BackwardS()-0.008) > 1e-12 {
		t.Errorf("times %v %v", p.ForwardS(), p.BackwardS())
	}
	if lt, ok := p.LargestTensor(); !ok || lt.Name != "fc.weight" {
		t.Errorf("largest %v %v", lt, ok)
	}
}

func TestScaledDoesNotMutate(t *testing.T) {
	p := validProfile()
	orig := p.Clone()
	s := p.Scaled(2.5)
	if !reflect.DeepEqual(p, orig) {
		t.Fatal("Scaled changed the original")
	}
	for i := range s.Layers {
		if s.Layers[i].ForwardS != 2.5*p.Layers[i].ForwardS || s.Layers[i].BackwardS != 2.5*p.Layers[i].BackwardS {
			t.Errorf("layer %d not scaled: %+v", i, s.Layers[i])
		}
	}
	s.Layers[0].Tensors[0].Params = 7
	if p.Layers[0].Tensors[0].Params != 100 {
		t.Error("Scaled copy shares tensors with the original")
	}
	if s.TotalParams() == p.TotalParams() {
		t.Error("expected totals to differ after changing the copy")
	}
	if err := p.Scaled(-1).Validate(); err == nil {
		t.Error("negative scale produced a valid profile")
	}
}
