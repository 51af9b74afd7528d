package tune

// A Gaussian-process regressor and the expected-improvement acquisition
// function, for the Bayesian-optimisation tuner (bo.go).
//
// The model follows what ByteScheduler's tuner gets from bayes_opt and
// scikit-learn: a Matérn ν = 5/2 kernel, here with one length scale per
// input dimension (ARD), a signal variance and a noise variance, fitted by
// maximising the log marginal likelihood from several starts; targets are
// normalised to zero mean and unit variance before fitting and predictions
// are returned in the targets' own units. Inputs are normalised to [0, 1]
// per dimension (through the logarithm for sizes, see Dim), so the length
// scales' bounds mean the same thing in every dimension.

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"

	"gonum.org/v1/gonum/mat"
)

// Dim is one input dimension of a GP: values in [Lo, Hi] map linearly to
// [0, 1], or through the logarithm if Log (then Lo must be > 0). Values
// outside [Lo, Hi] are accepted and map outside [0, 1].
type Dim struct {
	Lo, Hi float64
	Log    bool
}

// unit maps v to the dimension's normalised coordinate.
func (d Dim) unit(v float64) float64 {
	if d.Log {
		return (math.Log(v) - math.Log(d.Lo)) / (math.Log(d.Hi) - math.Log(d.Lo))
	}
	return (v - d.Lo) / (d.Hi - d.Lo)
}

// value maps a normalised coordinate back to the dimension's value.
func (d Dim) value(u float64) float64 {
	if d.Log {
		return math.Exp(math.Log(d.Lo) + u*(math.Log(d.Hi)-math.Log(d.Lo)))
	}
	return d.Lo + u*(d.Hi-d.Lo)
}

// Range is a closed interval [Lo, Hi] of a positive hyper-parameter; Lo ==
// Hi fixes it.
type Range struct{ Lo, Hi float64 }

// GPOptions configure FitGP. Zero fields take the stated defaults.
type GPOptions struct {
	// Dims are the input dimensions (required, at least one).
	Dims []Dim
	// LengthScale bounds every dimension's length scale, in normalised
	// units (default [0.01, 10]).
	LengthScale Range
	// SignalVar bounds the kernel's variance, in units of the normalised
	// targets' variance (default [0.01, 100]).
	SignalVar Range
	// NoiseVar bounds the observation-noise variance, in the same units
	// (default [1e-6, 1]; 1e-6 is scikit-learn's default alpha).
	NoiseVar Range
	// Restarts is how many seeded random starts the hyper-parameter fit
	// makes besides the one from the middle of the bounds (default 5, as
	// bayes_opt; negative means none).
	Restarts int
	// Seed seeds the random starts.
	Seed uint64
}

// GPHyper are a GP's fitted hyper-parameters, on the normalised inputs and
// targets.
type GPHyper struct {
	LengthScales []float64
	SignalVar    float64
	NoiseVar     float64
	// LogLikelihood is the log marginal likelihood of the normalised
	// targets under these hyper-parameters.
	LogLikelihood float64
}

// GP is a fitted Gaussian-process regressor. It is immutable and safe for
// concurrent use.
type GP struct {
	dims   []Dim
	u      [][]float64 // normalised inputs
	yMean  float64
	yScale float64
	hyp    GPHyper
	chol   *mat.Cholesky
	l      *mat.TriDense // the Cholesky factor's L
	alpha  *mat.VecDense // K⁻¹ y (normalised targets)
}

const sqrt5 = 2.23606797749979

// matern52 is the Matérn ν = 5/2 kernel of the scaled distance r.
func matern52(r float64) float64 {
	return (1 + sqrt5*r + 5*r*r/3) * math.Exp(-sqrt5*r)
}

// scaledDist is the distance between a and b with each dimension divided
// by its length scale.
func scaledDist(a, b, ls []float64) float64 {
	var s float64
	for d := range a {
		t := (a[d] - b[d]) / ls[d]
		s += t * t
	}
	return math.Sqrt(s)
}

func (r Range) withDefault(lo, hi float64) Range {
	if r == (Range{}) {
		return Range{lo, hi}
	}
	return r
}

func (r Range) check(name string) error {
	if !(r.Lo > 0) || !(r.Hi >= r.Lo) || math.IsInf(r.Hi, 0) {
		return fmt.Errorf("tune: GP %s bounds must satisfy 0 < lo <= hi < inf, got [%v, %v]", name, r.Lo, r.Hi)
	}
	return nil
}

// FitGP fits a GP to the points x (one row per point, one column per
// dimension of o.Dims) and targets y, choosing the hyper-parameters that
// maximise the log marginal likelihood. Errors name the bad input.
func FitGP(x [][]float64, y []float64, o GPOptions) (*GP, error) {
	if len(o.Dims) == 0 {
		return nil, errors.New("tune: GP needs at least one input dimension")
	}
	for i, d := range o.Dims {
		if math.IsNaN(d.Lo) || math.IsNaN(d.Hi) || math.IsInf(d.Lo, 0) || math.IsInf(d.Hi, 0) || !(d.Hi > d.Lo) {
			return nil, fmt.Errorf("tune: GP dimension %d: bounds must be finite with lo < hi, got [%v, %v]", i, d.Lo, d.Hi)
		}
		if d.Log && !(d.Lo > 0) {
			return nil, fmt.Errorf("tune: GP dimension %d is logarithmic: lower bound must be > 0, got %v", i, d.Lo)
		}
	}
	o.LengthScale = o.LengthScale.withDefault(0.01, 10)
	o.SignalVar = o.SignalVar.withDefault(0.01, 100)
	o.NoiseVar = o.NoiseVar.withDefault(1e-6, 1)
	for _, c := range []struct {
		name string
		r    Range
	}{{"length-scale", o.LengthScale}, {"signal-variance", o.SignalVar}, {"noise-variance", o.NoiseVar}} {
		if err := c.r.check(c.name); err != nil {
			return nil, err
		}
	}
	if o.Restarts == 0 {
		o.Restarts = 5
	}
	n := len(x)
	if n == 0 {
		return nil, errors.New("tune: GP needs at least one training point")
	}
	if len(y) != n {
		return nil, fmt.Errorf("tune: GP got %d points but %d targets", n, len(y))
	}
	g := &GP{dims: o.Dims, u: make([][]float64, n)}
	for i, p := range x {
		u, err := g.normalise(p)
		if err != nil {
			return nil, fmt.Errorf("tune: GP training point %d: %w", i, err)
		}
		g.u[i] = u
	}
	for i, v := range y {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("tune: GP target %d is %v, want a finite number", i, v)
		}
		g.yMean += v
	}
	g.yMean /= float64(n)
	for _, v := range y {
		g.yScale += (v - g.yMean) * (v - g.yMean)
	}
	g.yScale = math.Sqrt(g.yScale / float64(n))
	if !(g.yScale > 0) {
		g.yScale = 1 // constant targets: nothing to scale
	}
	yn := mat.NewVecDense(n, nil)
	for i, v := range y {
		yn.SetVec(i, (v-g.yMean)/g.yScale)
	}

	f := &lml{u: g.u, y: yn, dims: len(o.Dims)}
	f.lo = make([]float64, f.dims+2)
	f.hi = make([]float64, f.dims+2)
	for d := range f.dims {
		f.lo[d], f.hi[d] = math.Log(o.LengthScale.Lo), math.Log(o.LengthScale.Hi)
	}
	f.lo[f.dims], f.hi[f.dims] = math.Log(o.SignalVar.Lo), math.Log(o.SignalVar.Hi)
	f.lo[f.dims+1], f.hi[f.dims+1] = math.Log(o.NoiseVar.Lo), math.Log(o.NoiseVar.Hi)

	rng := rand.New(rand.NewPCG(o.Seed, 0x6770))      // "gp"
	starts := [][]float64{make([]float64, len(f.lo))} // u = 0: the middle of the log bounds
	for range max(o.Restarts, 0) {
		s := make([]float64, len(f.lo))
		for i := range s {
			// Uniform in the log bounds, kept off the saturated ends.
			s[i] = logit(0.02 + 0.96*rng.Float64())
		}
		starts = append(starts, s)
	}
	best, bestF := []float64(nil), math.Inf(1)
	for _, s := range starts {
		x, v := minimiseBFGS(f.negEval, s, 200)
		if v < bestF {
			best, bestF = x, v
		}
	}
	if best == nil || math.IsInf(bestF, 1) {
		return nil, fmt.Errorf("tune: GP fit of %d points failed: no hyper-parameters in the bounds give a positive-definite covariance", n)
	}
	theta := f.theta(best)
	g.hyp = GPHyper{LengthScales: make([]float64, f.dims), SignalVar: math.Exp(theta[f.dims]), NoiseVar: math.Exp(theta[f.dims+1])}
	for d := range f.dims {
		g.hyp.LengthScales[d] = math.Exp(theta[d])
	}
	k := covariance(g.u, g.hyp.LengthScales, g.hyp.SignalVar, g.hyp.NoiseVar)
	chol, err := choleskyJitter(k)
	if err != nil {
		return nil, err
	}
	g.chol = chol
	g.l = &mat.TriDense{}
	chol.LTo(g.l)
	g.alpha = mat.NewVecDense(n, nil)
	if err := chol.SolveVecTo(g.alpha, yn); err != nil {
		return nil, fmt.Errorf("tune: GP solve: %w", err)
	}
	g.hyp.LogLikelihood = -bestF
	return g, nil
}

// normalise checks a point and maps it to normalised coordinates.
func (g *GP) normalise(p []float64) ([]float64, error) {
	if len(p) != len(g.dims) {
		return nil, fmt.Errorf("has %d coordinates, want %d", len(p), len(g.dims))
	}
	u := make([]float64, len(p))
	for d, v := range p {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("coordinate %d is %v, want a finite number", d, v)
		}
		if g.dims[d].Log && !(v > 0) {
			return nil, fmt.Errorf("coordinate %d is %v, want > 0 on a logarithmic dimension", d, v)
		}
		u[d] = g.dims[d].unit(v)
	}
	return u, nil
}

// Hyper returns the fitted hyper-parameters.
func (g *GP) Hyper() GPHyper {
	h := g.hyp
	h.LengthScales = append([]float64(nil), h.LengthScales...)
	return h
}

// Predict returns the posterior mean and standard deviation of the latent
// function at x, in the targets' units. The standard deviation excludes the
// observation noise (it is the uncertainty of the function, which is what
// expected improvement needs).
func (g *GP) Predict(x []float64) (mean, std float64, err error) {
	u, err := g.normalise(x)
	if err != nil {
		return 0, 0, fmt.Errorf("tune: GP prediction point: %w", err)
	}
	m, s := g.predictUnit(u)
	return m, s, nil
}

// predictUnit predicts at normalised coordinates u.
func (g *GP) predictUnit(u []float64) (mean, std float64) {
	n := len(g.u)
	ks := mat.NewVecDense(n, nil)
	for i, ui := range g.u {
		ks.SetVec(i, g.hyp.SignalVar*matern52(scaledDist(u, ui, g.hyp.LengthScales)))
	}
	mn := mat.Dot(ks, g.alpha)
	v := mat.NewVecDense(n, nil)
	// v = L⁻¹ k*, so k*ᵀ K⁻¹ k* = |v|².
	if err := v.SolveVec(g.l, ks); err != nil {
		return g.yMean + g.yScale*mn, g.yScale * math.Sqrt(g.hyp.SignalVar)
	}
	vr := g.hyp.SignalVar - mat.Dot(v, v)
	return g.yMean + g.yScale*mn, g.yScale * math.Sqrt(max(vr, 0))
}

// covariance is the kernel matrix of the points u plus noise on the
// diagonal.
func covariance(u [][]float64, ls []float64, s2, noise float64) *mat.SymDense {
	n := len(u)
	k := mat.NewSymDense(n, nil)
	for i := range n {
		k.SetSym(i, i, s2+noise)
		for j := range i {
			k.SetSym(i, j, s2*matern52(scaledDist(u[i], u[j], ls)))
		}
	}
	return k
}

// choleskyJitter factorises k, adding growing jitter to its diagonal when
// it is not numerically positive definite.
func choleskyJitter(k *mat.SymDense) (*mat.Cholesky, error) {
	var chol mat.Cholesky
	if chol.Factorize(k) {
		return &chol, nil
	}
	n := k.SymmetricDim()
	var mean float64
	for i := range n {
		mean += k.At(i, i)
	}
	mean /= float64(n)
	jitter := 1e-10 * mean
	if !(jitter > 0) || math.IsInf(jitter, 0) || math.IsNaN(jitter) {
		return nil, fmt.Errorf("tune: GP covariance of %d points has mean diagonal %v: cannot factorise", n, mean)
	}
	kj := mat.NewSymDense(n, nil)
	for range 8 {
		kj.CopySym(k)
		for i := range n {
			kj.SetSym(i, i, k.At(i, i)+jitter)
		}
		if chol.Factorize(kj) {
			return &chol, nil
		}
		jitter *= 10
	}
	return nil, fmt.Errorf("tune: GP covariance of %d points is not positive definite even with jitter %.3g on its diagonal (duplicate inputs with too little noise?)", n, jitter/10)
}

// lml is the log marginal likelihood of normalised targets as a function
// of unconstrained parameters p: hyper-parameter i's logarithm is
// lo[i] + (hi[i]-lo[i])·sigmoid(p[i]), which keeps it in its bounds.
type lml struct {
	u      [][]float64
	y      *mat.VecDense
	dims   int
	lo, hi []float64
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

func logit(p float64) float64 { return math.Log(p / (1 - p)) }

// theta maps unconstrained parameters to log hyper-parameters.
func (f *lml) theta(p []float64) []float64 {
	t := make([]float64, len(p))
	for i, v := range p {
		t[i] = f.lo[i] + (f.hi[i]-f.lo[i])*sigmoid(v)
	}
	return t
}

// eval returns the log marginal likelihood at p and, if grad is not nil,
// stores its gradient with respect to p there. It returns -Inf when the
// covariance cannot be factorised.
func (f *lml) eval(p, grad []float64) float64 {
	th := f.theta(p)
	ls := make([]float64, f.dims)
	for d := range ls {
		ls[d] = math.Exp(th[d])
	}
	s2, noise := math.Exp(th[f.dims]), math.Exp(th[f.dims+1])
	n := len(f.u)
	chol, err := choleskyJitter(covariance(f.u, ls, s2, noise))
	if err != nil {
		for i := range grad {
			grad[i] = 0
		}
		return math.Inf(-1)
	}
	alpha := mat.NewVecDense(n, nil)
	if err := chol.SolveVecTo(alpha, f.y); err != nil {
		for i := range grad {
			grad[i] = 0
		}
		return math.Inf(-1)
	}
	v := -0.5*mat.Dot(f.y, alpha) - 0.5*chol.LogDet() - 0.5*float64(n)*math.Log(2*math.Pi)
	if grad == nil {
		return v
	}
	// d lml / d θ = ½ tr((ααᵀ - K⁻¹) dK/dθ); W = ααᵀ - K⁻¹.
	var kinv mat.SymDense
	if err := chol.InverseTo(&kinv); err != nil {
		for i := range grad {
			grad[i] = 0
		}
		return v
	}
	w := func(i, j int) float64 { return alpha.AtVec(i)*alpha.AtVec(j) - kinv.At(i, j) }
	dth := make([]float64, len(p))
	for i := range n {
		// Diagonal: dK/d log s2 = s2, dK/d log noise = noise.
		wii := w(i, i)
		dth[f.dims] += 0.5 * wii * s2
		dth[f.dims+1] += 0.5 * wii * noise
		for j := range i {
			wij := w(i, j) // counted twice (symmetry): ½·2
			r := scaledDist(f.u[i], f.u[j], ls)
			e := math.Exp(-sqrt5 * r)
			dth[f.dims] += wij * s2 * (1 + sqrt5*r + 5*r*r/3) * e
			// dk/d log l_d = s2·(5/3)(1+√5 r)e^{-√5 r}·Δ_d²/l_d².
			c := s2 * 5 / 3 * (1 + sqrt5*r) * e
			for d := range f.dims {
				t := (f.u[i][d] - f.u[j][d]) / ls[d]
				dth[d] += wij * c * t * t
			}
		}
	}
	for i, pi := range p {
		s := sigmoid(pi)
		grad[i] = dth[i] * (f.hi[i] - f.lo[i]) * s * (1 - s)
	}
	return v
}

// negEval is the negated log marginal likelihood and its gradient, to
// minimise.
func (f *lml) negEval(p, grad []float64) float64 {
	v := f.eval(p, grad)
	for i := range grad {
		grad[i] = -grad[i]
	}
	return -v
}

// minimiseBFGS minimises f (which returns its value and stores its
// gradient in grad) from x0 by BFGS with a backtracking (Armijo) line
// search, for at most iters steps, and returns the best point and value.
// It is small and dependency-free on purpose: gonum/optimize would pull
// in modules this project's go.sum does not list, and the problem has at
// most a handful of unconstrained parameters.
func minimiseBFGS(f func(x, grad []float64) float64, x0 []float64, iters int) ([]float64, float64) {
	n := len(x0)
	x := append([]float64(nil), x0...)
	g := make([]float64, n)
	fx := f(x, g)
	if math.IsNaN(fx) || math.IsInf(fx, 0) {
		return x, math.Inf(1)
	}
	h := mat.NewDense(n, n, nil) // inverse-Hessian approximation
	resetH := func() {
		h.Zero()
		for i := range n {
			h.Set(i, i, 1)
		}
	}
	resetH()
	xn, gn, d := make([]float64, n), make([]float64, n), make([]float64, n)
	sv, yv := mat.NewVecDense(n, nil), mat.NewVecDense(n, nil)
	for range iters {
		var gmax float64
		for _, v := range g {
			gmax = max(gmax, math.Abs(v))
		}
		if gmax < 1e-8 {
			break
		}
		dv := mat.NewVecDense(n, d)
		dv.MulVec(h, mat.NewVecDense(n, g))
		var slope, norm float64
		for i := range d {
			d[i] = -d[i]
			slope += g[i] * d[i]
			norm += d[i] * d[i]
		}
		if !(slope < 0) {
			resetH()
			slope, norm = 0, 0
			for i := range d {
				d[i] = -g[i]
				slope -= g[i] * g[i]
				norm += g[i] * g[i]
			}
		}
		// Cap the step: the parameters are squashed by a sigmoid, so
		// steps beyond a few units only saturate them.
		t := min(1, 4/math.Sqrt(norm))
		var fn float64
		ok := false
		for range 50 {
			for i := range xn {
				xn[i] = x[i] + t*d[i]
			}
			fn = f(xn, gn)
			if fn <= fx+1e-4*t*slope && !math.IsNaN(fn) {
				ok = true
				break
			}
			t /= 2
		}
		if !ok {
			break
		}
		for i := range n {
			sv.SetVec(i, xn[i]-x[i])
			yv.SetVec(i, gn[i]-g[i])
		}
		done := fx-fn <= 1e-12*(1+math.Abs(fx))
		copy(x, xn)
		copy(g, gn)
		fx = fn
		if done {
			break
		}
		// H ← (I - ρ s yᵀ) H (I - ρ y sᵀ) + ρ s sᵀ, ρ = 1/(yᵀs).
		sy := mat.Dot(sv, yv)
		if sy <= 1e-12 {
			continue
		}
		rho := 1 / sy
		var hy mat.VecDense
		hy.MulVec(h, yv)
		yhy := mat.Dot(yv, &hy)
		for i := range n {
			for j := range n {
				h.Set(i, j, h.At(i, j)-rho*(hy.AtVec(i)*sv.AtVec(j)+sv.AtVec(i)*hy.AtVec(j))+
					(rho*rho*yhy+rho)*sv.AtVec(i)*sv.AtVec(j))
			}
		}
	}
	return x, fx
}

// ExpectedImprovement is the expected improvement below best, for
// minimisation, of a Gaussian prediction with mean mu and standard
// deviation sigma, with exploration margin xi (in the units of mu):
//
//	EI = (best - mu - xi)·Φ(z) + sigma·φ(z),  z = (best - mu - xi)/sigma,
//
// and 0 when sigma is 0 (or not positive).
func ExpectedImprovement(mu, sigma, best, xi float64) float64 {
	if !(sigma > 0) {
		return 0
	}
	a := best - mu - xi
	z := a / sigma
	cdf := 0.5 * math.Erfc(-z/math.Sqrt2)
	pdf := math.Exp(-0.5*z*z) / math.Sqrt(2*math.Pi)
	return max(a*cdf+sigma*pdf, 0)
}
