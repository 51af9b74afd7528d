package sim

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/autobyte/autobyte/model"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/trace"
)

// Link rates and latency of the test matrices, as the CLI spells them.
const (
	gbps1     = 1.25e8  // 1 Gbps in bytes/s
	gbps10    = 1.25e9  // 10 Gbps
	gbps100   = 1.25e10 // 100 Gbps
	latency50 = 50e-6
	// shard4MB is the CLI's default big-array bound for parameter servers.
	shard4MB = 4_000_000
	// rel absorbs floating-point rounding when comparing a time to a bound.
	rel = 1e-9
)

// preset is one of the CLI's --scheduler choices.
type preset struct {
	name string
	cfg  sched.Config
}

// presets returns the CLI's scheduler presets for arch, plus bytescheduler
// under BytePS's strict admission rule.
func presets(arch Arch) []preset {
	part, credit := int64(4e6), int64(16e6)
	if arch == AllReduce {
		part, credit = 32e6, 64e6
	}
	bs := sched.Config{PartitionBytes: part, CreditBytes: credit, Order: sched.OrderPriority}
	strict := bs
	strict.Admission = sched.AdmitStrict
	return []preset{
		{"fifo", sched.Config{}},
		{"priority", sched.Config{Order: sched.OrderPriority}},
		{"bytescheduler", bs},
		{"bytescheduler-strict", strict},
	}
}

func profile(t testing.TB, name string) *model.Profile {
	t.Helper()
	p, err := model.Get(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// job returns a valid job with the CLI's defaults (4 MB shards for PS).
func job(p *model.Profile, arch Arch, workers, servers int, bw float64) Options {
	o := Options{Profile: p, Arch: arch, Workers: workers, Servers: servers,
		BandwidthBps: bw, LatencyS: latency50, Iterations: 6}
	if arch == PS {
		o.ShardBytes = shard4MB
	}
	return o
}

func run(t testing.TB, o Options) *Result {
	t.Helper()
	r, err := Run(o)
	if err != nil {
		t.Fatalf("Run(%s): %v", describe(o), err)
	}
	return r
}

// describe names a job in failure messages.
func describe(o Options) string {
	name := "<nil>"
	if o.Profile != nil {
		name = o.Profile.Name
	}
	return fmt.Sprintf("%s %v N=%d M=%d bw=%g sched=%+v shard=%d wire=%v",
		name, o.Arch, o.Workers, o.Servers, o.BandwidthBps, o.Sched, o.ShardBytes, o.Wire)
}

// topology is a worker/server count to run a model on.
type topology struct {
	arch             Arch
	workers, servers int
}

func (tp topology) String() string {
	if tp.arch == AllReduce {
		return fmt.Sprintf("allreduce-%d", tp.workers)
	}
	return fmt.Sprintf("ps-%dw%ds", tp.workers, tp.servers)
}

// matrixTopologies is the lower-bound matrix's topologies: PS with as many
// servers as workers, PS with a single (bottleneck) server, all-reduce.
func matrixTopologies(short bool) []topology {
	if short {
		return []topology{{PS, 8, 8}, {PS, 8, 1}, {AllReduce, 8, 0}}
	}
	return []topology{{PS, 8, 8}, {PS, 64, 64}, {PS, 8, 1}, {AllReduce, 8, 0}, {AllReduce, 64, 0}}
}

// TestLowerBoundHolds checks the bounds are bounds: no scheduler on any zoo
// model beats Bounds.MaxS in steady state, and no single iteration (not even
// the warm-up one) beats the fluid relaxation, which the bounds claim holds
// for every iteration's backward-communication-forward span.
func TestLowerBoundHolds(t *testing.T) {
	models := slices.DeleteFunc(model.Zoo(), func(n string) bool { return n == "toy3" })
	for _, m := range models {
		for _, tp := range matrixTopologies(testing.Short()) {
			for _, bw := range []float64{gbps1, gbps100} {
				for _, ps := range presets(tp.arch) {
					name := fmt.Sprintf("%s/%v/%gGbps/%s", m, tp, bw*8/1e9, ps.name)
					t.Run(name, func(t *testing.T) {
						t.Parallel()
						o := job(profile(t, m), tp.arch, tp.workers, tp.servers, bw)
						o.Sched = ps.cfg
						checkBounds(t, o, run(t, o))
					})
				}
			}
		}
	}
}

func checkBounds(t *testing.T, o Options, r *Result) {
	t.Helper()
	b := r.Bounds
	if r.IterationTimeS < b.MaxS*(1-rel) {
		t.Errorf("%s: steady-state iteration %.9g s beats the lower bound %.9g s (%+v)", describe(o), r.IterationTimeS, b.MaxS, b)
	}
	if len(r.IterationTimesS) != o.Iterations {
		t.Fatalf("%s: %d iteration times, want %d", describe(o), len(r.IterationTimesS), o.Iterations)
	}
	for k, it := range r.IterationTimesS {
		if it < b.FluidS*(1-rel) {
			t.Errorf("%s: iteration %d took %.9g s, below the fluid bound %.9g s", describe(o), k, it, b.FluidS)
		}
	}
}

// TestBytesConserved checks the network accounting: every byte a worker
// pushes arrives at a server and every byte a server answers arrives at a
// worker; each worker moves exactly its gradient each way per iteration, no
// matter how tensors are partitioned or sharded; and a ring all-reduce moves
// 2(N-1)/N of the gradient over each link.
func TestBytesConserved(t *testing.T) {
	// Partitions and shard sizes that divide no tensor, whole-element
	// splitting must still lose or duplicate nothing.
	const oddPart, oddShard = 999_999, 1_000_003
	parts := []int64{0, oddPart, 4e6}
	for _, m := range []string{"toy3", "resnet50", "bert-base", "vgg16"} {
		for _, part := range parts {
			cfg := sched.Config{PartitionBytes: part, CreditBytes: 2 * part, Order: sched.OrderPriority}
			for _, shard := range []int64{0, oddShard, shard4MB} {
				for _, servers := range []int{1, 3, 5} {
					o := job(profile(t, m), PS, 5, servers, gbps10)
					o.Sched, o.ShardBytes, o.Iterations = cfg, shard, 3
					checkPSBytes(t, o, run(t, o))
				}
			}
			for _, n := range []int{2, 3, 8} {
				o := job(profile(t, m), AllReduce, n, 0, gbps10)
				o.Sched, o.Iterations = cfg, 3
				checkRingBytes(t, o, run(t, o))
			}
		}
	}
}

func checkPSBytes(t *testing.T, o Options, r *Result) {
	t.Helper()
	l := r.Links
	if len(l.WorkerEgress) != o.Workers || len(l.WorkerIngress) != o.Workers ||
		len(l.ServerEgress) != o.Servers || len(l.ServerIngress) != o.Servers {
		t.Fatalf("%s: link counts %d/%d workers, %d/%d servers", describe(o),
			len(l.WorkerEgress), len(l.WorkerIngress), len(l.ServerEgress), len(l.ServerIngress))
	}
	want := o.Profile.TotalBytes() * int64(o.Iterations)
	for i := range o.Workers {
		if l.WorkerEgress[i] != want || l.WorkerIngress[i] != want {
			t.Errorf("%s: worker %d sent %d and received %d bytes, want %d each way",
				describe(o), i, l.WorkerEgress[i], l.WorkerIngress[i], want)
		}
	}
	if a, b := sum(l.WorkerEgress), sum(l.ServerIngress); a != b {
		t.Errorf("%s: workers pushed %d bytes but servers received %d", describe(o), a, b)
	}
	if a, b := sum(l.ServerEgress), sum(l.WorkerIngress); a != b {
		t.Errorf("%s: servers answered %d bytes but workers received %d", describe(o), a, b)
	}
}

func checkRingBytes(t *testing.T, o Options, r *Result) {
	t.Helper()
	l := r.Links
	if len(l.ServerEgress)+len(l.ServerIngress) != 0 {
		t.Errorf("%s: all-reduce reports server links %v %v", describe(o), l.ServerEgress, l.ServerIngress)
	}
	// The simulator sums each piece's float share and rounds once at the
	// end, so the total is the exact share to within rounding (half a byte)
	// plus a negligible accumulation error.
	n := int64(o.Workers)
	exact := float64(2*(n-1)*o.Profile.TotalBytes()*int64(o.Iterations)) / float64(n)
	for i := range o.Workers {
		eg, in := l.WorkerEgress[i], l.WorkerIngress[i]
		if eg != in || math.Abs(float64(eg)-exact) > 1 {
			t.Errorf("%s: worker %d sent %d and received %d bytes, want %.1f each way", describe(o), i, eg, in, exact)
		}
	}
}

func sum(xs []int64) int64 {
	var s int64
	for _, x := range xs {
		s += x
	}
	return s
}

// TestDeterminism checks that a run is a pure function of its options: the
// same seed reproduces the jittered timeline exactly, and the seed does
// reach the jitter.
func TestDeterminism(t *testing.T) {
	for _, tp := range []topology{{PS, 8, 8}, {AllReduce, 8, 0}} {
		o := job(profile(t, "resnet50"), tp.arch, tp.workers, tp.servers, gbps10)
		o.Sched = presets(tp.arch)[2].cfg
		o.Jitter, o.Seed = 0.2, 42
		a, b := run(t, o), run(t, o)
		if !slices.Equal(a.IterationTimesS, b.IterationTimesS) || a.Events != b.Events {
			t.Errorf("%v: same seed, different runs: %v (%d events) vs %v (%d events)",
				tp, a.IterationTimesS, a.Events, b.IterationTimesS, b.Events)
		}
		o.Seed = 43
		if c := run(t, o); slices.Equal(a.IterationTimesS, c.IterationTimesS) {
			t.Errorf("%v: seeds 42 and 43 gave identical iteration times %v", tp, c.IterationTimesS)
		}
	}
}

// TestJitterRespectsBound checks that jitter, which only slows compute
// steps, never makes an iteration beat the bounds of the jitter-free job.
func TestJitterRespectsBound(t *testing.T) {
	for _, tp := range []topology{{PS, 8, 8}, {PS, 8, 1}, {AllReduce, 8, 0}} {
		for _, ps := range presets(tp.arch) {
			for seed := range uint64(3) {
				o := job(profile(t, "resnet50"), tp.arch, tp.workers, tp.servers, gbps10)
				o.Sched = ps.cfg
				o.Jitter, o.Seed = 0.2, seed
				r := run(t, o)
				if r.Bounds != LowerBounds(o) {
					t.Errorf("%s: result bounds %+v differ from LowerBounds %+v", describe(o), r.Bounds, LowerBounds(o))
				}
				checkBounds(t, o, r)
			}
		}
	}
}

// TestBytesSchedulerBeatsFIFO checks the point of the project on the demo
// job: some bytescheduler setting of a small grid beats the unscheduled
// framework on a communication-heavy model.
func TestBytesSchedulerBeatsFIFO(t *testing.T) {
	o := job(profile(t, "vgg16"), PS, 8, 8, gbps10)
	o.Iterations = 10
	fifo := o
	fifoS := run(t, fifo).IterationTimeS
	best := math.Inf(1)
	for _, part := range []int64{1e6, 4e6, 16e6} {
		for _, credit := range []int64{4e6, 16e6, 64e6} {
			o.Sched = sched.Config{PartitionBytes: part, CreditBytes: credit, Order: sched.OrderPriority}
			best = min(best, run(t, o).IterationTimeS)
		}
	}
	// A 5% margin keeps the test about scheduling rather than noise-level
	// differences; the demo shows far more.
	if best > 0.95*fifoS {
		t.Errorf("best bytescheduler %.4g s per iteration, fifo %.4g s: want at least 5%% faster", best, fifoS)
	}
	t.Logf("vgg16 ps 8x8 10Gbps: fifo %.4g s, best bytescheduler %.4g s (%.2fx)", fifoS, best, fifoS/best)
}

// TestRandomJobs checks the bounds and the byte accounting on random small
// profiles, topologies and configurations, including corner cases the zoo
// never hits: 1-byte elements, zero-time layers, zero latency, one worker,
// 1-byte partitions, credit and shards.
func TestRandomJobs(t *testing.T) {
	seeds := uint64(600)
	if testing.Short() {
		seeds = 100
	}
	for seed := range seeds {
		o := randomJob(rand.New(rand.NewPCG(seed, 1)))
		r, err := runNoPanic(o)
		if err != nil {
			t.Fatalf("seed %d: %s: %v", seed, describe(o), err)
		}
		checkBounds(t, o, r)
		if o.Arch == PS {
			checkPSBytes(t, o, r)
		} else {
			checkRingBytes(t, o, r)
		}
		if t.Failed() {
			t.Fatalf("seed %d failed", seed)
		}
	}
}

func randomJob(r *rand.Rand) Options {
	pick := func(xs ...int64) int64 { return xs[r.IntN(len(xs))] }
	part := pick(0, 1, 7, 100_000, 999_999)
	// Tiny partitions make one piece per element: keep those tensors small.
	maxParams := int64(2_000_000)
	if part > 0 && part < 1000 {
		maxParams = 500
	}
	p := &model.Profile{Name: "random", BatchSize: 1, Device: "test", BytesPerParam: int(pick(1, 2, 4))}
	for l := range 1 + r.IntN(6) {
		layer := model.Layer{Name: fmt.Sprint("layer", l), ForwardS: r.Float64() * 0.01, BackwardS: r.Float64() * 0.02}
		if r.IntN(5) == 0 {
			layer.ForwardS = 0
		}
		for k := range 1 + r.IntN(3) {
			layer.Tensors = append(layer.Tensors, model.Tensor{Name: fmt.Sprintf("t%d.%d", l, k), Params: 1 + r.Int64N(maxParams)})
		}
		p.Layers = append(p.Layers, layer)
	}
	o := Options{Profile: p, Workers: 1 + r.IntN(9), BandwidthBps: float64(pick(1e6, 1e8, 1e10)),
		LatencyS: []float64{0, 1e-6, 1e-3}[r.IntN(3)], Iterations: 1 + r.IntN(6),
		Sched: sched.Config{PartitionBytes: part, CreditBytes: pick(0, 1, 100_000, 4_000_000),
			Order: sched.Order(r.IntN(2)), Admission: sched.Admission(r.IntN(2))}}
	if r.IntN(2) == 0 {
		o.Arch = AllReduce
	} else {
		o.Servers = 1 + r.IntN(9)
		o.ShardBytes = pick(0, 1, 3, 1000, 1_000_003)
		if r.IntN(3) == 0 {
			shares := make([]float64, o.Servers)
			for i := range shares {
				shares[i] = 0.1 + r.Float64()
			}
			o.Sched.ServerWeights, _ = sched.Weigh(shares) // 1..9 positive shares
		}
	}
	// Links of their own from iteration 0 on (so the bounds of iteration
	// 0's conditions hold for the steady state too).
	if r.IntN(3) == 0 {
		o.WorkerLinkTraces = map[int][]Step{r.IntN(o.Workers): {{0, o.BandwidthBps * (0.1 + r.Float64())}}}
	}
	if o.Servers > 0 && r.IntN(2) == 0 {
		o.ServerLinkTraces = map[int][]Step{r.IntN(o.Servers): {{0, o.BandwidthBps * (0.1 + 2*r.Float64())}}}
	}
	o.Wire = Wire(r.IntN(2)) // drawn last: the draws above pick the same jobs as before
	o.Sched.FusionBytes = pick(0, 0, 1000, 5_000_000)
	return o
}

// TestSingleWorkerAllReduce checks that one worker has nobody to reduce
// with: the iteration is pure compute and no byte crosses a link.
func TestSingleWorkerAllReduce(t *testing.T) {
	for _, m := range model.Zoo() {
		for _, ps := range presets(AllReduce) {
			p := profile(t, m)
			o := job(p, AllReduce, 1, 0, gbps1)
			o.Sched = ps.cfg
			r := run(t, o)
			compute := p.ForwardS() + p.BackwardS()
			for k, it := range r.IterationTimesS {
				if math.Abs(it-compute) > rel*compute {
					t.Errorf("%s: iteration %d took %.9g s, want compute %.9g s", describe(o), k, it, compute)
				}
			}
			if sum(r.Links.WorkerEgress) != 0 || sum(r.Links.WorkerIngress) != 0 {
				t.Errorf("%s: links carried %v out, %v in; want 0", describe(o), r.Links.WorkerEgress, r.Links.WorkerIngress)
			}
		}
	}
}

// TestInvalidOptions checks that each invalid field is refused with an
// error naming the offending value, and that Run never panics on it.
func TestInvalidOptions(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	cases := []invalidCase{
		{"nil profile", func(o *Options) { o.Profile = nil }, []string{"profile"}},
		{"invalid profile", func(o *Options) { o.Profile.Layers[1].Tensors = nil }, []string{"layer 1", "layer1", "tensor"}},
		{"workers 0", func(o *Options) { o.Workers = 0 }, []string{"workers", "got 0"}},
		{"workers negative", func(o *Options) { o.Workers = -3 }, []string{"workers", "-3"}},
		{"ps servers 0", func(o *Options) { o.Servers = 0 }, []string{"servers", "got 0"}},
		{"allreduce servers", func(o *Options) { o.Arch, o.Servers = AllReduce, 2 }, []string{"servers", "2"}},
		{"unknown arch", func(o *Options) { o.Arch = 7 }, []string{"architecture", "7"}},
		{"bandwidth 0", func(o *Options) { o.BandwidthBps = 0 }, []string{"bandwidth", "got 0"}},
		{"bandwidth negative", func(o *Options) { o.BandwidthBps = -5 }, []string{"bandwidth", "-5"}},
		{"bandwidth NaN", func(o *Options) { o.BandwidthBps = nan }, []string{"bandwidth", "NaN"}},
		{"bandwidth Inf", func(o *Options) { o.BandwidthBps = inf }, []string{"bandwidth", "+Inf"}},
		{"latency negative", func(o *Options) { o.LatencyS = -1e-3 }, []string{"latency", "-0.001"}},
		{"latency NaN", func(o *Options) { o.LatencyS = nan }, []string{"latency", "NaN"}},
		{"latency Inf", func(o *Options) { o.LatencyS = inf }, []string{"latency", "+Inf"}},
		{"message cost negative", func(o *Options) { o.MessageCostS = -2e-5 }, []string{"message cost", "-2e-05"}},
		{"message cost NaN", func(o *Options) { o.MessageCostS = nan }, []string{"message cost", "NaN"}},
		{"message cost Inf", func(o *Options) { o.MessageCostS = inf }, []string{"message cost", "+Inf"}},
		{"iterations 0", func(o *Options) { o.Iterations = 0 }, []string{"iterations", "got 0"}},
		{"jitter negative", func(o *Options) { o.Jitter = -0.5 }, []string{"jitter", "-0.5"}},
		{"jitter NaN", func(o *Options) { o.Jitter = nan }, []string{"jitter", "NaN"}},
		{"shard negative", func(o *Options) { o.ShardBytes = -1 }, []string{"shard", "-1"}},
		{"partition negative", func(o *Options) { o.Sched.PartitionBytes = -7 }, []string{"partition", "-7"}},
		{"credit negative", func(o *Options) { o.Sched.CreditBytes = -9 }, []string{"credit", "-9"}},
		{"unknown order", func(o *Options) { o.Sched.Order = 9 }, []string{"order", "9"}},
		{"unknown admission", func(o *Options) { o.Sched.Admission = 4 }, []string{"admission", "4"}},
	}
	checkRefused(t, cases)
}

// invalidCase is a change that makes a valid job invalid, and what Run's
// error must then mention.
type invalidCase struct {
	name   string
	mutate func(*Options)
	want   []string // substrings of the error
}

// checkRefused checks, case by case, that Run refuses toy3 on parameter
// servers so changed, with no result and an error that mentions every
// want.
func checkRefused(t *testing.T, cases []invalidCase) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := job(profile(t, "toy3"), PS, 2, 1, 1e6)
			c.mutate(&o)
			r, err := runNoPanic(o)
			if err == nil {
				t.Fatalf("Run accepted %s: %+v", c.name, r)
			}
			if r != nil {
				t.Errorf("Run returned a result with error %v", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// runNoPanic turns a panic in Run into an error so one bad case cannot hide
// the others.
func runNoPanic(o Options) (r *Result, err error) {
	defer func() {
		if p := recover(); p != nil {
			r, err = nil, fmt.Errorf("panic: %v", p)
		}
	}()
	return Run(o)
}

type traceEvent struct {
	Name string  `json:"name"`
	Cat  string  `json:"cat"`
	Ph   string  `json:"ph"`
	Ts   float64 `json:"ts"`
	Dur  float64 `json:"dur"`
	PID  int     `json:"pid"`
}

// TestTrace checks rank 0's timeline: valid JSON, one compute span per
// forward and backward layer (the backward passes of every iteration plus
// one more forward than backward, since the last forward closes the last
// iteration), never two at once, and one comm span per piece.
func TestTrace(t *testing.T) {
	for _, tp := range []topology{{PS, 2, 1}, {AllReduce, 2, 0}} {
		var buf bytes.Buffer
		p := profile(t, "toy3")
		o := job(p, tp.arch, tp.workers, tp.servers, 1e6)
		o.Sched = sched.Config{PartitionBytes: 500_000, CreditBytes: 1_000_000, Order: sched.OrderPriority}
		o.Iterations = 3
		o.Trace = trace.NewWriter(&buf)
		r := run(t, o)
		if err := o.Trace.Close(); err != nil {
			t.Fatal(err)
		}
		var doc struct{ TraceEvents []traceEvent }
		if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
			t.Fatalf("%v: trace is not valid JSON: %v\n%s", tp, err, buf.String())
		}
		var compute, comm []traceEvent
		for _, e := range doc.TraceEvents {
			switch {
			case e.Ph == "X" && e.Cat == "compute":
				compute = append(compute, e)
			case e.Ph == "X" && e.Cat == "comm":
				comm = append(comm, e)
			}
		}
		L := len(p.Layers)
		if want := 2*L*o.Iterations + L; len(compute) != want {
			t.Errorf("%v: %d compute spans, want %d", tp, len(compute), want)
		}
		names := map[string]int{}
		for _, e := range compute {
			names[e.Name]++
		}
		for l := range L {
			fw, bw := fmt.Sprintf("FW layer%d", l), fmt.Sprintf("BW layer%d", l)
			if names[fw] != o.Iterations+1 || names[bw] != o.Iterations {
				t.Errorf("%v: %d %q and %d %q spans, want %d and %d", tp, names[fw], fw, names[bw], bw, o.Iterations+1, o.Iterations)
			}
		}
		slices.SortFunc(compute, func(a, b traceEvent) int { return cmp.Compare(a.Ts, b.Ts) })
		for i := 1; i < len(compute); i++ {
			if prev := compute[i-1]; compute[i].Ts < prev.Ts+prev.Dur-1e-6 {
				t.Errorf("%v: %q at %v µs overlaps %q ending at %v µs", tp, compute[i].Name, compute[i].Ts, prev.Name, prev.Ts+prev.Dur)
			}
		}
		if want := r.Pieces * o.Iterations; len(comm) != want {
			t.Errorf("%v: %d comm spans, want %d (%d pieces × %d iterations)", tp, len(comm), want, r.Pieces, o.Iterations)
		}
	}
}
