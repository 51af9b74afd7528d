package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// detectWithin is how long every surviving process may take to notice a
// killed peer and exit.
const detectWithin = 10 * time.Second

// lostPeerScenario is long enough that a kill lands mid-job: resnet50 at
// 5x compute on 1 Gbit/s links takes about 1.5 s per iteration.
var lostPeerScenario = []string{"--model=resnet50", "--compute-scale=5", "--iterations=50", "--bandwidth=1Gbps"}

// job is a cluster of processes started by the test.
type job struct {
	servers, workers []*proc
}

func (j *job) all() []*proc { return append(append([]*proc{}, j.servers...), j.workers...) }

// startJob starts every server and worker of a job on loopback as separate
// processes of the binary.
func startJob(t *testing.T, arch string, workers, servers int, scenario []string) *job {
	t.Helper()
	common := []string{"--arch=" + arch, "--workers=" + strconv.Itoa(workers),
		"--master=127.0.0.1:" + strconv.Itoa(freePort(t)), "--token=e2e-token", "--listen=127.0.0.1:0"}
	if arch == "ps" {
		common = append(common, "--servers="+strconv.Itoa(servers))
	}
	common = append(common, scenario...)
	j := &job{}
	for m := 0; m < servers; m++ {
		j.servers = append(j.servers, start(t, fmt.Sprintf("server %d", m), nil, append([]string{"server", "--index=" + strconv.Itoa(m)}, common...)...))
	}
	for r := 0; r < workers; r++ {
		j.workers = append(j.workers, start(t, fmt.Sprintf("worker %d", r), nil, append([]string{"worker", "--rank=" + strconv.Itoa(r)}, common...)...))
	}
	return j
}

// peerNames are the ways an error may name the process called name
// ("worker 2" is also "rank 2"; "server 0" is also "parameter server 0").
func peerNames(name string) []string {
	if r, ok := strings.CutPrefix(name, "worker "); ok {
		return []string{"worker " + r, "rank " + r}
	}
	return []string{name}
}

func namesAny(out string, names []string) bool {
	for _, n := range names {
		if strings.Contains(out, n) {
			return true
		}
	}
	return false
}

// stackSummary waits for the goroutine dump of a process sent SIGQUIT and
// returns, for each goroutine running autobyte code, its state and the
// innermost autobyte function: where the process is stuck.
func stackSummary(p *proc) string {
	p.wait(2 * time.Second)
	var keep []string
	for _, g := range strings.Split(p.stderr.String(), "\n\n") {
		lines := strings.Split(strings.TrimSpace(g), "\n")
		if !strings.HasPrefix(lines[0], "goroutine ") {
			continue
		}
		for _, l := range lines[1:] {
			if strings.Contains(l, "autobyte/autobyte/") && !strings.HasPrefix(l, "\t") && !strings.HasPrefix(l, "created by") {
				state := lines[0]
				if i := strings.Index(state, "["); i >= 0 {
					state = strings.TrimSuffix(state[i:], ":")
				}
				fn := l
				if i := strings.LastIndex(fn, "("); i > 0 {
					fn = fn[:i]
				}
				keep = append(keep, "  "+state+" "+strings.TrimPrefix(fn, "github.com/autobyte/autobyte/"))
				break
			}
		}
	}
	return strings.Join(keep, "\n")
}

// TestLostPeer kills one process of a running job with SIGKILL and checks
// that every other process exits non-zero within 10 s with an error naming
// the lost peer.
func TestLostPeer(t *testing.T) {
	cases := []struct {
		arch             string
		workers, servers int
		victim           string
	}{
		{"ps", 3, 2, "worker 2"},
		{"ps", 3, 2, "worker 0"},
		{"ps", 3, 2, "server 0"},
		{"allreduce", 3, 0, "worker 2"},
		{"allreduce", 3, 0, "worker 0"},
	}
	for _, c := range cases {
		t.Run(c.arch+"/kill-"+strings.ReplaceAll(c.victim, " ", "-"), func(t *testing.T) {
			j := startJob(t, c.arch, c.workers, c.servers, lostPeerScenario)
			j.workers[0].waitLine(t, "iteration 2/", 60*time.Second)
			var victim *proc
			for _, p := range j.all() {
				if p.name == c.victim {
					victim = p
				}
			}
			if err := victim.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			var others []*proc
			for _, p := range j.all() {
				if p != victim {
					others = append(others, p)
					p.wait(time.Until(killed.Add(detectWithin)))
				}
			}
			var report []string
			var hung []*proc
			for _, p := range others {
				if !p.exited() {
					hung = append(hung, p)
					report = append(report, p.name+": still running")
					continue
				}
				d := p.exit.Sub(killed)
				report = append(report, fmt.Sprintf("%s: exit %d after %.2f s", p.name, p.code(), d.Seconds()))
				if p.code() == 0 {
					t.Errorf("%s exited 0 after losing %s\n%s", p.name, c.victim, p.output())
				}
				if !namesAny(p.output(), peerNames(c.victim)) {
					t.Errorf("%s's error does not name the lost %s (want one of %q):\n%s", p.name, c.victim, peerNames(c.victim), p.output())
				}
				noCrash(t, p.name, p.output())
			}
			// Dump every hung process at once: one dying first could unblock another.
			for _, p := range hung {
				_ = p.cmd.Process.Signal(syscall.SIGQUIT)
			}
			for _, p := range hung {
				t.Errorf("%s still running %v after %s was killed; its goroutines in autobyte code (SIGQUIT dump):\n%s", p.name, detectWithin, c.victim, stackSummary(p))
			}
			t.Logf("killed %s: %s", c.victim, strings.Join(report, "; "))
		})
	}
}

// childrenOf lists the processes whose parent is ppid, with their command
// lines (arguments joined by spaces).
func childrenOf(ppid int) map[int]string {
	out := map[int]string{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces, so cut at the last ')'.
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[1] != strconv.Itoa(ppid) {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		out[pid] = strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))
	}
	return out
}

// procState is the state letter of pid ("" if it is gone) and its command line.
func procState(pid int) (string, string) {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return "", ""
	}
	s := string(stat)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	cmdline, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	return f[0], strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))
}

// childRunning returns launch's children (pid to command line) and the
// pid of the one whose command line holds role (e.g. "worker --rank=2"),
// failing the test if there is none.
func childRunning(t *testing.T, l *proc, role string) (int, map[int]string) {
	t.Helper()
	kids := childrenOf(l.cmd.Process.Pid)
	for pid, cl := range kids {
		if strings.Contains(cl, " "+role+" ") {
			return pid, kids
		}
	}
	t.Fatalf("no child of launch runs %q; children: %v", role, kids)
	return 0, nil
}

// TestLaunchLostChild kills one child of 'autobyte launch' and checks that
// launch exits non-zero within 10 s naming it, and leaves no child behind.
func TestLaunchLostChild(t *testing.T) {
	cases := []struct {
		arch   string
		args   []string
		victim string // the child's role flag
		name   string
	}{
		{"ps", []string{"--workers=3", "--servers=2"}, "worker --rank=2", "worker 2"},
		{"allreduce", []string{"--workers=3"}, "worker --rank=1", "worker 1"},
	}
	for _, c := range cases {
		t.Run(c.arch+"/kill-"+strings.ReplaceAll(c.name, " ", "-"), func(t *testing.T) {
			args := append([]string{"launch", "--arch=" + c.arch}, c.args...)
			l := start(t, "launch", nil, append(args, lostPeerScenario...)...)
			l.waitLine(t, "[worker 0] iteration 2/", 60*time.Second)
			victim, kids := childRunning(t, l, c.victim)
			if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			if !l.wait(detectWithin + 5*time.Second) {
				t.Fatalf("launch still running %v after %s was killed:\n%s", detectWithin+5*time.Second, c.name, l.output())
			}
			d := l.exit.Sub(killed)
			t.Logf("killed %s (pid %d): launch exited %d after %.2f s: %s", c.name, victim, l.code(), d.Seconds(), lastLine(l.stderr.String()))
			if d > detectWithin {
				t.Errorf("launch took %.2f s to exit after %s was killed, want <= %v", d.Seconds(), c.name, detectWithin)
			}
			if l.code() == 0 {
				t.Errorf("launch exited 0 after losing %s", c.name)
			}
			errLine := lastLine(l.stderr.String())
			if !strings.HasPrefix(errLine, "autobyte: ") || !strings.Contains(errLine, c.name) {
				t.Errorf("launch's last line should be its error naming %s, got %q", c.name, errLine)
			}
			noCrash(t, "launch", l.output())
			// Children that are not gone right after launch exits were left
			// behind (Pdeathsig would kill them a moment later; allow it).
			time.Sleep(300 * time.Millisecond)
			for pid, cl := range kids {
				if st, now := procState(pid); st != "" && now == cl {
					t.Errorf("child %d (%s) left behind in state %s after launch exited", pid, cl, st)
				}
			}
		})
	}
}

var spaces = regexp.MustCompile(`\s+`)

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return spaces.ReplaceAllString(s, " ")
}

// TestCleanShutdown: a job that runs to the end exits 0 every time (the
// orderly goodbyes at the end of a job must not race with closing the
// connections they travel on). Five short launches.
func TestCleanShutdown(t *testing.T) {
	for i := 0; i < 5; i++ {
		cmd := execCommand("launch", "--workers=2", "--servers=1", "--model=toy3", "--compute-scale=0.02", "--iterations=8", "--json")
		out, err := cmd.Output()
		if err != nil {
			t.Errorf("run %d of a job that should succeed: %v: %s", i+1, err, lastLine(stderrOf(err)))
			continue
		}
		var rep struct {
			Verified        bool      `json:"verified"`
			IterationTimesS []float64 `json:"iteration_times_s"`
		}
		if err := json.Unmarshal(out, &rep); err != nil || !rep.Verified || len(rep.IterationTimesS) != 8 {
			t.Errorf("run %d: report %q (err %v): want verified sums and 8 iteration times", i+1, out, err)
		}
	}
}

// TestLaunchHungChild stops (SIGSTOP) one child of 'autobyte launch': a
// process that hangs instead of dying keeps its sockets open, so only the
// peer timeout (5 s) notices it. Launch must end within 10 s of the stop,
// name the hung child as the root cause and leave nothing behind.
func TestLaunchHungChild(t *testing.T) {
	cases := []struct {
		victim string // the child's role flag
		name   string
	}{
		{"server --index=0", "server 0"},
		{"worker --rank=2", "worker 2"},
	}
	for _, c := range cases {
		t.Run("stop-"+strings.ReplaceAll(c.name, " ", "-"), func(t *testing.T) {
			args := append([]string{"launch", "--arch=ps", "--workers=3", "--servers=2"}, lostPeerScenario...)
			l := start(t, "launch", nil, args...)
			l.waitLine(t, "[worker 0] iteration 2/", 60*time.Second)
			victim, kids := childRunning(t, l, c.victim)
			if err := syscall.Kill(victim, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			// A stopped victim left behind must not outlive the test.
			t.Cleanup(func() { _ = syscall.Kill(victim, syscall.SIGKILL) })
			stopped := time.Now()
			if !l.wait(30 * time.Second) {
				t.Fatalf("launch still running 30 s after %s was stopped:\n%s", c.name, l.output())
			}
			d := l.exit.Sub(stopped)
			errLine := lastLine(l.stderr.String())
			t.Logf("stopped %s (pid %d): launch exited %d after %.2f s: %s", c.name, victim, l.code(), d.Seconds(), errLine)
			if d >= 10*time.Second {
				t.Errorf("launch took %.2f s to end the job after %s hung, want < 10 s", d.Seconds(), c.name)
			}
			if l.code() == 0 {
				t.Errorf("launch exited 0 after %s hung", c.name)
			}
			if want := "autobyte: launch: " + c.name + " stopped responding: "; !strings.HasPrefix(errLine, want) || !strings.Contains(errLine, "no data for 5s") {
				t.Errorf("launch's last line should name %s as hung (%q..., with the peer timeout), got %q", c.name, want, errLine)
			}
			noCrash(t, "launch", l.output())
			time.Sleep(300 * time.Millisecond)
			for pid, cl := range kids {
				if st, now := procState(pid); st != "" && now == cl {
					t.Errorf("child %d (%s) left behind in state %s after launch exited", pid, cl, st)
				}
			}
		})
	}
}
