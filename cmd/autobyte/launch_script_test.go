package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/autobyte/autobyte/bridge"
	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/job"
	"github.com/autobyte/autobyte/proto"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/worker"
)

// TestLaunchScriptEnv: a training command runs once per worker with the
// rendezvous and autobyte settings in its environment; rank 0's stdout is
// launch's stdout.
func TestLaunchScriptEnv(t *testing.T) {
	out, err := run(t, "launch", "--workers", "2", "--arch", "allreduce", "--partition", "1MB", "--credit", "2MB", "--",
		"sh", "-c", `echo "rank=$RANK world=$WORLD_SIZE arch=$AUTOBYTE_ARCH part=$AUTOBYTE_PARTITION credit=$AUTOBYTE_CREDIT sched=$AUTOBYTE_SCHEDULER gloo=$GLOO_SOCKET_IFNAME master=$MASTER_ADDR token=${AUTOBYTE_TOKEN:+set}"`)
	if err != nil {
		t.Fatal(err)
	}
	want := "rank=0 world=2 arch=allreduce part=1000000 credit=2000000 sched=bytescheduler gloo=lo master=127.0.0.1 token=set"
	if strings.TrimSpace(out) != want {
		t.Fatalf("stdout %q, want rank 0's line only: %q", out, want)
	}
}

func TestLaunchScriptErrors(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"launch", "--workers", "2", "--arch", "allreduce", "--", "sh", "-c", `[ "$RANK" = 1 ] && exit 3; exit 0`},
			"worker 1 failed (exit status 3)"},
		{[]string{"launch", "--workers", "1", "--arch", "allreduce", "--", "/no/such/program"}, `"/no/such/program"`},
		{[]string{"launch", "--workers", "1", "--arch", "allreduce", "stray"}, "a training command goes after --"},
		{[]string{"launch", "--workers", "1", "--json", "--", "true"}, "--json does not apply to a training command"},
		{[]string{"launch", "--workers", "1", "--model", "vgg16", "--", "true"}, "--model does not apply"},
		{[]string{"launch", "--workers", "1", "--tuner", "grid", "--", "true"}, `--tuner "grid"`},
		{[]string{"launch", "--workers", "1", "--arch", "allreduce", "--servers", "1", "--", "true"}, "all-reduce has no parameter servers"},
		{[]string{"launch", "--workers", "1", "--arch", "allreduce", "--tune-malloc=false"}, "--tune-malloc applies to a training command"},
	}
	for _, c := range cases {
		_, err := run(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one containing %q", c.args, err, c.want)
		}
	}
}

// TestLaunchScriptAllocator: a training command gets glibc allocator
// settings by default, none with --tune-malloc=false, and the user's own
// whenever the environment already chooses the allocator.
func TestLaunchScriptAllocator(t *testing.T) {
	show := `echo "mmap=$MALLOC_MMAP_THRESHOLD_ trim=$MALLOC_TRIM_THRESHOLD_ arena=$MALLOC_ARENA_MAX"`
	cases := []struct {
		flags []string
		env   string // set in launch's own environment
		want  string
	}{
		{nil, "", "mmap=33554432 trim=4294967296 arena="},
		{[]string{"--tune-malloc=false"}, "", "mmap= trim= arena="},
		{nil, "MALLOC_ARENA_MAX=2", "mmap= trim= arena=2"},
		{nil, "MALLOC_TRIM_THRESHOLD_=1000", "mmap= trim=1000 arena="},
	}
	for _, c := range cases {
		for _, k := range []string{"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX", "GLIBC_TUNABLES", "LD_PRELOAD"} {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
		if k, v, ok := strings.Cut(c.env, "="); ok {
			t.Setenv(k, v)
		}
		args := append([]string{"launch", "--workers", "1", "--arch", "allreduce"}, c.flags...)
		out, err := run(t, append(args, "--", "sh", "-c", show)...)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(out); got != c.want {
			t.Errorf("flags %q env %q: %q, want %q", c.flags, c.env, got, c.want)
		}
	}
	for env, want := range map[string]int{"GLIBC_TUNABLES=glibc.malloc.trim_threshold=0": 0, "LD_PRELOAD=/x/libjemalloc.so": 0, "PATH=/bin": 2} {
		if got := len(allocatorEnv([]string{env})); got != want {
			t.Errorf("allocatorEnv(%q): %d settings, want %d", env, got, want)
		}
	}
}

// TestLaunchSharedMemoryFlag: --shm=false reaches a training command as
// AUTOBYTE_SHM=0 and every replay child as --shm=false (a child that did
// not know the flag would fail the job); sums verify either way.
func TestLaunchSharedMemoryFlag(t *testing.T) {
	for flags, want := range map[string]string{"": "shm=", "--shm=false": "shm=0"} {
		args := []string{"launch", "--workers", "1", "--arch", "allreduce"}
		if flags != "" {
			args = append(args, flags)
		}
		out, err := run(t, append(args, "--", "sh", "-c", `echo "shm=$AUTOBYTE_SHM"`)...)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(out); got != want {
			t.Errorf("launch %s: %q, want %q", flags, got, want)
		}
	}
	for _, arch := range [][]string{{"--servers", "1"}, {"--arch", "allreduce"}} {
		args := append([]string{"launch", "--model", "toy3", "--compute-scale", "0.001", "--workers", "2", "--iterations", "3",
			"--verify", "full", "--json", "--shm=false"}, arch...)
		out, err := run(t, args...)
		if err != nil {
			t.Fatalf("%v: %v", arch, err)
		}
		var rep struct {
			Verified bool  `json:"verified"`
			Checked  int64 `json:"checked_elements"`
		}
		if err := json.Unmarshal([]byte(out), &rep); err != nil || !rep.Verified || rep.Checked == 0 {
			t.Fatalf("%v: sums not verified (%v):\n%s", arch, err, out)
		}
	}
}

// TestScriptEnvRoundTrip: every setting launch gives a training command
// through its environment is read back by the plugin's settings parser
// (package bridge) as the same job: a value one side writes and the other
// refuses or reads otherwise (launch --shard 0 once stopped every script)
// fails here.
func TestScriptEnvRoundTrip(t *testing.T) {
	bs := sched.Config{PartitionBytes: 1 << 20, CreditBytes: 2 << 20, Order: sched.OrderPriority}
	ps := job.Spec{Arch: worker.PS, Workers: 2, Servers: 2, Sched: bs, ShardBytes: proto.DefaultShardBytes}
	with := func(s job.Spec, change func(*job.Spec)) job.Spec { change(&s); return s }
	specs := map[string]job.Spec{
		"ps":              ps,
		"ps, no sharding": with(ps, func(s *job.Spec) { s.ShardBytes = 0 }),
		"ps, 1 MiB shard": with(ps, func(s *job.Spec) { s.ShardBytes = 1 << 20 }),
		"ps, weights":     with(ps, func(s *job.Spec) { s.Sched.ServerWeights = sched.ServerWeights{1000, 250} }),
		"ps, pull":        with(ps, func(s *job.Spec) { s.PullMode = true }),
		"ps, fusion":      with(ps, func(s *job.Spec) { s.Sched.FusionBytes = 1 << 20 }),
		"ps, bf16":        with(ps, func(s *job.Spec) { s.Sched.Compression = dtype.BF16 }),
		"ps, fifo":        with(ps, func(s *job.Spec) { s.Sched = sched.Config{Order: sched.OrderFIFO} }),
		"ps, priority":    with(ps, func(s *job.Spec) { s.Sched = sched.Config{Order: sched.OrderPriority} }),
		"allreduce":       {Arch: worker.AllReduce, Workers: 3, Sched: bs},
		"allreduce, fp16": {Arch: worker.AllReduce, Workers: 3, Sched: with(job.Spec{Sched: bs}, func(s *job.Spec) { s.Sched.Compression = dtype.F16 }).Sched},
	}
	lc := launchConfig{peerTimeout: 7 * time.Second, logLevel: "warn", shaped: 125e6, linkRate: 125e6, scriptTuner: "autobyte", noShm: true}
	for name, spec := range specs {
		vars := map[string]string{}
		for _, kv := range scriptEnv(spec, lc, 1, "127.0.0.1", 29500, 29499, "tok") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				vars[k] = v // later entries win, as in a process's environment
			}
		}
		st, err := bridge.ParseSettings(bridge.Request{Tensors: []bridge.Tensor{{Name: "w", Layer: 0, Elems: 10}}}, func(k string) string { return vars[k] })
		if err != nil {
			t.Errorf("%s: the plugin refuses launch's environment: %v", name, err)
			continue
		}
		got := st.Spec
		if got.Arch != spec.Arch || got.Workers != spec.Workers || got.Servers != spec.Servers || got.ShardBytes != spec.ShardBytes ||
			got.PullMode != spec.PullMode || got.Sched != spec.Sched || st.Rank != 1 {
			t.Errorf("%s: the plugin reads rank %d of %+v, launch meant rank 1 of %+v", name, st.Rank, got, spec)
		}
		if n := st.Net; n.PeerTimeout != lc.peerTimeout || n.BandwidthBps != lc.shaped || !n.NoSharedMemory || n.Token != "tok" ||
			n.Master != "127.0.0.1:29500" || st.Tuner != lc.scriptTuner || st.LinkRateBps != lc.linkRate {
			t.Errorf("%s: the plugin reads network %+v, tuner %q at %v B/s; launch meant %+v", name, n, st.Tuner, st.LinkRateBps, lc)
		}
	}
}
