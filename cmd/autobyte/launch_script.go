package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/job"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/supervise"
	"github.com/autobyte/autobyte/transport"
	"github.com/autobyte/autobyte/worker"
)

// scriptGrace is how long the other processes of a job get to notice a
// failed one and exit on their own before launch stops them.
const scriptGrace = 4 * time.Second

// allocatorEnv returns glibc allocator settings for a training process
// whose environment is env, unless env already tunes glibc's allocator.
//
// A training step frees and allocates the same tensors (activations, and
// gradients after zero_grad) every iteration. By default glibc serves
// blocks above a threshold that starts at 128 KiB with mmap and returns
// freed memory at the top of its heap to the kernel, so such tensors come
// back as fresh pages that the kernel faults in and zeroes on every step.
// Fixing the mmap threshold at its largest (32 MiB) and trimming only
// above 4 GiB of free memory keeps them for reuse: ResNet-18 on 3
// loopback workers ran 20-30% faster so, DDP and autobyte alike
// (docs/pytorch.md). The cost is that a process keeps its peak heap.
func allocatorEnv(env []string) []string {
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "MALLOC_") || k == "GLIBC_TUNABLES" || k == "LD_PRELOAD" {
			return nil // the user chose the allocator's settings (or another allocator)
		}
	}
	return []string{"MALLOC_MMAP_THRESHOLD_=33554432", "MALLOC_TRIM_THRESHOLD_=4294967296"}
}

// scriptEnv is the environment of worker rank of a scripted job: the
// torchrun conventions (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT: torchPort, for the script's own torch.distributed) plus
// AUTOBYTE_MASTER_PORT (masterPort, autobyte's rendezvous) and the other
// AUTOBYTE_* settings the plugin reads (see package bridge), and what gloo
// needs to run torch DDP with the same command.
func scriptEnv(spec job.Spec, lc launchConfig, rank int, masterHost string, masterPort, torchPort int, token string) []string {
	env := os.Environ()
	set := func(k, v string) { env = append(env, k+"="+v) }
	set("RANK", strconv.Itoa(rank))
	set("WORLD_SIZE", strconv.Itoa(spec.Workers))
	set("LOCAL_RANK", strconv.Itoa(rank))
	set("LOCAL_WORLD_SIZE", strconv.Itoa(spec.Workers))
	set("MASTER_ADDR", masterHost)
	set("MASTER_PORT", strconv.Itoa(torchPort))
	set("AUTOBYTE_MASTER_PORT", strconv.Itoa(masterPort))
	set("AUTOBYTE_TOKEN", token)
	if spec.Arch == worker.PS {
		set("AUTOBYTE_ARCH", "ps")
		set("AUTOBYTE_SERVERS", strconv.Itoa(spec.Servers))
		set("AUTOBYTE_SHARD", strconv.FormatInt(spec.ShardBytes, 10))
		if w := spec.Sched.ServerWeights; w.Weighted() {
			set("AUTOBYTE_SERVER_WEIGHTS", w.String())
		}
		if spec.PullMode {
			set("AUTOBYTE_PS_PULL", "1")
		}
	} else {
		set("AUTOBYTE_ARCH", "allreduce")
	}
	if spec.Sched.FusionBytes > 0 {
		set("AUTOBYTE_FUSION", strconv.FormatInt(spec.Sched.FusionBytes, 10))
	} else if lc.scriptAuto.Fuse != 0 {
		set("AUTOBYTE_FUSION", "auto")
	}
	if c := spec.Sched.Compression; c != dtype.F32 {
		set("AUTOBYTE_COMPRESSION", c.String())
	} else if lc.scriptAuto.Compress != dtype.F32 {
		set("AUTOBYTE_COMPRESSION", "auto")
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
	if lc.tuneMalloc {
		env = append(env, allocatorEnv(env)...)
	}
	set("AUTOBYTE_PEER_TIMEOUT", lc.peerTimeout.String())
	if lc.noShm {
		set("AUTOBYTE_SHM", "0")
	}
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

// launchScript runs a user's training command as every worker of the job
// and returns when all of them exited. With parameter servers, the
// servers start once a worker's autobyte engine listens at the
// rendezvous address (transport.Probe): a script that never opens an
// engine (torch DDP with the same command) then runs without them, and a
// torch.distributed store on that port is not mistaken for the engine.
// Rank 0's stdout goes to out unprefixed (its last line is usually the
// script's result); everything else goes to errOut, prefixed.
func launchScript(ctx context.Context, argv []string, spec job.Spec, lc launchConfig, out, errOut io.Writer) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("launch: cannot find this program to start servers: %w", err)
	}
	if _, err := exec.LookPath(argv[0]); err != nil {
		return fmt.Errorf("launch: the training command %q: %w", argv[0], err)
	}
	token, err := newToken()
	if err != nil {
		return err
	}
	// The script's torch.distributed (DDP, or a metrics all-reduce beside
	// autobyte) listens at MASTER_PORT, autobyte's rank 0 at
	// AUTOBYTE_MASTER_PORT: two ports, so that both can run in one job.
	masterHost, masterPort, torchPort := "127.0.0.1", 0, 0
	listen := func(int) string { return "127.0.0.1:0" }
	if lc.bed != nil {
		masterHost, torchPort, masterPort = lc.bed.Hosts[spec.Servers].IP, 29500, 29501
		listen = func(host int) string { return net.JoinHostPort(lc.bed.Hosts[host].IP, "0") }
	} else if masterPort, torchPort, err = twoFreePorts(); err != nil {
		return err
	}
	master := net.JoinHostPort(masterHost, strconv.Itoa(masterPort))
	var mu sync.Mutex // out and errOut
	lineTo := func(w io.Writer, prefix string) func(string) {
		return func(line string) {
			mu.Lock()
			defer mu.Unlock()
			fmt.Fprintf(w, "%s%s\n", prefix, line)
		}
	}
	command := func(host int, name string, args ...string) *exec.Cmd {
		if lc.bed != nil {
			return lc.bed.Command(context.Background(), host, name, args...)
		}
		return exec.Command(name, args...)
	}
	sup := supervise.New(supervise.Options{Grace: scriptGrace, LostPeer: scriptLostPeer})
	for r := 0; r < spec.Workers; r++ {
		name := fmt.Sprintf("worker %d", r)
		// Status: the script's engine reports the peer it lost, if that is
		// why it failed (the script itself only shows its exception).
		c := &supervise.Child{Name: name, Cmd: command(spec.Servers+r, argv[0], argv[1:]...), Status: true, OnStderr: lineTo(errOut, "["+name+"] ")}
		c.Cmd.Env = scriptEnv(spec, lc, r, masterHost, masterPort, torchPort, token)
		c.OnStdout = lineTo(errOut, "["+name+"] ")
		if r == 0 {
			c.OnStdout = lineTo(out, "")
		}
		if err := sup.Start(c); err != nil {
			stopNow(sup)
			return fmt.Errorf("launch: %w", err)
		}
	}
	// The servers serve every engine the script opens, one after another
	// (a script may train a model, shut autobyte down and distribute the
	// next), until the workers are done and launch stops them.
	jobArgs := []string{"--arch=ps", "--workers=" + strconv.Itoa(spec.Workers), "--servers=" + strconv.Itoa(spec.Servers),
		"--master=" + master, "--log-level=" + lc.logLevel, "--peer-timeout=" + lc.peerTimeout.String(), "--sessions=0"}
	if lc.noShm {
		jobArgs = append(jobArgs, "--shm=false")
	}
	if spec.PullMode {
		jobArgs = append(jobArgs, "--ps-pull")
	}
	if lc.shaped > 0 {
		jobArgs = append(jobArgs, "--bandwidth="+strconv.FormatFloat(lc.shaped, 'g', -1, 64)+"B/s")
	}
	startServers := func() error {
		for m := 0; m < spec.Servers; m++ {
			name := fmt.Sprintf("server %d", m)
			c := &supervise.Child{Name: name, Cmd: command(m, self, childArgs("server", m, nil, jobArgs, listen(m))...),
				Status: true, Server: true, UntilStopped: true, OnStderr: lineTo(errOut, "["+name+"] ")}
			c.Cmd.Env = append(os.Environ(), "AUTOBYTE_TOKEN="+token)
			if err := sup.Start(c); err != nil {
				return err
			}
		}
		return nil
	}
	probeCtx, stopProbe := context.WithCancel(ctx)
	defer stopProbe()
	startErr := make(chan error, 1)
	if spec.Servers > 0 {
		go func() {
			if awaitEngine(probeCtx, lc, spec.Servers, master) {
				startErr <- startServers()
			}
		}()
	}
	_, err = sup.Wait(ctx)
	stopProbe()
	select {
	case serr := <-startErr:
		if serr != nil && !errors.Is(serr, supervise.ErrStopping) && err == nil {
			err = fmt.Errorf("starting the parameter servers: %w", serr)
		}
	default:
	}
	if err != nil {
		return reportFailure(errOut, err)
	}
	return nil
}

// scriptLostPeer tells a script that failed because its engine lost a
// peer (the plugin raises autobyte.AutobyteError naming it) from one that
// failed on its own, by the last line Python prints for an uncaught
// exception.
func scriptLostPeer(last string) bool {
	return strings.HasPrefix(last, "autobyte.AutobyteError: ") && strings.Contains(last, ": lost ")
}

// awaitEngine waits until an autobyte engine listens at master (rank 0's
// plugin opened the job) and reports whether it does before ctx ends.
// With a testbed the probe runs inside the servers' first host.
func awaitEngine(ctx context.Context, lc launchConfig, servers int, master string) bool {
	for {
		if lc.bed != nil {
			// The launcher's namespace may not reach the testbed's hosts:
			// ask from inside one, with this same program.
			self, err := os.Executable()
			if err == nil && lc.bed.Command(ctx, 0, self, "probe", master).Run() == nil {
				return true
			}
		} else if transport.Probe(ctx, master, 500*time.Millisecond) == nil {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(200 * time.Millisecond):
		}
	}
}
