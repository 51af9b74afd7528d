package job

import (
	"fmt"
	"strings"
	"testing"

	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/model"
	"github.com/autobyte/autobyte/proto"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/sim"
	"github.com/autobyte/autobyte/tune"
	"github.com/autobyte/autobyte/worker"
)

// conformanceProfile makes every decision a function of the protocol
// alone, not of timing. Credit binds within a layer (admission is
// exercised), but each backward layer computes for 200 ms, against a few
// milliseconds for the largest layer's pieces on a loaded loopback even
// under -race (80 ms once proved too little at a load average of 7, with
// PyTorch jobs sharing 2 cores), so a layer's pieces are all done before
// the next layer posts; tensors within a layer are posted in priority order, so an answer
// racing the next post changes nothing either. Within a layer, pieces in
// flight finish in any order on a real cluster: the scenarios' credit is
// chosen so that no completion order changes which piece starts next
// (TestConformanceIsTimingFree checks every order). (Where credit is
// contended across layers, which pieces start first depends on when
// answers arrive: there the two harnesses may differ by timing, as two
// real runs do.)
func conformanceProfile() *model.Profile {
	sizes := [][]int64{{1000, 7}, {3_333}, {12_001, 1}, {4_096}}
	p := &model.Profile{Name: "conformance", BatchSize: 1, Device: "none", BytesPerParam: 4}
	for l, ts := range sizes {
		layer := model.Layer{Name: fmt.Sprintf("l%d", l), ForwardS: 0.001, BackwardS: 0.200}
		for i, n := range ts {
			layer.Tensors = append(layer.Tensors, model.Tensor{Name: fmt.Sprintf("l%d.t%d", l, i), Params: n})
		}
		p.Layers = append(p.Layers, layer)
	}
	return p
}

// conformanceScenario is one scenario run through both harnesses.
type conformanceScenario struct {
	name             string
	arch             worker.Arch
	workers, servers int
	cfg              sched.Config
	// change, if set, is a configuration a scripted tuner proposes after
	// observing iteration 1, from iteration 3.
	change *sched.Config
}

func (c conformanceScenario) tuner() tune.Tuner {
	if c.change == nil {
		return nil
	}
	return &scripted{script: map[int]tune.Proposal{1: {Config: *c.change, FromIteration: 3}}}
}

const conformanceIterations = 5

// simulate runs c through the simulator and returns its decision log.
func (c conformanceScenario) simulate(t *testing.T, shardBytes int64) *proto.DecisionLog {
	t.Helper()
	log := proto.NewDecisionLog()
	o := sim.Options{Profile: conformanceProfile(), Arch: c.arch, Workers: c.workers, Servers: c.servers,
		BandwidthBps: 1e9, LatencyS: 50e-6, Sched: c.cfg, ShardBytes: shardBytes, Iterations: conformanceIterations, Decisions: log}
	if tn := c.tuner(); tn != nil {
		o.Tuner = tn
	}
	if _, err := sim.Run(o); err != nil {
		t.Fatalf("%s: simulator: %v", c.name, err)
	}
	return log
}

// runReal runs c as a real cluster on loopback and returns its decision
// log, with every sum verified.
func (c conformanceScenario) runReal(t *testing.T, shardBytes int64) *proto.DecisionLog {
	t.Helper()
	log := proto.NewDecisionLog()
	spec := Spec{Profile: conformanceProfile(), Arch: c.arch, Workers: c.workers, Servers: c.servers,
		Iterations: conformanceIterations, ShardBytes: shardBytes, Sched: c.cfg}
	_, err := runClusterWith(t, spec, func(r int) WorkerOptions {
		o := WorkerOptions{Rank: r, Verify: worker.VerifyFull, Decisions: log}
		if tn := c.tuner(); r == 0 && tn != nil {
			o.Tuning = TuningOptions{Tuner: tn}
		}
		return o
	})
	if err != nil {
		t.Fatalf("%s: real cluster: %v", c.name, err)
	}
	return log
}

const conformanceShardBytes = 5_000

func conformanceScenarios() []conformanceScenario {
	bs := sched.Config{PartitionBytes: 8_000, CreditBytes: 20_000, Order: sched.OrderPriority}
	finer := sched.Config{PartitionBytes: 3_000, CreditBytes: 9_000, Order: sched.OrderPriority, Admission: sched.AdmitStrict}
	compressed := bs
	compressed.Compression = dtype.BF16
	weighed := finer
	weighed.ServerWeights = sched.ServerWeights{4, 1, 2}
	// 20 kB fuses tensors 0-2 (layers 0 and 1) and 4-5 (layers 2 and 3).
	fused, fusedFiner := bs, finer
	fused.FusionBytes, fusedFiner.FusionBytes = 20_000, 20_000
	return []conformanceScenario{
		{name: "ps/fifo", arch: worker.PS, workers: 3, servers: 2, cfg: sched.Config{}},
		{name: "ps/bytescheduler", arch: worker.PS, workers: 3, servers: 2, cfg: bs},
		{name: "ps/bytescheduler+change", arch: worker.PS, workers: 3, servers: 2, cfg: bs, change: &finer},
		{name: "allreduce/fifo", arch: worker.AllReduce, workers: 3, cfg: sched.Config{}},
		{name: "allreduce/bytescheduler", arch: worker.AllReduce, workers: 3, cfg: bs},
		{name: "allreduce/bytescheduler+change", arch: worker.AllReduce, workers: 3, cfg: bs, change: &finer},
		{name: "ps/compression on", arch: worker.PS, workers: 3, servers: 2, cfg: bs, change: &compressed},
		{name: "allreduce/compression off", arch: worker.AllReduce, workers: 3, cfg: compressed, change: &bs},
		{name: "ps/fusion+change", arch: worker.PS, workers: 3, servers: 2, cfg: fused, change: &fusedFiner},
		{name: "allreduce/fusion", arch: worker.AllReduce, workers: 3, cfg: fused},
		{name: "ps/fusion on", arch: worker.PS, workers: 3, servers: 2, cfg: bs, change: &fused},
		{name: "allreduce/fusion off", arch: worker.AllReduce, workers: 3, cfg: fused, change: &bs},
		{name: "ps/server weights", arch: worker.PS, workers: 3, servers: 3, cfg: bs, change: &weighed},
	}
}

// TestConformance runs the same scenarios (parameter servers and ring;
// fifo and bytescheduler; a tuner's change at a stated iteration) through
// the simulator and through a real loopback cluster: both drive the same
// protocol machines, so the decision logs (the order in which every
// connection of every worker starts pieces, and the epochs with the
// iteration each applies from) must be identical.
func TestConformance(t *testing.T) {
	for _, c := range conformanceScenarios() {
		t.Run(c.name, func(t *testing.T) {
			simLog := c.simulate(t, conformanceShardBytes)
			realLog := c.runReal(t, conformanceShardBytes)
			if d := proto.Diff(simLog, realLog); d != "" {
				t.Fatalf("simulator and runtime decided differently: %s", d)
			}
			n := len(simLog.Lines())
			if n == 0 {
				t.Fatal("empty decision logs")
			}
			if c.change != nil && !hasEpoch(simLog, fmt.Sprintf("epoch 1 from 3 partition %d", c.change.PartitionBytes)) {
				t.Errorf("the logs do not show the change from iteration 3: %v", simLog.Lines())
			}
		})
	}
}

func hasEpoch(log *proto.DecisionLog, prefix string) bool {
	for _, l := range log.Lines() {
		if strings.Contains(l, prefix) {
			return true
		}
	}
	return false
}

// TestConformanceCatchesDivergence is the negative control: a planted
// divergence between the two harnesses (the runtime places shards under
// another big-array bound; the simulator's tuner makes no change) makes the comparison fail.
func TestConformanceCatchesDivergence(t *testing.T) {
	sc := conformanceScenarios()
	ps := sc[1]
	if d := proto.Diff(ps.simulate(t, conformanceShardBytes), ps.runReal(t, 2*conformanceShardBytes)); d == "" {
		t.Error("a runtime that shards pieces otherwise than the simulator went unnoticed")
	}
	changed := sc[5]
	unchanged := changed
	unchanged.change = nil
	if d := proto.Diff(unchanged.simulate(t, 0), changed.runReal(t, 0)); d == "" {
		t.Error("a configuration change the simulator did not make went unnoticed")
	}
	// A runtime that kept even weights where the simulator moved load.
	weighed := sc[len(sc)-1]
	even := weighed
	cfg := *weighed.change
	cfg.ServerWeights = sched.ServerWeights{}
	even.change = &cfg
	if d := proto.Diff(weighed.simulate(t, conformanceShardBytes), even.runReal(t, conformanceShardBytes)); d == "" {
		t.Errorf("a runtime that placed by bytes where the simulator weighed the servers went unnoticed (diff %q)", d)
	}
}
