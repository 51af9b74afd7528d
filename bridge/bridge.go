// Package bridge is the Go side of the language bindings (the PyTorch
// plugin in python/autobyte): it turns a binding's tensor list and the
// AUTOBYTE_* / torchrun environment into a connected worker engine
// (job.ConnectWith), and exposes the few calls a binding needs: post a
// gradient, wait for a layer's sums, close.
//
// It owns the environment contract of a scripted worker (see Settings) and
// nothing else: no cgo (cmd/libautobyte wraps it for C callers), no Python,
// no process launch.
package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/autobyte/autobyte/cluster"
	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/job"
	"github.com/autobyte/autobyte/model"
	"github.com/autobyte/autobyte/observe"
	"github.com/autobyte/autobyte/proto"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/supervise"
	"github.com/autobyte/autobyte/transport"
	"github.com/autobyte/autobyte/tune"
	"github.com/autobyte/autobyte/units"
	"github.com/autobyte/autobyte/worker"
	"golang.org/x/sys/unix"
)

// Tensor is one tensor the binding synchronises, in the binding's order
// (its index is the tensor id of Post).
type Tensor struct {
	Name string `json:"name"`
	// Layer is the tensor's layer; layers are numbered 0.. in the order the
	// forward pass should receive them (lower = more urgent).
	Layer int `json:"layer"`
	Elems int `json:"elems"`
	// Wire pins the type its gradient travels in: bfloat16 or float16 (a
	// 16-bit parameter's own type), or float32 (never compressed, e.g. a
	// broadcast that must stay exact). Empty: a float32 gradient that
	// travels in the configuration's compression (AUTOBYTE_COMPRESSION,
	// or what a tuner chooses). Posted data is float32 whatever the wire.
	Wire string `json:"wire,omitempty"`
	// Iterations says which iterations post it: "" (every one), "first"
	// (iteration 0 only: a broadcast at start) or "after_first" (every
	// one but 0: a gradient whose parameter a "first" tensor broadcasts).
	// The gates of an iteration wait for exactly the tensors it posts.
	Iterations string `json:"iterations,omitempty"`
}

// Request is what a binding sends to Open, as JSON.
type Request struct {
	Tensors []Tensor `json:"tensors"`
	// Settings override the environment, by variable name (e.g.
	// "AUTOBYTE_PARTITION": "1MB"); see Settings.
	Settings map[string]string `json:"settings,omitempty"`
}

// Settings is a scripted worker's configuration, read from the environment
// the launcher (or torchrun) sets, with Request.Settings taking precedence:
//
//	RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT   rendezvous: rank 0 listens at MASTER_PORT+1 (torch.distributed owns MASTER_PORT)
//	AUTOBYTE_MASTER_PORT   where rank 0 listens instead of MASTER_PORT+1
//	AUTOBYTE_TOKEN         shared secret of the job
//	AUTOBYTE_ARCH          ps or allreduce (default: ps if AUTOBYTE_SERVERS > 0, else allreduce)
//	AUTOBYTE_SERVERS       parameter servers (ps)
//	AUTOBYTE_SCHEDULER     bytescheduler (default), priority or fifo
//	AUTOBYTE_PARTITION     partition size, e.g. 4MB (default: ByteScheduler's, by arch)
//	AUTOBYTE_CREDIT        credit size (default: ByteScheduler's, or one partition per server up to one per worker where that is more; proto.DefaultCredit)
//	AUTOBYTE_SHARD         ps big-array bound (default 4MB; 0 = never split over servers)
//	AUTOBYTE_SERVER_WEIGHTS  ps: the share of the bytes each server is given, one number per server, e.g. 4:4:1 (default: even by bytes)
//	AUTOBYTE_PS_PULL       1 = separate pulls instead of answered pushes
//	AUTOBYTE_FUSION        fuse neighbouring tensors smaller than this into units of at most this size (e.g. 256KB; default 0 = never)
//	AUTOBYTE_COMPRESSION   none (default), bf16 or fp16: the wire type of float32 gradients no tensor pins;
//	                       auto: the autobyte tuner turns bf16 on while the job is communication-bound
//	AUTOBYTE_BANDWIDTH     shape this worker's links in-process (e.g. 1Gbps; default off)
//	AUTOBYTE_LISTEN        where an all-reduce worker accepts its ring neighbour (default any interface)
//	AUTOBYTE_PEER_TIMEOUT  a silent peer fails the job after this long (default 5s)
//	AUTOBYTE_RENDEZVOUS_TIMEOUT  fail, naming the missing members, when the job has not gathered this long (default 10m)
//	AUTOBYTE_TIMEOUT       the training thread's longest wait for sums before it fails (default 30m, as torch.distributed's; 0: for ever)
//	AUTOBYTE_SHM           0 keeps connections to processes of this host on TCP (default 1: shared memory)
//	AUTOBYTE_LOG_LEVEL     debug, info, warn (default) or error
//	AUTOBYTE_TUNER         static (default), autobyte or bo: rank 0 tunes partition and credit while the job runs
//	AUTOBYTE_LINK_RATE     the hosts' link rate for the tuner (e.g. 1Gbps; default: measured)
//	AUTOBYTE_TRACE         the binding's timeline DIR/NAME; the engine writes its pieces' to DIR/engine-NAME
//	AUTOBYTE_STATUS_FD     the supervisor's status pipe ('autobyte launch' gives one to each script), told which peer was lost
type Settings struct {
	Spec job.Spec
	Net  job.Net
	Rank int
	// Tuner is rank 0's tuner ("" or "static": none).
	Tuner string
	// LinkRateBps is the link rate the tuner is told (0: measured).
	LinkRateBps float64
	// EngineTrace, if set, receives the engine's Chrome-trace timeline
	// (each piece's QUEUE and COMMUNICATION phases).
	EngineTrace string
	// Tensors are the engine's tensors, with the types Tensor.Wire pins.
	Tensors []worker.Tensor
	// TunerCompress is the type rank 0's autobyte tuner may switch
	// compression to (AUTOBYTE_COMPRESSION=auto); float32: none.
	TunerCompress dtype.DType
	// TunerFuse is the fusion size rank 0's autobyte tuner may switch to
	// and back (AUTOBYTE_FUSION=auto); 0: none.
	TunerFuse int64
	// WaitTimeout bounds how long the training thread waits for a layer's
	// sums (AUTOBYTE_TIMEOUT; 0: no bound). Peers that die or go silent
	// are caught by the peer timeout; this catches a live peer whose
	// script is stuck, as torch.distributed's collective timeout does.
	WaitTimeout time.Duration
	// StatusFD is the descriptor of the supervisor's status pipe
	// (AUTOBYTE_STATUS_FD; 0: none). An engine that fails because it lost
	// a peer reports which one there, so that the supervisor can follow the
	// failure to its root cause (a script only shows its exception).
	StatusFD int
}

// DefaultWaitTimeout is torch.distributed's default timeout of collectives.
const DefaultWaitTimeout = 30 * time.Minute

// getenv looks a variable up in the overrides, then the environment.
type getenv func(string) string

func lookup(over map[string]string, env func(string) string) getenv {
	return func(k string) string {
		if v, ok := over[k]; ok {
			return v
		}
		return env(k)
	}
}

// ParseSettings builds the job spec and network settings of a scripted
// worker from the tensors and the environment (env is os.Getenv in
// production). Every error names the variable and its value.
func ParseSettings(req Request, env func(string) string) (Settings, error) {
	var s Settings
	get := lookup(req.Settings, env)
	atoi := func(name string, def int) (int, error) {
		v := get(name)
		if v == "" {
			return def, nil
		}
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%s=%q is not a non-negative integer", name, v)
		}
		return n, nil
	}
	env0, err := cluster.FromLookup(cluster.Env{WorldSize: 1}, get)
	if err != nil {
		return s, err
	}
	s.Rank = env0.Rank
	world := env0.WorldSize
	if world < 1 || s.Rank >= world {
		return s, fmt.Errorf("RANK=%d is out of range for WORLD_SIZE=%d", s.Rank, world)
	}
	servers, err := atoi("AUTOBYTE_SERVERS", 0)
	if err != nil {
		return s, err
	}
	arch := worker.AllReduce
	switch a := get("AUTOBYTE_ARCH"); a {
	case "":
		if servers > 0 {
			arch = worker.PS
		}
	case "ps":
		arch = worker.PS
		if servers < 1 {
			return s, fmt.Errorf("AUTOBYTE_ARCH=ps needs AUTOBYTE_SERVERS >= 1, got %d", servers)
		}
	case "allreduce":
		if servers > 0 {
			return s, fmt.Errorf("AUTOBYTE_ARCH=allreduce has no parameter servers, got AUTOBYTE_SERVERS=%d", servers)
		}
	default:
		return s, fmt.Errorf("AUTOBYTE_ARCH=%q: want ps or allreduce", a)
	}
	cfg, err := schedConfig(get, arch, world, servers)
	if err != nil {
		return s, err
	}
	if v := get("AUTOBYTE_SERVER_WEIGHTS"); v != "" {
		if arch != worker.PS {
			return s, fmt.Errorf("AUTOBYTE_SERVER_WEIGHTS=%q: all-reduce has no parameter servers", v)
		}
		if cfg.ServerWeights, err = sched.ParseServerWeightsFor(v, servers); err != nil {
			return s, fmt.Errorf("AUTOBYTE_SERVER_WEIGHTS (AUTOBYTE_SERVERS=%d): %w", servers, err)
		}
	}
	shard := int64(proto.DefaultShardBytes)
	switch v := get("AUTOBYTE_SHARD"); v {
	case "":
	case "0":
		shard = 0 // never split over servers (launch --shard 0 passes it so)
	default:
		if shard, err = units.ParseBytes(v); err != nil {
			return s, fmt.Errorf("AUTOBYTE_SHARD=%q: %w (or 0: never)", v, err)
		}
	}
	if arch == worker.AllReduce {
		shard = 0
	}
	if v := get("AUTOBYTE_FUSION"); v == "auto" {
		s.TunerFuse = tune.AutoFusionBytes
	} else if v != "" && v != "0" {
		if cfg.FusionBytes, err = units.ParseBytes(v); err != nil {
			return s, fmt.Errorf("AUTOBYTE_FUSION=%q: %w (or auto)", v, err)
		}
	}
	pull := false
	switch v := get("AUTOBYTE_PS_PULL"); v {
	case "", "0", "false":
	case "1", "true":
		pull = true
	default:
		return s, fmt.Errorf("AUTOBYTE_PS_PULL=%q: want 0 or 1", v)
	}
	if v := get("AUTOBYTE_COMPRESSION"); v == "auto" {
		s.TunerCompress = dtype.BF16
	} else if cfg.Compression, err = dtype.Parse(v); err != nil {
		return s, fmt.Errorf("AUTOBYTE_COMPRESSION=%q: %w (or auto)", v, err)
	}
	prof, err := profileOf(req.Tensors)
	if err != nil {
		return s, err
	}
	s.Spec = job.Spec{Profile: prof, Arch: arch, Workers: world, Servers: servers, Sched: cfg,
		ShardBytes: shard, PullMode: pull}
	for i, t := range req.Tensors {
		et := worker.Tensor{Name: t.Name, Layer: t.Layer, Elems: t.Elems}
		switch t.Iterations {
		case "":
		case "first":
			et.Posted = proto.FirstOnly
		case "after_first":
			et.Posted = proto.AfterFirst
		default:
			return s, fmt.Errorf("bridge: tensor %d %q: iterations %q: want first, after_first or none", i, t.Name, t.Iterations)
		}
		if t.Wire != "" {
			if et.Wire, err = dtype.Parse(t.Wire); err != nil {
				return s, fmt.Errorf("bridge: tensor %d %q: %w", i, t.Name, err)
			}
			et.Exact = true
		}
		s.Tensors = append(s.Tensors, et)
	}
	if err := s.Spec.Validate(); err != nil {
		return s, err
	}
	if s.Net, err = netOf(get, env0); err != nil {
		return s, err
	}
	switch v := get("AUTOBYTE_TUNER"); v {
	case "", "static":
	case "autobyte", "bo":
		s.Tuner = v
	default:
		return s, fmt.Errorf("AUTOBYTE_TUNER=%q: want static, autobyte or bo", v)
	}
	if s.TunerCompress != dtype.F32 && s.Tuner != "autobyte" {
		return s, fmt.Errorf("AUTOBYTE_COMPRESSION=auto: only AUTOBYTE_TUNER=autobyte chooses the compression, got AUTOBYTE_TUNER=%q", get("AUTOBYTE_TUNER"))
	}
	if s.TunerFuse != 0 && s.Tuner != "autobyte" {
		return s, fmt.Errorf("AUTOBYTE_FUSION=auto: only AUTOBYTE_TUNER=autobyte chooses the fusion, got AUTOBYTE_TUNER=%q", get("AUTOBYTE_TUNER"))
	}
	if v := get("AUTOBYTE_LINK_RATE"); v != "" {
		if s.LinkRateBps, err = units.ParseRate(v); err != nil {
			return s, fmt.Errorf("AUTOBYTE_LINK_RATE=%q: %w", v, err)
		}
	} else {
		s.LinkRateBps = s.Net.BandwidthBps
	}
	if v := get("AUTOBYTE_TRACE"); v != "" {
		s.EngineTrace = filepath.Join(filepath.Dir(v), "engine-"+filepath.Base(v))
	}
	if v := get(supervise.StatusFDEnv); v != "" {
		if s.StatusFD, err = strconv.Atoi(strings.TrimSpace(v)); err != nil || s.StatusFD < 3 {
			return s, fmt.Errorf("%s=%q: want the number of an open file descriptor above 2", supervise.StatusFDEnv, v)
		}
	}
	s.WaitTimeout = DefaultWaitTimeout
	if v := get("AUTOBYTE_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if secs, ferr := strconv.ParseFloat(strings.TrimSpace(v), 64); ferr == nil {
			// A bare number is seconds, as torch.distributed's timeout; the
			// bound keeps the conversion finite.
			d, err = time.Duration(secs*float64(time.Second)), nil
			if !(secs >= 0 && secs < 1e9) {
				err = errors.New("out of range")
			}
		}
		if err != nil || d < 0 {
			return s, fmt.Errorf("AUTOBYTE_TIMEOUT=%q: want a duration such as 30m, 90s or 90 (seconds; 0: wait for ever)", v)
		}
		s.WaitTimeout = d
	}
	return s, nil
}

func schedConfig(get getenv, arch worker.Arch, workers, servers int) (sched.Config, error) {
	part, credit := get("AUTOBYTE_PARTITION"), get("AUTOBYTE_CREDIT")
	switch v := get("AUTOBYTE_SCHEDULER"); v {
	case "fifo", "priority":
		if part != "" || credit != "" {
			return sched.Config{}, fmt.Errorf("AUTOBYTE_PARTITION and AUTOBYTE_CREDIT apply to AUTOBYTE_SCHEDULER=bytescheduler, not %q", v)
		}
		if v == "fifo" {
			return sched.Config{Order: sched.OrderFIFO}, nil
		}
		return sched.Config{Order: sched.OrderPriority}, nil
	case "", "bytescheduler":
	default:
		return sched.Config{}, fmt.Errorf("AUTOBYTE_SCHEDULER=%q: want bytescheduler, priority or fifo", v)
	}
	cfg := proto.ByteSchedulerDefaults(arch)
	var err error
	if part != "" {
		if cfg.PartitionBytes, err = units.ParseBytes(part); err != nil {
			return cfg, fmt.Errorf("AUTOBYTE_PARTITION=%q: %w", part, err)
		}
	}
	cfg.CreditBytes = proto.DefaultCredit(arch, workers, servers, cfg.PartitionBytes)
	if credit != "" {
		if cfg.CreditBytes, err = units.ParseBytes(credit); err != nil {
			return cfg, fmt.Errorf("AUTOBYTE_CREDIT=%q: %w", credit, err)
		}
	}
	return cfg, cfg.Validate()
}

// profileOf turns the binding's tensors into a model profile without
// compute times: layers in the order given by Tensor.Layer.
func profileOf(ts []Tensor) (*model.Profile, error) {
	if len(ts) == 0 {
		return nil, fmt.Errorf("bridge: no tensors to synchronise (does the model have trainable float32 parameters?)")
	}
	p := &model.Profile{Name: "script", BatchSize: 1, Device: "script", BytesPerParam: 4}
	for i, t := range ts {
		if t.Layer < 0 || t.Layer >= len(ts) {
			return nil, fmt.Errorf("bridge: tensor %d %q: layer %d out of range 0..%d", i, t.Name, t.Layer, len(ts)-1)
		}
		if t.Elems < 1 {
			return nil, fmt.Errorf("bridge: tensor %d %q: %d elements, want >= 1", i, t.Name, t.Elems)
		}
		for len(p.Layers) <= t.Layer {
			p.Layers = append(p.Layers, model.Layer{Name: "layer" + strconv.Itoa(len(p.Layers))})
		}
		l := &p.Layers[t.Layer]
		l.Tensors = append(l.Tensors, model.Tensor{Name: t.Name, Params: int64(t.Elems)})
	}
	// TensorsOf numbers tensors layer by layer; the binding's ids must be
	// the same numbers.
	id := 0
	for l, layer := range p.Layers {
		if len(layer.Tensors) == 0 {
			return nil, fmt.Errorf("bridge: layer %d has no tensors (layers must be numbered 0..%d without gaps)", l, len(p.Layers)-1)
		}
		for _, t := range layer.Tensors {
			if ts[id].Name != t.Name {
				return nil, fmt.Errorf("bridge: tensor %d %q is listed out of layer order (tensors must be sorted by layer)", id, ts[id].Name)
			}
			id++
		}
	}
	return p, p.Validate()
}

func netOf(get getenv, env cluster.Env) (job.Net, error) {
	var n job.Net
	addr, port, world := env.MasterAddr, env.Port, env.WorldSize
	switch {
	case addr == "" && world == 1:
		addr = "127.0.0.1"
	case addr == "":
		return n, fmt.Errorf("MASTER_ADDR is not set (rank 0's address; %d workers need a rendezvous)", world)
	}
	switch {
	case port == 0 && world > 1:
		return n, fmt.Errorf("MASTER_PORT is not set (rank 0 listens at MASTER_PORT+1 for autobyte's rendezvous, or at AUTOBYTE_MASTER_PORT)")
	case port == 0:
		p, err := cluster.FreePort()
		if err != nil {
			return n, err
		}
		port = p
	}
	n.Master = net.JoinHostPort(addr, strconv.Itoa(port))
	n.Token = get("AUTOBYTE_TOKEN")
	if n.Token == "" {
		if world > 1 {
			return n, fmt.Errorf("AUTOBYTE_TOKEN is not set: every process of the job needs the same secret ('autobyte launch' sets one; under torchrun export AUTOBYTE_TOKEN yourself)")
		}
		n.Token = "single-process"
	}
	n.Listen = get("AUTOBYTE_LISTEN")
	if v := get("AUTOBYTE_BANDWIDTH"); v != "" {
		bw, err := units.ParseRate(v)
		if err != nil {
			return n, fmt.Errorf("AUTOBYTE_BANDWIDTH=%q: %w", v, err)
		}
		n.BandwidthBps = bw
	}
	n.PeerTimeout = 5 * time.Second
	if v := get("AUTOBYTE_PEER_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return n, fmt.Errorf("AUTOBYTE_PEER_TIMEOUT=%q: want a positive duration such as 5s", v)
		}
		n.PeerTimeout = d
	}
	rendezvous, err := cluster.RendezvousTimeoutFrom(get)
	if err != nil {
		return n, err
	}
	n.RendezvousTimeout = rendezvous
	switch v := get("AUTOBYTE_SHM"); v {
	case "", "1", "on", "true":
	case "0", "off", "false":
		n.NoSharedMemory = true
	default:
		return n, fmt.Errorf("AUTOBYTE_SHM=%q: want 1 (same-host connections through shared memory, the default) or 0 (TCP)", v)
	}
	var level slog.Level
	if v := get("AUTOBYTE_LOG_LEVEL"); v == "" {
		level = slog.LevelWarn
	} else if err := level.UnmarshalText([]byte(v)); err != nil {
		return n, fmt.Errorf("AUTOBYTE_LOG_LEVEL=%q: want debug, info, warn or error", v)
	}
	n.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("rank", env.Rank)
	return n, nil
}

// Session is one connected worker of a scripted job.
type Session struct {
	w        *job.Worker
	settings Settings
	tensors  []Tensor
	tuning   *job.Tuning
	trace    *observe.Observer

	mu     sync.Mutex
	closed bool
}

// Hooks tell a binding what the engine did, on the engine's goroutines, so
// that its training thread can wait without calling into Go (see
// worker.Config.OnOpen and OnStop). Both may be nil.
type Hooks struct {
	OnOpen func(layer, iteration int)
	OnStop func(err error)
}

// Open parses the request, joins the job and starts the engine. It blocks
// until every process of the job has joined (or ctx ends).
func Open(ctx context.Context, reqJSON []byte, env func(string) string, hooks Hooks) (*Session, error) {
	req, err := DecodeRequest(reqJSON)
	if err != nil {
		return nil, err
	}
	return OpenRequest(ctx, req, env, hooks)
}

// DecodeRequest parses a binding's request; unknown fields are errors.
func DecodeRequest(reqJSON []byte) (Request, error) {
	var req Request
	dec := json.NewDecoder(strings.NewReader(string(reqJSON)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return Request{}, fmt.Errorf("bridge: bad request %.80q: %w", reqJSON, err)
	}
	return req, nil
}

// OpenRequest is Open with the request decoded.
func OpenRequest(ctx context.Context, req Request, env func(string) string, hooks Hooks) (*Session, error) {
	st, err := ParseSettings(req, env)
	if err != nil {
		return nil, err
	}
	co := job.ConnectOptions{Tensors: st.Tensors, OnOpen: hooks.OnOpen, OnStop: hooks.OnStop}
	if st.StatusFD > 0 {
		co.OnStop = reportLostPeer(st.StatusFD, hooks.OnStop)
	}
	var trace *observe.Observer
	if st.EngineTrace != "" {
		if trace, err = observe.New(st.EngineTrace, st.Rank, nil); err != nil {
			return nil, fmt.Errorf("AUTOBYTE_TRACE: %w", err)
		}
		// In CLOCK_MONOTONIC seconds, the clock of Python's
		// time.perf_counter, so the plugin's timeline and this one line up.
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err == nil {
			trace.AlignClock(time.Now(), float64(ts.Sec)+float64(ts.Nsec)/1e9)
		}
		co.Observer = trace
	}
	var tuning *job.Tuning
	if st.Rank == 0 && st.Tuner != "" {
		if st.Spec.Sched.PartitionBytes == 0 && st.Spec.Sched.CreditBytes == 0 {
			return nil, fmt.Errorf("AUTOBYTE_TUNER=%s tunes partition and credit: it needs AUTOBYTE_SCHEDULER=bytescheduler", st.Tuner)
		}
		arch := "ps"
		if st.Spec.Arch == worker.AllReduce {
			arch = "allreduce"
		}
		tn, err := tune.New(st.Tuner, tune.NewOptions{Arch: arch, Base: st.Spec.Sched, Seed: 1, Compress: st.TunerCompress, Fuse: st.TunerFuse})
		if err != nil {
			return nil, fmt.Errorf("AUTOBYTE_TUNER=%s: %w", st.Tuner, err)
		}
		o := job.TuningOptions{Tuner: tn}
		if st.LinkRateBps > 0 {
			rate := st.LinkRateBps
			o.BandwidthAt = func(int) float64 { return rate }
		}
		logTuner(st.Net.Logger, tn, &o)
		tuning = job.NewTuning(st.Spec, o, co.Observer)
		co.Observer = tuning.Observer()
	}
	w, err := job.ConnectWith(ctx, st.Spec, st.Rank, st.Net, co)
	if err != nil {
		if trace != nil {
			_ = trace.Close()
		}
		return nil, err
	}
	if tuning != nil {
		tuning.Attach(w)
	}
	return &Session{w: w, settings: st, tensors: req.Tensors, tuning: tuning, trace: trace}, nil
}

// status is the process's channel to its supervisor, opened once: a script
// may open one session after another, and the pipe outlives each.
var status struct {
	once     sync.Once
	reporter *supervise.Reporter
}

// reportLostPeer wraps an engine's OnStop: when the engine stops because it
// lost a peer, the supervisor hears which one (the process's exit report:
// it is about to fail), before next runs.
func reportLostPeer(fd int, next func(error)) func(error) {
	return func(err error) {
		if _, lost := transport.LostPeer(err); lost {
			status.once.Do(func() { status.reporter = supervise.FromFD(fd) })
			status.reporter.Exit(err)
		}
		if next != nil {
			next(err)
		}
	}
}

// logTuner logs what rank 0's tuner does: at info level each configuration
// change and each autobyte tuner event, at debug level every iteration's
// statistics (so a run that tunes badly can be replayed offline).
func logTuner(log *slog.Logger, tn tune.Tuner, o *job.TuningOptions) {
	if log == nil {
		return
	}
	ab, _ := tn.(*tune.AutoByte)
	seen := 0
	o.OnStats = func(st tune.Stats) {
		log.Debug("tuner statistics", "iteration", st.Iteration, "iteration_time_s", st.IterationTimeS,
			"forward_s", st.ForwardS, "backward_s", st.BackwardS, "bandwidth_bps", st.BandwidthBps,
			"goodput_bps", st.GoodputBps, "partition", st.Config.PartitionBytes, "credit", st.Config.CreditBytes)
		if ab == nil {
			return
		}
		evs := ab.EventsFrom(seen)
		for _, e := range evs {
			log.Info("tuner: " + e.String())
		}
		seen += len(evs)
	}
	o.OnChange = func(c job.ConfigChange) {
		log.Info("tuner: configuration change", "from_iteration", c.FromIteration,
			"partition", units.FormatBytes(c.Config.PartitionBytes), "credit", units.FormatBytes(c.Config.CreditBytes))
	}
}

// Tuning says whether this session tunes itself (rank 0 with a tuner): the
// binding must then report its compute with Mark.
func (s *Session) Tuning() bool { return s.tuning != nil }

// WaitTimeout is how long the training thread may wait for a layer's sums
// (0: no bound); see Settings.WaitTimeout.
func (s *Session) WaitTimeout() time.Duration { return s.settings.WaitTimeout }

// Mark events of a training step, for the tuner's measurements.
const (
	ForwardBegin = iota
	ForwardEnd
	BackwardEnd
)

// Mark reports event of iteration k (a no-op without tuning). ForwardEnd
// runs the tuner; a configuration it proposes applies from a later
// iteration on every worker and server.
func (s *Session) Mark(event, k int) error {
	if s.tuning == nil {
		return nil
	}
	switch event {
	case ForwardBegin:
		return s.tuning.ForwardBegin(k)
	case ForwardEnd:
		return s.tuning.ForwardEnd(k)
	case BackwardEnd:
		return s.tuning.BackwardEnd(k)
	}
	return fmt.Errorf("bridge: unknown mark %d", event)
}

// Report is what a session did, as JSON for the binding: the
// configurations in force and the (engine) iteration each applied from.
func (s *Session) Report() ([]byte, error) {
	type config struct {
		FromIteration  int   `json:"from_iteration"`
		PartitionBytes int64 `json:"partition_bytes"`
		CreditBytes    int64 `json:"credit_bytes"`
	}
	r := struct {
		Tuner   string   `json:"tuner"`
		Configs []config `json:"configs"`
	}{Tuner: "static"}
	if s.tuning != nil {
		r.Tuner = s.settings.Tuner
		for _, c := range s.tuning.Configs() {
			r.Configs = append(r.Configs, config{c.FromIteration, c.Config.PartitionBytes, c.Config.CreditBytes})
		}
	} else {
		r.Configs = []config{{0, s.settings.Spec.Sched.PartitionBytes, s.settings.Spec.Sched.CreditBytes}}
	}
	return json.Marshal(r)
}

// Post hands over tensor's gradient of iteration; the engine overwrites
// data with the sum over all workers. The caller must keep data alive and
// untouched until WaitLayer returns for the tensor's layer and iteration.
func (s *Session) Post(tensor, iteration int, data []float32) error {
	return s.PostAll(iteration, []worker.Posting{{Tensor: tensor, Grad: data}})
}

// PostAll hands over several gradients of iteration at once, as Post
// would each (see worker.Engine.PostAll).
func (s *Session) PostAll(iteration int, posts []worker.Posting) error {
	if iteration < 0 {
		return fmt.Errorf("bridge: iteration %d < 0", iteration)
	}
	return s.w.PostAll(iteration, posts)
}

// WaitLayer blocks until every tensor of layer of iteration is summed.
func (s *Session) WaitLayer(layer, iteration int) error {
	from := time.Now()
	err := s.w.WaitLayer(layer, iteration)
	s.Waited(from, time.Now())
	return err
}

// Waited tells the tuner (if any) that the training thread was blocked on
// a layer's sums from from to to: a binding that waits outside Go (Hooks)
// reports its waits so, before its next Mark.
func (s *Session) Waited(from, to time.Time) {
	if s.tuning != nil {
		s.tuning.Waited(from, to)
	}
}

// Close ends the session: ok says goodbye to every peer (the job ended
// normally); otherwise connections close with an error the peers report.
// Closing twice is a no-op.
func (s *Session) Close(ok bool, reason string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	var cause error
	if !ok {
		if reason == "" {
			reason = "the training script failed"
		}
		cause = fmt.Errorf("worker %d: %s", s.settings.Rank, reason)
	}
	err := s.w.Engine.Err()
	s.w.Close(cause)
	if s.trace != nil {
		if terr := s.trace.Close(); terr != nil && err == nil && ok {
			err = fmt.Errorf("bridge: engine timeline %s: %w", s.settings.EngineTrace, terr)
		}
	}
	if ok {
		return err
	}
	return nil
}
