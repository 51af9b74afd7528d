package tune

import "github.com/autobyte/autobyte/sched"

// Static is the tuner that never changes anything: the job keeps its
// initial configuration, Config, for the whole run. It is the baseline of
// every fixed setting (FIFO, priority, ByteScheduler's defaults, the best
// static configuration in hindsight).
type Static struct {
	// Config is the fixed configuration; the caller starts the job with it.
	Config sched.Config
}

// NewStatic returns a Static tuner for cfg.
func NewStatic(cfg sched.Config) *Static { return &Static{Config: cfg} }

// Name returns "static".
func (*Static) Name() string { return "static" }

// Observe never proposes.
func (*Static) Observe(Stats) (Proposal, bool) { return Proposal{}, false }
