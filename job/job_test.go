package job

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/autobyte/autobyte/cluster"
	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/model"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/worker"
)

// testProfile has tensors of awkward sizes and no compute, so runs are
// quick and pieces, shards and ring chunks do not divide evenly.
func testProfile() *model.Profile {
	sizes := [][]int64{{1000, 7}, {33_333}, {250_001, 1}, {65_536}}
	p := &model.Profile{Name: "test", BatchSize: 1, Device: "none", BytesPerParam: 4}
	for l, ts := range sizes {
		layer := model.Layer{Name: fmt.Sprintf("l%d", l)}
		for i, n := range ts {
			layer.Tensors = append(layer.Tensors, model.Tensor{Name: fmt.Sprintf("l%d.t%d", l, i), Params: n})
		}
		p.Layers = append(p.Layers, layer)
	}
	return p
}

func freeAddr(t *testing.T) string {
	t.Helper()
	port, err := cluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// runCluster runs every process of spec as goroutines on loopback and
// returns the workers' summaries (or the first error).
func runCluster(t *testing.T, spec Spec, verify worker.Verify) ([]*Summary, error) {
	t.Helper()
	return runClusterWith(t, spec, func(r int) WorkerOptions { return WorkerOptions{Rank: r, Verify: verify} })
}

// runClusterWith is runCluster with worker r run with options(r).
func runClusterWith(t *testing.T, spec Spec, options func(r int) WorkerOptions) ([]*Summary, error) {
	t.Helper()
	n := Net{Master: freeAddr(t), Listen: "127.0.0.1:0", Token: "test-token", PeerTimeout: 5 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	sums := make([]*Summary, spec.Workers)
	record := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil && firstErr == nil {
			firstErr = err
			cancel()
		}
	}
	for m := 0; m < spec.Servers; m++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := RunServer(ctx, spec, m, n)
			record(err)
		}()
	}
	for r := 0; r < spec.Workers; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := RunWorker(ctx, spec, options(r), n)
			sums[r] = s
			record(err)
		}()
	}
	wg.Wait()
	return sums, firstErr
}

// TestExactAggregation: every element of every sum equals the exact sum,
// for parameter servers (1..4 servers, both answer modes) and all-reduce,
// 1..8 workers, partitions from 4 KB to larger than the largest tensor.
func TestExactAggregation(t *testing.T) {
	p := testProfile()
	type tc struct {
		arch             worker.Arch
		workers, servers int
		partition        int64
		pull             bool
	}
	var cases []tc
	for _, part := range []int64{4_000, 100_000, 2_000_000} {
		for _, w := range []int{1, 2, 3, 5, 8} {
			cases = append(cases, tc{worker.AllReduce, w, 0, part, false})
			for _, m := range []int{1, 2, 4} {
				cases = append(cases, tc{worker.PS, w, m, part, m == 2})
			}
		}
	}
	if testing.Short() {
		cases = cases[:8]
	}
	for _, c := range cases {
		name := fmt.Sprintf("arch%d/w%d/s%d/part%d/pull%v", c.arch, c.workers, c.servers, c.partition, c.pull)
		t.Run(name, func(t *testing.T) {
			spec := Spec{Profile: p, Arch: c.arch, Workers: c.workers, Servers: c.servers, Iterations: 3, PullMode: c.pull,
				ShardBytes: 64_000, Sched: sched.Config{PartitionBytes: c.partition, CreditBytes: 3 * c.partition, Order: sched.OrderPriority}}
			sums, err := runCluster(t, spec, worker.VerifyFull)
			if err != nil {
				t.Fatal(err)
			}
			var want int64
			for _, l := range p.Layers {
				for _, ts := range l.Tensors {
					want += ts.Params
				}
			}
			for r, s := range sums {
				if s.Checked < 3*want {
					t.Errorf("worker %d checked %d elements, want every element of 3 iterations (%d)", r, s.Checked, 3*want)
				}
				if len(s.IterationTimesS) != 3 {
					t.Errorf("worker %d reported %d iterations, want 3", r, len(s.IterationTimesS))
				}
			}
		})
	}
}

// TestFifoAndStrict: the unscheduled preset and the strict admission rule
// also deliver exact sums.
func TestFifoAndStrict(t *testing.T) {
	for _, cfg := range []sched.Config{{}, {PartitionBytes: 50_000, CreditBytes: 120_000, Order: sched.OrderPriority, Admission: sched.AdmitStrict}} {
		spec := Spec{Profile: testProfile(), Arch: worker.PS, Workers: 3, Servers: 2, Iterations: 2, ShardBytes: 40_000, Sched: cfg}
		if _, err := runCluster(t, spec, worker.VerifyFull); err != nil {
			t.Fatalf("%+v: %v", cfg, err)
		}
	}
}

// TestDigestMismatch: a process started with other settings is refused at
// rendezvous with an error that says so.
func TestDigestMismatch(t *testing.T) {
	spec := Spec{Profile: testProfile(), Arch: worker.PS, Workers: 2, Servers: 1, Iterations: 1}
	other := spec
	other.Iterations = 2
	if msgs := mismatchErrors(t, spec, other, spec); !strings.Contains(strings.Join(msgs, "\n"), "different job configuration") ||
		!strings.Contains(strings.Join(msgs, "\n"), "iterations: worker 1 has 2, rank 0 has 1") {
		t.Fatalf("errors %q should report the configuration mismatch, naming the iterations", msgs)
	}
}

// TestConfigCoversDigest: every change that moves the digest moves a part
// of Config, the description the coordinator names differences by (a
// change Config missed would be reported as a mismatch with nothing named),
// and the same spec describes itself the same way.
func TestConfigCoversDigest(t *testing.T) {
	base := Spec{Profile: testProfile(), Arch: worker.PS, Workers: 2, Servers: 1, Iterations: 1, ShardBytes: 4 << 20,
		Sched: sched.Config{PartitionBytes: 1 << 20, CreditBytes: 4 << 20, Order: sched.OrderPriority}}
	changes := map[string]func(s *Spec){
		"workers":     func(s *Spec) { s.Workers = 3 },
		"servers":     func(s *Spec) { s.Servers = 2 },
		"arch":        func(s *Spec) { s.Arch, s.Servers = worker.AllReduce, 0 },
		"pull":        func(s *Spec) { s.PullMode = true },
		"iterations":  func(s *Spec) { s.Iterations = 5 },
		"shard":       func(s *Spec) { s.ShardBytes = 0 },
		"partition":   func(s *Spec) { s.Sched.PartitionBytes = 2 << 20 },
		"credit":      func(s *Spec) { s.Sched.CreditBytes = 8 << 20 },
		"order":       func(s *Spec) { s.Sched.Order = sched.OrderFIFO },
		"admission":   func(s *Spec) { s.Sched.Admission = sched.AdmitStrict },
		"compression": func(s *Spec) { s.Sched.Compression = dtype.BF16 },
		"weights":     func(s *Spec) { s.Servers, s.Sched.ServerWeights = 2, sched.ServerWeights{1, 3} },
		"fusion":      func(s *Spec) { s.Sched.FusionBytes = 1 << 20 },
		"tensor size": func(s *Spec) { s.Profile.Layers[1].Tensors[0].Params++ },
		"tensor name": func(s *Spec) { s.Profile.Layers[1].Tensors[0].Name = "renamed" },
		"compute":     func(s *Spec) { s.Profile.Layers[0].ForwardS = 0.5 },
	}
	if !reflect.DeepEqual(base.Config(), base.Config()) {
		t.Fatal("the same spec describes itself differently")
	}
	for name, change := range changes {
		s := base
		s.Profile = base.Profile.Clone()
		change(&s)
		if s.Digest() == base.Digest() {
			t.Errorf("%s: the digest did not move (the change is not one the digest covers)", name)
		}
		if reflect.DeepEqual(s.Config(), base.Config()) {
			t.Errorf("%s: the digest moved but Config did not: %v", name, s.Config())
		}
	}
}

// mismatchErrors runs server 0 with server, worker 1 with w1 and worker 0
// with w0 (one server, two workers) and returns the errors they end with.
func mismatchErrors(t *testing.T, server, w1, w0 Spec) []string {
	t.Helper()
	n := Net{Master: freeAddr(t), Listen: "127.0.0.1:0", Token: "tok", PeerTimeout: 3 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make(chan error, 3)
	go func() { _, err := RunServer(ctx, server, 0, n); errs <- err }()
	go func() { _, err := RunWorker(ctx, w1, WorkerOptions{Rank: 1}, n); errs <- err }()
	go func() { _, err := RunWorker(ctx, w0, WorkerOptions{Rank: 0}, n); errs <- err }()
	var msgs []string
	for range 3 {
		if err := <-errs; err != nil {
			msgs = append(msgs, err.Error())
		}
	}
	return msgs
}

// TestWrongToken: a worker with another token never joins; the job fails
// with a refusal instead of hanging.
func TestWrongToken(t *testing.T) {
	spec := Spec{Profile: testProfile(), Arch: worker.PS, Workers: 2, Servers: 1, Iterations: 1}
	n := Net{Master: freeAddr(t), Listen: "127.0.0.1:0", Token: "right", PeerTimeout: 3 * time.Second}
	bad := n
	bad.Token = "wrong"
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	go func() { _, _ = RunWorker(ctx, spec, WorkerOptions{Rank: 0}, n) }()
	_, err := RunWorker(ctx, spec, WorkerOptions{Rank: 1}, bad)
	if err == nil || !strings.Contains(err.Error(), "token") {
		t.Fatalf("worker with a wrong token: %v, want a refusal naming the token", err)
	}
}

func TestSpecErrors(t *testing.T) {
	good := Spec{Profile: testProfile(), Arch: worker.PS, Workers: 2, Servers: 1, Iterations: 1}
	cases := []struct {
		mut  func(*Spec)
		want string
	}{
		{func(s *Spec) { s.Profile = nil }, "profile"},
		{func(s *Spec) { s.Workers = 0 }, "got 0"},
		{func(s *Spec) { s.Servers = 0 }, "got 0"},
		{func(s *Spec) { s.Arch = worker.AllReduce }, "got 1"},
		{func(s *Spec) { s.Iterations = -1 }, "got -1"},
		{func(s *Spec) { s.ShardBytes = -5 }, "got -5"},
	}
	for _, c := range cases {
		s := good
		c.mut(&s)
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate() = %v, want an error naming %q", err, c.want)
		}
	}
	if _, err := RunWorker(context.Background(), good, WorkerOptions{Rank: 5}, Net{}); err == nil || !strings.Contains(err.Error(), "rank 5") {
		t.Errorf("rank out of range: %v", err)
	}
	if _, err := RunServer(context.Background(), good, 3, Net{}); err == nil || !strings.Contains(err.Error(), "index 3") {
		t.Errorf("server index out of range: %v", err)
	}
}

// TestModelAgnosticServer: a server that knows only the architecture and
// the process counts (no profile, as the launcher starts it for a PyTorch
// script) serves a job exactly; one that disagrees on the worker count is
// refused at rendezvous.
func TestModelAgnosticServer(t *testing.T) {
	spec := Spec{Profile: testProfile(), Arch: worker.PS, Workers: 2, Servers: 1, Iterations: 2}
	bare := Spec{Arch: worker.PS, Workers: 2, Servers: 1}
	if bare.ServerDigest() != spec.ServerDigest() {
		t.Fatalf("server digest depends on the profile: %s vs %s", bare.ServerDigest(), spec.ServerDigest())
	}
	n := Net{Master: freeAddr(t), Listen: "127.0.0.1:0", Token: "tok", PeerTimeout: 5 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make(chan error, 3)
	go func() { _, err := RunServer(ctx, bare, 0, n); errs <- err }()
	for r := range 2 {
		go func() {
			_, err := RunWorker(ctx, spec, WorkerOptions{Rank: r, Verify: worker.VerifyFull}, n)
			errs <- err
		}()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatalf("job with a model-agnostic server: %v", err)
		}
	}

	wrong := bare
	wrong.Workers = 3
	if msgs := mismatchErrors(t, wrong, spec, spec); !strings.Contains(strings.Join(msgs, "\n"), "different job configuration") {
		t.Fatalf("errors %q should report the server's configuration mismatch", msgs)
	}
	if err := (Spec{Arch: worker.AllReduce, Workers: 2}).ValidateServer(); err == nil || !strings.Contains(err.Error(), "arch") {
		t.Fatalf("ValidateServer(all-reduce) = %v, want an error naming the architecture", err)
	}
}

// TestServeSessions: a server serving successive jobs serves two jobs of
// the same workers one after the other, exactly (VerifyFull), sums their
// bytes, and ends without error when stopped while it waits for a third.
// The negative control is RunServer (one job): the second job's workers
// then find no server and fail their rendezvous.
func TestServeSessions(t *testing.T) {
	spec := Spec{Profile: testProfile(), Arch: worker.PS, Workers: 2, Servers: 1, Iterations: 2}
	bare := Spec{Arch: worker.PS, Workers: 2, Servers: 1}
	n := Net{Master: freeAddr(t), Listen: "127.0.0.1:0", Token: "tok", PeerTimeout: 5 * time.Second, RendezvousTimeout: 3 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	runJob := func() error {
		errs := make(chan error, 2)
		for r := range 2 {
			go func() {
				_, err := RunWorker(ctx, spec, WorkerOptions{Rank: r, Verify: worker.VerifyFull}, n)
				errs <- err
			}()
		}
		return errors.Join(<-errs, <-errs)
	}

	srvCtx, stop := context.WithCancel(ctx)
	type result struct {
		sum *Summary
		err error
	}
	done := make(chan result, 1)
	go func() { s, err := ServeSessions(srvCtx, bare, 0, n, 0); done <- result{s, err} }()
	for job := range 2 {
		if err := runJob(); err != nil {
			t.Fatalf("job %d with a server serving successive jobs: %v", job, err)
		}
	}
	time.Sleep(200 * time.Millisecond) // the server waits for a third job
	stop()
	r := <-done
	if r.err != nil {
		t.Fatalf("server stopped between jobs: %v, want nil", r.err)
	}
	// The server's summary covers both jobs: twice one job's bytes.
	single := make(chan result, 1)
	go func() { s, err := RunServer(ctx, bare, 0, n); single <- result{s, err} }()
	if err := runJob(); err != nil {
		t.Fatalf("one job: %v", err)
	}
	s1 := <-single
	if s1.err != nil {
		t.Fatal(s1.err)
	}
	if r.sum.BytesReceived != 2*s1.sum.BytesReceived || s1.sum.BytesReceived == 0 {
		t.Errorf("server of two jobs received %d bytes, one job %d: want twice", r.sum.BytesReceived, s1.sum.BytesReceived)
	}
	if err := runJob(); err == nil || !strings.Contains(err.Error(), "server 0") {
		t.Errorf("a second job after RunServer's one: %v, want the rendezvous to fail waiting for server 0", err)
	}
	if _, err := ServeSessions(ctx, bare, 0, n, -1); err == nil || !strings.Contains(err.Error(), "-1") {
		t.Errorf("ServeSessions(-1) = %v, want an error naming -1", err)
	}
}
