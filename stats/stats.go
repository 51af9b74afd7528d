// Package stats holds the measurements that the simulator and the real
// runtime report alike, so their numbers mean the same thing. It knows
// nothing of how they were measured.
package stats

import "math"

// SteadyState is the mean of the iteration times after the warm-up: the
// first fifth of them, and at least the first one when there are two or
// more. It is NaN for no iterations.
func SteadyState(times []float64) float64 {
	if len(times) == 0 {
		return math.NaN()
	}
	skip := len(times) / 5
	if skip == 0 && len(times) > 1 {
		skip = 1
	}
	var sum float64
	for _, t := range times[skip:] {
		sum += t
	}
	return sum / float64(len(times)-skip)
}

// Summary is what a run's iteration times say, by the rules above: the
// steady state, the mean over the whole run (warm-up and tuning included),
// and the samples per second the steady state gives a global batch.
type Summary struct {
	SteadyS, MeanS, SamplesPerS float64
}

// Summarize applies those rules to a run's iteration times, for a global
// batch of globalBatch samples. Its fields are NaN for no iterations.
func Summarize(times []float64, globalBatch int) Summary {
	s := Summary{SteadyS: SteadyState(times), MeanS: math.NaN()}
	if len(times) > 0 {
		var total float64
		for _, t := range times {
			total += t
		}
		s.MeanS = total / float64(len(times))
	}
	s.SamplesPerS = float64(globalBatch) / s.SteadyS
	return s
}

// Intervals turns the ends of K+1 forward passes into K iteration times:
// iteration k runs from the end of forward k to the end of forward k+1
// (backward k, its communication, and the gated forward k+1).
func Intervals(forwardEnds []float64) []float64 {
	var out []float64
	for k := 1; k < len(forwardEnds); k++ {
		out = append(out, forwardEnds[k]-forwardEnds[k-1])
	}
	return out
}

// JobIterationTimes are a job's iteration times from each worker's own
// (Intervals of its forward ends, on its own clock): iteration k takes as
// long as the slowest worker's iteration k. Workers' clocks need not agree,
// so the runtime measures it as the simulator does. A worker with fewer
// intervals than the others counts for the iterations it has.
func JobIterationTimes(perWorker [][]float64) []float64 {
	n := 0
	for _, w := range perWorker {
		n = max(n, len(w))
	}
	out := make([]float64, n)
	for _, w := range perWorker {
		for k, t := range w {
			out[k] = max(out[k], t)
		}
	}
	return out
}
