package sim

import (
	"fmt"
	"math"

	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/units"
)

// Limits on what one simulation may cost, checked by Validate before
// anything is allocated. A tiny partition or millions of workers otherwise
// grow the process to gigabytes with nothing printed (vgg16 with 1-byte
// pieces is 138 million pieces per worker and iteration).
const (
	// MaxMemoryBytes bounds the estimated peak memory of a run: twice the
	// largest run of the repository's suites and scripts by far, and what
	// a laptop can spare.
	MaxMemoryBytes = 8 << 30
	// MaxEvents bounds the estimated events of a run: 15-40 minutes on a
	// 2-core machine, which handles 2-2.5 million events/s in small runs
	// and 0.8-1 million in runs of a thousand workers or more (their
	// queues and tables no longer fit the caches). The largest runs of the
	// tuner suites are below 10^8.
	MaxEvents = 2e9
	// MaxPlacementOps bounds the work of placing pieces on servers (one
	// sort of the servers by load per piece): about a minute.
	MaxPlacementOps = 1e10
	// MaxFlowOps bounds the work of sharing links under WireConnections
	// (every start and finish of a message reshares the links among the
	// messages in flight): about 15 minutes at the 4.5*10^7 steps/s
	// measured with resnet50, 32 workers and 8 servers.
	MaxFlowOps = 4e10
)

// Memory costs per unit, measured with /usr/bin/time on autobyte sim
// (maximum resident set, fitted from above so that the estimate was never
// below the measurement; it is up to 5x above it for PS runs of few
// workers): vgg16 with 4 KB pieces at 2 and 8 workers, all-reduce with
// 1 KB pieces, resnet50, bert-base and toy3 at 4,000-16,000 workers.
const (
	memBase        = 16 << 20 // the program itself
	memPerPiece    = 512      // the leader's core, the placement plan
	memPerPSPiece  = 320      // per worker and piece (or shard): followers, messages, events in flight
	memPerWorker   = 4 << 10  // per-layer gates, accounting, its core
	memPerTensor   = 16       // per worker and tensor: post times, counts
	memPerHost     = 128      // per link, servers included
	eventsPerEgres = 2        // a message's egress-free and delivery events
)

// Estimate is what a simulation will cost, computed from its options alone.
type Estimate struct {
	// PiecesPerIteration is how many pieces one worker schedules per
	// iteration under the initial configuration; Messages how many
	// messages cross the network per iteration (every push and every
	// answer of every shard of a piece; the ring's steps count as one
	// message per piece).
	PiecesPerIteration int64
	Messages           float64
	// Events is the number of simulation events of the whole run.
	Events float64
	// PlacementOps counts the comparisons of placing every piece.
	PlacementOps float64
	// FlowOps bounds the steps of sharing links under WireConnections:
	// two reshares per message, each over at most every connection (one
	// each way per worker and server) and every link.
	FlowOps float64
	// MemoryBytes is the estimated peak memory.
	MemoryBytes float64
}

// BudgetError is a run whose estimate exceeds a limit. Cause names the
// option that drives the estimate ("partition", "workers", "servers",
// "iterations" or "model"), so that a caller can name its own flag for it.
type BudgetError struct {
	Cause    string
	Estimate Estimate
	// What is over, e.g. "8.2 GB of memory (limit 8.6 GB)".
	What string
}

func (e *BudgetError) Error() string {
	if e.Estimate.PiecesPerIteration == 0 { // no model: processes alone
		return fmt.Sprintf("%s: %s", e.What, budgetAdvice[e.Cause])
	}
	return fmt.Sprintf("%s (%d pieces per worker per iteration): %s", e.What, e.Estimate.PiecesPerIteration, budgetAdvice[e.Cause])
}

// validateBudget is the end of Validate: the profile, then the budget,
// which needs a valid profile.
func (o *Options) validateBudget() error {
	if err := o.Profile.Validate(); err != nil {
		return err
	}
	_, err := o.Budget()
	return err
}

var budgetAdvice = map[string]string{
	"partition":  "use a larger partition (pieces of a few KB or more)",
	"workers":    "use fewer workers",
	"servers":    "use fewer servers",
	"iterations": "use fewer iterations",
	"model":      "the model is too large for this machine (a replaying worker holds about three copies of its gradients)",
}

// Budget estimates the cost of simulating o and returns a *BudgetError
// when it exceeds MaxMemoryBytes, MaxEvents or MaxPlacementOps. It needs
// only the fields Validate checks first (a profile, workers, servers,
// iterations, a valid configuration); it assumes the initial partition
// holds for the whole run (a tuner may change it).
func (o *Options) Budget() (Estimate, error) {
	var e Estimate
	if o.Profile == nil || o.Workers < 1 || o.Iterations < 1 {
		return e, nil // Validate reports these
	}
	elem := o.elemBytes()
	part := o.Sched.PartitionBytes
	W, M := float64(o.Workers), float64(o.Servers)
	var shards float64 // messages one worker pushes per iteration
	tensors := 0
	for _, l := range o.Profile.Layers {
		for _, t := range l.Tensors {
			tensors++
			size := t.Params * elem
			if size <= 0 {
				continue // Validate reports it
			}
			n := sched.PieceCount(size, elem, part)
			e.PiecesPerIteration += n
			per := 1.0
			if pb := size / n; o.Arch == PS && o.ShardBytes > 0 && pb > o.ShardBytes {
				per = float64(min(int64(o.Servers), pb/elem, (pb-1)/o.ShardBytes+1))
			}
			shards += float64(n) * per
		}
	}
	P := float64(e.PiecesPerIteration)
	iters := float64(o.Iterations)
	layers := float64(len(o.Profile.Layers))
	compute := 2 * layers * W // a forward and a backward event per layer and worker
	hosts := W
	// The leader announces every piece it starts to the followers (one
	// event per piece), on parameter servers and the ring alike.
	announce := 0.0
	if o.Workers > 1 {
		announce = P
	}
	if o.Arch == PS {
		hosts += M
		e.Messages = 2 * W * shards
		e.Events = iters * (eventsPerEgres*e.Messages + announce + compute)
		if M > 1 {
			e.PlacementOps = P * M * math.Log2(M)
		}
		e.MemoryBytes = memPerPSPiece * W * shards
		if o.Wire == WireConnections {
			e.FlowOps = 2 * e.Messages * iters * (2*W*M + 2*(W+M))
		}
	} else {
		e.Messages = P
		e.Events = iters * (2*P + announce + compute)
		// Every rank's machine follows the leader's pieces.
		e.MemoryBytes = memPerPSPiece * W * P
	}
	e.MemoryBytes += memBase + memPerPiece*P + W*(memPerWorker+memPerTensor*float64(tensors)) + memPerHost*hosts
	return e, o.overBudget(e)
}

// overBudget returns the first limit e exceeds, with the option that
// drives it.
func (o *Options) overBudget(e Estimate) error {
	// Pieces per iteration beyond what any sensible partition gives (a
	// 1 KB partition of gpt2 is 500,000) make the partition the cause;
	// otherwise the cluster's size or the run's length.
	cause := "workers"
	switch {
	case e.PiecesPerIteration > 1_000_000:
		cause = "partition"
	case o.Arch == PS && o.Servers > 4*o.Workers:
		cause = "servers"
	}
	switch {
	case e.MemoryBytes > MaxMemoryBytes:
		return &BudgetError{Cause: cause, Estimate: e,
			What: fmt.Sprintf("sim: an estimated %s of memory exceeds the limit of %s (%.3g messages, %.3g events)", units.FormatBytes(int64(e.MemoryBytes)), units.FormatBytes(MaxMemoryBytes), e.Messages*float64(o.Iterations), e.Events)}
	case e.PlacementOps > MaxPlacementOps:
		return &BudgetError{Cause: cause, Estimate: e,
			What: fmt.Sprintf("sim: placing %d pieces on %d servers takes an estimated %.3g steps, over the limit of %.3g", e.PiecesPerIteration, o.Servers, e.PlacementOps, float64(MaxPlacementOps))}
	case e.FlowOps > MaxFlowOps:
		return &BudgetError{Cause: cause, Estimate: e,
			What: fmt.Sprintf("sim: sharing the links of %d workers and %d servers (--wire connections) takes an estimated %.3g steps, over the limit of %.3g", o.Workers, o.Servers, e.FlowOps, float64(MaxFlowOps))}
	case e.Events > MaxEvents:
		if cause == "workers" && o.Iterations > 1000 {
			cause = "iterations"
		}
		return &BudgetError{Cause: cause, Estimate: e,
			What: fmt.Sprintf("sim: an estimated %.3g events exceed the limit of %.3g (15-40 minutes on 2 cores; %.3g messages)", e.Events, float64(MaxEvents), e.Messages*float64(o.Iterations))}
	}
	return nil
}

// Limits on a real run of the same options on one machine (autobyte
// launch starts every process here).
const (
	// RuntimeMessageCostS is the CPU a process spends per message it sends
	// or receives: 14.9 us measured by scripts/message-cost.sh on this
	// project's 2-core machine (docs/tuner-eval.md).
	RuntimeMessageCostS = 15e-6
	// MaxRuntimeOverheadS bounds the per-message CPU of the busiest
	// process per iteration: beyond a minute per iteration the run
	// measures the message overhead, not the scheduling.
	MaxRuntimeOverheadS = 60
	// runtimeMemPerProcess is a process's own memory (Go runtime, buffers,
	// connections) and runtimeMemPerPiece what the engine, the core and a
	// frame cost per piece in flight or posted.
	runtimeMemPerProcess = 32 << 20
	runtimeMemPerPiece   = 1024
)

// RuntimeEstimate is what a real run of the options costs when every
// process runs on one machine.
type RuntimeEstimate struct {
	PiecesPerIteration int64
	// BusiestMessages is the messages the busiest process sends and
	// receives per iteration, OverheadS their CPU at RuntimeMessageCostS.
	BusiestMessages float64
	OverheadS       float64
	// MemoryBytes is every process's memory together: per worker three
	// model sizes (the replay's gradients, the pattern it refills them
	// from, and receive buffers; vgg16 on 20 ring workers, estimated at
	// two, was killed for memory on a 23 GB machine), each server's sums
	// in flight, and the per-piece state.
	MemoryBytes float64
}

// RuntimeBudget estimates a real run of o (parameter servers or a ring,
// every process on one machine with memoryBytes of memory available; 0:
// unknown, not checked) and returns an error naming the cause when the busiest
// process would spend more than MaxRuntimeOverheadS per iteration on
// messages or the processes need more memory than the machine has.
func (o *Options) RuntimeBudget(memoryBytes int64) (RuntimeEstimate, error) {
	var r RuntimeEstimate
	if o.Profile == nil || o.Workers < 1 {
		return r, nil
	}
	elem := o.elemBytes()
	for _, l := range o.Profile.Layers {
		for _, t := range l.Tensors {
			if size := t.Params * elem; size > 0 {
				r.PiecesPerIteration += sched.PieceCount(size, elem, o.Sched.PartitionBytes)
			}
		}
	}
	P, W := float64(r.PiecesPerIteration), float64(o.Workers)
	model := float64(o.Profile.TotalBytes())
	procs := W
	switch {
	case o.Arch == PS:
		procs += float64(o.Servers)
		// A worker pushes each piece and receives its sum; a server takes
		// a push of its share of the pieces from every worker and answers
		// each; rank 0 also announces every piece to the other workers.
		worker := 2*P + (W-1)*P
		server := 2 * W * P / float64(o.Servers)
		r.BusiestMessages = max(worker, server)
		// Servers hold what the workers have in flight: the credit's
		// worth each, and never more than the model (credit 0 is no
		// window).
		inflight := model
		if c := float64(o.Sched.CreditBytes); c > 0 && c < model {
			inflight = c
		}
		r.MemoryBytes = 3*model*W + inflight*W
	default:
		// 2(N-1) ring steps per piece, each a send and a receive.
		r.BusiestMessages = 4*(W-1)*P + (W-1)*P
		r.MemoryBytes = 3 * model * W
	}
	r.OverheadS = r.BusiestMessages * RuntimeMessageCostS
	r.MemoryBytes += procs*runtimeMemPerProcess + W*P*runtimeMemPerPiece
	switch {
	case r.OverheadS > MaxRuntimeOverheadS:
		cause := "workers"
		if r.PiecesPerIteration > 100_000 {
			cause = "partition"
		}
		return r, &BudgetError{Cause: cause, Estimate: Estimate{PiecesPerIteration: r.PiecesPerIteration, Messages: r.BusiestMessages},
			What: fmt.Sprintf("runtime: the busiest process would handle %.3g messages per iteration, an estimated %s of CPU at %s each, over the limit of %s per iteration",
				r.BusiestMessages, units.FormatSeconds(r.OverheadS), units.FormatSeconds(RuntimeMessageCostS), units.FormatSeconds(MaxRuntimeOverheadS))}
	case memoryBytes > 0 && r.MemoryBytes > float64(memoryBytes):
		cause := processCause(o.Workers, o.Servers)
		switch {
		case r.PiecesPerIteration > 1_000_000:
			cause = "partition"
		case 3*model+runtimeMemPerProcess > float64(memoryBytes):
			cause = "model" // one worker alone would not fit
		}
		return r, &BudgetError{Cause: cause, Estimate: Estimate{PiecesPerIteration: r.PiecesPerIteration, Messages: r.BusiestMessages},
			What: fmt.Sprintf("runtime: %.0f processes need an estimated %s of memory, more than the %s this machine has available", procs, units.FormatBytes(int64(r.MemoryBytes)), units.FormatBytes(memoryBytes))}
	}
	return r, nil
}

// ProcessesBudget refuses a local job whose workers and servers could not
// all start in memoryBytes (0: unknown, not checked), counting only each
// process's own floor, runtimeMemPerProcess (a training script's processes
// need their framework's memory on top). A job of a training command
// checks this; a replay checks RuntimeBudget, which includes it.
func ProcessesBudget(workers, servers int, memoryBytes int64) error {
	procs := float64(workers) + float64(servers)
	if need := procs * runtimeMemPerProcess; memoryBytes > 0 && need > float64(memoryBytes) {
		return &BudgetError{Cause: processCause(workers, servers), What: fmt.Sprintf("runtime: %.0f processes need at least %s of memory (%s each for the engine alone), more than the %s this machine has available",
			procs, units.FormatBytes(int64(need)), units.FormatBytes(runtimeMemPerProcess), units.FormatBytes(memoryBytes))}
	}
	return nil
}

// processCause names the count that makes the processes too many: the
// servers where they outnumber the workers, else the workers.
func processCause(workers, servers int) string {
	if servers > workers {
		return "servers"
	}
	return "workers"
}

// elemBytes is the bytes one parameter's gradient takes on the wire under
// the initial configuration: the profile's parameter size, or its
// compression type's.
func (o *Options) elemBytes() int64 {
	if d, err := dtype.WireOf(o.Profile.BytesPerParam, o.Sched.Compression); err == nil {
		return int64(d.Size())
	}
	if o.Profile.BytesPerParam > 0 {
		return int64(o.Profile.BytesPerParam)
	}
	return sched.DefaultElemBytes
}
