package tune

// Synthetic model profiles for training the meta-network. The zoo has only
// a handful of models, and a network trained on five of them learns
// per-model answers (docs/tuner.md). Random profiles with their own layer
// counts, size distributions and compute distributions make the training
// set wide enough that the network must learn from the features instead.

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/autobyte/autobyte/model"
)

// SyntheticPrefix starts the name of a synthetic model: "synthetic-SEED"
// is SyntheticProfile(SEED).
const SyntheticPrefix = "synthetic-"

// SyntheticName is the model name of the synthetic profile of seed.
func SyntheticName(seed uint64) string { return fmt.Sprintf("%s%d", SyntheticPrefix, seed) }

// SyntheticProfile returns the random profile of seed (equal seeds give
// equal profiles), drawn as follows:
//   - 6–160 layers (log-uniform), each with one weight tensor and, with
//     probability 0.6, a small bias or norm tensor (0.1–1% of its weight);
//   - 5–150 M parameters in all (log-uniform; 20–600 MB of fp32
//     gradients);
//   - weight sizes log-normal with a deviation of 0.2–2.5 (how skewed the
//     sizes are) and a trend over depth of −3 to +3 in log (big tensors
//     early, as embeddings, or late, as classifier heads), plus with
//     probability 0.3 one giant tensor (10–60% of the model) at the first
//     or the last layer;
//   - 5–400 ms of forward and backward compute (log-uniform; backward
//     twice the forward), spread over the layers log-normally with a
//     deviation of 0–1 and a trend of its own.
func SyntheticProfile(seed uint64) *model.Profile {
	rng := rand.New(rand.NewPCG(seed, 0x73796e74))
	logU := func(lo, hi float64) float64 { return lo * math.Exp(rng.Float64()*math.Log(hi/lo)) }
	uni := func(lo, hi float64) float64 { return lo + rng.Float64()*(hi-lo) }
	layers := int(math.Round(logU(6, 160)))
	params := logU(5e6, 150e6)
	sizeSigma, sizeTrend := uni(0.2, 2.5), uni(-3, 3)
	timeSigma, timeTrend := uni(0, 1), uni(-2, 2)
	compute := logU(5e-3, 400e-3)
	giant := -1
	if rng.Float64() < 0.3 {
		giant = 0
		if rng.IntN(2) == 1 {
			giant = layers - 1
		}
	}
	size := make([]float64, layers)
	tm := make([]float64, layers)
	var sumSize, sumTime float64
	for i := range layers {
		pos := 0.0
		if layers > 1 {
			pos = float64(i)/float64(layers-1) - 0.5
		}
		size[i] = math.Exp(sizeSigma*rng.NormFloat64() + sizeTrend*pos)
		tm[i] = math.Exp(timeSigma*rng.NormFloat64() + timeTrend*pos)
		sumSize += size[i]
		sumTime += tm[i]
	}
	if giant >= 0 && layers > 1 {
		// The giant tensor holds frac of the model: size g with
		// g / (rest + g) = frac.
		frac := uni(0.1, 0.6)
		rest := sumSize - size[giant]
		size[giant] = frac / (1 - frac) * rest
		sumSize = rest + size[giant]
	}
	p := &model.Profile{Name: SyntheticName(seed), BatchSize: 32, Device: "synthetic", BytesPerParam: 4}
	fwd := compute / (1 + model.BackwardFactor)
	for i := range layers {
		name := fmt.Sprintf("layer%d", i)
		w := max(int64(1), int64(math.Round(params*size[i]/sumSize)))
		ts := []model.Tensor{{Name: name + ".weight", Params: w}}
		if rng.Float64() < 0.6 {
			ts = append(ts, model.Tensor{Name: name + ".bias", Params: max(int64(1), int64(float64(w)*logU(1e-3, 1e-2)))})
		}
		f := fwd * tm[i] / sumTime
		p.Layers = append(p.Layers, model.Layer{Name: name, ForwardS: f, BackwardS: model.BackwardFactor * f, Tensors: ts})
	}
	return p
}

// MetaProfile returns the profile of a scenario's model: a zoo model, or a
// synthetic one named by SyntheticName.
func MetaProfile(name string) (*model.Profile, error) {
	var seed uint64
	if _, err := fmt.Sscanf(name, SyntheticPrefix+"%d", &seed); err == nil && name == SyntheticName(seed) {
		return SyntheticProfile(seed), nil
	}
	return model.Get(name)
}
