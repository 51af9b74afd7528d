// Package e2e runs the autobyte binary as real processes: servers, workers
// and the launcher on loopback (and, as root, in a testbed), kills them, feeds
// them bad peers and measures their throughput. See docs/runtime-tests.md.
package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/autobyte/autobyte/cluster"
	"github.com/autobyte/autobyte/internal/syncbuf"
	"github.com/autobyte/autobyte/testbed"
)

// bin is the autobyte binary built by TestMain.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "autobyte-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "autobyte")
	build := exec.Command("go", "build", "-o", bin, "github.com/autobyte/autobyte/cmd/autobyte")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: building autobyte:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is one running autobyte process.
type proc struct {
	name   string
	cmd    *exec.Cmd
	stdout syncbuf.Buffer
	stderr syncbuf.Buffer
	// lines receives every stderr line (dropped when nobody listens).
	lines chan string
	done  chan struct{} // closed when the process exited
	err   error         // Wait's result, valid after done
	exit  time.Time     // when Wait returned
}

// start runs the binary with args; the process is killed when the test ends.
func start(t *testing.T, name string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(bin, args...), lines: make(chan string, 1024), done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout = &p.stdout
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	pipe, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() {
		sc := bufio.NewScanner(pipe)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			line := sc.Text()
			p.stderr.Write([]byte(line + "\n"))
			select {
			case p.lines <- line:
			default:
			}
		}
		p.err = p.cmd.Wait()
		p.exit = time.Now()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// waitLine waits until a stderr line contains s.
func (p *proc) waitLine(t *testing.T, s string, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l := <-p.lines:
			if strings.Contains(l, s) {
				return
			}
		case <-p.done:
			t.Fatalf("%s exited (%v) before printing %q\nstderr:\n%s\nstdout:\n%s", p.name, p.err, s, p.stderr.String(), p.stdout.String())
		case <-deadline:
			t.Fatalf("%s did not print %q within %v\nstderr:\n%s", p.name, s, timeout, p.stderr.String())
		}
	}
}

// wait waits for the process to exit; false if it did not within timeout.
func (p *proc) wait(timeout time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
		return false
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// code is the exit status (-1 if killed by a signal).
func (p *proc) code() int { return p.cmd.ProcessState.ExitCode() }

// output is stdout and stderr, for matching and for failure messages.
func (p *proc) output() string {
	return "stdout: " + p.stdout.String() + "\nstderr: " + p.stderr.String()
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	port, err := cluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// requireRoot skips a test that needs a testbed when it cannot have one,
// unless CI=true, where that is a failure.
func requireRoot(t testing.TB) {
	t.Helper()
	if err := testbed.Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("testbed needed and unavailable under CI=true: %v", err)
		}
		t.Logf("ROOT-ONLY TEST NOT RUN: %s needs a testbed, which needs root (and ip, tc, network namespaces): %v", t.Name(), err)
		t.Skipf("skipping: needs root for a testbed (ip, tc, netns): %v", err)
	}
}

// noCrash fails if out shows a Go panic or a goroutine dump.
func noCrash(t *testing.T, who, out string) {
	t.Helper()
	for _, s := range []string{"panic:", "goroutine ", "fatal error:"} {
		if strings.Contains(out, s) {
			t.Errorf("%s crashed (%q in its output):\n%s", who, s, out)
		}
	}
}

// execCommand is the binary with args, killed if the test process dies.
func execCommand(args ...string) *exec.Cmd {
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// stderrOf is the stderr captured by (*exec.Cmd).Output in its error.
func stderrOf(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}
