package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// cleanEnv is the environment without the rendezvous and token variables.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		switch strings.SplitN(kv, "=", 2)[0] {
		case "AUTOBYTE_TOKEN", "MASTER_ADDR", "MASTER_PORT", "AUTOBYTE_MASTER_PORT", "AUTOBYTE_RENDEZVOUS_TIMEOUT", "RANK", "WORLD_SIZE":
			continue
		}
		env = append(env, kv)
	}
	return env
}

// cliRun is how one autobyte command ended.
type cliRun struct {
	stdout, stderr string
	code           int
	took           time.Duration
}

// runCLI runs autobyte with args, in the environment cleared of the
// rendezvous variables plus env (KEY=VALUE), failing the test if it runs
// longer than limit.
func runCLI(t *testing.T, args []string, limit time.Duration, env ...string) cliRun {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(cleanEnv(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	began := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(limit):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%v: still running after %v; stderr: %q", args, limit, stderr.String())
	}
	return cliRun{stdout: stdout.String(), stderr: stderr.String(), code: cmd.ProcessState.ExitCode(), took: time.Since(began)}
}

// TestRendezvousTimeout: a worker whose rank 0 never starts (nobody
// listens at the master's port), and a rank 0 whose other members never
// come, exit 1 after --rendezvous-timeout, saying what they waited for.
func TestRendezvousTimeout(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"worker", "--rank=1", "--workers=2", "--model=toy3", "--token=x", "--master=127.0.0.1:1"}, "still waiting for rank 0's autobyte engine to answer: none has yet"},
		{[]string{"worker", "--rank=0", "--workers=3", "--servers=1", "--model=toy3", "--token=x", "--master=127.0.0.1:0"}, "still waiting for worker 1, worker 2 and server 0, of 3 workers and 1 server"},
	} {
		r := runCLI(t, append(c.args, "--rendezvous-timeout=1s"), 15*time.Second)
		if r.code != 1 {
			t.Errorf("%v: exit status %d, want 1", c.args, r.code)
		}
		if r.took < time.Second {
			t.Errorf("%v: gave up after %v, before its 1 s timeout", c.args, r.took)
		}
		if !strings.Contains(r.stderr, "timed out after 1s") || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v: stderr %q does not say it timed out waiting for %q", c.args, r.stderr, c.want)
		}
	}
	// The variable sets the timeout when the flag is not given; a given
	// flag wins over it, even at the flag's default value.
	joiner := []string{"worker", "--rank=1", "--workers=2", "--model=toy3", "--token=x", "--master=127.0.0.1:1"}
	if r := runCLI(t, joiner, 15*time.Second, "AUTOBYTE_RENDEZVOUS_TIMEOUT=1s"); r.code != 1 || !strings.Contains(r.stderr, "timed out after 1s") {
		t.Errorf("AUTOBYTE_RENDEZVOUS_TIMEOUT=1s: exit %d, stderr %q; want a timeout after 1s", r.code, r.stderr)
	}
	if r := runCLI(t, append(joiner, "--rendezvous-timeout=2s"), 15*time.Second, "AUTOBYTE_RENDEZVOUS_TIMEOUT=1h"); !strings.Contains(r.stderr, "timed out after 2s") {
		t.Errorf("--rendezvous-timeout=2s beside AUTOBYTE_RENDEZVOUS_TIMEOUT=1h: stderr %q; want the flag's 2s", r.stderr)
	}
	if r := runCLI(t, joiner, 10*time.Second, "AUTOBYTE_RENDEZVOUS_TIMEOUT=soon"); r.code != 1 || !strings.Contains(r.stderr, `AUTOBYTE_RENDEZVOUS_TIMEOUT: rendezvous timeout "soon"`) {
		t.Errorf("AUTOBYTE_RENDEZVOUS_TIMEOUT=soon: exit %d, stderr %q; want an error naming it", r.code, r.stderr)
	}
}

// TestCLIErrors: bad command lines exit 1 at once with one line naming
// the problem, and start nothing.
func TestCLIErrors(t *testing.T) {
	cases := []struct {
		args []string
		want []string // every one must appear in the line
	}{
		{[]string{"launch", "--bogus"}, []string{"--bogus"}},
		{[]string{"launch", "--workers=abc", "--model=toy3"}, []string{"--workers", "abc"}},
		{[]string{"launch", "--workers=2", "--model=nosuch"}, []string{"nosuch"}},
		{[]string{"launch", "--workers=2", "--model=toy3", "--verify=some"}, []string{"--verify", "some"}},
		{[]string{"launch", "--workers=2", "--model=toy3", "--bandwidth=fast"}, []string{"--bandwidth", "fast"}},
		{[]string{"launch", "--workers=2", "--model=toy3", "--peer-timeout=-1s"}, []string{"--peer-timeout"}},
		{[]string{"launch", "--workers=2", "--model=toy3", "--log-level=loud"}, []string{"--log-level", "loud"}},
		{[]string{"worker", "--rank=0", "--workers=2", "--model=toy3", "--master=127.0.0.1:1"}, []string{"token", "--token", "AUTOBYTE_TOKEN"}},
		{[]string{"worker", "--rank=0", "--workers=2", "--model=toy3", "--token=x"}, []string{"coordinator", "--master", "MASTER_ADDR"}},
		{[]string{"worker", "--rank=0", "--workers=2", "--model=toy3"}, []string{"--master"}},
		{[]string{"server", "--index=0", "--workers=2", "--model=toy3", "--master=127.0.0.1:1"}, []string{"token", "--token"}},
		{[]string{"server", "--index=0", "--workers=2", "--model=toy3", "--token=x"}, []string{"--master"}},
		{[]string{"worker", "--rank=1", "--workers=2", "--model=toy3", "--token=x", "--master=127.0.0.1:1", "--rendezvous-timeout=0s"}, []string{"--rendezvous-timeout", "0s"}},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			r := runCLI(t, c.args, 10*time.Second)
			stdout, stderr := r.stdout, r.stderr
			if r.code != 1 {
				t.Errorf("exit status %d, want 1", r.code)
			}
			lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
			if len(lines) != 1 || lines[0] == "" {
				t.Errorf("want exactly one line on stderr, got %d: %q", len(lines), stderr)
			}
			for _, w := range c.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("error %q does not mention %q", strings.TrimSpace(stderr), w)
				}
			}
			// launch must reject its own flags before it starts any process: an
			// error relayed from a child reads "autobyte: launch: server 0
			// failed: autobyte: ...".
			if n := strings.Count(stderr, "autobyte: "); n != 1 {
				t.Errorf("the error should be launch's own, not relayed from a child process (\"autobyte: \" %d times): %q", n, strings.TrimSpace(stderr))
			}
			if stdout != "" {
				t.Errorf("stdout should be empty, got %q", stdout)
			}
			t.Logf("%.0f ms: %s", r.took.Seconds()*1000, strings.TrimSpace(stderr))
		})
	}
}
