package tune

import (
	"math"
	"strings"
	"testing"

	"gonum.org/v1/gonum/mat"
)

// TestGPInterpolates checks that with (almost) no noise the posterior mean
// goes through the training points and its uncertainty vanishes there.
func TestGPInterpolates(t *testing.T) {
	dims := []Dim{{Lo: 0, Hi: 1}, {Lo: 1, Hi: 100, Log: true}}
	var x [][]float64
	var y []float64
	for i := range 9 {
		a, b := float64(i%3)/2, math.Pow(10, float64(i/3))
		x = append(x, []float64{a, b})
		y = append(y, 3+math.Sin(4*a)+math.Log10(b)*math.Log10(b))
	}
	g, err := FitGP(x, y, GPOptions{Dims: dims, NoiseVar: Range{1e-10, 1e-8}, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range x {
		m, s, err := g.Predict(p)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(m-y[i]) > 1e-3 || s > 1e-2 {
			t.Errorf("point %d %v: predicted %.6g ± %.3g, trained on %.6g", i, p, m, s, y[i])
		}
	}
	if h := g.Hyper(); len(h.LengthScales) != 2 || h.NoiseVar > 1e-8 || math.IsNaN(h.LogLikelihood) {
		t.Errorf("hyper-parameters %+v", h)
	}
}

// TestGPSine fits a noisy sine and checks the mean is close and the 3σ
// bands (plus the noise) cover the truth between the training points.
func TestGPSine(t *testing.T) {
	dims := []Dim{{Lo: 0, Hi: 2 * math.Pi}}
	var x [][]float64
	var y []float64
	for i := range 12 {
		v := 2 * math.Pi * float64(i) / 11
		x = append(x, []float64{v})
		y = append(y, math.Sin(v)+1e-3*math.Cos(37*v)) // small deterministic "noise"
	}
	g, err := FitGP(x, y, GPOptions{Dims: dims, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	var worst float64
	for i := range 101 {
		v := 2 * math.Pi * float64(i) / 100
		m, s, err := g.Predict([]float64{v})
		if err != nil {
			t.Fatal(err)
		}
		e := math.Abs(m - math.Sin(v))
		worst = max(worst, e)
		if e > 3*s+3e-3 {
			t.Errorf("x = %.3f: predicted %.5f ± %.5f, truth %.5f outside 3σ", v, m, s, math.Sin(v))
		}
	}
	t.Logf("worst error %.2g, hyper-parameters %+v", worst, g.Hyper())
	if worst > 0.02 {
		t.Errorf("worst error %.4f, want < 0.02 (hyper-parameters %+v)", worst, g.Hyper())
	}
	// Far outside the data the uncertainty grows.
	_, sIn, _ := g.Predict([]float64{math.Pi})
	_, sOut, _ := g.Predict([]float64{4 * math.Pi})
	if !(sOut > 10*sIn) {
		t.Errorf("std inside %.3g, far outside %.3g: want it to grow away from the data", sIn, sOut)
	}
}

// TestGPDeterministic checks a fit depends only on its inputs and seed.
func TestGPDeterministic(t *testing.T) {
	x := [][]float64{{1}, {2}, {3}, {5}, {8}}
	y := []float64{5, 3, 2, 2.5, 4}
	o := GPOptions{Dims: []Dim{{Lo: 1, Hi: 10, Log: true}}, Seed: 3}
	a, err := FitGP(x, y, o)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := FitGP(x, y, o)
	ma, sa, _ := a.Predict([]float64{4})
	mb, sb, _ := b.Predict([]float64{4})
	if ma != mb || sa != sb {
		t.Errorf("two fits differ: %v±%v vs %v±%v", ma, sa, mb, sb)
	}
}

// TestGPConstantAndSingle checks degenerate but valid training sets.
func TestGPConstantAndSingle(t *testing.T) {
	d := []Dim{{Lo: 0, Hi: 1}}
	g, err := FitGP([][]float64{{0.5}}, []float64{2}, GPOptions{Dims: d})
	if err != nil {
		t.Fatal(err)
	}
	if m, _, _ := g.Predict([]float64{0.5}); math.Abs(m-2) > 1e-3 {
		t.Errorf("one point: predicted %v at it, want 2", m)
	}
	g, err = FitGP([][]float64{{0}, {0.5}, {1}}, []float64{4, 4, 4}, GPOptions{Dims: d})
	if err != nil {
		t.Fatal(err)
	}
	if m, _, _ := g.Predict([]float64{0.25}); math.Abs(m-4) > 1e-3 {
		t.Errorf("constant targets: predicted %v, want 4", m)
	}
	// Duplicate inputs with different targets need the noise term.
	if _, err := FitGP([][]float64{{0.5}, {0.5}, {0.2}}, []float64{1, 2, 3}, GPOptions{Dims: d}); err != nil {
		t.Errorf("duplicate inputs: %v", err)
	}
}

// TestLMLGradient compares the analytic gradient of the log marginal
// likelihood with central differences.
func TestLMLGradient(t *testing.T) {
	u := [][]float64{{0, 0.1}, {0.3, 0.9}, {0.5, 0.5}, {0.9, 0.2}, {0.7, 0.7}}
	y := mat.NewVecDense(5, []float64{0.3, -1.2, 0.5, 1.4, -1})
	f := &lml{u: u, y: y, dims: 2, lo: []float64{-4, -4, -4, -12}, hi: []float64{2, 2, 4, 0}}
	for _, p := range [][]float64{{0, 0, 0, 0}, {1.5, -0.7, 0.3, -2}, {-2, 2, 1, 1}} {
		grad := make([]float64, 4)
		f.eval(p, grad)
		for i := range p {
			h := 1e-5
			pp := append([]float64(nil), p...)
			pm := append([]float64(nil), p...)
			pp[i] += h
			pm[i] -= h
			num := (f.eval(pp, nil) - f.eval(pm, nil)) / (2 * h)
			if math.Abs(num-grad[i]) > 1e-5*(1+math.Abs(num)) {
				t.Errorf("p = %v: d/dp%d analytic %.8g, numeric %.8g", p, i, grad[i], num)
			}
		}
	}
}

// TestMinimiseBFGS checks the optimiser on the Rosenbrock function.
func TestMinimiseBFGS(t *testing.T) {
	rosen := func(x, g []float64) float64 {
		a, b := 1-x[0], x[1]-x[0]*x[0]
		if g != nil {
			g[0] = -2*a - 400*x[0]*b
			g[1] = 200 * b
		}
		return a*a + 100*b*b
	}
	x, v := minimiseBFGS(rosen, []float64{-1.2, 1}, 500)
	if v > 1e-8 || math.Abs(x[0]-1) > 1e-3 || math.Abs(x[1]-1) > 1e-3 {
		t.Errorf("Rosenbrock minimum found at %v (value %g), want (1, 1)", x, v)
	}
}

// TestExpectedImprovement checks EI's formula and its limits.
func TestExpectedImprovement(t *testing.T) {
	if ei := ExpectedImprovement(1, 0, 1, 0.1); ei != 0 {
		t.Errorf("EI with σ = 0 at the best: %v, want 0", ei)
	}
	if ei := ExpectedImprovement(0.5, 0, 1, 0.1); ei != 0 {
		t.Errorf("EI with σ = 0: %v, want 0 by convention", ei)
	}
	if ei := ExpectedImprovement(1, 1e-12, 1, 0.1); ei > 1e-12 {
		t.Errorf("EI at the best with σ → 0: %v, want → 0", ei)
	}
	// With xi = 0 at mu = best, EI = σ·φ(0).
	if ei, want := ExpectedImprovement(2, 0.5, 2, 0), 0.5/math.Sqrt(2*math.Pi); math.Abs(ei-want) > 1e-12 {
		t.Errorf("EI(mu = best, xi = 0) = %v, want %v", ei, want)
	}
	// Far below the best, EI ≈ best - mu - xi.
	if ei := ExpectedImprovement(0, 0.01, 1, 0.1); math.Abs(ei-0.9) > 1e-9 {
		t.Errorf("EI far below the best = %v, want 0.9", ei)
	}
	// Lower mean and higher uncertainty both raise it.
	base := ExpectedImprovement(1, 0.2, 1, 0.1)
	if lower := ExpectedImprovement(0.8, 0.2, 1, 0.1); !(lower > base) {
		t.Errorf("lower mean: EI %v not above %v", lower, base)
	}
	if wider := ExpectedImprovement(1, 0.5, 1, 0.1); !(wider > base) {
		t.Errorf("higher σ: EI %v not above %v", wider, base)
	}
	if ei := ExpectedImprovement(5, 0.1, 1, 0.1); ei < 0 || ei > 1e-20 {
		t.Errorf("EI far above the best = %v, want ≈ 0 and >= 0", ei)
	}
}

// TestGPErrors checks bad inputs are refused with errors naming them.
func TestGPErrors(t *testing.T) {
	d := []Dim{{Lo: 0, Hi: 1}}
	x := [][]float64{{0.1}, {0.5}}
	for _, c := range []struct {
		name string
		x    [][]float64
		y    []float64
		o    GPOptions
		want string
	}{
		{"no dims", x, []float64{1, 2}, GPOptions{}, "dimension"},
		{"empty", nil, nil, GPOptions{Dims: d}, "at least one training point"},
		{"lengths", x, []float64{1}, GPOptions{Dims: d}, "2 points but 1 targets"},
		{"width", [][]float64{{0.1}, {0.5, 2}}, []float64{1, 2}, GPOptions{Dims: d}, "point 1: has 2 coordinates, want 1"},
		{"NaN x", [][]float64{{0.1}, {math.NaN()}}, []float64{1, 2}, GPOptions{Dims: d}, "point 1: coordinate 0 is NaN"},
		{"Inf y", x, []float64{1, math.Inf(1)}, GPOptions{Dims: d}, "target 1 is +Inf"},
		{"bounds", x, []float64{1, 2}, GPOptions{Dims: []Dim{{Lo: 1, Hi: 1}}}, "[1, 1]"},
		{"log lo", x, []float64{1, 2}, GPOptions{Dims: []Dim{{Lo: 0, Hi: 1, Log: true}}}, "must be > 0, got 0"},
		{"log x", [][]float64{{-1}, {2}}, []float64{1, 2}, GPOptions{Dims: []Dim{{Lo: 1, Hi: 4, Log: true}}}, "coordinate 0 is -1"},
		{"noise", x, []float64{1, 2}, GPOptions{Dims: d, NoiseVar: Range{0, 1}}, "noise-variance bounds"},
		{"length", x, []float64{1, 2}, GPOptions{Dims: d, LengthScale: Range{2, 1}}, "length-scale bounds must satisfy 0 < lo <= hi < inf, got [2, 1]"},
	} {
		_, err := FitGP(c.x, c.y, c.o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
	}
	g, err := FitGP(x, []float64{1, 2}, GPOptions{Dims: d})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.Predict([]float64{0.1, 0.2}); err == nil || !strings.Contains(err.Error(), "2 coordinates") {
		t.Errorf("predict at a 2-D point: %v", err)
	}
	if _, _, err := g.Predict([]float64{math.NaN()}); err == nil || !strings.Contains(err.Error(), "NaN") {
		t.Errorf("predict at NaN: %v", err)
	}
}
