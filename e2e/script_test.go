package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	libOnce sync.Once
	libPath string
	libErr  error
)

// engineLib builds the plugin's engine (cmd/libautobyte) once into a
// temporary directory, for scripts that open it through
// autobyte._native (no torch needed); it skips without python3.
func engineLib(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skipf("skipping: needs python3 to run a training script: %v", err)
	}
	libOnce.Do(func() {
		libPath = filepath.Join(filepath.Dir(bin), "libautobyte.so")
		out, err := exec.Command("go", "build", "-buildmode=c-shared", "-o", libPath, "github.com/autobyte/autobyte/cmd/libautobyte").CombinedOutput()
		if err != nil {
			libErr = err
			libPath = string(out)
		}
	})
	if libErr != nil {
		t.Fatalf("building the engine: %v\n%s", libErr, libPath)
	}
	return libPath
}

// stepScript opens the engine with one tensor of ones and runs ITERATIONS
// iterations (default 3), PAUSE seconds apart (default 0); every rank
// prints each sum; the rank RAISE names raises in the second iteration, as
// a training script with a bug does. Its peers then fail (the engine closed
// their connections with a reason) before it exits. An engine error ends
// the script as it ends a training script.
const stepScript = `
import atexit, ctypes, os, sys, time
from autobyte._native import Engine
rank, n = int(os.environ["RANK"]), 1000
eng = Engine([{"name": "w", "layer": 0, "elems": n}])

@atexit.register
def leave():
    # As autobyte.torch does: tell the peers why, then the interpreter's
    # (and torch's) teardown takes a while longer.
    if getattr(sys, "last_value", None) is not None:
        eng.close(False, "its training script raised an exception")
        time.sleep(1)
buf = (ctypes.c_float * n)()
for it in range(int(os.environ.get("ITERATIONS", "3"))):
    for i in range(n):
        buf[i] = 1.0
    eng.post(0, it, ctypes.addressof(buf), n)
    eng.wait_layer(0, it)
    print("iteration", it, "sum", buf[0], flush=True)
    time.sleep(float(os.environ.get("PAUSE", "0")))
    if it == 1 and rank == int(os.environ.get("RAISE", "-1")):
        raise ValueError("boom at rank %d" % rank)
eng.close()
`

// TestScriptRaises: the root cause of a job whose script raises on one
// worker is that worker and its exception, not the servers and workers
// that then lost it.
func TestScriptRaises(t *testing.T) {
	lib := engineLib(t)
	for _, raise := range []string{"1", "0"} {
		t.Run("rank-"+raise, func(t *testing.T) {
			l := start(t, "launch", []string{"AUTOBYTE_LIB=" + lib, "RAISE=" + raise},
				"launch", "--workers=3", "--servers=2", "--", "python3", "-c", stepScript)
			if !l.wait(60 * time.Second) {
				t.Fatalf("launch still running after 60 s:\n%s", l.output())
			}
			if l.code() == 0 {
				t.Fatalf("launch exited 0 though rank %s raised:\n%s", raise, l.output())
			}
			// Rank 0 got sums before the raise: the servers started once the
			// engine listened.
			if !strings.Contains(l.stdout.String(), "iteration 0 sum 3.0") {
				t.Errorf("rank 0 printed no sum of 3 for iteration 0 (were the servers started?):\n%s", l.output())
			}
			errLine := lastLine(l.stderr.String())
			want := "autobyte: launch: worker " + raise + " failed (exit status 1) after "
			if !strings.HasPrefix(errLine, want) || !strings.HasSuffix(errLine, ": ValueError: boom at rank "+raise) {
				t.Errorf("last line %q, want %q...: ValueError: boom at rank %s", errLine, want, raise)
			}
			if !strings.Contains(l.stderr.String(), "worker "+raise+": last ") || !strings.Contains(l.stderr.String(), "  | Traceback (most recent call last):") {
				t.Errorf("launch did not repeat worker %s's traceback before its error:\n%s", raise, l.stderr.String())
			}
			noCrash(t, "launch", l.stderr.String())
		})
	}
}

// storeScript is what torch.distributed's TCP store looks like on the
// rendezvous port: rank 0 listens at MASTER_PORT and never speaks first;
// the others connect to it. Nobody opens an autobyte engine. It lasts
// longer than the 5 s handshake timeout.
const storeScript = `
import os, socket, time
port = int(os.environ["MASTER_PORT"])
if os.environ["RANK"] == "0":
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(64)
    s.settimeout(0.1)
    conns, end = [], time.time() + 7
    while time.time() < end:
        try:
            conns.append(s.accept()[0])
        except socket.timeout:
            pass
    print("store done", flush=True)
else:
    time.sleep(0.5)
    c = socket.create_connection(("127.0.0.1", port))
    time.sleep(6.5)
`

// TestScriptWithoutEngine: a script that never opens an engine (torch DDP
// with the same launch command) runs to the end with --servers: the
// servers are never started, so they cannot fail the job by mistaking the
// store for the engine (they used to, after their 5 s handshake timeout).
func TestScriptWithoutEngine(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skipf("skipping: needs python3: %v", err)
	}
	begin := time.Now()
	cmd := execCommand("launch", "--workers=3", "--servers=2", "--", "python3", "-c", storeScript)
	cmd.Env = os.Environ()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	d := time.Since(begin)
	t.Logf("launch exited after %.2f s: %v", d.Seconds(), err)
	if err != nil {
		t.Fatalf("launch of a script without an engine failed: %v\nstdout: %s\nstderr: %s", err, out, stderr.String())
	}
	if strings.TrimSpace(string(out)) != "store done" {
		t.Errorf("stdout %q, want rank 0's line", out)
	}
	if strings.Contains(stderr.String(), "[server ") {
		t.Errorf("a server was started (or spoke) although no engine opened:\n%s", stderr.String())
	}
	if d > 12*time.Second {
		t.Errorf("launch took %.2f s for a 7 s script", d.Seconds())
	}
}

// TestScriptServerHung stops (SIGSTOP) a parameter server under a training
// script: the scripts' engines notice the silence after the peer timeout
// and their scripts raise. The root cause is the server that hung, which
// the scripts' engines report to launch as the peer they lost, not a
// script that raised nor the other server that lost it.
func TestScriptServerHung(t *testing.T) {
	lib := engineLib(t)
	l := start(t, "launch", []string{"AUTOBYTE_LIB=" + lib, "ITERATIONS=100000", "PAUSE=0.05"},
		"launch", "--workers=2", "--servers=2", "--", "python3", "-c", stepScript)
	l.waitLine(t, "[worker 1] iteration 5 sum 2.0", 60*time.Second)
	victim, _ := childRunning(t, l, "server --index=0")
	if err := syscall.Kill(victim, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(victim, syscall.SIGKILL) })
	stopped := time.Now()
	if !l.wait(30 * time.Second) {
		t.Fatalf("launch still running 30 s after server 0 was stopped:\n%s", l.output())
	}
	d := l.exit.Sub(stopped)
	errLine := lastLine(l.stderr.String())
	if d >= 10*time.Second {
		t.Errorf("launch took %.2f s to end the job after server 0 hung, want < 10 s", d.Seconds())
	}
	if l.code() == 0 {
		t.Errorf("launch exited 0 after server 0 hung")
	}
	if want := "autobyte: launch: server 0 stopped responding: worker "; !strings.HasPrefix(errLine, want) || !strings.Contains(errLine, "no data for 5s") {
		t.Errorf("launch's last line should name server 0 as hung (%q..., with the peer timeout), got %q\n%s", want, errLine, l.stderr.String())
	}
	noCrash(t, "launch", l.output())
}

// TestScriptEnvironment: the scheduling flags of launch reach a training
// script's engine through its environment (server weights among them),
// and the status pipe is given to the script but taken out of the
// environment of what the script starts once the plugin is imported.
func TestScriptEnvironment(t *testing.T) {
	lib := engineLib(t)
	const script = `
import os, subprocess, sys
print("weights", os.environ.get("AUTOBYTE_SERVER_WEIGHTS"), "shard", os.environ.get("AUTOBYTE_SHARD"), "status", os.environ.get("AUTOBYTE_STATUS_FD"))
import autobyte._native
child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('AUTOBYTE_STATUS_FD'))"], capture_output=True, text=True).stdout.strip()
print("child status", child)
`
	cmd := execCommand("launch", "--workers=1", "--servers=3", "--server-weights=4:4:1", "--shard=1MB", "--", "python3", "-c", script)
	cmd.Env = append(os.Environ(), "AUTOBYTE_LIB="+lib)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("launch failed: %v\nstdout: %s\nstderr: %s", err, out, stderr.String())
	}
	want := "weights 1000:1000:250 shard 1000000 status 3\nchild status None"
	if got := strings.TrimSpace(string(out)); got != want {
		t.Errorf("the script printed\n%s\nwant\n%s", got, want)
	}
}
