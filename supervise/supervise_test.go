package supervise

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestMain lets the test binary play a child: SUPERVISE_CHILD says what it
// does (see child).
func TestMain(m *testing.M) {
	if mode := os.Getenv("SUPERVISE_CHILD"); mode != "" {
		os.Exit(child(mode))
	}
	os.Exit(m.Run())
}

// child runs one behaviour and returns the exit status.
func child(mode string) int {
	r := FromEnv()
	after := func(d string) { t, _ := time.ParseDuration(d); time.Sleep(t) }
	kind, arg, _ := strings.Cut(mode, ":")
	switch kind {
	case "ok": // progress, then success
		r.Iteration(1, 2, 10*time.Millisecond)
		r.Tuner("from iteration 1: partition 1 MB")
		r.Exit(nil)
		return 0
	case "raise": // a script that raises, after arg
		after(arg)
		fmt.Fprintln(os.Stderr, "Traceback (most recent call last):")
		fmt.Fprintln(os.Stderr, `  File "train.py", line 3, in <module>`)
		fmt.Fprintln(os.Stderr, "ValueError: boom")
		return 1
	case "engineerr": // a script whose engine lost a peer, after arg
		after(arg)
		fmt.Fprintln(os.Stderr, "autobyte.AutobyteError: autobyte: worker 2: lost rank 1: transport: peer worker 1 closed the connection")
		return 1
	case "lose": // fails after arg, reporting it lost the peer named by LOST ("worker 1")
		after(arg)
		role, rank, _ := strings.Cut(os.Getenv("LOST"), " ")
		var n int
		fmt.Sscan(rank, &n)
		r.send(Message{Kind: KindExit, Error: "lost " + os.Getenv("LOST") + ": no data for 5s", Lost: &Lost{Role: role, Rank: n, Silent: os.Getenv("SILENT") == "1"}})
		return 1
	case "wake": // hangs; on SIGTERM finds its peer LOST gone, as a stopped process woken by SIGCONT does
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM)
		<-sig
		role, rank, _ := strings.Cut(os.Getenv("LOST"), " ")
		var n int
		fmt.Sscan(rank, &n)
		r.send(Message{Kind: KindExit, Error: "lost " + os.Getenv("LOST") + ": broken pipe", Lost: &Lost{Role: role, Rank: n}})
		return 1
	case "hang": // runs until killed, ignoring SIGTERM
		signal.Ignore(syscall.SIGTERM)
		time.Sleep(time.Hour)
	case "serve": // runs until SIGTERM
		time.Sleep(time.Hour)
	}
	return 2
}

func newChild(t *testing.T, name, mode string, env ...string) *Child {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(append(os.Environ(), "SUPERVISE_CHILD="+mode), env...)
	return &Child{Name: name, Cmd: cmd, Status: true}
}

func runAll(t *testing.T, o Options, cs ...*Child) ([]*Child, time.Duration, error) {
	t.Helper()
	s := New(o)
	for _, c := range cs {
		if err := s.Start(c); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	all, err := s.Wait(context.Background())
	return all, time.Since(start), err
}

func TestSuccessAndMessages(t *testing.T) {
	var mu sync.Mutex
	var got []string
	o := Options{OnMessage: func(c *Child, m Message) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, fmt.Sprintf("%s %s %d/%d %s", c.Name, m.Kind, m.Iteration, m.Of, m.Text))
	}}
	_, _, err := runAll(t, o, newChild(t, "worker 0", "ok"), newChild(t, "worker 1", "ok"))
	if err != nil {
		t.Fatalf("two children that exit 0: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, w := range []string{"worker 0 iteration 1/2 ", "worker 1 tuner 0/0 from iteration 1: partition 1 MB"} {
		found := false
		for _, g := range got {
			found = found || g == w
		}
		if !found {
			t.Errorf("message %q not seen; got %q", w, got)
		}
	}
}

// TestRootCauseIsTheRaiser: a script that raises is the root cause, not the
// processes that then lost it, whichever order they are listed in.
func TestRootCauseIsTheRaiser(t *testing.T) {
	raiser := newChild(t, "worker 1", "raise:300ms")
	raiser.Status = false // a script: no status messages
	server := newChild(t, "server 0", "lose:500ms", "LOST=worker 1")
	server.Server = true
	w0 := newChild(t, "worker 0", "lose:400ms", "LOST=worker 1")
	_, _, err := runAll(t, Options{}, server, w0, raiser)
	var f *Failure
	if !errors.As(err, &f) {
		t.Fatalf("error %v, want a *Failure", err)
	}
	if f.Child != "worker 1" || f.Reason != "ValueError: boom" || f.Exit != "exit status 1" || f.Hung {
		t.Fatalf("root cause %+v, want worker 1 with its exception", f)
	}
	if len(f.Lines) != 3 || f.Lines[0] != "Traceback (most recent call last):" {
		t.Errorf("last stderr lines %q, want the traceback", f.Lines)
	}
	if want := "worker 1 failed (exit status 1) after "; !strings.HasPrefix(err.Error(), want) || !strings.HasSuffix(err.Error(), ": ValueError: boom") {
		t.Errorf("error %q, want %q...: ValueError: boom", err, want)
	}
}

// TestScriptThatLostAPeerIsNoRootCause: a script child whose last line
// says its engine lost a peer exits first; the one that raised is still
// the root cause (with the classifier; without it, the first exit).
func TestScriptThatLostAPeerIsNoRootCause(t *testing.T) {
	isLost := func(last string) bool { return strings.HasPrefix(last, "autobyte.AutobyteError: ") }
	for _, classify := range []bool{true, false} {
		lost := newChild(t, "worker 2", "engineerr:100ms")
		raiser := newChild(t, "worker 1", "raise:400ms")
		lost.Status, raiser.Status = false, false
		o := Options{}
		want := "worker 2"
		if classify {
			o.LostPeer, want = isLost, "worker 1"
		}
		_, _, err := runAll(t, o, lost, raiser)
		var f *Failure
		if !errors.As(err, &f) || f.Child != want {
			t.Errorf("classifier %v: root cause %v, want %s", classify, err, want)
		}
	}
}

// TestHungPeerIsStoppedAtOnce: when the only child left is the one the
// others lost, it is hung: the supervisor stops it without waiting out the
// grace and names it.
func TestHungPeerIsStoppedAtOnce(t *testing.T) {
	hung := newChild(t, "server 0", "hang")
	hung.Server = true
	w := newChild(t, "worker 0", "lose:200ms", "LOST=server 0", "SILENT=1")
	_, d, err := runAll(t, Options{Grace: time.Minute, KillAfter: 300 * time.Millisecond}, hung, w)
	var f *Failure
	if !errors.As(err, &f) || !f.Hung || f.Child != "server 0" || f.LostBy != "worker 0" || f.Exit != "signal: killed" {
		t.Fatalf("error %v (%+v), want server 0 hung, noticed by worker 0, killed", err, f)
	}
	if !strings.Contains(err.Error(), "server 0 stopped responding: worker 0 lost it ") || !strings.Contains(err.Error(), "lost server 0: no data for 5s") {
		t.Errorf("error %q does not name the hung child and what its peer saw", err)
	}
	// 200 ms to the failure, 300 ms from SIGTERM to SIGKILL; the minute of
	// grace must not be waited.
	if d > 3*time.Second {
		t.Errorf("Wait took %v, want about 0.5 s", d)
	}
}

// TestHungPeerFoundThroughTheChain: the first process to exit lost a
// peer that lost another, ..., down to the hung one; what the hung one
// says once woken by the supervisor's stop is no cause.
func TestHungPeerFoundThroughTheChain(t *testing.T) {
	hung := newChild(t, "server 0", "wake", "LOST=worker 0")
	hung.Server = true
	s1 := newChild(t, "server 1", "lose:100ms", "LOST=worker 2")
	s1.Server = true
	w2 := newChild(t, "worker 2", "lose:200ms", "LOST=worker 0")
	w0 := newChild(t, "worker 0", "lose:300ms", "LOST=server 0", "SILENT=1")
	_, d, err := runAll(t, Options{Grace: time.Minute}, hung, s1, w2, w0)
	var f *Failure
	if !errors.As(err, &f) || !f.Hung || f.Child != "server 0" || f.LostBy != "worker 0" || len(f.Lines) != 0 {
		t.Fatalf("error %v (%+v), want server 0 hung, noticed by worker 0, no lines", err, f)
	}
	if d > 5*time.Second {
		t.Errorf("Wait took %v: the hung child should be stopped once it is the only one left", d)
	}
}

// TestGraceThenKill: after a failure, a child that neither exits nor was
// lost by anyone gets the grace, then SIGTERM, then SIGKILL.
func TestGraceThenKill(t *testing.T) {
	stubborn := newChild(t, "worker 2", "hang")
	polite := newChild(t, "server 1", "serve")
	bad := newChild(t, "worker 0", "raise:100ms")
	all, d, err := runAll(t, Options{Grace: 500 * time.Millisecond, KillAfter: 400 * time.Millisecond}, stubborn, polite, bad)
	var f *Failure
	if !errors.As(err, &f) || f.Child != "worker 0" {
		t.Fatalf("error %v, want worker 0 as the root cause", err)
	}
	if d < 900*time.Millisecond || d > 4*time.Second {
		t.Errorf("Wait took %v, want the 100 ms, the 500 ms grace and the 400 ms to SIGKILL", d)
	}
	for _, c := range all {
		if c.Name == "worker 2" && exitString(c.err) != "signal: killed" {
			t.Errorf("worker 2 ignoring SIGTERM ended with %q, want signal: killed", exitString(c.err))
		}
		if c.Name == "server 1" && exitString(c.err) != "signal: terminated" {
			t.Errorf("server 1 ended with %q, want signal: terminated", exitString(c.err))
		}
	}
}

// TestServersMustFollowWorkers: servers still running ServerGrace after
// every worker exited 0 fail the job with a message saying so.
func TestServersMustFollowWorkers(t *testing.T) {
	srv := newChild(t, "server 0", "serve")
	srv.Server = true
	_, d, err := runAll(t, Options{ServerGrace: 300 * time.Millisecond, KillAfter: 200 * time.Millisecond}, srv, newChild(t, "worker 0", "ok"))
	if err == nil || !strings.Contains(err.Error(), "parameter servers did not exit 300ms after the last worker") {
		t.Fatalf("error %v, want the servers named as not exiting", err)
	}
	if d > 3*time.Second {
		t.Errorf("Wait took %v", d)
	}
	// Negative control: a server that exits with the workers is fine.
	srv = newChild(t, "server 0", "ok")
	srv.Server = true
	if _, _, err := runAll(t, Options{ServerGrace: 300 * time.Millisecond}, srv, newChild(t, "worker 0", "ok")); err != nil {
		t.Fatalf("server and worker exiting 0: %v", err)
	}
}

// TestUntilStoppedServersAreStoppedWithTheWorkers: servers that serve one
// job after another are stopped as soon as every worker exited 0, and that
// is success, not the late servers of TestServersMustFollowWorkers; if a
// worker fails, the failure is still the job's.
func TestUntilStoppedServersAreStoppedWithTheWorkers(t *testing.T) {
	srv := newChild(t, "server 0", "serve")
	srv.Server, srv.UntilStopped = true, true
	_, d, err := runAll(t, Options{ServerGrace: 5 * time.Second, KillAfter: 5 * time.Second}, srv, newChild(t, "worker 0", "ok"))
	if err != nil {
		t.Fatalf("workers done, until-stopped server stopped: %v, want success", err)
	}
	if d > 3*time.Second {
		t.Errorf("Wait took %v: the server should be stopped at once, not after ServerGrace (5 s)", d)
	}
	if srv.stopped.IsZero() {
		t.Error("the server was never signalled")
	}
	srv = newChild(t, "server 0", "serve")
	srv.Server, srv.UntilStopped = true, true
	_, _, err = runAll(t, Options{Grace: 200 * time.Millisecond, KillAfter: 200 * time.Millisecond}, srv, newChild(t, "worker 0", "raise:0s"))
	var f *Failure
	if !errors.As(err, &f) || f.Child != "worker 0" {
		t.Fatalf("a worker raised beside an until-stopped server: %v, want worker 0's failure", err)
	}
}

func TestInterrupted(t *testing.T) {
	s := New(Options{KillAfter: 200 * time.Millisecond})
	if err := s.Start(newChild(t, "worker 0", "serve")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := s.Wait(ctx); err == nil || !strings.Contains(err.Error(), "interrupted") {
		t.Fatalf("Wait after the context ended: %v, want interrupted", err)
	}
	if err := s.Start(newChild(t, "server 0", "ok")); !errors.Is(err, ErrStopping) {
		t.Fatalf("Start after Wait: %v, want ErrStopping", err)
	}
}

func TestMachineMemory(t *testing.T) {
	if _, err := os.Stat("/proc/meminfo"); err != nil {
		t.Skip("no /proc/meminfo")
	}
	if m := MachineMemory(); m < 64<<20 || m > 1<<50 {
		t.Fatalf("MachineMemory() = %d bytes, implausible", m)
	}
}
