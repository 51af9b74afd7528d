package proto

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/tune"
)

// threeLayers: layer 0 has tensors 0 and 1, layer 1 tensor 2, layer 2
// tensor 3; sizes are awkward on purpose.
var threeLayers = []Tensor{{Layer: 0, Bytes: 400}, {Layer: 0, Bytes: 36}, {Layer: 1, Bytes: 1000}, {Layer: 2, Bytes: 8}}

var prio = sched.Config{PartitionBytes: 200, CreditBytes: 400, Order: sched.OrderPriority}

func newWorker(t *testing.T, cfg Config) *Worker {
	t.Helper()
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// pushes are the Push messages of r.
func pushes(r Ready) []Message {
	var out []Message
	for _, m := range r.Messages {
		if m.Kind == Push {
			out = append(out, m)
		}
	}
	return out
}

// answerAll answers every push of r, one shard at a time, and returns the
// gates opened along the way.
func answerAll(t *testing.T, w *Worker, r Ready) []Gate {
	t.Helper()
	var gates []Gate
	queue := pushes(r)
	for len(queue) > 0 {
		m := queue[0]
		queue = queue[1:]
		must(t, w.Answered(m.Piece.PieceID))
		next := w.Ready()
		gates = append(gates, next.Opened...)
		queue = append(queue, pushes(next)...)
	}
	return gates
}

// TestGatesPerLayerAndBarrier: under priority order each layer's gate opens
// when its own tensors are summed; under fifo (a global barrier) every gate
// of an iteration opens together, only when the last tensor is summed.
func TestGatesPerLayerAndBarrier(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  sched.Config
		want []Gate
	}{
		// Backward posts layer 2, then 1, then 0; with no window every
		// piece starts at once and answers come back in start order.
		{"priority", sched.Config{Order: sched.OrderPriority}, []Gate{{2, 0}, {1, 0}, {0, 0}}},
		{"fifo", sched.Config{}, []Gate{{0, 0}, {1, 0}, {2, 0}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorker(t, Config{Workers: 1, Arch: PS, Servers: 1, Tensors: threeLayers, Sched: c.cfg})
			var got []Gate
			for _, tensor := range []int{3, 2, 1, 0} {
				must(t, w.Post(tensor, 0))
				got = append(got, answerAll(t, w, w.Ready())...)
				if c.name == "fifo" && tensor != 0 && len(got) > 0 {
					t.Fatalf("fifo opened %v before the iteration's last tensor was summed", got)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("gates opened %v, want %v", got, c.want)
			}
		})
	}
}

// TestPostingSchedule: a binding's broadcast tensors (posted in iteration
// 0 only) and the gradients broadcast through them (posted from iteration
// 1 on) do not hold up any iteration's gates, under fifo's barrier either,
// and the machine forgets every iteration it completes. Posting a tensor
// in an iteration its schedule excludes is refused, naming both. As the
// negative control, the same tensors all posted every iteration leave
// fifo's barrier of iteration 1 shut when the broadcast tensor is not
// posted: the hang the schedule prevents.
func TestPostingSchedule(t *testing.T) {
	tensors := []Tensor{{Layer: 0, Bytes: 40, Posted: AfterFirst}, {Layer: 1, Bytes: 80}, {Layer: 2, Bytes: 120, Posted: FirstOnly}}
	for _, c := range []struct {
		name string
		cfg  sched.Config
	}{{"priority", sched.Config{Order: sched.OrderPriority}}, {"fifo", sched.Config{}}} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorker(t, Config{Workers: 1, Arch: PS, Servers: 1, Tensors: tensors, Sched: c.cfg})
			opened := map[Gate]bool{}
			post := func(tensor, k int) {
				must(t, w.Post(tensor, k))
				for _, g := range answerAll(t, w, w.Ready()) {
					opened[g] = true
				}
			}
			post(2, 0)
			post(1, 0)
			for k := 1; k <= 3; k++ {
				post(1, k)
				post(0, k)
			}
			for _, g := range []Gate{{1, 0}, {2, 0}, {0, 3}, {1, 3}} {
				if !opened[g] {
					t.Errorf("gate %v never opened (opened %v)", g, opened)
				}
			}
			if n := len(w.layerLeft); n != 0 {
				t.Errorf("%d iterations still tracked after all completed: %v", n, w.layerLeft)
			}
			err := w.Post(2, 4)
			if err == nil || !strings.Contains(err.Error(), "tensor 2") || !strings.Contains(err.Error(), "iteration 0 only") {
				t.Errorf("posting a first-only tensor in iteration 4: %v", err)
			}
			if err := w.Post(0, 0); err == nil || !strings.Contains(err.Error(), "every iteration after 0") {
				t.Errorf("posting an after-first tensor in iteration 0: %v", err)
			}
		})
	}
	every := []Tensor{{Layer: 0, Bytes: 40}, {Layer: 1, Bytes: 80}, {Layer: 2, Bytes: 120}}
	w := newWorker(t, Config{Workers: 1, Arch: PS, Servers: 1, Tensors: every, Sched: sched.Config{}})
	for _, tensor := range []int{2, 1, 0} {
		must(t, w.Post(tensor, 0))
		answerAll(t, w, w.Ready())
	}
	var gates []Gate
	for _, tensor := range []int{1, 0} {
		must(t, w.Post(tensor, 1))
		gates = append(gates, answerAll(t, w, w.Ready())...)
	}
	if len(gates) != 0 {
		t.Errorf("negative control: fifo opened %v of iteration 1 without its third tensor", gates)
	}
	if _, err := New(Config{Workers: 1, Arch: PS, Servers: 1, Tensors: []Tensor{{Layer: 0, Bytes: 4, Posted: 7}}}); err == nil || !strings.Contains(err.Error(), "Iterations(7)") {
		t.Errorf("New with posting schedule 7: %v", err)
	}
}

// TestShardCountdown: a piece sharded over three servers is done only when
// all three shards were answered.
func TestShardCountdown(t *testing.T) {
	w := newWorker(t, Config{Workers: 1, Arch: PS, Servers: 3, ShardBytes: 100, Tensors: []Tensor{{Layer: 0, Bytes: 300}},
		Sched: sched.Config{Order: sched.OrderPriority}})
	must(t, w.Post(0, 0))
	r := w.Ready()
	ps := pushes(r)
	servers := map[int]bool{}
	var total int64
	for i, m := range ps {
		servers[m.Server] = true
		total += m.Bytes
		if m.Shard != i {
			t.Errorf("push %d is shard %d", i, m.Shard)
		}
	}
	if len(ps) != 3 || len(servers) != 3 || total != 300 {
		t.Fatalf("pushes %+v: want 3 shards of the 300-byte piece on 3 distinct servers", ps)
	}
	for i := range 2 {
		must(t, w.Answered(ps[i].Piece.PieceID))
		if r := w.Ready(); len(r.Finished)+len(r.Synced)+len(r.Opened) != 0 {
			t.Fatalf("after %d of 3 shards: %+v", i+1, r)
		}
	}
	must(t, w.Answered(ps[2].Piece.PieceID))
	r = w.Ready()
	if len(r.Finished) != 1 || len(r.Synced) != 1 || len(r.Opened) != 1 {
		t.Fatalf("after the last shard: %+v, want the piece finished, the tensor synced and layer 0 open", r)
	}
	if err := w.Answered(ps[2].Piece.PieceID); err == nil || !strings.Contains(err.Error(), "not in flight") {
		t.Errorf("a fourth answer: %v, want it refused as not in flight", err)
	}
}

// TestServerWeightsMoveBytes: a configuration change to weights moves the
// bytes of the iterations it applies to, and only those: iteration 0 is
// placed evenly, iteration 1 (the new epoch) by the weights.
func TestServerWeightsMoveBytes(t *testing.T) {
	var tensors []Tensor
	for l := range 40 {
		tensors = append(tensors, Tensor{Layer: l, Bytes: 4000})
	}
	w := newWorker(t, Config{Workers: 1, Arch: PS, Servers: 2, Tensors: tensors, Sched: sched.Config{Order: sched.OrderPriority}})
	if _, err := w.Reconfigure(sched.Config{Order: sched.OrderPriority, ServerWeights: sched.ServerWeights{3, 1}}, 1); err != nil {
		t.Fatal(err)
	}
	for k := range 2 {
		load := make([]int64, 2)
		for i := len(tensors) - 1; i >= 0; i-- {
			must(t, w.Post(i, k))
			r := w.Ready()
			for _, m := range pushes(r) {
				load[m.Server] += m.Bytes
			}
			answerAll(t, w, r)
		}
		want := []int64{80_000, 80_000}
		if k == 1 {
			want = []int64{120_000, 40_000}
		}
		if load[0] != want[0] || load[1] != want[1] {
			t.Errorf("iteration %d: servers got %v bytes, want %v", k, load, want)
		}
	}
}

// TestPriorityKey: fifo travels in production order, the others by
// (layer, tensor, piece).
func TestPriorityKey(t *testing.T) {
	for _, c := range []struct {
		cfg  sched.Config
		fifo bool
	}{{sched.Config{}, true}, {sched.Config{PartitionBytes: 200, Order: sched.OrderPriority}, false}} {
		w := newWorker(t, Config{Workers: 1, Arch: PS, Servers: 1, Tensors: threeLayers, Sched: c.cfg})
		var msgs []Message
		for _, tensor := range []int{3, 2, 1, 0} {
			must(t, w.Post(tensor, 0))
			msgs = append(msgs, pushes(w.Ready())...)
		}
		for i, m := range msgs {
			want := PriorityKey(m.Piece)
			if c.fifo {
				want = uint64(i + 1)
			}
			if m.Priority != want {
				t.Errorf("%v: message %d (%+v) has priority %d, want %d", c.cfg.Order, i, m.Piece.PieceID, m.Priority, want)
			}
		}
	}
	a := PriorityKey(sched.Piece{PieceID: sched.PieceID{Tensor: 5, Index: 9}, Layer: 0})
	b := PriorityKey(sched.Piece{PieceID: sched.PieceID{Tensor: 0, Index: 0}, Layer: 1})
	if a >= b {
		t.Errorf("layer 0's key %d is not below layer 1's %d", a, b)
	}
}

// cluster is an in-memory job of one leader and followers with perfect
// servers: every push is answered once every worker pushed it. Messages
// are delivered in a random order (announcements in order per follower,
// as on one connection).
type cluster struct {
	t       *testing.T
	ws      []*Worker
	rng     *rand.Rand
	ctl     [][]Message // per follower, in order
	pending map[string]int
	due     []Message // answers to deliver, per worker below
	dueTo   []int
	starts  [][]sched.PieceID // per worker, in start order
	epochs  [][]Epoch
}

func newCluster(t *testing.T, n int, cfg Config, seed uint64) *cluster {
	c := &cluster{t: t, rng: rand.New(rand.NewPCG(seed, 1)), ctl: make([][]Message, n), pending: map[string]int{},
		starts: make([][]sched.PieceID, n), epochs: make([][]Epoch, n)}
	for r := range n {
		cfg.Rank, cfg.Workers = r, n
		c.ws = append(c.ws, newWorker(t, cfg))
	}
	return c
}

func (c *cluster) collect(r int) {
	rd := c.ws[r].Ready()
	c.epochs[r] = append(c.epochs[r], rd.Epochs...)
	for _, s := range rd.Started {
		c.starts[r] = append(c.starts[r], s.Piece.PieceID)
	}
	for _, m := range rd.Messages {
		switch m.Kind {
		case Announce, AnnounceEpoch:
			for f := 1; f < len(c.ws); f++ {
				c.ctl[f] = append(c.ctl[f], m)
			}
		case Push:
			k := fmt.Sprint(m.Piece.Epoch, m.Piece.PieceID, m.Shard)
			c.pending[k]++
			if c.pending[k] == len(c.ws) {
				delete(c.pending, k)
				for w := range c.ws {
					c.due, c.dueTo = append(c.due, m), append(c.dueTo, w)
				}
			}
		}
	}
}

// postIteration has every rank post its n tensors of iteration it in a
// random order, delivering random messages in between, then delivers
// every message left.
func (c *cluster) postIteration(it, n int) {
	for r := range c.ws {
		for _, tensor := range c.rng.Perm(n) {
			must(c.t, c.ws[r].Post(tensor, it))
			c.collect(r)
			for c.rng.IntN(3) == 0 && c.step() {
			}
		}
	}
	for c.step() {
	}
}

// step delivers one random message; false when none is left.
func (c *cluster) step() bool {
	var choices []int // -1-f: control for follower f; i >= 0: answer i
	for f := 1; f < len(c.ws); f++ {
		if len(c.ctl[f]) > 0 {
			choices = append(choices, -1-f)
		}
	}
	for i := range c.due {
		choices = append(choices, i)
	}
	if len(choices) == 0 {
		return false
	}
	ch := choices[c.rng.IntN(len(choices))]
	if ch < 0 {
		f := -1 - ch
		m := c.ctl[f][0]
		c.ctl[f] = c.ctl[f][1:]
		if m.Kind == AnnounceEpoch {
			must(c.t, c.ws[f].EpochAnnounced(m.Epoch))
		} else {
			must(c.t, c.ws[f].Announced(m.Piece))
		}
		c.collect(f)
		return true
	}
	m, w := c.due[ch], c.dueTo[ch]
	c.due = append(c.due[:ch], c.due[ch+1:]...)
	c.dueTo = append(c.dueTo[:ch], c.dueTo[ch+1:]...)
	must(c.t, c.ws[w].Answered(m.Piece.PieceID))
	c.collect(w)
	return true
}

// TestFollowersStartTheLeadersOrder drives leader and followers with
// random delivery orders and posting orders, a configuration change
// included: every worker starts the same pieces in the same order, learns
// the same epochs, and every iteration completes.
func TestFollowersStartTheLeadersOrder(t *testing.T) {
	tensors := []Tensor{{Layer: 0, Bytes: 4000}, {Layer: 1, Bytes: 1204}, {Layer: 1, Bytes: 8}, {Layer: 2, Bytes: 9996}}
	for seed := range uint64(30) {
		c := newCluster(t, 3, Config{Arch: PS, Servers: 2, ShardBytes: 1500, Tensors: tensors, Sched: prio}, seed)
		for it := range 4 {
			if it == 1 {
				if _, err := c.ws[0].Reconfigure(sched.Config{PartitionBytes: 1000, CreditBytes: 2500, Order: sched.OrderPriority}, 2); err != nil {
					t.Fatal(err)
				}
				c.collect(0)
			}
			c.postIteration(it, len(tensors))
		}
		for r := 1; r < len(c.ws); r++ {
			if !slices.Equal(c.starts[r], c.starts[0]) {
				t.Fatalf("seed %d: worker %d started %v, the leader %v", seed, r, c.starts[r], c.starts[0])
			}
			if fmt.Sprint(c.epochs[r]) != fmt.Sprint(c.epochs[0]) {
				t.Fatalf("seed %d: worker %d learned epochs %v, the leader accepted %v", seed, r, c.epochs[r], c.epochs[0])
			}
		}
		for r, w := range c.ws {
			if w.InFlightBytes() != 0 || len(w.layerLeft) != 0 {
				t.Fatalf("seed %d: worker %d ends with %d bytes in flight and %d iterations unsynced", seed, r, w.InFlightBytes(), len(w.layerLeft))
			}
			for l, k := range w.synced {
				if k != 3 {
					t.Errorf("seed %d: worker %d layer %d synced up to iteration %d, want 3", seed, r, l, k)
				}
			}
		}
	}
}

// TestEpochBeforeItsPieces: the leader announces a new epoch before any
// piece cut under it.
func TestEpochBeforeItsPieces(t *testing.T) {
	w := newWorker(t, Config{Workers: 2, Arch: AllReduce, Tensors: threeLayers, Sched: prio})
	if _, err := w.Reconfigure(sched.Config{PartitionBytes: 100, Order: sched.OrderPriority}, 0); err != nil {
		t.Fatal(err)
	}
	must(t, w.Post(3, 0))
	r := w.Ready()
	if len(r.Messages) < 3 || r.Messages[0].Kind != AnnounceEpoch || r.Messages[0].Epoch.Number != 1 {
		t.Fatalf("messages %+v: want the epoch announced first", r.Messages)
	}
	for _, m := range r.Messages[1:] {
		if m.Piece.Epoch != 1 {
			t.Errorf("message %+v: want a piece of epoch 1", m)
		}
	}
}

// TestOneWorkerRing: a one-rank ring has nothing to send: pieces finish as
// they start.
func TestOneWorkerRing(t *testing.T) {
	w := newWorker(t, Config{Workers: 1, Arch: AllReduce, Tensors: threeLayers, Sched: prio})
	for _, tensor := range []int{3, 2, 1, 0} {
		must(t, w.Post(tensor, 0))
	}
	r := w.Ready()
	if len(r.Messages) != 0 || len(r.Started) != len(r.Finished) || len(r.Synced) != 4 || len(r.Opened) != 3 {
		t.Fatalf("one-rank ring: %+v", r)
	}
}

// TestElementSize: pieces and shards of 2-byte tensors hold whole
// elements.
func TestElementSize(t *testing.T) {
	w := newWorker(t, Config{Workers: 1, Arch: PS, Servers: 3, ShardBytes: 7, Tensors: []Tensor{{Layer: 0, Bytes: 30, ElemBytes: 2}},
		Sched: sched.Config{PartitionBytes: 11, Order: sched.OrderPriority}})
	must(t, w.Post(0, 0))
	var total int64
	for _, m := range pushes(w.Ready()) {
		if m.Bytes%2 != 0 || m.Offset%2 != 0 || m.Piece.Bytes%2 != 0 {
			t.Errorf("push %+v cuts a 2-byte element", m)
		}
		total += m.Bytes
	}
	if total != 30 {
		t.Errorf("pushes carry %d bytes, want 30", total)
	}
}

// ParseArch reads back every name String prints, and only those.
func TestArchNames(t *testing.T) {
	for _, a := range []Arch{PS, AllReduce} {
		if got, err := ParseArch(a.String()); got != a || err != nil {
			t.Errorf("ParseArch(%q) = %v, %v; want %v", a.String(), got, err, a)
		}
	}
	if got := Arch(7).String(); got != "Arch(7)" {
		t.Errorf("Arch(7).String() = %q", got)
	}
	if _, err := ParseArch("ring"); err == nil || err.Error() != `unknown architecture "ring" (want ps or allreduce)` {
		t.Errorf("ParseArch(\"ring\"): %v", err)
	}
}

func TestBadInput(t *testing.T) {
	good := Config{Workers: 2, Arch: PS, Servers: 1, Tensors: threeLayers}
	for _, c := range []struct {
		name   string
		change func(*Config)
		want   []string
	}{
		{"rank", func(c *Config) { c.Rank = 2 }, []string{"rank 2", "2 workers"}},
		{"no servers", func(c *Config) { c.Servers = 0 }, []string{"server", "0"}},
		{"no tensors", func(c *Config) { c.Tensors = nil }, []string{"no tensors"}},
		{"gap", func(c *Config) { c.Tensors = []Tensor{{Layer: 1, Bytes: 4}} }, []string{"layer 0 has no tensors"}},
		{"half element", func(c *Config) { c.Tensors = []Tensor{{Layer: 0, Bytes: 5}} }, []string{"tensor 0", "5 bytes", "4-byte"}},
		{"arch", func(c *Config) { c.Arch = 7 }, []string{"architecture 7"}},
		{"shard", func(c *Config) { c.ShardBytes = -1 }, []string{"shard", "-1"}},
		{"credit", func(c *Config) { c.Sched.CreditBytes = -4 }, []string{"credit", "-4"}},
		{"weights", func(c *Config) { c.Sched.ServerWeights = sched.ServerWeights{1, 2} }, []string{"1:2", "weigh 2 servers, the job has 1"}},
		{"ring weights", func(c *Config) { c.Arch, c.Servers, c.Sched.ServerWeights = AllReduce, 0, sched.ServerWeights{1, 2} }, []string{"all-reduce"}},
	} {
		cfg := good
		c.change(&cfg)
		_, err := New(cfg)
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: err = %v, want it to name %q", c.name, err, w)
			}
		}
	}
	leader := newWorker(t, good)
	follower := newWorker(t, Config{Rank: 1, Workers: 2, Arch: PS, Servers: 1, Tensors: threeLayers})
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"tensor out of range", leader.Post(9, 0), "tensor 9"},
		{"negative iteration", leader.Post(0, -1), "iteration -1"},
		{"follower reconfigures", second(follower.Reconfigure(prio, 3)), "only rank 0"},
		{"leader weighs 3 of 1 servers", second(leader.Reconfigure(sched.Config{Order: sched.OrderPriority, ServerWeights: sched.ServerWeights{1, 1, 2}}, 3)), "weigh 3 servers, the job has 1"},
		{"follower told 2 weights", follower.EpochAnnounced(Epoch{Number: 1, From: 5, Config: sched.Config{ServerWeights: sched.ServerWeights{3, 1}}}), "the job has 1"},
		{"leader announced to", leader.Announced(sched.Piece{}), "leader"},
		{"epoch skipped", follower.EpochAnnounced(Epoch{Number: 2, From: 5}), "epoch 2"},
		{"unknown epoch", follower.Announced(sched.Piece{Epoch: 3, Count: 1}), "epoch 3"},
		{"piece cut otherwise", follower.Announced(sched.Piece{PieceID: sched.PieceID{Tensor: 0}, Count: 2, Bytes: 200}), "1 pieces"},
		{"ring done on PS", leader.RingDone(sched.PieceID{}), "parameter-server"},
	} {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%s: err = %v, want it to name %q", c.name, c.err, c.want)
		}
	}
}

func second(_ Epoch, err error) error { return err }

// TestSchedule is the one rule for tuners' proposals.
func TestSchedule(t *testing.T) {
	history := []tune.ConfigChange{{Config: prio}, {FromIteration: 6, Config: prio}}
	for _, c := range []struct {
		name string
		p    tune.Proposal
		k    int
		want string // "" = accepted
	}{
		{"at k+Lead after the last change", tune.Proposal{Config: prio, FromIteration: 7}, 5, ""},
		{"next iteration", tune.Proposal{Config: prio, FromIteration: 8}, 7, "too late, it must apply from iteration 9 or later"},
		{"before the last change", tune.Proposal{Config: prio, FromIteration: 6}, 2, "after the change from iteration 6"},
		{"invalid", tune.Proposal{Config: sched.Config{PartitionBytes: -2}, FromIteration: 9}, 1, "-2"},
	} {
		ch, err := Schedule(history, c.p, c.k, "scripted")
		switch {
		case c.want == "" && (err != nil || ch.FromIteration != c.p.FromIteration || ch.Config != c.p.Config):
			t.Errorf("%s: %+v, %v; want it accepted as proposed", c.name, ch, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "scripted")):
			t.Errorf("%s: err = %v, want it to name the tuner and %q", c.name, err, c.want)
		}
	}
}

// TestDecisionLogDiff: equal logs compare equal, and a planted difference
// (one piece started in another order) is found: the conformance tests'
// comparison can fail.
func TestDecisionLogDiff(t *testing.T) {
	run := func(order []int) *DecisionLog {
		log := NewDecisionLog()
		w := newWorker(t, Config{Workers: 1, Arch: PS, Servers: 2, Tensors: threeLayers, Sched: sched.Config{PartitionBytes: 200, Order: sched.OrderFIFO}})
		for _, tensor := range order {
			must(t, w.Post(tensor, 0))
			r := w.Ready()
			log.Record(0, &r)
		}
		return log
	}
	if d := Diff(run([]int{3, 2, 1, 0}), run([]int{3, 2, 1, 0})); d != "" {
		t.Errorf("equal runs differ: %s", d)
	}
	if d := Diff(run([]int{3, 2, 1, 0}), run([]int{3, 2, 0, 1})); d == "" {
		t.Error("runs that posted layer 0's tensors in another order compare equal")
	}
	if d := Diff(run([]int{3, 2, 1, 0}), run([]int{3, 2, 1})); !strings.Contains(d, "more entries") {
		t.Errorf("a shorter log: %q, want it to say the other has more entries", d)
	}
}
