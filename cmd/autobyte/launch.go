package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/autobyte/autobyte/cluster"
	"github.com/autobyte/autobyte/job"
	"github.com/autobyte/autobyte/sim"
	"github.com/autobyte/autobyte/stats"
	"github.com/autobyte/autobyte/supervise"
	"github.com/autobyte/autobyte/testbed"
	"github.com/autobyte/autobyte/tlsca"
	"github.com/autobyte/autobyte/tune"
	"github.com/autobyte/autobyte/units"
)

func newLaunchCmd() *cobra.Command {
	var f scenarioFlags
	var asJSON bool
	var verify, logLevel string
	var peerTimeout time.Duration
	var bedName, traceDir string
	var metricsPort int
	var useTLS bool
	var tf tunerFlags
	cmd := &cobra.Command{
		Use:   "launch",
		Short: "Start a whole local cluster (servers and workers as separate processes on loopback) and run a job",
		Long: `launch starts --servers parameter servers and --workers workers as separate
processes on this machine, connected over loopback TCP, runs the job, shows
rank 0's progress per iteration and prints a summary. With --bandwidth every
process shapes its own egress and ingress to that rate (in-process token
buckets), so the cluster behaves like hosts on links of that rate.

If any process fails, the others are stopped and launch exits non-zero with
the failed process's error.`,
		Example: `  autobyte launch --workers 4 --servers 2 --model resnet50 --bandwidth 1Gbps --iterations 10
  autobyte launch --workers 4 --arch allreduce --model vgg16 --compute-scale 2 --json
  autobyte launch --workers 3 --servers 3 --bandwidth 1Gbps -- /usr/bin/python3 examples/torch_cnn.py --backend autobyte
  autobyte launch --workers 3 --arch allreduce --bandwidth 1Gbps -- /usr/bin/python3 examples/torch_cnn.py --backend ddp`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 && cmd.ArgsLenAtDash() != 0 {
				return fmt.Errorf("unexpected arguments %q (a training command goes after --)", args)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, script []string) error {
			if cmd.Flags().Changed("congestion") && bedName == "" {
				return fmt.Errorf("--congestion needs --testbed: on loopback every process shares this machine's TCP settings")
			}
			if len(script) > 0 {
				return runScriptLaunch(cmd, &f, script, bedName, traceDir, logLevel, peerTimeout)
			}
			if err := simOnly(cmd); err != nil {
				return err
			}
			if cmd.Flags().Changed("tune-malloc") {
				return fmt.Errorf("--tune-malloc applies to a training command after -- (a replay's processes are Go's and do not use glibc's allocator)")
			}
			spec, o, err := f.spec(cmd)
			if err != nil {
				return err
			}
			// Every process runs on this machine: its memory is the bound.
			if _, err := o.RuntimeBudget(supervise.MachineMemory()); err != nil {
				return f.budgetFlag(o, err)
			}
			if _, err := parseVerify(verify); err != nil {
				return err
			}
			if _, err := tf.build(o, f.seed, f.autoKnobs()); err != nil {
				return err
			}
			if len(o.BandwidthTrace) > 0 && bedName == "" {
				return fmt.Errorf("--bandwidth-trace %s needs --testbed NAME: the launcher changes each host's tc rate as rank 0 reaches each step; in-process shaping cannot follow a trace (parameter servers do not know the iteration)", f.bandwidthTrace)
			}
			if len(o.WorkerLinkTraces) > 0 && bedName == "" {
				return fmt.Errorf("--link-trace: a worker's link trace needs --testbed NAME (the launcher changes that host's tc rate as rank 0 reaches each step); without one, only parameter servers follow theirs, in-process")
			}
			if _, err := processFlags(logLevel, peerTimeout); err != nil {
				return err
			}
			ctx, stop := signalContext()
			defer stop()
			lc := launchConfig{verify: verify, logLevel: logLevel, peerTimeout: peerTimeout,
				shaped: shapedRate(cmd, o), progress: cmd.ErrOrStderr(), traceDir: traceDir, metricsPort: metricsPort,
				workerArgs: tf.args(), noShm: noShm(cmd)}
			if traceDir != "" {
				if err := os.MkdirAll(traceDir, 0o755); err != nil {
					return fmt.Errorf("--trace: %w", err)
				}
			}
			if metricsPort < 0 || metricsPort > 65535-spec.Workers {
				return fmt.Errorf("--metrics-port %d out of range: worker r serves on port PORT+r, so with %d workers PORT must be in 1..%d (0 = off)",
					metricsPort, spec.Workers, 65535-spec.Workers)
			}
			if bedName != "" {
				rates := hostRates{o: o, servers: spec.Servers}
				traced := len(o.BandwidthTrace) > 0 || len(o.ServerLinkTraces)+len(o.WorkerLinkTraces) > 0
				bed, cleanup, err := prepareTestbed(ctx, cmd, bedName, spec.Workers+spec.Servers, rates, traced)
				if err != nil {
					return err
				}
				defer cleanup()
				lc.bed, lc.shaped = bed, 0
				lc.rates = rates
			}
			args := scenarioArgs(cmd)
			if useTLS {
				dir, err := os.MkdirTemp("", "autobyte-tls-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				ips := []net.IP{net.IPv4(127, 0, 0, 1)}
				if lc.bed != nil {
					for _, h := range lc.bed.Hosts {
						ips = append(ips, net.ParseIP(h.IP))
					}
				}
				files, err := tlsca.Ephemeral(dir, ips)
				if err != nil {
					return fmt.Errorf("--tls: %w", err)
				}
				args = append(args, "--tls-cert="+files.Cert, "--tls-key="+files.Key, "--tls-ca="+files.CA)
			}
			res, err := launchLocal(ctx, args, spec, lc)
			if err != nil {
				return err
			}
			rep := newLaunchReport(f, o, res)
			rep.ShapedBps = shapedRate(cmd, o)
			rep.RateChanges = res.rateChanges
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(rep)
			}
			return rep.writeText(cmd.OutOrStdout())
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	cmd.Flags().StringVar(&verify, "verify", "sample", "workers check sums against exact values: none, sample or full")
	cmd.Flags().StringVar(&logLevel, "log-level", "warn", "children's log level")
	cmd.Flags().DurationVar(&peerTimeout, "peer-timeout", 5*time.Second, "a silent peer fails the job after this long")
	cmd.Flags().BoolVar(&useTLS, "tls", false, "use mutual TLS on every connection (a throw-away CA and certificate for this run)")
	cmd.Flags().StringVar(&traceDir, "trace", "", "write each worker's Chrome-trace timeline to DIR/rank-N.json (a training command's too: AUTOBYTE_TRACE)")
	cmd.Flags().IntVar(&metricsPort, "metrics-port", 0, "serve worker r's Prometheus metrics on port PORT+r (0 = off)")
	cmd.Long += `

With a command after --, launch runs that command (a training script using
the PyTorch plugin, python/autobyte) as every worker instead of replaying a
model: it starts the parameter servers (--arch ps) and the script with
RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (for the script's own
torch.distributed), AUTOBYTE_MASTER_PORT (autobyte's rendezvous),
AUTOBYTE_* (the scheduling flags) and GLOO_SOCKET_IFNAME set, so torch DDP
runs with the same command.
Rank 0's output goes to stdout; the others' to stderr, prefixed. If one
process fails, the rest are stopped within a few seconds.`
	cmd.Flags().Bool("tune-malloc", true, "give a training command glibc allocator settings that keep freed memory for reuse "+
		"(MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_; see docs/pytorch.md) unless its environment sets them; false leaves glibc's defaults")
	cmd.Flags().Bool("shm", true, "carry the bytes between processes of one host through shared memory; false keeps them on TCP "+
		"(hosts of a testbed are apart and use TCP either way)")
	cmd.Flags().StringVar(&bedName, "testbed", "", "run each process in its own host of this testbed (root; created for the run if it does not exist); --bandwidth is then each host's tc rate")
	cmd.Flags().String("congestion", "", "with --testbed: the hosts' TCP congestion control for this run (cubic, bbr, reno, ...; default: cubic on a testbed created for the run, an existing one's as it is)")
	tf.register(cmd)
	cmd.Long += `

Rank 0 measures every iteration's statistics and hands them to --tuner,
whose proposals change the partition and credit on every worker and server
at an iteration boundary (configuration epochs); --json then reports
mean_iteration_time_s over the whole run and configs, each with the
iteration it applied from. --compute-trace and --straggler scale the
replay's compute by iteration and rank. --bandwidth-trace needs --testbed:
the launcher sets every host's tc rate to each step when rank 0 reports
reaching its iteration (see docs/runtime-tuning.md).`
	return cmd
}

// runScriptLaunch is launch with a training command after --.
func runScriptLaunch(cmd *cobra.Command, f *scenarioFlags, script []string, bedName, traceDir, logLevel string, peerTimeout time.Duration) error {
	// Flags the plugin has no setting for would do nothing: refuse them.
	for _, name := range []string{"json", "verify", "tls", "metrics-port", "model", "profile", "iterations",
		"grid-partitions", "grid-credits", "grid-trial", "bo-trial", "bandwidth-trace", "link-trace", "compute-trace", "straggler",
		"admission", "jitter", "seed", "latency", "compute-scale"} {
		if cmd.Flags().Changed(name) {
			return fmt.Errorf("--%s does not apply to a training command (the script decides)", name)
		}
	}
	spec, o, err := f.specFor(cmd, false)
	if err != nil {
		return err
	}
	if err := sim.ProcessesBudget(spec.Workers, spec.Servers, supervise.MachineMemory()); err != nil {
		return f.budgetFlag(o, err)
	}
	if _, err := processFlags(logLevel, peerTimeout); err != nil {
		return err
	}
	tuner, _ := cmd.Flags().GetString("tuner")
	switch tuner {
	case "static", "autobyte", "bo":
	default:
		return fmt.Errorf("--tuner %q: a training command supports static, autobyte or bo", tuner)
	}
	ctx, stop := signalContext()
	defer stop()
	tuneMalloc, _ := cmd.Flags().GetBool("tune-malloc")
	lc := launchConfig{logLevel: logLevel, peerTimeout: peerTimeout, shaped: shapedRate(cmd, o), progress: cmd.ErrOrStderr(),
		scriptTuner: tuner, traceDir: traceDir, scriptAuto: f.autoKnobs(), tuneMalloc: tuneMalloc, noShm: noShm(cmd)}
	if err := lc.scriptAuto.check(tuner); err != nil {
		return err
	}
	if traceDir != "" {
		if err := os.MkdirAll(traceDir, 0o755); err != nil {
			return fmt.Errorf("--trace: %w", err)
		}
	}
	if cmd.Flags().Changed("bandwidth") {
		lc.linkRate = o.BandwidthBps
	}
	if bedName != "" {
		bed, cleanup, err := prepareTestbed(ctx, cmd, bedName, spec.Workers+spec.Servers, hostRates{o: o, servers: spec.Servers}, false)
		if err != nil {
			return err
		}
		defer cleanup()
		lc.bed, lc.shaped = bed, 0
	}
	return launchScript(ctx, script, spec, lc, cmd.OutOrStdout(), cmd.ErrOrStderr())
}

// hostRates are each testbed host's link rate by iteration: servers are
// hosts 0..M-1 and workers M..M+N-1, each at its --link-trace, else at
// --bandwidth and --bandwidth-trace (the simulator's rule, sim.Options).
type hostRates struct {
	o       sim.Options
	servers int
}

func (r hostRates) at(host, k int) float64 {
	if host < r.servers {
		return r.o.ServerRateAt(host, k)
	}
	return r.o.WorkerRateAt(host-r.servers, k)
}

func (r hostRates) name(host int) string {
	if host < r.servers {
		return fmt.Sprintf("server%d", host)
	}
	return fmt.Sprintf("worker%d", host-r.servers)
}

// changes are the iterations at which some host's rate changes, after 0.
func (r hostRates) changes() []sim.Step {
	var its []int
	add := func(steps []sim.Step) {
		for _, st := range steps {
			if st.Iteration > 0 && !slices.Contains(its, st.Iteration) {
				its = append(its, st.Iteration)
			}
		}
	}
	add(r.o.BandwidthTrace)
	for _, m := range []map[int][]sim.Step{r.o.ServerLinkTraces, r.o.WorkerLinkTraces} {
		for _, steps := range m {
			add(steps)
		}
	}
	slices.Sort(its)
	out := make([]sim.Step, len(its))
	for i, k := range its {
		out[i] = sim.Step{Iteration: k}
	}
	return out
}

// prepareTestbed loads testbed name, or creates it for this run (removed
// again by cleanup), and sets every host's rate to its rate at iteration 0
// when --bandwidth is given or force is set.
func prepareTestbed(ctx context.Context, cmd *cobra.Command, name string, hosts int, rates hostRates, force bool) (*testbed.Testbed, func(), error) {
	if err := testbed.Available(); err != nil {
		return nil, nil, fmt.Errorf("--testbed %s: %w", name, err)
	}
	congestion, _ := cmd.Flags().GetString("congestion")
	rateBps := rates.o.BandwidthAt(0)
	cleanup, created := func() {}, false
	bed, err := testbed.Load(name)
	if err != nil {
		created = true
		bed, err = testbed.Up(ctx, testbed.Options{Name: name, Hosts: hosts, RateBps: rateBps, Congestion: congestion})
		if err != nil {
			return nil, nil, fmt.Errorf("--testbed %s: %w", name, err)
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "testbed %s: %d hosts at %s, TCP %s (removed after the run)\n", name, hosts, units.FormatRate(rateBps), bed.Congestion)
		cleanup = func() { _ = testbed.Down(context.Background(), name) }
	} else if len(bed.Hosts) < hosts {
		return nil, nil, fmt.Errorf("--testbed %s has %d hosts, the job needs %d (workers + servers)", name, len(bed.Hosts), hosts)
	} else if congestion != "" && congestion != bed.Congestion {
		if err := bed.SetCongestion(ctx, congestion); err != nil {
			return nil, nil, fmt.Errorf("--congestion %s: %w", congestion, err)
		}
	}
	if cmd.Flags().Changed("bandwidth") || force {
		for h := 0; h < hosts; h++ {
			if r := rates.at(h, 0); r != rateBps || !created { // a new bed is at rateBps already
				if err := bed.Set(ctx, h, r, bed.Hosts[h].DelayS); err != nil {
					cleanup()
					return nil, nil, fmt.Errorf("--testbed %s: %s: %w", name, rates.name(h), err)
				}
			}
		}
	}
	return bed, cleanup, nil
}

type launchConfig struct {
	// scriptTuner and linkRate are a training command's tuner and the
	// hosts' rate it is told (0: unknown).
	scriptTuner string
	linkRate    float64
	// scriptAuto are the knobs the script's tuner chooses (--compression
	// auto, --fusion auto).
	scriptAuto       autoKnobs
	verify, logLevel string
	peerTimeout      time.Duration
	shaped           float64
	progress         io.Writer
	// bed, if set, runs every process in its own testbed host: servers in
	// hosts 0..M-1, workers in M..M+N-1.
	bed         *testbed.Testbed
	traceDir    string
	metricsPort int
	// workerArgs are extra flags for every worker (the tuner's).
	workerArgs []string
	// tuneMalloc: a training command gets allocatorEnv's settings.
	tuneMalloc bool
	// noShm keeps same-host connections on TCP (--shm=false).
	noShm bool
	// rates, with bed, change each host's rate when rank 0 reaches an
	// iteration where it changes (rates at iteration 0 are already in
	// force).
	rates hostRates
}

// launchResult is what the processes reported.
type launchResult struct {
	workers, servers []*job.Summary
	wall             time.Duration
	rateChanges      []rateChange
}

// scenarioArgs re-emits the scenario flags the user set, for the children.
func scenarioArgs(cmd *cobra.Command) []string {
	var probe scenarioFlags
	names := map[string]bool{}
	tmp := &cobra.Command{}
	probe.register(tmp)
	tmp.Flags().VisitAll(func(fl *pflag.Flag) { names[fl.Name] = true })
	var args []string
	cmd.Flags().Visit(func(fl *pflag.Flag) {
		if !names[fl.Name] {
			return
		}
		// A repeatable flag (--straggler) is re-emitted once per value.
		if sv, ok := fl.Value.(pflag.SliceValue); ok {
			for _, v := range sv.GetSlice() {
				args = append(args, "--"+fl.Name+"="+v)
			}
			return
		}
		args = append(args, "--"+fl.Name+"="+fl.Value.String())
	})
	return args
}

func freePort() (int, error) {
	port, err := cluster.FreePort()
	if err != nil {
		return 0, fmt.Errorf("launch: %w", err)
	}
	return port, nil
}

// twoFreePorts returns two different free ports.
func twoFreePorts() (int, int, error) {
	a, err := freePort()
	if err != nil {
		return 0, 0, err
	}
	for range 100 {
		b, err := freePort()
		if err != nil {
			return 0, 0, err
		}
		if b != a {
			return a, b, nil
		}
	}
	return 0, 0, fmt.Errorf("launch: no second free port besides %d", a)
}

// childArgs is the command line of an autobyte child of a job: its role
// ("server" or "worker") and index, the role's own flags, the job's
// flags every process shares, and where it listens. Every child launch
// starts is built here.
func childArgs(role string, index int, own, job []string, listen string) []string {
	flag := "--rank="
	if role == "server" {
		flag = "--index="
	}
	args := append([]string{role, flag + strconv.Itoa(index)}, own...)
	return append(append(args, job...), "--listen="+listen)
}

// newToken is a fresh cluster token for one job.
func newToken() (string, error) {
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return "", err
	}
	return hex.EncodeToString(tok), nil
}

// reportFailure writes the root cause's last lines of stderr to w (they
// are not otherwise shown in full) and returns the job's error.
func reportFailure(w io.Writer, err error) error {
	var f *supervise.Failure
	if errors.As(err, &f) && len(f.Lines) > 0 {
		n := min(len(f.Lines), 10)
		fmt.Fprintf(w, "%s: last %d lines of stderr:\n", f.Child, n)
		for _, l := range f.Lines[len(f.Lines)-n:] {
			fmt.Fprintf(w, "  | %s\n", l)
		}
	}
	return fmt.Errorf("launch: %w", err)
}

// launchLocal runs the job as child processes on loopback (or in testbed
// hosts).
func launchLocal(ctx context.Context, childArgsCommon []string, spec job.Spec, lc launchConfig) (*launchResult, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("launch: cannot find this program to start children: %w", err)
	}
	token, err := newToken()
	if err != nil {
		return nil, err
	}
	common := append(childArgsCommon, "--log-level="+lc.logLevel, "--peer-timeout="+lc.peerTimeout.String())
	if lc.noShm {
		common = append(common, "--shm=false")
	}
	master, listen := "", func(int) string { return "127.0.0.1:0" }
	if lc.bed != nil {
		// The testbed shapes the links; processes must not shape again.
		common = append(common, "--shape=false")
		master = net.JoinHostPort(lc.bed.Hosts[spec.Servers].IP, "29500")
		listen = func(host int) string { return net.JoinHostPort(lc.bed.Hosts[host].IP, "0") }
	} else {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		master = "127.0.0.1:" + strconv.Itoa(port)
	}
	common = append(common, "--master="+master)
	env := append(os.Environ(), "AUTOBYTE_TOKEN="+token)
	start := time.Now()
	var rates *rateDriver
	if lc.bed != nil && len(lc.rates.changes()) > 0 {
		rates = newRateDriver(lc.bed, spec.Servers+spec.Workers, lc.rates, spec.Iterations, start, lc.progress)
		go rates.run(ctx)
	}
	var mu sync.Mutex // lc.progress
	show := func(name, line string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(lc.progress, "[%s] %s\n", name, line)
	}
	sup := supervise.New(supervise.Options{OnMessage: func(c *supervise.Child, m supervise.Message) {
		if c.Name != "worker 0" {
			return
		}
		switch m.Kind {
		case supervise.KindIteration:
			show(c.Name, fmt.Sprintf("iteration %d/%d: %s", m.Iteration, m.Of, units.FormatSeconds(m.Seconds)))
			if rates != nil {
				rates.reached(m.Iteration)
			}
		case supervise.KindTuner:
			show(c.Name, "tuner: "+m.Text)
		}
	}})
	var children []*supervise.Child
	add := func(name, role string, index, host int, own ...string) {
		args := childArgs(role, index, own, common, listen(host))
		var cmd *exec.Cmd
		if lc.bed != nil {
			cmd = lc.bed.Command(ctx, host, self, args...)
		} else {
			cmd = exec.Command(self, args...)
		}
		cmd.Env = env
		c := &supervise.Child{Name: name, Cmd: cmd, Status: true, Server: role == "server"}
		c.OnStderr = func(line string) {
			if strings.Contains(line, "level=ERROR") {
				show(name, line)
			}
		}
		children = append(children, c)
	}
	for m := 0; m < spec.Servers; m++ {
		add(fmt.Sprintf("server %d", m), "server", m, m)
	}
	for r := 0; r < spec.Workers; r++ {
		own := append([]string{"--verify=" + lc.verify}, lc.workerArgs...)
		if lc.traceDir != "" {
			own = append(own, "--trace="+filepath.Join(lc.traceDir, fmt.Sprintf("rank-%d.json", r)))
		}
		if lc.metricsPort > 0 {
			own = append(own, "--metrics-addr=:"+strconv.Itoa(lc.metricsPort+r))
		}
		add(fmt.Sprintf("worker %d", r), "worker", r, spec.Servers+r, own...)
	}
	for _, c := range children {
		if err := sup.Start(c); err != nil {
			stopNow(sup)
			return nil, fmt.Errorf("launch: %w", err)
		}
	}
	_, err = sup.Wait(ctx)
	if rates != nil {
		rates.stop()
	}
	if err != nil {
		return nil, reportFailure(lc.progress, err)
	}
	res := &launchResult{wall: time.Since(start)}
	if rates != nil {
		res.rateChanges = rates.changes
	}
	for _, c := range children {
		var s job.Summary
		line := strings.TrimSpace(c.Stdout())
		if i := strings.LastIndexByte(line, '\n'); i >= 0 {
			line = line[i+1:]
		}
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			return nil, fmt.Errorf("launch: %s printed no summary (%q): %w", c.Name, line, err)
		}
		if s.Role == "server" {
			res.servers = append(res.servers, &s)
		} else {
			res.workers = append(res.workers, &s)
		}
	}
	return res, nil
}

// stopNow stops every child already started (a later one failed to
// start) and waits for them.
func stopNow(sup *supervise.Supervisor) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _ = sup.Wait(ctx)
}

// launchReport is the JSON contract of 'autobyte launch --json'.
type launchReport struct {
	runReport
	ShapedBps       float64 `json:"shaped_bytes_per_s"`
	BytesSent       int64   `json:"bytes_sent"`
	Verified        bool    `json:"verified"`
	CheckedElements int64   `json:"checked_elements"`
	// Tuner is rank 0's tuner; runReport.Configs the configurations it
	// applied, each from its iteration (the first is the initial one).
	Tuner       string   `json:"tuner,omitempty"`
	TunerEvents []string `json:"tuner_events,omitempty"`
	// Stats are rank 0's measured statistics per iteration.
	Stats []tune.Stats `json:"stats,omitempty"`
	// RateChanges are the bandwidth-trace steps put in force on the testbed.
	RateChanges []rateChange `json:"rate_changes,omitempty"`
}

func newLaunchReport(f scenarioFlags, o sim.Options, r *launchResult) launchReport {
	rep := launchReport{Verified: f.iterations > 0}
	var perWorker [][]float64
	var changes []sim.ConfigChange
	for _, w := range r.workers {
		perWorker = append(perWorker, w.IterationTimesS)
		rep.BytesSent += w.BytesSent
		rep.CheckedElements += w.Checked
		rep.Verified = rep.Verified && w.Checked > 0
		if w.Rank == 0 {
			rep.Tuner, rep.TunerEvents, rep.Stats = w.Tuner, w.TunerEvents, w.Stats
			changes = append(changes, w.Configs...)
		}
	}
	for _, s := range r.servers {
		rep.BytesSent += s.BytesSent
	}
	if len(changes) == 0 {
		changes = []sim.ConfigChange{{Config: o.Sched}}
	}
	rep.runReport = newRunReport(f, o, stats.JobIterationTimes(perWorker), changes, r.wall)
	return rep
}

func (r launchReport) writeText(w io.Writer) error {
	fmt.Fprintf(w, "\n%s on %s", r.Model, units.FormatCount(r.Workers, "worker"))
	if r.Arch == "ps" {
		fmt.Fprintf(w, " + %s", units.FormatCount(r.Servers, "server"))
	}
	fmt.Fprintf(w, " (%s), scheduler %s: %s per iteration (steady state), %.1f samples/s\n",
		r.Arch, r.Scheduler, units.FormatSeconds(r.IterationTimeS), r.SamplesPerS)
	fmt.Fprintf(w, "bytes sent %s, sums verified: %v (%d elements checked), wall %s\n",
		units.FormatBytes(r.BytesSent), r.Verified, r.CheckedElements, units.FormatSeconds(r.WallS))
	if len(r.Configs) > 1 {
		fmt.Fprintf(w, "tuner %s: mean %s per iteration over the run; configs", r.Tuner, units.FormatSeconds(r.MeanIterationS))
		for i, c := range r.Configs {
			sep := ";"
			if i == 0 {
				sep = ""
			}
			fmt.Fprintf(w, "%s from %d: %s", sep, c.FromIteration, c.config.Knobs())
		}
		fmt.Fprintln(w)
	}
	return nil
}

// rateChange is one step of a bandwidth trace the launcher put in force on
// the testbed.
type rateChange struct {
	// Iteration is the step's iteration; ReachedIteration the iteration
	// rank 0 had reached when the launcher learnt it (its progress line:
	// forward pass ReachedIteration ended); AtS when the change started
	// (since the launch) and SetS how long setting the hosts took. Host
	// names the one host set ("server1", "worker3"); absent, every host
	// was set to RateBps.
	Iteration        int     `json:"iteration"`
	ReachedIteration int     `json:"reached_iteration"`
	Host             string  `json:"host,omitempty"`
	RateBps          float64 `json:"rate_bytes_per_s"`
	AtS              float64 `json:"at_s"`
	SetS             float64 `json:"set_s"`
	Error            string  `json:"error,omitempty"`
}

// rateDriver changes the testbed hosts' tc rates as rank 0 reaches each
// iteration where a host's rate changes (a bandwidth trace: every host; a
// link trace: one). It learns the iteration from rank 0's progress lines
// ("iteration J/N: ...", printed when forward pass J ended, just before
// backward J starts iteration J's communication), so the children need no
// privileges and rank 0's loop never waits for tc.
type rateDriver struct {
	bed      *testbed.Testbed
	hosts    int
	rates    hostRates
	steps    []sim.Step // the iterations at which a rate changes
	current  []float64  // each host's rate in force
	start    time.Time
	progress io.Writer
	iters    chan int
	done     chan struct{}
	changes  []rateChange
}

func newRateDriver(bed *testbed.Testbed, hosts int, rates hostRates, iterations int, start time.Time, progress io.Writer) *rateDriver {
	d := &rateDriver{bed: bed, hosts: hosts, rates: rates, steps: rates.changes(), current: make([]float64, hosts),
		start: start, progress: progress, iters: make(chan int, iterations+2), done: make(chan struct{})}
	for h := range d.current {
		d.current[h] = rates.at(h, 0) // in force from the start (prepareTestbed)
	}
	return d
}

// reached tells the driver that rank 0 ended forward pass j; it never
// blocks.
func (d *rateDriver) reached(j int) {
	select {
	case d.iters <- j:
	default: // a later message carries a later iteration
	}
}

// stepsDue returns the steps at or before iteration j not yet applied.
func stepsDue(steps []sim.Step, j int) (due, rest []sim.Step) {
	n := 0
	for n < len(steps) && steps[n].Iteration <= j {
		n++
	}
	return steps[:n], steps[n:]
}

func (d *rateDriver) run(ctx context.Context) {
	defer close(d.done)
	for j := range d.iters {
		var due []sim.Step
		due, d.steps = stepsDue(d.steps, j)
		if len(due) == 0 {
			continue
		}
		// Only the last due step matters; the earlier ones were missed.
		k := due[len(due)-1].Iteration
		var set []int
		for h := 0; h < d.hosts; h++ {
			if r := d.rates.at(h, k); r != d.current[h] {
				set = append(set, h)
			}
		}
		at, t0 := time.Since(d.start).Seconds(), time.Now()
		var changes []rateChange
		for _, h := range set {
			r := d.rates.at(h, k)
			ch := rateChange{Iteration: k, ReachedIteration: j, Host: d.rates.name(h), RateBps: r, AtS: at}
			if err := d.bed.Set(ctx, h, r, d.bed.Hosts[h].DelayS); err != nil {
				ch.Error = err.Error()
			}
			d.current[h] = r
			changes = append(changes, ch)
		}
		setS := time.Since(t0).Seconds()
		if len(set) == d.hosts && d.hosts > 1 && allSame(changes) {
			ch := changes[0]
			ch.Host = ""
			for _, c := range changes {
				if ch.Error == "" {
					ch.Error = c.Error
				}
			}
			changes = []rateChange{ch}
		}
		for _, ch := range changes {
			ch.SetS = setS
			d.changes = append(d.changes, ch)
			who := "every host"
			if ch.Host != "" {
				who = ch.Host
			}
			msg := fmt.Sprintf("testbed: %s at %s from iteration %d (rank 0 at %d; set in %s)", who, units.FormatRate(ch.RateBps), k, j, units.FormatSeconds(setS))
			if ch.Error != "" {
				msg += ": " + ch.Error
			}
			fmt.Fprintln(d.progress, msg)
		}
	}
}

// allSame reports whether every change sets the same rate.
func allSame(changes []rateChange) bool {
	for _, c := range changes {
		if c.RateBps != changes[0].RateBps {
			return false
		}
	}
	return true
}

// stop ends run once every line was fed, and waits for it.
func (d *rateDriver) stop() {
	close(d.iters)
	<-d.done
}

// noShm is --shm=false.
func noShm(cmd *cobra.Command) bool {
	on, _ := cmd.Flags().GetBool("shm")
	return !on
}
