package model

import (
	"math"
	"reflect"
	"sort"
	"strings"
	"testing"
)

func TestZooTotals(t *testing.T) {
	cases := []struct {
		name    string
		params  int64
		tensors int
		layers  int
	}{
		{"alexnet", 61_100_840, 16, 8},
		{"vgg16", 138_357_544, 32, 16},
		{"resnet50", 25_557_032, 161, 54},
		{"resnet101", 44_549_160, 314, 105},
		{"transformer", 63_082_496, 253, 31},
		{"bert-base", 109_482_240, 199, 26},
		{"gpt2", 124_439_808, 148, 26},
		{"toy3", 1_500_000, 3, 3},
	}
	if len(cases) != len(Zoo()) {
		t.Errorf("Zoo() has %d models %v, test covers %d", len(Zoo()), Zoo(), len(cases))
	}
	for _, c := range cases {
		p, err := Get(c.name)
		if err != nil {
			t.Fatalf("Get(%q): %v", c.name, err)
		}
		if err := p.Validate(); err != nil {
			t.Errorf("%s: Validate: %v", c.name, err)
		}
		if p.Name != c.name {
			t.Errorf("%s: Name = %q", c.name, p.Name)
		}
		if got := p.TotalParams(); got != c.params {
			t.Errorf("%s: TotalParams = %d, want %d", c.name, got, c.params)
		}
		if got := p.TotalBytes(); got != 4*c.params {
			t.Errorf("%s: TotalBytes = %d, want %d", c.name, got, 4*c.params)
		}
		if got := p.NumTensors(); got != c.tensors {
			t.Errorf("%s: NumTensors = %d, want %d", c.name, got, c.tensors)
		}
		if got := len(p.Layers); got != c.layers {
			t.Errorf("%s: %d layers, want %d", c.name, got, c.layers)
		}
	}
}

func TestZooSortedAndUnknown(t *testing.T) {
	names := Zoo()
	if !sort.StringsAreSorted(names) {
		t.Errorf("Zoo() not sorted: %v", names)
	}
	_, err := Get("resnet-50")
	if err == nil {
		t.Fatal("Get(unknown) succeeded")
	}
	for _, want := range append([]string{`"resnet-50"`}, names...) {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

func TestGetReturnsIndependentCopies(t *testing.T) {
	a, _ := Get("resnet50")
	b, _ := Get("resnet50")
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two Gets differ")
	}
	a.Name = "changed"
	a.Layers[0].ForwardS = 99
	a.Layers[0].Tensors[0].Params = 1
	a.Layers = a.Layers[:1]
	c, _ := Get("resnet50")
	if !reflect.DeepEqual(b, c) {
		t.Error("changing one Get result changed another")
	}
}

func TestToy3Exact(t *testing.T) {
	p, _ := Get("toy3")
	if p.BatchSize != 1 || p.Device != "toy (unit time)" || p.BytesPerParam != 4 {
		t.Errorf("toy3 header = %+v", p)
	}
	want := []int64{375_000, 750_000, 375_000}
	for i, l := range p.Layers {
		if l.Name != "layer"+string(rune('0'+i)) {
			t.Errorf("layer %d name %q", i, l.Name)
		}
		if l.ForwardS != 1 || l.BackwardS != 1 {
			t.Errorf("layer %d times %v/%v, want 1/1", i, l.ForwardS, l.BackwardS)
		}
		if len(l.Tensors) != 1 || l.Tensors[0].Params != want[i] {
			t.Errorf("layer %d tensors %+v, want one of %d params", i, l.Tensors, want[i])
		}
	}
}

func TestLayerOrder(t *testing.T) {
	r, _ := Get("resnet50")
	if first := r.Layers[0].Tensors[0]; first != (Tensor{"conv1.weight", 9408}) {
		t.Errorf("resnet50 first tensor = %+v", first)
	}
	last := r.Layers[len(r.Layers)-1]
	if last.Name != "fc" || last.Tensors[0] != (Tensor{"fc.weight", 2_048_000}) {
		t.Errorf("resnet50 last layer = %+v", last)
	}
	v, _ := Get("vgg16")
	lt, _ := v.LargestTensor()
	if lt != (Tensor{"classifier.0.weight", 102_760_448}) {
		t.Errorf("vgg16 largest tensor = %+v", lt)
	}
	firsts := map[string]string{
		"alexnet":     "features.0.weight",
		"vgg16":       "features.0.weight",
		"resnet101":   "conv1.weight",
		"transformer": "embed_tokens.weight",
		"bert-base":   "embeddings.word_embeddings.weight",
		"gpt2":        "wte.weight",
	}
	for name, want := range firsts {
		p, _ := Get(name)
		if got := p.Layers[0].Tensors[0].Name; got != want {
			t.Errorf("%s first tensor = %q, want %q", name, got, want)
		}
	}
	// Per-layer spot checks from the architectures.
	b, _ := Get("bert-base")
	if got := b.Layers[len(b.Layers)-1].Name; got != "pooler" {
		t.Errorf("bert-base last layer = %q", got)
	}
	g, _ := Get("gpt2")
	if got := g.Layers[1].Tensors[2]; got != (Tensor{"h.0.attn.c_attn.weight", 768 * 2304}) {
		t.Errorf("gpt2 c_attn = %+v", got)
	}
}

func TestComputeTimes(t *testing.T) {
	r, _ := Get("resnet50")
	iter := r.ForwardS() + r.BackwardS()
	if iter < 0.090 || iter > 0.110 {
		t.Errorf("resnet50 fwd+bwd = %.4f s, want 0.090-0.110", iter)
	}
	for _, name := range Zoo() {
		p, _ := Get(name)
		for i, l := range p.Layers {
			if !(l.ForwardS > 0) {
				t.Errorf("%s layer %d %q: forward %v not > 0", name, i, l.Name, l.ForwardS)
			}
			if name != "toy3" && math.Abs(l.BackwardS-2*l.ForwardS) > 1e-15 {
				t.Errorf("%s layer %d: backward %v != 2 × forward %v", name, i, l.BackwardS, l.ForwardS)
			}
		}
	}
	// conv1 of resnet50: 2·7·7·3·64·112·112 FLOPs per image, batch 32.
	want := 2.0 * 7 * 7 * 3 * 64 * 112 * 112 * 32 / (ReferencePeakFLOPS * ReferenceEfficiency)
	if got := r.Layers[0].ForwardS; math.Abs(got-want) > 1e-12 {
		t.Errorf("resnet50 conv1 forward = %v, want %v", got, want)
	}
}
