package sim

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/autobyte/autobyte/model"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/tune"
)

func zooOptions(t *testing.T, name string, arch Arch, workers int, part int64) Options {
	t.Helper()
	p, err := model.Get(name)
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Profile: p, Arch: arch, Workers: workers, BandwidthBps: 1.25e9, LatencyS: 50e-6, Iterations: 4,
		Sched: sched.Config{PartitionBytes: part, CreditBytes: 4 * part, Order: sched.OrderPriority}}
	if arch == PS {
		o.Servers, o.ShardBytes = workers, 4_000_000
	}
	return o
}

// TestBudgetRefusesUnboundedRuns: inputs that used to grow the process to
// gigabytes in silence are refused by Validate at once, naming the option
// that drives the cost and the estimate.
func TestBudgetRefusesUnboundedRuns(t *testing.T) {
	part1 := zooOptions(t, "vgg16", PS, 8, 1)
	many := zooOptions(t, "resnet50", PS, 2_000_000, 4_000_000)
	long := zooOptions(t, "resnet50", PS, 64, 4_000_000)
	long.Iterations = 200_000
	servers := zooOptions(t, "resnet50", PS, 1, 64_000)
	servers.Servers = 3_000_000
	flows := zooOptions(t, "resnet50", PS, 512, 4_000_000)
	flows.Servers, flows.Wire = 64, WireConnections
	cases := []struct {
		name  string
		o     Options
		cause string
		want  []string
	}{
		{"vgg16 1-byte pieces", part1, "partition", []string{"138357544 pieces per worker per iteration", "of memory exceeds the limit of 8.6 GB", "larger partition"}},
		{"2M workers", many, "workers", []string{"176 pieces per worker per iteration", "of memory exceeds", "fewer workers"}},
		{"200,000 iterations", long, "iterations", []string{"events exceed the limit of 2e+09", "fewer iterations"}},
		{"3M servers", servers, "servers", []string{"placing 1735 pieces on 3000000 servers", "fewer servers"}},
		{"connections of 512 workers and 64 servers", flows, "workers", []string{"sharing the links of 512 workers and 64 servers (--wire connections)", "fewer workers"}},
	}
	for _, c := range cases {
		start := time.Now()
		err := c.o.Validate()
		if el := time.Since(start); el > time.Second {
			t.Errorf("%s: Validate took %v; the estimate must not run or allocate the job", c.name, el)
		}
		var be *BudgetError
		if !errors.As(err, &be) {
			t.Errorf("%s: Validate = %v, want a *BudgetError", c.name, err)
			continue
		}
		if be.Cause != c.cause {
			t.Errorf("%s: cause %q, want %q (%v)", c.name, be.Cause, c.cause, err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not contain %q", c.name, err, w)
			}
		}
		if _, err := Run(c.o); !errors.As(err, &be) {
			t.Errorf("%s: Run = %v, want the budget refusal", c.name, err)
		}
	}
}

// TestBudgetEstimatesEvents: the estimate follows what runs measure (the
// limits mean something), and ordinary runs are within budget.
func TestBudgetEstimatesEvents(t *testing.T) {
	cases := []Options{
		zooOptions(t, "vgg16", PS, 4, 64_000),
		zooOptions(t, "resnet50", PS, 16, 4_000_000),
		zooOptions(t, "resnet50", AllReduce, 8, 16_000),
		zooOptions(t, "alexnet", PS, 3, 8_000_000), // sharded pieces
		zooOptions(t, "transformer", AllReduce, 5, 0),
	}
	for _, o := range cases {
		e, err := o.Budget()
		if err != nil {
			t.Fatalf("%s %v %d workers: %v", o.Profile.Name, o.Arch, o.Workers, err)
		}
		r, err := Run(o)
		if err != nil {
			t.Fatal(err)
		}
		if e.PiecesPerIteration != int64(r.Pieces) {
			t.Errorf("%s %v: estimated %d pieces per iteration, the run scheduled %d", o.Profile.Name, o.Arch, e.PiecesPerIteration, r.Pieces)
		}
		if ratio := e.Events / float64(r.Events); math.Abs(ratio-1) > 0.15 {
			t.Errorf("%s %v %d workers: estimated %.0f events, the run had %d (ratio %.2f, want within 15%%)", o.Profile.Name, o.Arch, o.Workers, e.Events, r.Events, ratio)
		}
		if e.MemoryBytes <= memBase || e.MemoryBytes > MaxMemoryBytes/10 {
			t.Errorf("%s %v: estimated memory %.0f bytes, want above the base and far below the limit", o.Profile.Name, o.Arch, e.MemoryBytes)
		}
	}
}

// TestRuntimeBudget: a real run with pieces so small that the message
// overhead explodes, or more processes than memory, is refused; the
// documented launches are not.
func TestRuntimeBudget(t *testing.T) {
	tiny := zooOptions(t, "resnet50", PS, 3, 16)
	tiny.Servers = 2
	_, err := tiny.RuntimeBudget(0)
	var be *BudgetError
	if !errors.As(err, &be) || be.Cause != "partition" || !strings.Contains(err.Error(), "messages per iteration") {
		t.Errorf("resnet50 with 16-byte pieces: %v, want a refusal caused by the partition naming the messages", err)
	}
	huge := zooOptions(t, "resnet50", PS, 2_000_000, 4_000_000)
	if _, err := huge.RuntimeBudget(64 << 30); !errors.As(err, &be) || be.Cause != "workers" {
		t.Errorf("2,000,000 workers: %v, want a refusal caused by the workers", err)
	}
	big := zooOptions(t, "vgg16", AllReduce, 16, 32_000_000)
	if _, err := big.RuntimeBudget(4 << 30); !errors.As(err, &be) || !strings.Contains(err.Error(), "more than the 4.3 GB this machine has available") {
		t.Errorf("vgg16 on 16 workers with 4 GiB: %v, want a memory refusal", err)
	}
	if _, err := big.RuntimeBudget(0); err != nil {
		t.Errorf("vgg16 on 16 workers, memory unknown: %v, want no refusal", err)
	}
	// One worker of vgg16 (553 MB of gradients) does not fit in 1 GB:
	// fewer workers would not help, the model is the cause; in 4 GB it
	// fits, and 16 workers are the cause (the control).
	one := zooOptions(t, "vgg16", AllReduce, 1, 32_000_000)
	if _, err := one.RuntimeBudget(1 << 30); !errors.As(err, &be) || be.Cause != "model" || !strings.Contains(err.Error(), "the model is too large") {
		t.Errorf("vgg16 on 1 worker with 1 GiB: %v, want a refusal caused by the model", err)
	}
	if _, err := big.RuntimeBudget(4 << 30); !errors.As(err, &be) || be.Cause != "workers" {
		t.Errorf("vgg16 on 16 workers with 4 GiB: %v, want a refusal caused by the workers", err)
	}
	// What servers hold in flight is the credit's worth per worker, never
	// more than the model: a credit beyond it, or none, costs the same.
	mem := func(credit int64) float64 {
		o := zooOptions(t, "resnet50", PS, 4, 4_000_000)
		o.Sched.CreditBytes = credit
		e, err := o.RuntimeBudget(0)
		if err != nil {
			t.Fatal(err)
		}
		return e.MemoryBytes
	}
	if none, beyond, small := mem(0), mem(math.MaxInt64), mem(16_000_000); none != beyond || small >= none {
		t.Errorf("resnet50 ps memory estimate: credit 0 %.0f, credit MaxInt64 %.0f, 16 MB %.0f; want the first two equal and 16 MB below", none, beyond, small)
	}
	for _, o := range []Options{zooOptions(t, "resnet50", PS, 4, 4_000_000), zooOptions(t, "alexnet", PS, 4, 4_000_000), zooOptions(t, "resnet50", AllReduce, 4, 32_000_000)} {
		if e, err := o.RuntimeBudget(16 << 30); err != nil || e.OverheadS > 1 {
			t.Errorf("%s %v on 4 workers: %+v, %v; want within budget", o.Profile.Name, o.Arch, e, err)
		}
	}
}

// TestProcessesBudget: a training command's job is refused when its
// processes' own floor does not fit the machine, and accepted when it does
// or when the memory is unknown.
func TestProcessesBudget(t *testing.T) {
	var be *BudgetError
	err := ProcessesBudget(100_000, 100_000, 24<<30)
	if !errors.As(err, &be) || be.Cause != "workers" || !strings.Contains(err.Error(), "200000 processes need at least") {
		t.Errorf("200,000 processes in 24 GiB: %v, want a refusal caused by the workers, naming the processes", err)
	}
	if strings.Contains(err.Error(), "pieces per worker") {
		t.Errorf("a job of a training command has no pieces to report: %v", err)
	}
	if err := ProcessesBudget(1, 100_000, 24<<30); !errors.As(err, &be) || be.Cause != "servers" {
		t.Errorf("1 worker and 100,000 servers: %v, want a refusal caused by the servers", err)
	}
	if err := ProcessesBudget(8, 8, 24<<30); err != nil {
		t.Errorf("16 processes in 24 GiB: %v, want no refusal", err)
	}
	if err := ProcessesBudget(100_000, 0, 0); err != nil {
		t.Errorf("memory unknown: %v, want no refusal", err)
	}
}

// TestBudgetFollowsTheTuner: the budget is estimated with the first
// configuration, so a tuner's smaller partition is estimated again when it
// is proposed, and one over budget ends the run with an error naming the
// tuner, the iteration and the configuration, before any piece of it is
// made. A proposal within budget (the control) is taken.
func TestBudgetFollowsTheTuner(t *testing.T) {
	o := zooOptions(t, "vgg16", PS, 8, 4_000_000)
	for _, c := range []struct {
		part int64
		want string // "" = the run completes with the change
	}{
		{1, "the scripted tuner's configuration from iteration 2 (partition 1 B"},
		{1_000_000, ""},
	} {
		cfg := o.Sched
		cfg.PartitionBytes = c.part
		o.Tuner = &scripted{plan: map[int]tune.Proposal{0: {Config: cfg, FromIteration: 2}}}
		start := time.Now()
		r, err := Run(o)
		if c.want == "" {
			if err != nil || len(r.Configs) != 2 || r.Configs[1].Config.PartitionBytes != c.part {
				t.Errorf("partition %d from iteration 2: %v, configs %+v", c.part, err, r)
			}
			continue
		}
		var be *BudgetError
		if !errors.As(err, &be) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "of memory exceeds") {
			t.Errorf("partition %d from iteration 2: error %v, want a *BudgetError containing %q", c.part, err, c.want)
		}
		if el := time.Since(start); el > 10*time.Second {
			t.Errorf("the refused proposal ended the run after %v", el)
		}
	}
}
