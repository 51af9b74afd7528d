package sim

import (
	"math"
	"strings"
	"testing"

	"github.com/autobyte/autobyte/model"
)

// pushArrivals runs one iteration of a one-tensor job with no compute and
// no latency and returns when the pushes arrived at the server, in order.
func pushArrivals(t *testing.T, o Options) []float64 {
	t.Helper()
	var arrivals []float64
	runPushes(t, o, func(s *simulation, _ pieceKey) { arrivals = append(arrivals, s.now) })
	return arrivals
}

// runPushes runs job o, calling pushed at every push that reaches a
// server.
func runPushes(t *testing.T, o Options, pushed func(s *simulation, k pieceKey)) {
	t.Helper()
	s, err := newSimulation(o)
	if err != nil {
		t.Fatal(err)
	}
	s.pushed = func(_ int32, k pieceKey, _ int64) { pushed(s, k) }
	if _, err := s.run(); err != nil {
		t.Fatal(err)
	}
}

func oneTensorJob(workers int, wire Wire) Options {
	p := &model.Profile{Name: "one", BatchSize: 1, Device: "none", BytesPerParam: 4,
		Layers: []model.Layer{{Name: "l0", Tensors: []model.Tensor{{Name: "t0", Params: 250_000}}}}}
	return Options{Profile: p, Arch: PS, Workers: workers, Servers: 1, BandwidthBps: 1e6, Iterations: 1, Wire: wire}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

// TestConnectionsShareLinks: two workers push 1 MB each to one server at
// 1 MB/s at the same moment. Under WireConnections the two connections
// share the server's ingress, so both pushes arrive at 2 s; the host model
// (the control, which a broken sharing rule would match) serves them one
// after the other, at 1 s and 2 s.
func TestConnectionsShareLinks(t *testing.T) {
	for _, c := range []struct {
		wire Wire
		want []float64
	}{
		{WireConnections, []float64{2, 2}},
		{WireHost, []float64{1, 2}},
	} {
		got := pushArrivals(t, oneTensorJob(2, c.wire))
		if len(got) != 2 || !near(got[0], c.want[0]) || !near(got[1], c.want[1]) {
			t.Errorf("%v: pushes arrived at %v s, want %v", c.wire, got, c.want)
		}
	}
}

// TestConnectionsMaxMinFair: worker 1's link runs at a quarter of the
// rate, so its push can use only 0.25 MB/s of the server's 1 MB/s and
// max-min fairness gives the other 0.75 MB/s to worker 0 (an equal split
// would give it 0.5). Worker 0's 1 MB arrives at 4/3 s; by then worker 1
// sent 1/3 MB and sends the rest at its own 0.25 MB/s: 4 s in all.
func TestConnectionsMaxMinFair(t *testing.T) {
	o := oneTensorJob(2, WireConnections)
	o.WorkerLinkTraces = map[int][]Step{1: {{0, 0.25e6}}}
	got := pushArrivals(t, o)
	if want := []float64{4.0 / 3, 4}; len(got) != 2 || !near(got[0], want[0]) || !near(got[1], want[1]) {
		t.Errorf("pushes arrived at %v s, want %v", got, want)
	}
}

// TestConnectionsMessageCost: the fixed cost per message holds the
// message on its connection before its bytes flow.
func TestConnectionsMessageCost(t *testing.T) {
	o := oneTensorJob(1, WireConnections)
	o.MessageCostS = 0.5
	if got := pushArrivals(t, o); len(got) != 1 || !near(got[0], 1.5) {
		t.Errorf("push arrived at %v s, want [1.5]", got)
	}
}

// TestConnectionsOneLinkEach: where every host talks over one connection
// the two wires agree exactly (1 worker, 1 server, the zoo's ResNet-50).
func TestConnectionsOneLinkEach(t *testing.T) {
	o := job(profile(t, "resnet50"), PS, 1, 1, gbps1)
	for _, p := range presets(PS) {
		o.Sched = p.cfg
		host := run(t, o)
		o.Wire = WireConnections
		conn := run(t, o)
		o.Wire = WireHost
		for k := range host.IterationTimesS {
			if !near(conn.IterationTimesS[k], host.IterationTimesS[k]) {
				t.Errorf("%s: iteration %d took %v s on connections, %v s on the host model", p.name, k, conn.IterationTimesS[k], host.IterationTimesS[k])
			}
		}
	}
}

func TestParseWire(t *testing.T) {
	for _, w := range []Wire{WireHost, WireConnections} {
		if got, err := ParseWire(w.String()); err != nil || got != w {
			t.Errorf("ParseWire(%q) = %v, %v", w.String(), got, err)
		}
	}
	if _, err := ParseWire("tcp"); err == nil || !strings.Contains(err.Error(), `"tcp"`) {
		t.Errorf("ParseWire(tcp): error %v, want one naming the value", err)
	}
	o := oneTensorJob(1, Wire(7))
	if _, err := Run(o); err == nil || !strings.Contains(err.Error(), "Wire(7)") {
		t.Errorf("Run with wire 7: error %v, want one naming it", err)
	}
}
