// Package job runs one process of a real training job: a parameter server
// or a worker that replays a model profile through the worker engine. It
// wires rendezvous (package cluster), connections (transport), summation
// (ps), the ring (allreduce) and the engine (worker) together, and reports
// what the process measured. The CLI's server, worker and launch commands
// are thin wrappers around it.
//
// It knows nothing of command-line flags or child processes.
package job

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"time"

	"golang.org/x/time/rate"

	"github.com/autobyte/autobyte/cluster"
	"github.com/autobyte/autobyte/model"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/transport"
	"github.com/autobyte/autobyte/tune"
	"github.com/autobyte/autobyte/units"
	"github.com/autobyte/autobyte/worker"
)

// Spec is the job every process of it must agree on (its digest is checked
// at rendezvous).
type Spec struct {
	Profile    *model.Profile
	Arch       worker.Arch
	Workers    int
	Servers    int
	Sched      sched.Config
	ShardBytes int64
	// Iterations is how many iterations a replaying worker (RunWorker)
	// runs; 0 for open-ended jobs driven through the Go API or the Python
	// plugin.
	Iterations int
	// PullMode makes PS workers pull each sum separately.
	PullMode bool
}

// ServerDigest identifies the part of the spec a parameter server needs:
// servers sum whatever pieces workers push, so they need not know the
// model, and one server binary serves any model (e.g. a PyTorch script's).
func (s Spec) ServerDigest() string {
	return shortDigest(struct {
		Arch worker.Arch
		W, M int
		Pull bool
	}{s.Arch, s.Workers, s.Servers, s.PullMode})
}

// shortDigest identifies v by its JSON: 12 hex digits of its SHA-256.
func shortDigest(v any) string {
	b, _ := json.Marshal(v)
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:6])
}

// ServerConfig is the part of the spec a parameter server needs, for
// people (cluster.Member.Config): the coordinator names what differs when
// a digest does not match.
func (s Spec) ServerConfig() map[string]string {
	c := fmt.Sprintf("%v, %d workers, %d servers", s.Arch, s.Workers, s.Servers)
	if s.PullMode {
		c += ", sums pulled"
	}
	return map[string]string{"cluster": c}
}

// Config is the spec for people, in the parts Digest covers: cluster,
// model, scheduling and iterations (see ServerConfig).
func (s Spec) Config() map[string]string {
	c := s.ServerConfig()
	if p := s.Profile; p != nil {
		c["model"] = fmt.Sprintf("%s: %d tensors in %d layers, %d parameters of %d bytes (profile digest %s)",
			p.Name, p.NumTensors(), len(p.Layers), p.TotalParams(), p.BytesPerParam, shortDigest(p))
	}
	shard := "no sharding"
	if s.ShardBytes > 0 {
		shard = "shards of " + units.FormatBytes(s.ShardBytes)
	}
	c["scheduling"] = fmt.Sprintf("%v order, %v admission, %s, %s", s.Sched.Order, s.Sched.Admission, s.Sched.Knobs(), shard)
	c["iterations"] = strconv.Itoa(s.Iterations)
	return c
}

// ValidateServer reports the first invalid field a server uses.
func (s Spec) ValidateServer() error {
	switch {
	case s.Arch != worker.PS:
		return fmt.Errorf("job: parameter servers serve the ps architecture only, got arch %d", s.Arch)
	case s.Workers < 1:
		return fmt.Errorf("job: workers must be >= 1, got %d", s.Workers)
	case s.Servers < 1:
		return fmt.Errorf("job: parameter servers must be >= 1, got %d", s.Servers)
	}
	return nil
}

// Digest identifies the spec.
func (s Spec) Digest() string {
	return shortDigest(struct {
		Profile    *model.Profile
		Arch       worker.Arch
		W, M       int
		Sched      sched.Config
		Shard      int64
		Iterations int
		Pull       bool
	}{s.Profile, s.Arch, s.Workers, s.Servers, s.Sched, s.ShardBytes, s.Iterations, s.PullMode})
}

// Validate reports the first invalid field.
func (s Spec) Validate() error {
	switch {
	case s.Profile == nil:
		return fmt.Errorf("job: no model profile")
	case s.Workers < 1:
		return fmt.Errorf("job: workers must be >= 1, got %d", s.Workers)
	case s.Arch == worker.PS && s.Servers < 1:
		return fmt.Errorf("job: parameter servers must be >= 1, got %d", s.Servers)
	case s.Arch == worker.AllReduce && s.Servers != 0:
		return fmt.Errorf("job: all-reduce has no servers, got %d", s.Servers)
	case s.Iterations < 0:
		return fmt.Errorf("job: iterations must be >= 0, got %d", s.Iterations)
	case s.ShardBytes < 0:
		return fmt.Errorf("job: shard size must be >= 0, got %d", s.ShardBytes)
	}
	if err := s.Sched.Validate(); err != nil {
		return err
	}
	return s.Profile.Validate()
}

// Net is how a process reaches the others.
type Net struct {
	// Master is the coordinator's address (rank 0 listens there).
	Master string
	// Listen is where a server or an all-reduce worker accepts data
	// connections; ":0" picks a free port on every interface.
	Listen string
	Token  string
	// BandwidthBps shapes this process's egress and ingress in-process
	// (bytes/s); 0 leaves them unshaped.
	BandwidthBps float64
	// RateAt, if set with BandwidthBps, is a parameter server's shaped
	// rate by iteration (its host's link trace): the server changes its
	// rate when the first push of an iteration with another rate arrives.
	RateAt func(iteration int) float64
	// PeerTimeout bounds how long a silent peer is tolerated (default 5 s).
	PeerTimeout time.Duration
	// RendezvousTimeout bounds the wait for every member of the job to
	// register (default cluster.DefaultRendezvousTimeout); meanwhile
	// Logger hears every 30 s which members are still awaited.
	RendezvousTimeout time.Duration
	// TLS, if set, wraps every connection in (mutual) TLS.
	TLS *tls.Config
	// NoSharedMemory keeps connections between processes of one host on
	// TCP; by default their bytes go through shared memory
	// (transport.Config.SharedMemoryRing).
	NoSharedMemory bool
	Logger         *slog.Logger
}

// patience bounds and reports this process's rendezvous.
func (n Net) patience() cluster.Patience {
	return cluster.Patience{Timeout: n.RendezvousTimeout, Log: n.Logger}
}

func (n Net) transport(role string, rank int) (transport.Config, error) {
	cfg := transport.Config{Token: n.Token, Rank: rank, Role: role, PeerTimeout: n.PeerTimeout, Logger: n.Logger, TLS: n.TLS}
	if n.NoSharedMemory {
		cfg.SharedMemoryRing = -1
	}
	if n.BandwidthBps > 0 {
		if math.IsInf(n.BandwidthBps, 0) || math.IsNaN(n.BandwidthBps) {
			return cfg, fmt.Errorf("job: bandwidth must be a positive rate, got %v B/s", n.BandwidthBps)
		}
		// A burst of 2 ms of traffic, at least 64 KiB: smooth at high rates,
		// not a byte-at-a-time crawl at low ones.
		burst := max(64<<10, int(n.BandwidthBps*0.002))
		cfg.Egress = rate.NewLimiter(rate.Limit(n.BandwidthBps), burst)
		cfg.Ingress = rate.NewLimiter(rate.Limit(n.BandwidthBps), burst)
	}
	return cfg, nil
}

// Summary is what one process reports; the launcher gathers them.
type Summary struct {
	Role  string `json:"role"`
	Rank  int    `json:"rank"`
	Error string `json:"error,omitempty"`
	// Worker only.
	IterationTimesS []float64 `json:"iteration_times_s,omitempty"`
	IterationTimeS  float64   `json:"iteration_time_s,omitempty"`
	Checked         int64     `json:"checked_elements,omitempty"`
	// Rank 0 of a tuned (or measured) replay: the configurations it
	// applied, the first being the initial one, and its statistics per
	// iteration.
	Configs []ConfigChange `json:"configs,omitempty"`
	Stats   []tune.Stats   `json:"stats,omitempty"`
	// Tuner names rank 0's tuner, and TunerEvents are what it did (the
	// CLI fills them).
	Tuner       string   `json:"tuner,omitempty"`
	TunerEvents []string `json:"tuner_events,omitempty"`
	// BytesSent and BytesReceived count every connection of the process.
	BytesSent     int64   `json:"bytes_sent"`
	BytesReceived int64   `json:"bytes_received"`
	WallS         float64 `json:"wall_s"`
}
