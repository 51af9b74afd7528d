package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/autobyte/autobyte/job"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/units"
	"github.com/autobyte/autobyte/worker"
)

// scriptGrace is how long the other processes of a job get to notice a
// failed one and exit on their own before launch stops them.
const scriptGrace = 4 * time.Second

// scriptEnv is the environment of worker rank of a scripted job: the
// torchrun conventions (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT) plus the AUTOBYTE_* settings the plugin reads (see package
// bridge), and what gloo needs to run torch DDP with the same command.
func scriptEnv(spec job.Spec, lc launchConfig, rank int, masterHost string, masterPort int, token string) []string {
	env := os.Environ()
	set := func(k, v string) { env = append(env, k+"="+v) }
	set("RANK", strconv.Itoa(rank))
	set("WORLD_SIZE", strconv.Itoa(spec.Workers))
	set("LOCAL_RANK", strconv.Itoa(rank))
	set("LOCAL_WORLD_SIZE", strconv.Itoa(spec.Workers))
	set("MASTER_ADDR", masterHost)
	set("MASTER_PORT", strconv.Itoa(masterPort))
	set("AUTOBYTE_TOKEN", token)
	if spec.Arch == worker.PS {
		set("AUTOBYTE_ARCH", "ps")
		set("AUTOBYTE_SERVERS", strconv.Itoa(spec.Servers))
		set("AUTOBYTE_SHARD", strconv.FormatInt(spec.ShardBytes, 10))
		if spec.PullMode {
			set("AUTOBYTE_PS_PULL", "1")
		}
	} else {
		set("AUTOBYTE_ARCH", "allreduce")
	}
	switch {
	case spec.Sched.PartitionBytes == 0 && spec.Sched.CreditBytes == 0 && spec.Sched.Order == sched.OrderFIFO:
		set("AUTOBYTE_SCHEDULER", "fifo")
	case spec.Sched.PartitionBytes == 0 && spec.Sched.CreditBytes == 0:
		set("AUTOBYTE_SCHEDULER", "priority")
	default:
		set("AUTOBYTE_SCHEDULER", "bytescheduler")
		set("AUTOBYTE_PARTITION", strconv.FormatInt(spec.Sched.PartitionBytes, 10))
		set("AUTOBYTE_CREDIT", strconv.FormatInt(spec.Sched.CreditBytes, 10))
	}
	if lc.shaped > 0 {
		set("AUTOBYTE_BANDWIDTH", strconv.FormatFloat(lc.shaped, 'g', -1, 64)+"B/s")
	}
	if lc.scriptTuner != "" {
		set("AUTOBYTE_TUNER", lc.scriptTuner)
	}
	if lc.linkRate > 0 {
		set("AUTOBYTE_LINK_RATE", strconv.FormatFloat(lc.linkRate, 'g', -1, 64)+"B/s")
	}
	if lc.traceDir != "" {
		set("AUTOBYTE_TRACE", filepath.Join(lc.traceDir, fmt.Sprintf("rank-%d.json", rank)))
	}
	set("AUTOBYTE_PEER_TIMEOUT", lc.peerTimeout.String())
	set("AUTOBYTE_LOG_LEVEL", lc.logLevel)
	if lc.bed != nil {
		host := spec.Servers + rank
		set("AUTOBYTE_LISTEN", net.JoinHostPort(lc.bed.Hosts[host].IP, "0"))
		set("GLOO_SOCKET_IFNAME", "eth0")
	} else {
		set("AUTOBYTE_LISTEN", "127.0.0.1:0")
		set("GLOO_SOCKET_IFNAME", "lo")
	}
	if dir := pythonDir(); dir != "" {
		pp := dir
		if old := os.Getenv("PYTHONPATH"); old != "" {
			pp += string(os.PathListSeparator) + old
		}
		set("PYTHONPATH", pp)
	}
	return env
}

// pythonDir finds this checkout's python/ directory (the plugin), from the
// working directory upwards; "" if there is none (an installed plugin).
func pythonDir() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for range 6 {
		if _, err := os.Stat(filepath.Join(dir, "python", "autobyte", "__init__.py")); err == nil {
			return filepath.Join(dir, "python")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return ""
}

// pipeLines copies lines from r to w, each prefixed, and keeps the last
// non-empty one in *last (if last is not nil).
func pipeLines(r io.Reader, w io.Writer, prefix string, mu *sync.Mutex, last *string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		mu.Lock()
		if last != nil && strings.TrimSpace(line) != "" {
			*last = line
		}
		fmt.Fprintf(w, "%s%s\n", prefix, line)
		mu.Unlock()
	}
}

// launchScript runs a user's training script as every worker of the job,
// with parameter servers started here (ps), and returns when all workers
// exited. Rank 0's stdout goes to out unprefixed (its last line is usually
// the script's result); everything else goes to errOut, prefixed.
func launchScript(ctx context.Context, argv []string, spec job.Spec, lc launchConfig, out, errOut io.Writer) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("launch: cannot find this program to start servers: %w", err)
	}
	if _, err := exec.LookPath(argv[0]); err != nil {
		return fmt.Errorf("launch: the training command %q: %w", argv[0], err)
	}
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return err
	}
	token := hex.EncodeToString(tok)
	masterHost, masterPort := "127.0.0.1", 0
	listen := func(int) string { return "127.0.0.1:0" }
	if lc.bed != nil {
		masterHost, masterPort = lc.bed.Hosts[spec.Servers].IP, 29500
		listen = func(host int) string { return net.JoinHostPort(lc.bed.Hosts[host].IP, "0") }
	} else if masterPort, err = freePort(); err != nil {
		return err
	}
	var mu sync.Mutex
	type proc struct {
		name   string
		cmd    *exec.Cmd
		server bool
		last   string
		out    bytes.Buffer
	}
	var procs []*proc
	command := func(host int, name string, args ...string) *exec.Cmd {
		if lc.bed != nil {
			return lc.bed.Command(context.Background(), host, name, args...)
		}
		return exec.Command(name, args...)
	}
	for m := 0; m < spec.Servers; m++ {
		args := []string{"server", "--index=" + strconv.Itoa(m), "--arch=ps",
			"--workers=" + strconv.Itoa(spec.Workers), "--servers=" + strconv.Itoa(spec.Servers),
			"--master=" + net.JoinHostPort(masterHost, strconv.Itoa(masterPort)), "--listen=" + listen(m),
			"--log-level=" + lc.logLevel, "--peer-timeout=" + lc.peerTimeout.String()}
		if spec.PullMode {
			args = append(args, "--ps-pull")
		}
		if lc.shaped > 0 {
			args = append(args, "--bandwidth="+strconv.FormatFloat(lc.shaped, 'g', -1, 64)+"B/s")
		}
		c := command(m, self, args...)
		c.Env = append(os.Environ(), "AUTOBYTE_TOKEN="+token)
		procs = append(procs, &proc{name: fmt.Sprintf("server %d", m), cmd: c, server: true})
	}
	for r := 0; r < spec.Workers; r++ {
		c := command(spec.Servers+r, argv[0], argv[1:]...)
		c.Env = scriptEnv(spec, lc, r, masterHost, masterPort, token)
		procs = append(procs, &proc{name: fmt.Sprintf("worker %d", r), cmd: c})
	}
	type exit struct {
		p   *proc
		err error
	}
	exits := make(chan exit, len(procs))
	stop := func(sig syscall.Signal) {
		for _, p := range procs {
			if p.cmd.Process != nil {
				_ = p.cmd.Process.Signal(sig) // fails harmlessly once it exited
			}
		}
	}
	running := 0
	for i, p := range procs {
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		stdout, err := p.cmd.StdoutPipe()
		if err != nil {
			return err
		}
		stderr, err := p.cmd.StderrPipe()
		if err != nil {
			return err
		}
		if err := p.cmd.Start(); err != nil {
			stop(syscall.SIGKILL)
			return fmt.Errorf("launch: starting %s (%s): %w", p.name, p.cmd.Path, err)
		}
		running++
		var pipes sync.WaitGroup
		pipes.Add(2)
		go func() {
			defer pipes.Done()
			switch {
			case p.server:
				_, _ = io.Copy(&p.out, stdout) // the server's JSON summary
			case i == spec.Servers:
				pipeLines(stdout, out, "", &mu, nil)
			default:
				pipeLines(stdout, errOut, "["+p.name+"] ", &mu, nil)
			}
		}()
		go func() {
			defer pipes.Done()
			pipeLines(stderr, errOut, "["+p.name+"] ", &mu, &p.last)
		}()
		// Wait after the pipes are drained (os/exec's rule).
		go func() {
			pipes.Wait()
			exits <- exit{p, p.cmd.Wait()}
		}()
	}
	start := time.Now()
	var failure error
	// A process killed by a signal is the likeliest root cause: the others
	// fail because they lost it, possibly before launch hears of the kill.
	failureKilled := false
	stopping := false // launch is stopping the processes itself
	workersLeft := spec.Workers
	var deadline <-chan time.Time
	for running > 0 {
		select {
		case e := <-exits:
			running--
			if !e.p.server {
				workersLeft--
			}
			killed := false
			if ee, ok := e.err.(*exec.ExitError); ok {
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					killed = true
				}
			}
			if e.err != nil && (failure == nil || killed && !failureKilled && !stopping) {
				failureKilled = killed
				mu.Lock()
				why := e.p.last
				mu.Unlock()
				if why == "" {
					why = e.err.Error()
				}
				failure = fmt.Errorf("launch: %s failed (%v) after %s: %s", e.p.name, e.err, units.FormatSeconds(time.Since(start).Seconds()), why)
				if deadline == nil {
					deadline = time.After(scriptGrace)
				}
			}
			if failure == nil && workersLeft == 0 && deadline == nil {
				// Servers end after every worker's goodbye.
				deadline = time.After(10 * time.Second)
			}
		case <-deadline:
			stopping = true
			if failure == nil {
				failure = fmt.Errorf("launch: parameter servers did not exit 10 s after the last worker: did every worker join the job (autobyte.torch.DistributedOptimizer) and finish it?")
			}
			stop(syscall.SIGTERM)
			deadline = time.After(time.Second)
			go func() { time.Sleep(time.Second); stop(syscall.SIGKILL) }()
		case <-ctx.Done():
			stopping = true
			stop(syscall.SIGTERM)
			go func() { time.Sleep(time.Second); stop(syscall.SIGKILL) }()
			if failure == nil {
				failure = fmt.Errorf("launch: interrupted: %w", context.Cause(ctx))
			}
			ctx = context.Background()
		}
	}
	return failure
}
