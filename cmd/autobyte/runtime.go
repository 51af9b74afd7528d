package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/autobyte/autobyte/cluster"
	"github.com/autobyte/autobyte/job"
	"github.com/autobyte/autobyte/observe"
	"github.com/autobyte/autobyte/sim"
	"github.com/autobyte/autobyte/supervise"
	"github.com/autobyte/autobyte/transport"
	"github.com/autobyte/autobyte/tune"
	"github.com/autobyte/autobyte/units"
	"github.com/autobyte/autobyte/worker"
)

// netFlags are how a runtime process finds and authenticates its peers.
type netFlags struct {
	master, listen, token string
	peerTimeout           time.Duration
	rendezvousTimeout     time.Duration
	flags                 *pflag.FlagSet // where they were registered, to tell which were given
	logLevel              string
	shape                 bool
	shm                   bool
	tls                   tlsFiles
}

func (n *netFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	n.flags = fs
	fs.StringVar(&n.master, "master", "", "rendezvous address host:port (default: $MASTER_ADDR and $AUTOBYTE_MASTER_PORT, else $MASTER_PORT+1: torch.distributed owns MASTER_PORT)")
	fs.StringVar(&n.listen, "listen", "", "address to accept data connections on (default :0, any interface, a free port)")
	fs.StringVar(&n.token, "token", "", "shared cluster token (default: $AUTOBYTE_TOKEN)")
	fs.DurationVar(&n.peerTimeout, "peer-timeout", 5*time.Second, "fail when a peer is silent (no heartbeat) this long")
	fs.DurationVar(&n.rendezvousTimeout, "rendezvous-timeout", cluster.DefaultRendezvousTimeout, "fail, naming the missing members, when the job has not gathered this long after start (default: $AUTOBYTE_RENDEZVOUS_TIMEOUT, else 10m)")
	fs.StringVar(&n.logLevel, "log-level", "warn", "log level: debug, info, warn, error")
	fs.StringVar(&n.tls.cert, "tls-cert", "", "TLS: this process's certificate (PEM); with --tls-key and --tls-ca every connection uses mutual TLS")
	fs.StringVar(&n.tls.key, "tls-key", "", "TLS: the certificate's private key (PEM)")
	fs.StringVar(&n.tls.ca, "tls-ca", "", "TLS: the CA (PEM) every peer's certificate must be signed by")
	fs.BoolVar(&n.shape, "shape", true, "shape this process's egress and ingress to --bandwidth when --bandwidth is given")
	fs.BoolVar(&n.shm, "shm", true, "carry the bytes of connections to processes on this host through shared memory (false: TCP)")
}

func (n *netFlags) resolve(env cluster.Env, bandwidth float64) (job.Net, error) {
	var out job.Net
	master := n.master
	if master == "" {
		if env.MasterAddr == "" || env.Port == 0 {
			return out, cluster.ErrNoCoordinator
		}
		master = net.JoinHostPort(env.MasterAddr, strconv.Itoa(env.Port))
	}
	token := n.token
	if token == "" {
		token = os.Getenv("AUTOBYTE_TOKEN")
	}
	if token == "" {
		return out, fmt.Errorf("no cluster token: pass --token or set AUTOBYTE_TOKEN (every process of a job needs the same one)")
	}
	level, err := processFlags(n.logLevel, n.peerTimeout)
	if err != nil {
		return out, err
	}
	rendezvous, err := n.rendezvous()
	if err != nil {
		return out, err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if !n.shape {
		bandwidth = 0
	}
	tc, err := n.tls.config()
	if err != nil {
		return out, err
	}
	return job.Net{Master: master, Listen: n.listen, Token: token, BandwidthBps: bandwidth, PeerTimeout: n.peerTimeout,
		RendezvousTimeout: rendezvous, Logger: log, TLS: tc, NoSharedMemory: !n.shm}, nil
}

// rendezvous is --rendezvous-timeout if given, else
// $AUTOBYTE_RENDEZVOUS_TIMEOUT if set, else the flag's default.
func (n *netFlags) rendezvous() (time.Duration, error) {
	d := n.rendezvousTimeout
	if n.flags == nil || !n.flags.Changed("rendezvous-timeout") {
		env, err := cluster.RendezvousTimeoutFrom(os.Getenv)
		if err != nil {
			return 0, err
		}
		if env > 0 {
			d = env
		}
	}
	if d <= 0 {
		return 0, fmt.Errorf("--rendezvous-timeout must be > 0, got %v", d)
	}
	return d, nil
}

// processFlags checks the flags every process of a job takes (and launch
// passes on): --log-level and --peer-timeout.
func processFlags(logLevel string, peerTimeout time.Duration) (slog.Level, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return level, fmt.Errorf("--log-level %q: want debug, info, warn or error", logLevel)
	}
	if peerTimeout <= 0 {
		return level, fmt.Errorf("--peer-timeout must be > 0, got %v", peerTimeout)
	}
	return level, nil
}

// spec builds the job spec from the scenario flags.
func (f *scenarioFlags) spec(cmd *cobra.Command) (job.Spec, sim.Options, error) {
	return f.specFor(cmd, true)
}

// specFor is spec; without needModel the profile may be nil (servers serve
// any model; scripts bring their own).
func (f *scenarioFlags) specFor(cmd *cobra.Command, needModel bool) (job.Spec, sim.Options, error) {
	o, err := f.optionsFor(cmd, needModel)
	if err != nil {
		return job.Spec{}, o, err
	}
	arch := worker.PS
	if o.Arch == sim.AllReduce {
		arch = worker.AllReduce
	}
	return job.Spec{Profile: o.Profile, Arch: arch, Workers: o.Workers, Servers: o.Servers, Sched: o.Sched,
		ShardBytes: o.ShardBytes, Iterations: o.Iterations, PullMode: f.pull}, o, nil
}

// signalContext is cancelled by SIGINT or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// printSummary prints the process's JSON summary and tells a supervisor
// (autobyte launch) how it ends, naming the peer it lost if that is why.
func printSummary(cmd *cobra.Command, st *supervise.Reporter, s *job.Summary, err error) error {
	if err != nil {
		s.Error = err.Error()
	}
	b, _ := json.Marshal(s)
	fmt.Fprintln(cmd.OutOrStdout(), string(b))
	st.Exit(err)
	return err
}

func newServerCmd() *cobra.Command {
	var f scenarioFlags
	var n netFlags
	var index, sessions int
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run one parameter server of a job (usually started by 'autobyte launch')",
		Long: `server runs one parameter server. It sums whatever tensors the workers push,
so it needs no model: --workers, --servers and --ps-pull must match the
workers' (they are checked at rendezvous); --model is accepted and ignored.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			spec, o, err := f.specFor(cmd, false)
			if err != nil {
				return err
			}
			if err := simOnly(cmd); err != nil {
				return err
			}
			env, err := cluster.FromEnv(cluster.Env{})
			if err != nil {
				return err
			}
			jn, err := n.resolve(env, shapedRate(cmd, o))
			if err != nil {
				return err
			}
			if _, traced := o.ServerLinkTraces[index]; traced && jn.BandwidthBps > 0 {
				// In-process shaping follows this host's link trace.
				jn.BandwidthBps = o.ServerRateAt(index, 0)
				jn.RateAt = func(k int) float64 { return o.ServerRateAt(index, k) }
			}
			ctx, stop := signalContext()
			defer stop()
			s, err := job.ServeSessions(ctx, spec, index, jn, sessions)
			return printSummary(cmd, supervise.FromEnv(), s, err)
		},
	}
	f.register(cmd)
	n.register(cmd)
	cmd.Flags().IntVar(&index, "index", 0, "this server's index (0 .. servers-1)")
	cmd.Flags().IntVar(&sessions, "sessions", 1, "jobs to serve one after another, each from its rendezvous (0: until stopped; a training script that opens the engine again, e.g. after autobyte.torch.shutdown(), starts a new job)")
	return cmd
}

func newWorkerCmd() *cobra.Command {
	var f scenarioFlags
	var n netFlags
	var rank int
	var verify, traceFile, metricsAddr string
	var tf tunerFlags
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run one worker of a job: replays a model's compute and communicates its gradients for real",
		Long: `worker replays a model profile's per-layer compute (scaled by --compute-scale)
and sends real gradient data through the scheduling core and the transport, so
it benchmarks a cluster for any zoo model or profile. Rank 0 is the
coordinator: it listens at --master (or $MASTER_ADDR, port $AUTOBYTE_MASTER_PORT,
else $MASTER_PORT+1, since torch.distributed owns MASTER_PORT). The rank
comes from --rank or $RANK, the number of workers from --workers or
$WORLD_SIZE.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			env, err := cluster.FromEnv(cluster.Env{Rank: rank, WorldSize: f.workers})
			if err != nil {
				return err
			}
			if !cmd.Flags().Changed("rank") {
				rank = env.Rank
			}
			if !cmd.Flags().Changed("workers") && env.WorldSize > 0 {
				f.workers = env.WorldSize
			}
			spec, o, err := f.spec(cmd)
			if err != nil {
				return err
			}
			if err := simOnly(cmd); err != nil {
				return err
			}
			if _, err := o.RuntimeBudget(0); err != nil {
				return f.budgetFlag(o, err)
			}
			jn, err := n.resolve(env, shapedRate(cmd, o))
			if err != nil {
				return err
			}
			if len(o.BandwidthTrace) > 0 && jn.BandwidthBps > 0 {
				return fmt.Errorf("--bandwidth-trace %s: in-process shaping cannot follow a trace (parameter servers do not know the iteration); shape the links outside and pass --shape=false, as 'autobyte launch --testbed' does", f.bandwidthTrace)
			}
			if len(o.WorkerLinkTraces) > 0 && jn.BandwidthBps > 0 {
				return fmt.Errorf("--link-trace: a worker's link trace needs the links shaped outside (autobyte launch --testbed); in-process shaping follows only a parameter server's")
			}
			var tuner tune.Tuner
			if rank == 0 {
				if tuner, err = tf.build(o, f.seed, f.autoKnobs()); err != nil {
					return err
				}
			}
			v, err := parseVerify(verify)
			if err != nil {
				return err
			}
			ctx, stop := signalContext()
			defer stop()
			st := supervise.FromEnv()
			progress := func(k int, d time.Duration) {
				if rank == 0 {
					fmt.Fprintf(cmd.ErrOrStderr(), "iteration %d/%d: %s\n", k+1, spec.Iterations, units.FormatSeconds(d.Seconds()))
					st.Iteration(k+1, spec.Iterations, d)
				}
			}
			var metrics *observe.Metrics
			if metricsAddr != "" {
				metrics = observe.NewMetrics("worker", rank)
				if _, err := metrics.Serve(ctx, metricsAddr); err != nil {
					return err
				}
			}
			var obs *observe.Observer
			if traceFile != "" || metrics != nil {
				if obs, err = observe.New(traceFile, rank, metrics); err != nil {
					return err
				}
			}
			wo := job.WorkerOptions{Rank: rank, Verify: v, OnIteration: progress, ComputeScaleAt: computeScaleAt(o, rank)}
			if obs != nil {
				wo.Observer = obs
			}
			var events []string
			if tuner != nil {
				wo.Tuning = runtimeTuning(cmd, o, tuner, &events, st)
			}
			s, err := job.RunWorker(ctx, spec, wo, jn)
			if rank == 0 {
				s.Tuner, s.TunerEvents = tf.name, events
			}
			if obs != nil {
				if cerr := obs.Close(); cerr != nil && err == nil {
					err = fmt.Errorf("--trace %s: %w", traceFile, cerr)
				}
			}
			return printSummary(cmd, st, s, err)
		},
	}
	f.register(cmd)
	n.register(cmd)
	cmd.Flags().IntVar(&rank, "rank", 0, "this worker's rank (default: $RANK)")
	cmd.Flags().StringVar(&verify, "verify", "sample", "check sums against exact values: none, sample or full")
	cmd.Flags().StringVar(&traceFile, "trace", "", "write this worker's Chrome-trace timeline to FILE")
	cmd.Flags().StringVar(&metricsAddr, "metrics-addr", "", "serve Prometheus metrics at http://ADDR/metrics (e.g. :9100)")
	tf.register(cmd)
	cmd.Long += `

Rank 0 measures each iteration's statistics (docs/runtime-tuning.md) and
hands them to --tuner, whose proposals it applies on every worker and
server at an iteration boundary. --compute-trace and --straggler scale the
replay's compute by iteration and rank; --bandwidth-trace only tells the
tuner the rate in force (the links must be shaped outside, --shape=false).`
	return cmd
}

func parseVerify(s string) (worker.Verify, error) {
	switch s {
	case "none":
		return worker.VerifyNone, nil
	case "sample":
		return worker.VerifySample, nil
	case "full":
		return worker.VerifyFull, nil
	}
	return 0, fmt.Errorf("unknown --verify %q (want none, sample or full)", s)
}

// shapedRate is the in-process shaping rate: --bandwidth when given (or
// --shape forced), otherwise none.
func shapedRate(cmd *cobra.Command, o sim.Options) float64 {
	if cmd.Flags().Changed("bandwidth") {
		return o.BandwidthBps
	}
	return 0
}

// tunerFlags choose the tuner rank 0 runs (as autobyte sim's --tuner).
type tunerFlags struct {
	name, gridParts, gridCredits string
	gridTrial, boTrial           int
}

func (t *tunerFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&t.name, "tuner", "static", "the leader's (rank 0's) tuner: static (the configuration given), grid (try every partition × credit of the grid for --grid-trial iterations, then keep the best), bo (ByteScheduler's one-shot Bayesian optimisation) or autobyte (the meta-network tuner, which follows changes)")
	fs.StringVar(&t.gridParts, "grid-partitions", "1MB,4MB,16MB", "grid tuner: partition sizes")
	fs.StringVar(&t.gridCredits, "grid-credits", "4MB,16MB,64MB", "grid tuner: credit sizes")
	fs.IntVar(&t.gridTrial, "grid-trial", 5, "grid tuner: iterations per candidate")
	fs.IntVar(&t.boTrial, "bo-trial", 100, "bo tuner: iterations per trial (ByteScheduler: about 100; 15 trials, then frozen)")
}

// args re-emits the tuner flags for a child process.
func (t *tunerFlags) args() []string {
	return []string{"--tuner=" + t.name, "--grid-partitions=" + t.gridParts, "--grid-credits=" + t.gridCredits,
		"--grid-trial=" + strconv.Itoa(t.gridTrial), "--bo-trial=" + strconv.Itoa(t.boTrial)}
}

// build returns the tuner for a job started with o (tune.New, as autobyte
// sim builds it, so equal flags tune alike in the simulator and at run time).
// auto are the knobs left to the autobyte tuner (--compression auto,
// --fusion auto).
func (t *tunerFlags) build(o sim.Options, seed uint64, auto autoKnobs) (tune.Tuner, error) {
	if err := auto.check(t.name); err != nil {
		return nil, err
	}
	no := tune.NewOptions{Arch: o.Arch.String(), Base: o.Sched, GridTrial: t.gridTrial, BOTrial: t.boTrial, Seed: seed,
		Compress: auto.Compress, Fuse: auto.Fuse}
	if t.name == "grid" {
		var err error
		if no.GridPartitions, err = parseSizes("--grid-partitions", t.gridParts); err != nil {
			return nil, err
		}
		if no.GridCredits, err = parseSizes("--grid-credits", t.gridCredits); err != nil {
			return nil, err
		}
	}
	tn, err := tune.New(t.name, no)
	if err != nil {
		return nil, fmt.Errorf("--tuner: %w", err)
	}
	return tn, nil
}

// computeScaleAt is worker rank's compute multiplier by iteration: the
// compute trace times its straggler factor at the iteration (nil when
// neither applies to it).
func computeScaleAt(o sim.Options, rank int) func(int) float64 {
	_, slow := o.Stragglers[rank]
	_, comes := o.StragglerTraces[rank]
	if len(o.ComputeTrace) == 0 && !slow && !comes {
		return nil
	}
	return func(k int) float64 { return o.ComputeScaleAt(k) * o.SlowdownAt(rank, k) }
}

// runtimeTuning is rank 0's tuning: the configured rate by iteration when
// the run has one (--bandwidth or --bandwidth-trace), else the measured one;
// the round trip when --latency is given (the links' own latency is not
// measured: the tuner then assumes its default);
// configuration changes and the autobyte tuner's events go to stderr as
// "tuner: ..." lines (launch shows them) and into events.
func runtimeTuning(cmd *cobra.Command, o sim.Options, tuner tune.Tuner, events *[]string, st *supervise.Reporter) job.TuningOptions {
	to := job.TuningOptions{Tuner: tuner, Collect: true}
	if cmd.Flags().Changed("latency") {
		to.RoundTripS = 2 * o.LatencyS
	}
	if len(o.BandwidthTrace) > 0 || cmd.Flags().Changed("bandwidth") {
		to.BandwidthAt = func(k int) float64 { return o.BandwidthAt(k) }
	}
	stderr := cmd.ErrOrStderr()
	note := func(s string) {
		*events = append(*events, s)
		fmt.Fprintf(stderr, "tuner: %s\n", s)
		st.Tuner(s)
	}
	if ab, ok := tuner.(*tune.AutoByte); ok {
		seen := 0
		to.OnStats = func(tune.Stats) {
			evs := ab.EventsFrom(seen)
			for _, e := range evs {
				note(e.String())
			}
			seen += len(evs)
		}
	}
	to.OnChange = func(c job.ConfigChange) {
		note(fmt.Sprintf("from iteration %d: %s", c.FromIteration, c.Config.Knobs()))
	}
	return to
}

// newProbeCmd is 'autobyte probe ADDR': exit 0 when an autobyte listener
// answers at ADDR (launch runs it inside a testbed host, which its own
// network namespace cannot reach).
func newProbeCmd() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:    "probe ADDR",
		Short:  "Exit 0 when an autobyte listener answers at ADDR (host:port)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return transport.Probe(cmd.Context(), args[0], timeout)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 500*time.Millisecond, "give up after this long")
	return cmd
}
