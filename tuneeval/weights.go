package tuneeval

// Server weights for the static baselines. A scenario whose server links
// change has no single right placement: the best static configuration in
// hindsight must be searched over weights as well as over partition and
// credit, or a tuner that moves load would be measured against a straw
// man. The candidates are even weights, each phase's ideal weights (the
// servers' link rates then), the rates averaged over the run, and blends
// of each of those with even weights, so that a compromise between the
// phases is among them.

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/sim"
)

// weightBlends are the fractions of the way from even weights to a
// phase's ideal ones that are candidates too.
var weightBlends = []float64{1.0 / 3, 2.0 / 3}

// WeightCandidates are the server weights the static baselines of s are
// chosen from: even weights only, unless a server's link changes.
func (s Scenario) WeightCandidates() []sched.ServerWeights {
	o, err := s.Options()
	if err != nil {
		return []sched.ServerWeights{{}}
	}
	return WeightCandidates(o, s.Phases())
}

// WeightCandidates are the candidate server weights of a job o whose
// conditions are constant over each of phases: even weights, each
// phase's and the run's mean ideal weights, and their blends with even
// weights.
func WeightCandidates(o sim.Options, phases []Phase) []sched.ServerWeights {
	out := []sched.ServerWeights{{}}
	if o.Arch != sim.PS || o.Servers < 2 || len(o.ServerLinkTraces) == 0 {
		return out
	}
	add := func(shares []float64) {
		w, err := sched.Weigh(shares)
		if err == nil && !slices.Contains(out, w) {
			out = append(out, w)
		}
	}
	even := make([]float64, o.Servers)
	for i := range even {
		even[i] = 1
	}
	mean := make([]float64, o.Servers)
	var ideals [][]float64
	for _, ph := range phases {
		rates := make([]float64, o.Servers)
		var top float64
		for i := range rates {
			rates[i] = o.ServerRateAt(i, ph.From)
			top = max(top, rates[i])
		}
		for i := range rates {
			rates[i] /= top // the fastest at 1, like even weights
			mean[i] += rates[i] * float64(ph.To-ph.From) / float64(o.Iterations)
		}
		ideals = append(ideals, rates)
	}
	ideals = append(ideals, mean)
	for _, ideal := range ideals {
		add(ideal)
		for _, f := range weightBlends {
			blend := make([]float64, len(ideal))
			for i := range blend {
				blend[i] = (1-f)*even[i] + f*ideal[i]
			}
			add(blend)
		}
	}
	return out
}

// StaticCandidates are the configurations the best static configuration
// and the per-phase oracle of s are chosen from: the grid (Candidates)
// under each of its WeightCandidates.
func (s Scenario) StaticCandidates() []sched.Config {
	var out []sched.Config
	for _, w := range s.WeightCandidates() {
		for _, c := range Candidates() {
			c.ServerWeights = w
			out = append(out, c)
		}
	}
	return out
}

// linkPhase is the length of a LinkSuite scenario's phases.
const linkPhase = 80

// LinkSuite is the suite of server links that slow down for part of a
// run: 8 parameter-server jobs at 10 Gbps (ResNet-50, VGG16, BERT-base,
// GPT-2; 8 to 32 workers; 4 to 8 servers) where one or two servers' links
// run 4-10x slower for a third of the run or more, the cases of a NIC
// shared with another job or a rack behind a congested uplink. It was
// written down before any of its scenarios was run; the tuner's rule was
// developed on another job (tune's TestAutoByteFollowsSlowServer: VGG16,
// 8 workers, 4 servers, one link at 1/8).
func LinkSuite() []Scenario {
	const n = 3 * linkPhase
	window := func(slow string) string {
		return fmt.Sprintf("%d:%s,%d:10Gbps", linkPhase, slow, 2*linkPhase)
	}
	ps := func(m string, workers, servers int, kind string, links map[string]string) Scenario {
		return Scenario{Model: m, Arch: "ps", Workers: workers, Servers: servers, Bandwidth: steady, Kind: kind, LinkTraces: links, Iterations: n}
	}
	return named([]Scenario{
		ps("resnet50", 16, 4, "server1-10x", map[string]string{"server1": window("1Gbps")}),
		ps("vgg16", 16, 8, "server3-4x", map[string]string{"server3": window("2.5Gbps")}),
		ps("bert-base", 8, 4, "server0-8x", map[string]string{"server0": window("1.25Gbps")}),
		ps("gpt2", 32, 8, "server2-10x", map[string]string{"server2": window("1Gbps")}),
		// Two servers, slow over overlapping windows, at different rates.
		ps("vgg16", 8, 4, "two-servers", map[string]string{
			"server1": window("1Gbps"), "server2": fmt.Sprintf("%d:2.5Gbps,%d:10Gbps", linkPhase+linkPhase/2, 2*linkPhase+linkPhase/2)}),
		// Two servers of one rack behind a congested uplink.
		ps("resnet50", 32, 8, "rack-5x", map[string]string{"server1": window("2Gbps"), "server5": window("2Gbps")}),
		// Slow from the middle to the end: no recovery.
		ps("bert-base", 16, 8, "server7-6x-stays", map[string]string{"server7": fmt.Sprintf("%d:1.67Gbps", linkPhase)}),
		// One server slows, then another, in turn.
		ps("gpt2", 16, 4, "in-turn", map[string]string{"server3": window("1.25Gbps"), "server0": fmt.Sprintf("%d:2.5Gbps", 2*linkPhase)}),
	})
}

// TestbedLinkScenario is the link suite's job that the testbed runs for
// real (scripts/testbed-slow-server.sh): ResNet-50, 3 workers and 3
// servers at 1 Gbit/s, server 1's host cut to 250 Mbit/s for the middle
// third of 120 iterations.
func TestbedLinkScenario() Scenario {
	return named([]Scenario{{Model: "resnet50", Arch: "ps", Workers: 3, Servers: 3, Bandwidth: "1Gbps", Kind: "testbed-server1-4x",
		LinkTraces: map[string]string{"server1": "40:250Mbps,80:1Gbps"}, Iterations: 120}})[0]
}

// RandomLinkSuite draws n link scenarios from seed, the held-out check of
// the tuner's rule: jobs of LinkSuite's kind that the rule was not tuned
// on. Each is a parameter-server job of 3*linkPhase iterations:
//
//   - ResNet-50, VGG16, BERT-base or GPT-2 (even odds); 8, 16 or 32
//     workers; 4 or 8 servers (even odds);
//   - every link at 5-25 Gbps (log-uniform);
//   - one server's link (two, at odds of 1 in 3, each drawn on its own)
//     4-10x slower (log-uniform) from an iteration in [linkPhase/2,
//     linkPhase] for linkPhase to 3*linkPhase/2 iterations (uniform), or to
//     the end at odds of 1 in 4.
//
// The space was fixed before any of these scenarios was run. Names are
// lNN-MODEL-Nw-Ms-serverA-Fx[-serverB-Gx].
func RandomLinkSuite(n int, seed uint64) []Scenario {
	rng := rand.New(rand.NewPCG(seed, 0x6c696e6b)) // "link"
	logU := func(lo, hi float64) float64 { return logUniform(rng, lo, hi) }
	g := threeDigits
	models := []string{"resnet50", "vgg16", "bert-base", "gpt2"}
	const iters = 3 * linkPhase
	out := make([]Scenario, 0, n)
	for i := range n {
		s := Scenario{Model: models[rng.IntN(len(models))], Arch: "ps", Iterations: iters,
			Workers: []int{8, 16, 32}[rng.IntN(3)], Servers: []int{4, 8}[rng.IntN(2)], LinkTraces: map[string]string{}}
		rate := logU(5, 25) // Gbps
		s.Bandwidth = g(rate) + "Gbps"
		slow := 1
		if rng.IntN(3) == 0 {
			slow = 2
		}
		servers := rng.Perm(s.Servers)[:slow]
		var kind []string
		for _, srv := range servers {
			f := logU(4, 10)
			from := linkPhase/2 + rng.IntN(linkPhase/2+1)
			trace := fmt.Sprintf("%d:%sGbps", from, g(rate/f))
			if rng.IntN(4) != 0 {
				trace += fmt.Sprintf(",%d:%sGbps", from+linkPhase+rng.IntN(linkPhase/2+1), g(rate))
			}
			s.LinkTraces[fmt.Sprintf("server%d", srv)] = trace
			kind = append(kind, fmt.Sprintf("server%d-%sx", srv, g(f)))
		}
		s.Kind = strings.Join(kind, "-")
		s.Name = fmt.Sprintf("l%02d-%s-%dw-%ds-%s", i, s.Model, s.Workers, s.Servers, s.Kind)
		out = append(out, s)
	}
	return out
}
