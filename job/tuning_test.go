package job

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/tune"
	"github.com/autobyte/autobyte/worker"
)

// recorder is a worker.Observer that counts what it is passed on.
type recorder struct {
	mu                            sync.Mutex
	started, done, computes, iter int
}

func (r *recorder) PieceStarted(sched.Piece, time.Time, time.Time, int64) {
	r.mu.Lock()
	r.started++
	r.mu.Unlock()
}
func (r *recorder) PieceDone(sched.Piece, time.Time, time.Time, int64) {
	r.mu.Lock()
	r.done++
	r.mu.Unlock()
}
func (r *recorder) Compute(string, int, time.Time, time.Time) {
	r.mu.Lock()
	r.computes++
	r.mu.Unlock()
}
func (r *recorder) Iteration(int, time.Duration) {
	r.mu.Lock()
	r.iter++
	r.mu.Unlock()
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

// TestStatsCollector feeds a collector a made-up timeline (milliseconds
// from t0) and checks every measured field against the hand-computed
// value, and that every call reaches the next observer.
func TestStatsCollector(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(x float64) time.Time { return t0.Add(time.Duration(x * float64(time.Millisecond))) }
	var got []Measurement
	rec := &recorder{}
	c := NewStatsCollector(worker.PS, 2, 1, rec, func(m Measurement) { got = append(got, m) })
	var now time.Time
	c.now = func() time.Time { return now }
	piece := func(it, idx int, bytes int64) sched.Piece {
		return sched.Piece{PieceID: sched.PieceID{Iteration: it, Tensor: 0, Index: idx}, Bytes: bytes}
	}

	// Iteration 0: forward 0 (0-10), backward 0 (10-30) opens the span;
	// two pieces in flight 32-45 and 35-60; forward 1 (50-70) overlaps
	// them for 10 ms; forward 1 ends at 70.
	c.Compute("FW l0", 0, ms(0), ms(10))
	c.Compute("BW l0", 0, ms(10), ms(30))
	c.PieceStarted(piece(0, 0, 1000), ms(30), ms(32), 1000)
	c.PieceStarted(piece(0, 1, 3000), ms(30), ms(35), 4000)
	c.PieceDone(piece(0, 0, 1000), ms(32), ms(45), 3000)
	c.PieceDone(piece(0, 1, 3000), ms(35), ms(60), 0)
	c.Compute("FW l0", 1, ms(50), ms(70))
	now = ms(70)
	c.Iteration(0, 60*time.Millisecond)

	// Iteration 1: backward 1 (70-90), one piece 90-110 while forward 2
	// (95-105) runs: overlap 10 of 20 ms; forward 2 ends at 120.
	c.Compute("BW l0", 1, ms(70), ms(90))
	c.PieceStarted(piece(1, 0, 2000), ms(90), ms(90), 2000)
	c.Compute("FW l0", 2, ms(95), ms(105))
	c.PieceDone(piece(1, 0, 2000), ms(90), ms(110), 0)
	now = ms(120)
	c.Iteration(1, 50*time.Millisecond)

	if len(got) != 2 {
		t.Fatalf("got %d measurements, want 2", len(got))
	}
	want := []struct {
		st    tune.Stats
		commS float64
	}{
		{tune.Stats{Iteration: 0, IterationTimeS: 0.060, ForwardS: 0.020, BackwardS: 0.020, GoodputBps: 4000 / 0.060,
			QueueDelayS: 0.0035, Overlap: 10.0 / 28, InFlightBytes: (1000*3 + 4000*10 + 3000*15) / 60.0}, 0.028},
		{tune.Stats{Iteration: 1, IterationTimeS: 0.050, ForwardS: 0.010, BackwardS: 0.020, GoodputBps: 2000 / 0.050,
			QueueDelayS: 0, Overlap: 0.5, InFlightBytes: 2000 * 20 / 50.0}, 0.020},
	}
	for i, w := range want {
		g := got[i].Stats
		fields := []struct {
			name      string
			got, want float64
		}{
			{"iteration time", g.IterationTimeS, w.st.IterationTimeS},
			{"forward", g.ForwardS, w.st.ForwardS},
			{"backward", g.BackwardS, w.st.BackwardS},
			{"goodput", g.GoodputBps, w.st.GoodputBps},
			{"queue delay", g.QueueDelayS, w.st.QueueDelayS},
			{"overlap", g.Overlap, w.st.Overlap},
			{"in flight", g.InFlightBytes, w.st.InFlightBytes},
			{"comm", got[i].CommS, w.commS},
		}
		if g.Iteration != w.st.Iteration {
			t.Errorf("measurement %d: iteration %d", i, g.Iteration)
		}
		for _, f := range fields {
			if !near(f.got, f.want) {
				t.Errorf("iteration %d: %s = %v, want %v", i, f.name, f.got, f.want)
			}
		}
	}
	if rec.started != 3 || rec.done != 3 || rec.computes != 5 || rec.iter != 2 {
		t.Errorf("next observer saw %d starts, %d dones, %d computes, %d iterations; want 3, 3, 5, 2", rec.started, rec.done, rec.computes, rec.iter)
	}
}

// TestStatsCollectorRing: a ring worker sends 2(N-1)/N of each piece.
func TestStatsCollectorRing(t *testing.T) {
	var got []Measurement
	c := NewStatsCollector(worker.AllReduce, 4, 0, nil, func(m Measurement) { got = append(got, m) })
	t0 := time.Unix(0, 0)
	c.now = func() time.Time { return t0.Add(2 * time.Second) }
	c.Compute("BW l", 0, t0, t0.Add(time.Second))
	c.PieceStarted(sched.Piece{Bytes: 4000}, t0.Add(time.Second), t0.Add(time.Second), 4000)
	c.PieceDone(sched.Piece{Bytes: 4000}, t0.Add(time.Second), t0.Add(1500*time.Millisecond), 0)
	c.Iteration(0, 2*time.Second)
	if len(got) != 1 || !near(got[0].Stats.GoodputBps, 4000*1.5/2) || !near(got[0].CommS, 0.5) {
		t.Fatalf("got %+v, want goodput %v B/s over 2 s and 0.5 s of communication", got, 4000*1.5/2)
	}
}

func TestStatsContext(t *testing.T) {
	p := testProfile()
	st := StatsContext(Spec{Profile: p, Arch: worker.PS, Workers: 3, Servers: 2})
	// Tensors of 1000, 7, 33333, 250001, 1, 65536 float32s.
	total := int64(4 * (1000 + 7 + 33_333 + 250_001 + 1 + 65_536))
	if st.ModelBytes != total || st.Tensors != 6 || st.Workers != 3 || st.Servers != 2 || st.Arch != "ps" ||
		!near(st.SizeSkew, 4*250_001/(float64(total)/6)) {
		t.Errorf("context %+v", st)
	}
	ar := StatsContext(Spec{Profile: p, Arch: worker.AllReduce, Workers: 3})
	if ar.Arch != "allreduce" || ar.Servers != 0 {
		t.Errorf("all-reduce context %+v", ar)
	}
}

// scripted is a deterministic fake tuner: after observing iteration k it
// proposes script[k], if any, and records every Stats it saw.
type scripted struct {
	script map[int]tune.Proposal
	seen   []tune.Stats
}

func (*scripted) Name() string { return "scripted" }
func (s *scripted) Observe(st tune.Stats) (tune.Proposal, bool) {
	s.seen = append(s.seen, st)
	p, ok := s.script[st.Iteration]
	return p, ok
}

// runTunedCluster is runCluster with rank 0 tuned by tuning.
func runTunedCluster(t *testing.T, spec Spec, tuning TuningOptions) ([]*Summary, error) {
	t.Helper()
	return runClusterWith(t, spec, func(r int) WorkerOptions {
		o := WorkerOptions{Rank: r, Verify: worker.VerifyFull}
		if r == 0 {
			o.Tuning = tuning
		}
		return o
	})
}

// TestTunedExactness runs whole clusters whose configuration a scripted
// tuner changes four times mid-run through rank 0's tuner loop (partition,
// credit, order and admission) and checks every element of every
// sum, the configurations applied, and the statistics the tuner saw.
func TestTunedExactness(t *testing.T) {
	p := testProfile()
	var elems, tensors int64
	for _, l := range p.Layers {
		for _, ts := range l.Tensors {
			elems += ts.Params
			tensors++
		}
	}
	base := sched.Config{PartitionBytes: 100_000, CreditBytes: 300_000, Order: sched.OrderPriority}
	c1 := sched.Config{PartitionBytes: 4_000, CreditBytes: 12_000, Order: sched.OrderPriority}
	c2 := sched.Config{Order: sched.OrderPriority} // whole tensors, no window
	c3 := sched.Config{PartitionBytes: 1_000, CreditBytes: 5_000, Order: sched.OrderFIFO, Admission: sched.AdmitStrict}
	c4 := sched.Config{PartitionBytes: 64_000, CreditBytes: 64_000, Order: sched.OrderPriority, Admission: sched.AdmitStrict}
	const iterations = 8
	want := []ConfigChange{{FromIteration: 0, Config: base}, {FromIteration: 2, Config: c1}, {FromIteration: 4, Config: c2}, {FromIteration: 5, Config: c3}, {FromIteration: 7, Config: c4}}
	rate := func(k int) float64 {
		if k < 4 {
			return 1e9
		}
		return 1e8
	}
	type tc struct {
		arch             worker.Arch
		workers, servers int
		pull             bool
		// roundTripS is the configured round trip (0: measured).
		roundTripS float64
	}
	cases := []tc{{worker.PS, 2, 2, false, 0}, {worker.PS, 3, 1, true, 2e-3}, {worker.AllReduce, 3, 0, false, 0}, {worker.AllReduce, 1, 0, false, 0}}
	if testing.Short() {
		cases = cases[:1:1]
		cases = append(cases, tc{worker.AllReduce, 3, 0, false, 0})
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("arch%d/w%d/s%d/pull%v", c.arch, c.workers, c.servers, c.pull), func(t *testing.T) {
			tuner := &scripted{script: map[int]tune.Proposal{
				0: {Config: c1, FromIteration: 2}, // the earliest a tuner may state (tune.Lead)
				2: {Config: c2, FromIteration: 4},
				3: {Config: c3, FromIteration: 5}, // right after the previous change
				5: {Config: c4, FromIteration: 7},
			}}
			spec := Spec{Profile: p, Arch: c.arch, Workers: c.workers, Servers: c.servers, Iterations: iterations, PullMode: c.pull,
				ShardBytes: 64_000, Sched: base}
			var changes []ConfigChange
			sums, err := runTunedCluster(t, spec, TuningOptions{Tuner: tuner, BandwidthAt: rate, RoundTripS: c.roundTripS,
				OnChange: func(ch ConfigChange) { changes = append(changes, ch) }})
			if err != nil {
				t.Fatal(err)
			}
			for r, s := range sums {
				// VerifyFull checks every element, and each tensor's last
				// one once more.
				if want := (elems + tensors) * iterations; s.Checked != want {
					t.Errorf("worker %d checked %d elements, want every one (%d)", r, s.Checked, want)
				}
			}
			got := sums[0].Configs
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("configs %+v, want %+v", got, want)
			}
			if fmt.Sprint(changes) != fmt.Sprint(want[1:]) {
				t.Errorf("OnChange saw %+v, want %+v", changes, want[1:])
			}
			if len(tuner.seen) != iterations || len(sums[0].Stats) != iterations {
				t.Fatalf("tuner saw %d iterations, summary has %d, want %d", len(tuner.seen), len(sums[0].Stats), iterations)
			}
			for k, st := range tuner.seen {
				inForce := want[0].Config
				for _, ch := range want[1:] {
					if ch.FromIteration <= k {
						inForce = ch.Config
					}
				}
				if st.Iteration != k || st.Config != inForce || st.BandwidthBps != rate(k) || st.Workers != c.workers ||
					st.ModelBytes != 4*elems || !(st.IterationTimeS > 0) || (c.workers > 1 || c.arch == worker.PS) != (st.GoodputBps > 0) || st.Overlap < 0 || st.Overlap > 1 {
					t.Errorf("stats of iteration %d: %+v (config in force %+v)", k, st, inForce)
				}
				// Every server is measured on parameter servers (each
				// holds some of every iteration's pieces here), none on
				// a ring.
				if c.arch == worker.PS {
					if len(st.ServerGoodputBps) != c.servers || len(st.ServerResponseS) != c.servers {
						t.Errorf("iteration %d: %d server goodputs and %d response times for %d servers", k, len(st.ServerGoodputBps), len(st.ServerResponseS), c.servers)
					}
					for i := range st.ServerGoodputBps {
						if !(st.ServerGoodputBps[i] > 0) || !(st.ServerResponseS[i] > 0) {
							t.Errorf("iteration %d, server %d: goodput %v B/s, response %v s", k, i, st.ServerGoodputBps[i], st.ServerResponseS[i])
						}
					}
				} else if st.ServerGoodputBps != nil {
					t.Errorf("iteration %d of a ring: server goodputs %v", k, st.ServerGoodputBps)
				}
				// A configured round trip is passed on; otherwise the
				// kernel's on loopback (microseconds), or none
				// for a one-worker ring, which has no data connection.
				switch {
				case c.roundTripS > 0 && st.RoundTripS != c.roundTripS,
					c.roundTripS == 0 && c.workers > 1 && !(st.RoundTripS > 0 && st.RoundTripS < 2e-3),
					c.workers == 1 && st.RoundTripS != 0:
					t.Errorf("iteration %d: round trip %v s (configured %v s)", k, st.RoundTripS, c.roundTripS)
				}
			}
			for _, s := range sums[1:] {
				if len(s.Configs) != 0 || len(s.Stats) != 0 {
					t.Errorf("worker %d reported configs %+v and %d statistics: only rank 0 tunes", s.Rank, s.Configs, len(s.Stats))
				}
			}
		})
	}
}

// TestTunerEarlyProposal: a proposal from before k+tune.Lead is refused,
// not clamped, as in the simulator (proto.Schedule is the one rule): the
// job ends with an error naming the iterations.
func TestTunerEarlyProposal(t *testing.T) {
	spec := Spec{Profile: testProfile(), Arch: worker.PS, Workers: 2, Servers: 1, Iterations: 5, ShardBytes: 64_000,
		Sched: sched.Config{PartitionBytes: 100_000, CreditBytes: 300_000, Order: sched.OrderPriority}}
	tuner := &scripted{script: map[int]tune.Proposal{1: {Config: sched.Config{Order: sched.OrderPriority}, FromIteration: 2}}}
	_, err := runTunedCluster(t, spec, TuningOptions{Tuner: tuner})
	for _, w := range []string{"too late", "iteration 2", "after iteration 1", "iteration 3 or later"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("err = %v, want it to name %q", err, w)
		}
	}
}

// TestTunerBadProposal: a tuner proposing an invalid configuration ends
// the job with an error naming the value, on every worker, without a hang.
func TestTunerBadProposal(t *testing.T) {
	spec := Spec{Profile: testProfile(), Arch: worker.PS, Workers: 2, Servers: 1, Iterations: 5, ShardBytes: 64_000,
		Sched: sched.Config{PartitionBytes: 100_000, CreditBytes: 300_000, Order: sched.OrderPriority}}
	tuner := &scripted{script: map[int]tune.Proposal{1: {Config: sched.Config{PartitionBytes: -5}, FromIteration: 3}}}
	_, err := runTunedCluster(t, spec, TuningOptions{Tuner: tuner})
	if err == nil || !strings.Contains(err.Error(), "-5") {
		t.Fatalf("err = %v, want the invalid partition -5 named", err)
	}
}
