package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/autobyte/autobyte/sim"
	"github.com/autobyte/autobyte/units"
)

// TestMain lets this test binary stand in for the autobyte binary when a
// command under test (launch, demo) starts itself as child processes.
func TestMain(m *testing.M) {
	if os.Getenv("AUTOBYTE_TEST_AS_CLI") == "1" {
		main()
		os.Exit(0)
	}
	os.Setenv("AUTOBYTE_TEST_AS_CLI", "1")
	os.Exit(m.Run())
}

// run executes the CLI in-process and returns stdout and the error.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func simJSON(t *testing.T, args ...string) map[string]any {
	t.Helper()
	out, err := run(t, append([]string{"sim", "--json"}, args...)...)
	if err != nil {
		t.Fatalf("autobyte sim %v: %v", args, err)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("sim --json printed invalid JSON: %v\n%s", err, out)
	}
	return m
}

// TestToy3Contract checks the documented example through the CLI contract.
func TestToy3Contract(t *testing.T) {
	base := []string{"--model", "toy3", "--workers", "1", "--servers", "1", "--bandwidth", "1MB/s", "--latency", "0"}
	fifo := simJSON(t, append(base, "--scheduler", "fifo")...)
	bs := simJSON(t, append(base, "--scheduler", "bytescheduler", "--partition", "0.5MB", "--credit", "1MB")...)
	if got := fifo["iteration_time_s"].(float64); math.Abs(got-13) > 1e-9 {
		t.Errorf("fifo iteration_time_s = %v, want 13", got)
	}
	if got := bs["iteration_time_s"].(float64); math.Abs(got-9) > 1e-9 {
		t.Errorf("bytescheduler iteration_time_s = %v, want 9", got)
	}
	for _, key := range []string{"iteration_time_s", "lower_bound_s", "samples_per_s", "partition_bytes", "credit_bytes"} {
		if _, ok := bs[key]; !ok {
			t.Errorf("sim --json lacks %q", key)
		}
	}
	if bs["partition_bytes"].(float64) != 500000 || bs["credit_bytes"].(float64) != 1e6 {
		t.Errorf("partition/credit = %v/%v, want 500000/1000000", bs["partition_bytes"], bs["credit_bytes"])
	}
	if fifo["partition_bytes"].(float64) != 0 {
		t.Errorf("fifo partition_bytes = %v, want 0 (no partitioning)", fifo["partition_bytes"])
	}
}

// TestMessageCostFlag: --message-cost adds its fixed time to every message.
// On the unscheduled toy example (fifo, one piece per layer) the last
// answer comes back after the worker's three pushes and the server's three
// answers, but push 2 and answer 2 overlap push 1: four of the six costs
// are on the critical path, so an iteration takes 13 + 4c seconds. 0 is
// the run without the flag, bit for bit; bad values name the flag.
func TestMessageCostFlag(t *testing.T) {
	base := []string{"--model", "toy3", "--workers", "1", "--servers", "1", "--bandwidth", "1MB/s", "--latency", "0", "--scheduler", "fifo"}
	without := simJSON(t, base...)
	zero := simJSON(t, append(base, "--message-cost", "0")...)
	if fmt.Sprint(zero["iteration_times_s"]) != fmt.Sprint(without["iteration_times_s"]) {
		t.Errorf("--message-cost 0 changed the run: %v vs %v", zero["iteration_times_s"], without["iteration_times_s"])
	}
	if _, ok := without["message_cost_s"]; ok {
		t.Errorf("sim --json reports message_cost_s without --message-cost: %v", without["message_cost_s"])
	}
	cost := simJSON(t, append(base, "--message-cost", "250ms")...)
	if got := cost["iteration_time_s"].(float64); math.Abs(got-14) > 1e-9 {
		t.Errorf("fifo with --message-cost 250ms: iteration_time_s = %v, want 13 + 4 x 0.25 = 14", got)
	}
	if got := cost["message_cost_s"]; got != 0.25 {
		t.Errorf("message_cost_s = %v, want 0.25", got)
	}
	out, err := run(t, append([]string{"sim"}, append(base, "--message-cost", "20us")...)...)
	if err != nil || !strings.Contains(out, "20 µs per message") {
		t.Errorf("sim --message-cost 20us printed %q (error %v), want the cost on the cluster line", out, err)
	}
}

// TestChangingConditions: a bandwidth drop slows the run, configs and the
// whole-run mean are reported, and the grid tuner moves through its grid.
func TestChangingConditions(t *testing.T) {
	base := []string{"--model", "resnet50", "--workers", "4", "--iterations", "40"}
	steady := simJSON(t, base...)
	drop := simJSON(t, append(base, "--bandwidth-trace", "0:10Gbps,10:1Gbps")...)
	if drop["mean_iteration_time_s"].(float64) <= 1.5*steady["mean_iteration_time_s"].(float64) {
		t.Errorf("a 10x bandwidth drop from iteration 10: mean %v, without it %v", drop["mean_iteration_time_s"], steady["mean_iteration_time_s"])
	}
	if drop["iteration_time_s"].(float64) < drop["lower_bound_s"].(float64) {
		t.Errorf("steady state %v below its bound %v", drop["iteration_time_s"], drop["lower_bound_s"])
	}
	grid := simJSON(t, append(base, "--tuner", "grid", "--grid-partitions", "1MB,4MB", "--grid-credits", "8MB", "--grid-trial", "3")...)
	if n := len(grid["configs"].([]any)); n < 3 {
		t.Errorf("grid tuner applied %d configurations, want the initial one and both candidates", n)
	}
	// The meta-network tuner re-configures after the drop and beats the
	// default configuration kept through it.
	ab := simJSON(t, append(base, "--bandwidth-trace", "0:10Gbps,10:1Gbps", "--tuner", "autobyte")...)
	if n := len(ab["configs"].([]any)); n < 2 {
		t.Errorf("autobyte tuner never re-configured: configs %v", ab["configs"])
	}
	if ab["mean_iteration_time_s"].(float64) >= drop["mean_iteration_time_s"].(float64) {
		t.Errorf("autobyte tuner mean %v, default configuration %v", ab["mean_iteration_time_s"], drop["mean_iteration_time_s"])
	}
	bo := simJSON(t, append(base, "--tuner", "bo", "--bo-trial", "6")...)
	if n := len(bo["configs"].([]any)); n < 2 {
		t.Errorf("bo tuner never proposed: configs %v", bo["configs"])
	}
}

// TestFusionAuto: --fusion auto starts unfused and lets the autobyte tuner
// switch fusion on where messages are costly; the configurations it
// applied name the fusion size.
func TestFusionAuto(t *testing.T) {
	r := simJSON(t, "--model", "resnet50", "--workers", "8", "--servers", "4", "--bandwidth", "10Gbps", "--message-cost", "200us",
		"--iterations", "60", "--tuner", "autobyte", "--fusion", "auto")
	configs := r["configs"].([]any)
	if f, ok := configs[0].(map[string]any)["fusion_bytes"]; ok {
		t.Errorf("the run started with fusion %v, want none", f)
	}
	fused := false
	for _, c := range configs {
		fused = fused || c.(map[string]any)["fusion_bytes"] == float64(1<<20)
	}
	if !fused {
		t.Errorf("the tuner never applied 1 MiB fusion: configs %v", configs)
	}
}

func TestByteSchedulerDefaults(t *testing.T) {
	ps := simJSON(t, "--model", "resnet50", "--workers", "2", "--iterations", "2")
	ar := simJSON(t, "--model", "resnet50", "--workers", "2", "--arch", "allreduce", "--iterations", "2")
	if ps["partition_bytes"].(float64) != 4e6 || ps["credit_bytes"].(float64) != 16e6 {
		t.Errorf("ps defaults = %v/%v, want 4e6/16e6 (1M/4M fp32 elements)", ps["partition_bytes"], ps["credit_bytes"])
	}
	if ar["partition_bytes"].(float64) != 32e6 || ar["credit_bytes"].(float64) != 64e6 {
		t.Errorf("allreduce defaults = %v/%v, want 32e6/64e6 (8M/16M fp32 elements)", ar["partition_bytes"], ar["credit_bytes"])
	}
}

// TestDefaultCreditFollowsServers: on many servers the default credit
// covers one partition per server (up to one per worker), and that is what
// keeps the servers busy. ByteScheduler's 16 MB, given explicitly, is the negative control:
// it must be far slower on the same job, or the check proves nothing.
func TestDefaultCreditFollowsServers(t *testing.T) {
	job := []string{"--model", "resnet50", "--workers", "64", "--servers", "32", "--iterations", "4"}
	def := simJSON(t, job...)
	if def["credit_bytes"].(float64) != 32*4e6 {
		t.Fatalf("32 servers, 4 MB partitions: default credit %v, want %v (one partition per server)", def["credit_bytes"], 32*4e6)
	}
	small := simJSON(t, append(job, "--credit", "16MB")...)
	if small["credit_bytes"].(float64) != 16e6 {
		t.Fatalf("--credit 16MB gave credit %v", small["credit_bytes"])
	}
	d, s := def["iteration_time_s"].(float64), small["iteration_time_s"].(float64)
	if d > 0.5*s {
		t.Errorf("64 workers, 32 servers: default credit %.3f s per iteration, ByteScheduler's 16 MB %.3f s; want at most half", d, s)
	}
	if r := def["achieved_over_bound"].(float64); r > 3 {
		t.Errorf("64 workers, 32 servers: default credit at %.2f x the lower bound, want <= 3", r)
	}
	// The partition given sets the default too; a credit given wins.
	if m := simJSON(t, "--model", "resnet50", "--workers", "8", "--servers", "8", "--partition", "8MB", "--iterations", "2"); m["credit_bytes"].(float64) != 8*m["partition_bytes"].(float64) {
		t.Errorf("8 servers, --partition 8MB: default credit %v, want 8 x %v", m["credit_bytes"], m["partition_bytes"])
	}
	// 6 workers keep 6 servers busy: more pieces in flight only queue on
	// the workers' links.
	if m := simJSON(t, "--model", "resnet50", "--workers", "6", "--servers", "12", "--iterations", "2"); m["credit_bytes"].(float64) != 6*4e6 {
		t.Errorf("6 workers, 12 servers: default credit %v, want 6 x 4e6", m["credit_bytes"])
	}
	if m := simJSON(t, "--model", "resnet50", "--workers", "8", "--servers", "8", "--credit", "4MB", "--iterations", "2"); m["credit_bytes"].(float64) != 4e6 {
		t.Errorf("--credit 4MB on 8 servers gave %v", m["credit_bytes"])
	}
}

func TestProfileFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "m.json")
	if err := os.WriteFile(good, []byte(`{"name":"mine","batch_size":4,"device":"x","layers":[
		{"name":"a","forward_s":0.01,"backward_s":0.02,"tensors":[{"name":"a.w","params":1000000}]},
		{"name":"b","forward_s":0.01,"backward_s":0.02,"tensors":[{"name":"b.w","params":250000}]}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	m := simJSON(t, "--profile", good, "--workers", "4", "--iterations", "3")
	if m["model"] != "mine" || m["gradient_bytes"].(float64) != 5e6 {
		t.Errorf("profile run: model %v gradient_bytes %v, want mine and 5e6", m["model"], m["gradient_bytes"])
	}
}

// TestBadInput: every bad value fails with one line that names it.
func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"name":"x","batch_size":1,"layers":[{"name":"a","tensors":[{"name":"w","params":-5}]}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	garbage := filepath.Join(dir, "garbage.json")
	if err := os.WriteFile(garbage, []byte(`{"name": `), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"sim", "--model", "nosuch"}, `"nosuch"`},
		{[]string{"sim"}, "--model"},
		{[]string{"sim", "--model", "toy3", "--profile", bad}, "not both"},
		{[]string{"sim", "--profile", bad}, "-5"},
		{[]string{"sim", "--profile", garbage}, "garbage.json"},
		{[]string{"sim", "--profile", filepath.Join(dir, "missing.json")}, "missing.json"},
		{[]string{"sim", "--model", "toy3", "--bandwidth", "0Gbps"}, `"0Gbps"`},
		{[]string{"sim", "--model", "toy3", "--bandwidth", "-1Gbps"}, `"-1Gbps"`},
		{[]string{"sim", "--model", "toy3", "--bandwidth", "10Gbpx"}, `"10Gbpx"`},
		{[]string{"sim", "--model", "toy3", "--partition", "0MB"}, `"0MB"`},
		{[]string{"sim", "--model", "toy3", "--credit", "-4MB"}, `"-4MB"`},
		{[]string{"sim", "--model", "toy3", "--partition", "4XB"}, `"XB"`},
		{[]string{"sim", "--model", "toy3", "--latency", "-5us"}, `"-5us"`},
		{[]string{"sim", "--model", "toy3", "--message-cost", "-5us"}, `--message-cost: duration "-5us"`},
		{[]string{"sim", "--model", "toy3", "--message-cost", "15"}, `--message-cost: duration "15"`},
		{[]string{"sim", "--model", "toy3", "--message-cost", "NaN"}, `--message-cost: duration "NaN"`},
		{[]string{"sim", "--model", "toy3", "--wire", "tcp"}, `--wire: unknown wire model "tcp"`},
		{[]string{"tune", "gap", "--message-cost", "0,-1us"}, `--message-cost: duration "-1us"`},
		{[]string{"tune", "gap", "--only", "nosuch"}, `"nosuch"`},
		{[]string{"tune", "gap", "--parallel", "0"}, "got 0"},
		{[]string{"tune", "gap", "--random", "-2"}, "--random must be >= 0, got -2"},
		{[]string{"tune", "gap", "--random", "3", "--only", "resnet50-ps-8w-change"}, `"resnet50-ps-8w-change"`},
		{[]string{"sim", "--model", "toy3", "--workers", "0"}, "got 0"},
		{[]string{"sim", "--model", "toy3", "--workers", "-3"}, "got -3"},
		{[]string{"sim", "--model", "toy3", "--workers", "abc"}, `"abc"`},
		{[]string{"sim", "--model", "toy3", "--servers", "0"}, "got 0"},
		{[]string{"sim", "--model", "toy3", "--arch", "allreduce", "--servers", "2"}, "--servers 2"},
		{[]string{"sim", "--model", "toy3", "--arch", "mesh"}, `"mesh"`},
		{[]string{"sim", "--model", "toy3", "--scheduler", "magic"}, `"magic"`},
		{[]string{"sim", "--model", "toy3", "--scheduler", "fifo", "--partition", "1MB"}, `"fifo"`},
		{[]string{"sim", "--model", "toy3", "--admission", "loose"}, `"loose"`},
		{[]string{"sim", "--model", "toy3", "--compute-scale", "0"}, "got 0"},
		{[]string{"sim", "--model", "toy3", "--compute-scale", "-2"}, "got -2"},
		{[]string{"sim", "--model", "toy3", "--iterations", "0"}, "got 0"},
		{[]string{"sim", "--model", "toy3", "--jitter", "-1"}, "got -1"},
		// Compute beyond a day per iteration: a replay would sleep that
		// long, and far beyond it the durations wrap (a launch replay of
		// --compute-scale 1e300 once ran at full speed).
		{[]string{"sim", "--model", "toy3", "--compute-scale", "1e300"}, "--compute-scale 1e+300: profile \"toy3\": one iteration's compute"},
		{[]string{"launch", "--model", "toy3", "--compute-scale", "1e300"}, "--compute-scale 1e+300: profile \"toy3\""},
		{[]string{"sim", "--model", "toy3", "--jitter", "1e300"}, "an iteration could compute for"},
		{[]string{"sim", "--model", "toy3", "--compute-trace", "0:1,5:1e9"}, "times 1e+09 from the compute trace"},
		{[]string{"launch", "--model", "toy3", "--workers", "2", "--straggler", "1:1e12@3-4"}, "times 1e+12 from the compute trace, stragglers"},
		{[]string{"sim", "--model", "toy3", "--compression", "int8"}, `--compression: dtype: unknown element type "int8"`},
		{[]string{"sim", "--model", "toy3", "--fusion", "lots"}, `--fusion: `},
		{[]string{"sim", "--model", "toy3", "--fusion", "auto", "--tuner", "bo"}, "--fusion auto: only --tuner autobyte chooses the fusion, got --tuner bo"},
		{[]string{"launch", "--workers", "2", "--fusion", "auto", "--tuner", "static", "--", "/bin/true"}, "--fusion auto: only --tuner autobyte"},
		{[]string{"plot", "--out", filepath.Join(dir, "p.png"), "nofile"}, `run "nofile": want NAME=RESULT_FILE`},
		{[]string{"plot", "a=b"}, "--out must name"},
		{[]string{"launch", "--model", "toy3", "--compression", "fp8"}, `--compression: dtype: unknown element type "fp8"`},
		{[]string{"sim", "--model", "toy3", "--shard", "lots"}, `"lots"`},
		{[]string{"sim", "--model", "toy3", "--trace", filepath.Join(dir, "no", "such", "dir", "t.json")}, "t.json"},
		{[]string{"sweep", "--models", "nosuch"}, `"nosuch"`},
		{[]string{"sweep", "--workers", "x"}, `"x"`},
		{[]string{"sweep", "--partitions", "0B"}, `"0B"`},
		{[]string{"sweep", "--format", "xml"}, `"xml"`},
		{[]string{"sweep", "--iterations", "1"}, "got 1"},
		{[]string{"models", "extra"}, "extra"},
		{[]string{"sim", "--model", "toy3", "--bandwidth-trace", "0:1Gbps,x"}, `"x"`},
		{[]string{"sim", "--model", "toy3", "--compute-trace", "0:-2"}, `"-2"`},
		{[]string{"sim", "--model", "toy3", "--workers", "2", "--straggler", "5:2"}, `"5:2"`},
		{[]string{"sim", "--model", "toy3", "--straggler", "0:0.5"}, `"0:0.5"`},
		{[]string{"sim", "--model", "toy3", "--straggler", "0:2@5-5"}, `iterations "5-5"`},
		{[]string{"sim", "--model", "toy3", "--straggler", "0:2@-1"}, `iterations "-1"`},
		{[]string{"sim", "--model", "toy3", "--straggler", "0:2@x-9"}, `iterations "x-9"`},
		{[]string{"sim", "--model", "toy3", "--straggler", "02"}, `no ':'; want RANK:FACTOR[@FROM[-TO]]`},
		{[]string{"sim", "--model", "toy3", "--workers", "2", "--straggler", "1:2", "--straggler", "1:3@4"}, "rank 1 already has a --straggler"},
		{[]string{"sim", "--model", "toy3", "--tuner", "oracle"}, `"oracle"`},
		{[]string{"sim", "--model", "toy3", "--tuner", "grid", "--grid-trial", "0"}, "0"},
		{[]string{"launch", "--model", "toy3", "--bandwidth-trace", "0:1Gbps"}, "--testbed"},
		{[]string{"sim", "--model", "toy3", "--link-trace", "server1"}, `"server1": want ROLE RANK=TRACE`},
		{[]string{"sim", "--model", "toy3", "--link-trace", "switch0=0:1Gbps"}, `host "switch0"`},
		{[]string{"sim", "--model", "toy3", "--link-trace", "server1=0:1Gbps,x"}, `"x"`},
		{[]string{"sim", "--model", "toy3", "--workers", "2", "--servers", "2", "--link-trace", "server2=0:1Gbps"}, "link trace of server2: no such server (the job has 2)"},
		{[]string{"sim", "--model", "toy3", "--link-trace", "server0=0:1Gbps", "--link-trace", "server0=5:2Gbps"}, "server0 already has a link trace"},
		{[]string{"sim", "--model", "toy3", "--workers", "2", "--servers", "2", "--server-weights", "1:2:3"}, `--server-weights: sched: server weights "1:2:3": 3 weights for 2 servers`},
		{[]string{"sim", "--model", "toy3", "--workers", "2", "--servers", "2", "--server-weights", "1:1:1"}, `"1:1:1": 3 weights for 2 servers`},
		{[]string{"sim", "--model", "toy3", "--workers", "2", "--servers", "2", "--server-weights", "1:0"}, `server 1's weight "0"`},
		{[]string{"sim", "--model", "toy3", "--arch", "allreduce", "--server-weights", "1:2"}, "all-reduce has no parameter servers"},
		{[]string{"launch", "--model", "toy3", "--link-trace", "worker0=0:1Gbps"}, "needs --testbed"},
		{[]string{"launch", "--model", "toy3", "--workers", "2", "--servers", "2", "--link-trace", "server2=0:1Gbps"}, "link trace of server2: no such server (the job has 2)"},
		{[]string{"launch", "--model", "toy3", "--workers", "2", "--link-trace", "worker2=0:1Gbps", "--testbed", "nosuchbed"}, "link trace of worker2: no such worker (the job has 2)"},
		{[]string{"server", "--model", "toy3", "--master", "127.0.0.1:1", "--token", "t", "--workers", "2", "--servers", "2", "--link-trace", "server-1=0:1Gbps"}, "server-1"},
		{[]string{"launch", "--workers", "2", "--link-trace", "server0=0:1Gbps", "--", "/bin/true"}, "--link-trace does not apply"},
		{[]string{"launch", "--model", "toy3", "--workers", "2", "--metrics-port", "65535"}, "--metrics-port 65535 out of range: worker r serves on port PORT+r, so with 2 workers PORT must be in 1..65533"},
		// A sweep checks every run before the first starts: one over the
		// budget is refused at once, not after hours of the others.
		{[]string{"sweep", "--workers", "100000", "--models", "resnet50", "--bandwidth", "1Gbps", "--arch", "ps"}, "resnet50 ps 100000 workers: sim: an estimated"},
		{[]string{"demo", "--load-plot", "/nonexistent/dir/load.png"}, "--load-plot: cannot write /nonexistent/dir/load.png"},
		// Long commands refuse a path that cannot take their results
		// before any work.
		{[]string{"tune", "train", "--out", "/nonexistent/dir/w.json"}, "--out: cannot write /nonexistent/dir/w.json: cannot create a file in /nonexistent/dir"},
		{[]string{"tune", "train", "--out", filepath.Join(dir, "w.json"), "--data", "/nonexistent/dir/d.json"}, "--data: cannot write /nonexistent/dir/d.json"},
		{[]string{"tune", "eval", "--quick", "--out", "/proc/nope"}, "--out: cannot create directory /proc/nope"},
		// Each process of a training command needs at least the engine's
		// memory: 2 million processes are refused before any starts.
		{[]string{"launch", "--workers", "1000000", "--", "/bin/true"}, "--workers 1000000: runtime: 2000000 processes need at least"},
		{[]string{"worker", "--model", "toy3", "--master", "127.0.0.1:1", "--token", "t", "--bandwidth", "1Gbps", "--link-trace", "worker0=5:2Gbps"}, "a worker's link trace needs the links shaped outside"},
		{[]string{"launch", "--model", "toy3", "--tuner", "oracle"}, `"oracle"`},
		{[]string{"launch", "--model", "toy3", "--tuner", "grid", "--grid-credits", "0B"}, `"0B"`},
		{[]string{"launch", "--model", "toy3", "--compute-trace", "0:0"}, `"0"`},
		{[]string{"launch", "--workers", "2", "--tuner", "grid", "--", "/bin/true"}, "--tuner"},
		{[]string{"launch", "--workers", "2", "--compute-trace", "0:2", "--", "/bin/true"}, "--compute-trace"},
		{[]string{"worker", "--model", "toy3", "--master", "127.0.0.1:1", "--token", "t", "--bandwidth", "1Gbps", "--bandwidth-trace", "0:1Gbps,5:2Gbps"}, "0:1Gbps,5:2Gbps"},
		{[]string{"worker", "--model", "toy3", "--master", "127.0.0.1:1", "--token", "t", "--tuner", "oracle"}, `"oracle"`},
		{[]string{"worker", "--model", "toy3"}, "MASTER_ADDR"},
		{[]string{"worker", "--model", "toy3", "--master", "127.0.0.1:1"}, "token"},
		{[]string{"worker", "--model", "toy3", "--master", "127.0.0.1:1", "--token", "t", "--tls-cert", "c.pem"}, "--tls-key"},
		{[]string{"worker", "--model", "toy3", "--master", "127.0.0.1:1", "--token", "t", "--verify", "most"}, `"most"`},
		{[]string{"server", "--model", "toy3", "--master", "127.0.0.1:1", "--token", "t", "--log-level", "loud"}, `"loud"`},
		{[]string{"launch", "--model", "toy3", "--verify", "most"}, `"most"`},
		{[]string{"launch", "--model", "toy3", "--arch", "allreduce", "--servers", "1"}, "--servers 1"},
		// Inputs whose cost is unbounded are refused before anything runs,
		// naming the flag, the value and the estimate.
		{[]string{"sim", "--model", "vgg16", "--partition", "1B"}, "--partition 1B: sim: an estimated 425.1 GB of memory exceeds the limit of 8.6 GB"},
		{[]string{"sim", "--model", "resnet50", "--workers", "2000000"}, "--workers 2000000: sim: an estimated"},
		{[]string{"sim", "--model", "resnet50", "--workers", "64", "--iterations", "200000"}, "--iterations 200000: sim: an estimated"},
		{[]string{"launch", "--model", "resnet50", "--workers", "3", "--servers", "2", "--partition", "16B"}, "--partition 16B: runtime: the busiest process would handle"},
		{[]string{"launch", "--model", "resnet50", "--workers", "2000000"}, "--workers 2000000: runtime: "},
		{[]string{"worker", "--model", "resnet50", "--workers", "3", "--partition", "8B", "--master", "127.0.0.1:1", "--token", "t"}, "--partition 8B: runtime:"},
		// Flags that would do nothing are refused.
		{[]string{"launch", "--model", "toy3", "--jitter", "0.1"}, "--jitter applies to autobyte sim only"},
		{[]string{"launch", "--model", "toy3", "--congestion", "bbr"}, "--congestion needs --testbed"},
		{[]string{"launch", "--workers", "2", "--congestion", "bbr", "--", "/bin/true"}, "--congestion needs --testbed"},
		{[]string{"testbed", "up", "--name", "abbad", "--congestion", "BBR"}, `congestion control "BBR" invalid`},
		{[]string{"worker", "--model", "toy3", "--jitter", "0.1", "--master", "127.0.0.1:1", "--token", "t"}, "--jitter applies to autobyte sim only"},
		{[]string{"launch", "--workers", "2", "--admission", "strict", "--", "/bin/true"}, "--admission does not apply to a training command"},
		{[]string{"launch", "--workers", "2", "--seed", "3", "--", "/bin/true"}, "--seed does not apply"},
		{[]string{"launch", "--workers", "2", "--jitter", "0.5", "--", "/bin/true"}, "--jitter does not apply"},
	}
	for _, c := range cases {
		_, err := run(t, c.args...)
		if err == nil {
			t.Errorf("autobyte %v: no error", c.args)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, c.want) || strings.Contains(msg, "\n") {
			t.Errorf("autobyte %v: error %q should be one line naming %s", c.args, msg, c.want)
		}
	}
}

// TestExitCode runs the real main in a child process: bad input exits
// non-zero with one "autobyte: ..." line on stderr and no stack trace.
func TestExitCode(t *testing.T) {
	cmd := exec.Command(os.Args[0], "sim", "--model", "toy3", "--bandwidth", "5furlongs")
	cmd.Env = append(os.Environ(), "AUTOBYTE_TEST_AS_CLI=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v, want exit status 1; stderr %q", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "autobyte: ") || !strings.Contains(lines[0], "5furlongs") {
		t.Errorf("stderr = %q, want one line 'autobyte: ...' naming 5furlongs", stderr.String())
	}
}

func TestModelsAndDemo(t *testing.T) {
	out, err := run(t, "models")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"vgg16", "138,357,544", "resnet50", "25,557,032", "toy3"} {
		if !strings.Contains(out, want) {
			t.Errorf("models output lacks %q:\n%s", want, out)
		}
	}
	// The demo spawns this test binary as its servers and workers (see
	// TestMain); a small model keeps it quick.
	plotPath := filepath.Join(t.TempDir(), "load.png")
	out, err = run(t, "demo", "--model", "toy3", "--compute-scale", "0.001", "--iterations", "3", "--bandwidth", "1GB/s",
		"--load-model", "toy3", "--load-iterations", "12", "--load-slow-from", "4", "--load-plot", plotPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"fifo", "bytescheduler", "measured", "simulated", "speedup", "true",
		"server 1's link drops to", "autobyte, measured", "best static weights", "even weights, simulated", "sums exact: true", "plot: " + plotPath} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	if st, err := os.Stat(plotPath); err != nil || st.Size() == 0 {
		t.Errorf("demo's load plot %s: %v", plotPath, err)
	}
	if _, err := run(t, "demo", "--model", "toy3", "--iterations", "1", "--load-model", "toy3", "--load-iterations", "5", "--load-slow-from", "9"); err == nil ||
		!strings.Contains(err.Error(), "from iteration 9 of 5") {
		t.Errorf("demo with the slow link after the run: %v", err)
	}
}

// TestLaunch runs real local clusters (this test binary stands in for the
// children, see TestMain): both architectures, with mutual TLS, and checks
// the JSON contract.
func TestLaunch(t *testing.T) {
	for _, arch := range []string{"ps", "allreduce"} {
		args := []string{"launch", "--model", "toy3", "--compute-scale", "0.001", "--workers", "3", "--arch", arch,
			"--iterations", "3", "--verify", "full", "--tls", "--json"}
		if arch == "ps" {
			args = append(args, "--servers", "2")
		}
		out, err := run(t, args...)
		if err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(out), &m); err != nil {
			t.Fatalf("%s: launch --json printed %q: %v", arch, out, err)
		}
		for _, key := range []string{"iteration_time_s", "iteration_times_s", "scheduler", "partition_bytes", "credit_bytes", "bytes_sent", "verified"} {
			if _, ok := m[key]; !ok {
				t.Errorf("%s: launch --json lacks %q", arch, key)
			}
		}
		if m["verified"] != true || len(m["iteration_times_s"].([]any)) != 3 || m["bytes_sent"].(float64) < 3*6e6 {
			t.Errorf("%s: launch reported %v", arch, out)
		}
	}
}

func TestTraceFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.json")
	if _, err := run(t, "sim", "--model", "toy3", "--workers", "1", "--bandwidth", "1MB/s", "--iterations", "2", "--trace", path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		TraceEvents []map[string]any `json:"traceEvents"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("trace is not valid JSON: %v", err)
	}
	if len(doc.TraceEvents) < 10 {
		t.Errorf("trace has %d events, want compute and communication events", len(doc.TraceEvents))
	}
}

// TestLaunchTuned runs a real local cluster whose rank 0 tunes it (the grid
// tuner changes the configuration twice) under a compute trace and a
// straggler, and checks the JSON contract: every configuration with the
// iteration it applied from, the mean over the whole run, rank 0's
// statistics, and sums verified across every change.
func TestLaunchTuned(t *testing.T) {
	const iterations = 8
	out, err := run(t, "launch", "--model", "toy3", "--compute-scale", "0.001", "--workers", "2", "--servers", "1",
		"--iterations", "8", "--verify", "full", "--json", "--tuner", "grid", "--grid-partitions", "1MB,256KB", "--grid-credits", "2MB",
		"--grid-trial", "2", "--compute-trace", "0:1,3:2", "--straggler", "1:1.5")
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Verified bool      `json:"verified"`
		Checked  int64     `json:"checked_elements"`
		Times    []float64 `json:"iteration_times_s"`
		Mean     float64   `json:"mean_iteration_time_s"`
		Tuner    string    `json:"tuner"`
		Stats    []struct {
			Iteration int     `json:"iteration"`
			Forward   float64 `json:"forward_s"`
		} `json:"stats"`
		Configs []struct {
			From      int   `json:"from_iteration"`
			Partition int64 `json:"partition_bytes"`
			Credit    int64 `json:"credit_bytes"`
		} `json:"configs"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("launch --json printed %q: %v", out, err)
	}
	// 1.5M float32s per worker and iteration, checked in full (and each
	// of the 3 tensors' last element once more), on 2 workers.
	if !rep.Verified || rep.Checked != 2*iterations*(1_500_000+3) {
		t.Errorf("verified %v, %d elements checked; want every element of every iteration", rep.Verified, rep.Checked)
	}
	var total float64
	for _, x := range rep.Times {
		total += x
	}
	if len(rep.Times) != iterations || math.Abs(rep.Mean-total/iterations) > 1e-9 {
		t.Errorf("mean_iteration_time_s %v over %v, want their mean", rep.Mean, rep.Times)
	}
	if rep.Tuner != "grid" || len(rep.Stats) != iterations {
		t.Errorf("tuner %q with %d statistics, want grid and %d", rep.Tuner, len(rep.Stats), iterations)
	}
	if len(rep.Configs) < 3 || rep.Configs[0].From != 0 || rep.Configs[0].Partition != 4_000_000 {
		t.Fatalf("configs %+v, want the initial one from 0 and the grid's two candidates", rep.Configs)
	}
	for i := 1; i < len(rep.Configs); i++ {
		if rep.Configs[i].From <= rep.Configs[i-1].From || rep.Configs[i].Credit != 2_000_000 {
			t.Errorf("configs %+v: want increasing iterations and the grid's credit", rep.Configs)
		}
	}
}

func TestStepsDue(t *testing.T) {
	steps := []sim.Step{{Iteration: 5, Value: 1}, {Iteration: 9, Value: 2}, {Iteration: 12, Value: 3}}
	due, rest := stepsDue(steps, 4)
	if len(due) != 0 || len(rest) != 3 {
		t.Errorf("at 4: due %v rest %v", due, rest)
	}
	due, rest = stepsDue(steps, 10) // rank 0 reported 5 and 9 late: both due, the last wins
	if len(due) != 2 || due[1].Value != 2 || len(rest) != 1 {
		t.Errorf("at 10: due %v rest %v", due, rest)
	}
	due, rest = stepsDue(rest, 12)
	if len(due) != 1 || len(rest) != 0 {
		t.Errorf("at 12: due %v rest %v", due, rest)
	}
}

// TestHostRates: the testbed's hosts (servers first) follow their own link
// trace, else the bandwidth trace, and the driver's change points are
// every iteration where one of them changes.
func TestHostRates(t *testing.T) {
	o := sim.Options{Workers: 2, Servers: 2, BandwidthBps: 100, BandwidthTrace: []sim.Step{{Iteration: 10, Value: 50}}}
	if err := o.ParseLinkTrace("server1=0:10B/s,20:100B/s", units.ParseRate); err != nil {
		t.Fatal(err)
	}
	if err := o.ParseLinkTrace("worker0=5:7B/s", units.ParseRate); err != nil {
		t.Fatal(err)
	}
	r := hostRates{o: o, servers: 2}
	for _, c := range []struct {
		host, k int
		want    float64
		name    string
	}{{0, 0, 100, "server0"}, {0, 10, 50, "server0"}, {1, 0, 10, "server1"}, {1, 15, 10, "server1"}, {1, 25, 100, "server1"},
		{2, 4, 100, "worker0"}, {2, 5, 7, "worker0"}, {3, 12, 50, "worker1"}} {
		if got := r.at(c.host, c.k); got != c.want || r.name(c.host) != c.name {
			t.Errorf("host %d (%s) at %d: %v B/s, want %s at %v", c.host, r.name(c.host), c.k, got, c.name, c.want)
		}
	}
	var its []int
	for _, st := range r.changes() {
		its = append(its, st.Iteration)
	}
	if !slices.Equal(its, []int{5, 10, 20}) {
		t.Errorf("change points %v, want [5 10 20]", its)
	}
}

func TestComputeScaleAt(t *testing.T) {
	o := sim.Options{ComputeTrace: []sim.Step{{Iteration: 3, Value: 2}}, Stragglers: map[int]float64{1: 1.5},
		StragglerTraces: map[int][]sim.Step{2: {{Iteration: 5, Value: 4}, {Iteration: 7, Value: 1}}}}
	if f := computeScaleAt(sim.Options{}, 0); f != nil {
		t.Errorf("no trace, no straggler: want no scaling")
	}
	if f := computeScaleAt(sim.Options{StragglerTraces: o.StragglerTraces}, 0); f != nil {
		t.Errorf("another rank's straggler window: want no scaling of rank 0")
	}
	f0, f1, f2 := computeScaleAt(o, 0), computeScaleAt(o, 1), computeScaleAt(o, 2)
	for _, c := range []struct {
		f    func(int) float64
		k    int
		want float64
	}{{f0, 0, 1}, {f0, 3, 2}, {f0, 9, 2}, {f1, 0, 1.5}, {f1, 3, 3}, {f2, 4, 2}, {f2, 5, 8}, {f2, 6, 8}, {f2, 7, 2}} {
		if got := c.f(c.k); got != c.want {
			t.Errorf("scale at %d = %v, want %v", c.k, got, c.want)
		}
	}
}

// TestBalanceHint: with many servers the default 4 MB pieces are too few
// to spread, and sim says so with a partition that spreads them; the
// suggested partition does bring the busiest server near the mean (and the
// iteration time down), where the hint is no longer printed.
func TestBalanceHint(t *testing.T) {
	args := []string{"sim", "--model", "resnet50", "--workers", "64", "--servers", "64", "--iterations", "3"}
	out, err := run(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`balance +the busiest server received ([0-9.]+)x the servers' mean: 176 pieces per iteration do not spread evenly over 64 servers; smaller pieces would \(e\.g\. --partition (\d+KiB)\)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no balance hint for 64 servers at 4 MB pieces:\n%s", out)
	}
	coarse := simJSON(t, args[1:]...)
	fine := simJSON(t, append(args[1:], "--partition", m[2])...)
	links := func(r map[string]any) float64 {
		l := r["link_bytes"].(map[string]any)
		return l["server_ingress_max"].(float64) / l["server_ingress_mean"].(float64)
	}
	if x := links(coarse); x < 1.5 {
		t.Errorf("4 MB pieces: busiest server %.2fx the mean, but the hint was printed", x)
	}
	if x := links(fine); x >= 1.5 {
		t.Errorf("--partition %s: busiest server still %.2fx the mean", m[2], x)
	}
	if c, f := coarse["iteration_time_s"].(float64), fine["iteration_time_s"].(float64); !(f < 0.8*c) {
		t.Errorf("--partition %s: %.3f s per iteration, against %.3f s at 4 MB: the hint does not pay", m[2], f, c)
	}
	out, err = run(t, append(args, "--partition", m[2])...)
	if err != nil || strings.Contains(out, "balance") {
		t.Errorf("--partition %s: still a balance hint (%v):\n%s", m[2], err, out)
	}
	// The usual sizes are even: no hint (8 workers, 8 servers).
	if out, err := run(t, "sim", "--model", "resnet50", "--workers", "8", "--iterations", "3"); err != nil || strings.Contains(out, "balance") {
		t.Errorf("8 servers: a balance hint (%v):\n%s", err, out)
	}
}

// TestSimProgress: a long simulation reports at most one line per interval
// on stderr, none for the last iteration, and nothing within its first
// interval.
func TestSimProgress(t *testing.T) {
	var b strings.Builder
	report := simProgress(&b, 4, 0)
	for k := range 4 {
		report(k, int64(1000*(k+1)))
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "sim: iteration 1 of 4, 1e+03 events in ") || !strings.Contains(lines[2], "iteration 3 of 4, 3e+03 events") || !strings.HasSuffix(lines[2], " left") {
		t.Errorf("every iteration reported as:\n%s", b.String())
	}
	b.Reset()
	report = simProgress(&b, 4, time.Hour)
	for k := range 4 {
		report(k, 1)
	}
	if b.Len() != 0 {
		t.Errorf("a run shorter than the interval reported %q", b.String())
	}
}
