package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/autobyte/autobyte/cluster"
	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/proto"
	"github.com/autobyte/autobyte/supervise"
	"github.com/autobyte/autobyte/transport"
	"github.com/autobyte/autobyte/tune"
	"github.com/autobyte/autobyte/worker"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

var twoTensors = []Tensor{{Name: "a", Layer: 0, Elems: 10}, {Name: "b", Layer: 1, Elems: 3}}

func TestParseSettingsDefaults(t *testing.T) {
	st, err := ParseSettings(Request{Tensors: twoTensors}, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	if st.Spec.Workers != 1 || st.Rank != 0 || st.Spec.Arch != worker.AllReduce {
		t.Fatalf("defaults: %d workers, rank %d, arch %v; want one all-reduce worker", st.Spec.Workers, st.Rank, st.Spec.Arch)
	}
	if st.Spec.Sched != proto.ByteSchedulerDefaults(worker.AllReduce) {
		t.Fatalf("sched %+v, want ByteScheduler's all-reduce defaults", st.Spec.Sched)
	}
	if got := st.Spec.Profile.TotalParams(); got != 13 {
		t.Fatalf("profile has %d params, want 13", got)
	}
	// On parameter servers a credit not given covers one partition per
	// server, up to one per worker (proto.DefaultCredit), as the CLI's does.
	for servers, want := range map[string]int64{"2": proto.PSCreditBytes, "8": 8 * proto.PSPartitionBytes, "12": 10 * proto.PSPartitionBytes} {
		env := map[string]string{"AUTOBYTE_SERVERS": servers, "WORLD_SIZE": "10", "RANK": "3", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "AUTOBYTE_TOKEN": "t"}
		st, err := ParseSettings(Request{Tensors: twoTensors}, envOf(env))
		if err != nil {
			t.Fatal(err)
		}
		if st.Spec.Sched.CreditBytes != want || st.Spec.Sched.PartitionBytes != proto.PSPartitionBytes {
			t.Errorf("AUTOBYTE_SERVERS=%s: sched %+v, want ps partition %d and credit %d", servers, st.Spec.Sched, proto.PSPartitionBytes, want)
		}
	}

	env := map[string]string{"RANK": "2", "WORLD_SIZE": "3", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
		"AUTOBYTE_TOKEN": "t", "AUTOBYTE_SERVERS": "2", "AUTOBYTE_PARTITION": "1MB", "AUTOBYTE_CREDIT": "4MB",
		"AUTOBYTE_BANDWIDTH": "1Gbps", "AUTOBYTE_PS_PULL": "1"}
	st, err = ParseSettings(Request{Tensors: twoTensors, Settings: map[string]string{"AUTOBYTE_CREDIT": "8MB"}}, envOf(env))
	if err != nil {
		t.Fatal(err)
	}
	if st.Spec.Arch != worker.PS || st.Spec.Servers != 2 || st.Rank != 2 || st.Spec.Workers != 3 || !st.Spec.PullMode {
		t.Fatalf("spec %+v rank %d: want ps, 2 servers, rank 2 of 3, pull", st.Spec, st.Rank)
	}
	if st.Spec.Sched.PartitionBytes != 1_000_000 || st.Spec.Sched.CreditBytes != 8_000_000 {
		t.Fatalf("sched %+v: want partition 1MB and the request's credit 8MB over the environment's", st.Spec.Sched)
	}
	if st.Net.Master != "10.0.0.1:29501" || st.Net.BandwidthBps != 125e6 { // MASTER_PORT+1: torch.distributed owns MASTER_PORT
		t.Fatalf("net %+v: want master 10.0.0.1:29501 and 125e6 B/s", st.Net)
	}
	if st.EngineTrace != "" {
		t.Fatalf("engine trace %q without AUTOBYTE_TRACE", st.EngineTrace)
	}
	env["AUTOBYTE_TRACE"] = "/tmp/traces/rank-2.json"
	if st, err = ParseSettings(Request{Tensors: twoTensors}, envOf(env)); err != nil {
		t.Fatal(err)
	}
	if st.EngineTrace != "/tmp/traces/engine-rank-2.json" {
		t.Fatalf("engine trace %q, want /tmp/traces/engine-rank-2.json beside the plugin's", st.EngineTrace)
	}
}

// TestParseSettingsWire: AUTOBYTE_COMPRESSION is the initial
// configuration's compression; a tensor that names its wire type is
// pinned to it, the others are float32 gradients the compression applies
// to.
func TestParseSettingsWire(t *testing.T) {
	ts := []Tensor{{Name: "a", Layer: 0, Elems: 3, Iterations: "after_first"}, {Name: "b", Layer: 0, Elems: 2, Wire: "float32"}, {Name: "c", Layer: 1, Elems: 1, Wire: "bfloat16", Iterations: "first"}}
	want := []worker.Tensor{{Name: "a", Layer: 0, Elems: 3, Posted: proto.AfterFirst}, {Name: "b", Layer: 0, Elems: 2, Wire: dtype.F32, Exact: true}, {Name: "c", Layer: 1, Elems: 1, Wire: dtype.BF16, Exact: true, Posted: proto.FirstOnly}}
	for comp, d := range map[string]dtype.DType{"": dtype.F32, "none": dtype.F32, "fp16": dtype.F16, "bf16": dtype.BF16} {
		st, err := ParseSettings(Request{Tensors: ts, Settings: map[string]string{"AUTOBYTE_COMPRESSION": comp}}, envOf(nil))
		if err != nil {
			t.Fatalf("compression %q: %v", comp, err)
		}
		if st.Spec.Sched.Compression != d || !slices.Equal(st.Tensors, want) || st.TunerCompress != dtype.F32 {
			t.Errorf("compression %q: %v and tensors %+v, want %v and %+v", comp, st.Spec.Sched.Compression, st.Tensors, d, want)
		}
	}
	st, err := ParseSettings(Request{Tensors: ts, Settings: map[string]string{"AUTOBYTE_COMPRESSION": "auto", "AUTOBYTE_TUNER": "autobyte"}}, envOf(nil))
	if err != nil || st.Spec.Sched.Compression != dtype.F32 || st.TunerCompress != dtype.BF16 {
		t.Errorf("auto: %v, starting with %v, tuner may choose %v; want float32 and bfloat16", err, st.Spec.Sched.Compression, st.TunerCompress)
	}
}

// TestParseSettingsFusion: AUTOBYTE_FUSION pins a fusion size, or leaves
// it to the autobyte tuner (auto: the job starts unfused).
func TestParseSettingsFusion(t *testing.T) {
	ts := []Tensor{{Name: "a", Layer: 0, Elems: 3}}
	for v, want := range map[string]int64{"": 0, "0": 0, "1MiB": 1 << 20, "4096": 4096} {
		st, err := ParseSettings(Request{Tensors: ts, Settings: map[string]string{"AUTOBYTE_FUSION": v}}, envOf(nil))
		if err != nil || st.Spec.Sched.FusionBytes != want || st.TunerFuse != 0 {
			t.Errorf("AUTOBYTE_FUSION=%q: %v, fusion %d, tuner may fuse at %d; want %d and none", v, err, st.Spec.Sched.FusionBytes, st.TunerFuse, want)
		}
	}
	st, err := ParseSettings(Request{Tensors: ts, Settings: map[string]string{"AUTOBYTE_FUSION": "auto", "AUTOBYTE_TUNER": "autobyte"}}, envOf(nil))
	if err != nil || st.Spec.Sched.FusionBytes != 0 || st.TunerFuse != tune.AutoFusionBytes {
		t.Errorf("auto: %v, starting with %d, tuner may fuse at %d; want 0 and %d", err, st.Spec.Sched.FusionBytes, st.TunerFuse, tune.AutoFusionBytes)
	}
}

// TestParseSettingsShard: AUTOBYTE_SHARD sets the size above which a piece
// is split over every server; 0, which launch --shard 0 passes, never
// splits; the default is proto.DefaultShardBytes; all-reduce never shards.
func TestParseSettingsShard(t *testing.T) {
	ps := map[string]string{"AUTOBYTE_SERVERS": "2"}
	for v, want := range map[string]int64{"": proto.DefaultShardBytes, "0": 0, "1MiB": 1 << 20} {
		ps["AUTOBYTE_SHARD"] = v
		st, err := ParseSettings(Request{Tensors: twoTensors}, envOf(ps))
		if err != nil || st.Spec.ShardBytes != want {
			t.Errorf("AUTOBYTE_SHARD=%q: %v, shard %d; want %d", v, err, st.Spec.ShardBytes, want)
		}
	}
	ps["AUTOBYTE_SHARD"] = "-1MB"
	if _, err := ParseSettings(Request{Tensors: twoTensors}, envOf(ps)); err == nil || !strings.Contains(err.Error(), `AUTOBYTE_SHARD="-1MB"`) {
		t.Errorf("AUTOBYTE_SHARD=-1MB: %v, want a refusal naming it", err)
	}
}

func TestParseSettingsServerWeights(t *testing.T) {
	ps := map[string]string{"AUTOBYTE_SERVERS": "3"}
	for v, want := range map[string]string{"": "", "4:4:1": "1000:1000:250", "2,2,2": ""} {
		ps["AUTOBYTE_SERVER_WEIGHTS"] = v
		st, err := ParseSettings(Request{Tensors: twoTensors}, envOf(ps))
		if err != nil || st.Spec.Sched.ServerWeights.String() != want {
			t.Errorf("AUTOBYTE_SERVER_WEIGHTS=%q: %v, weights %q; want %q", v, err, st.Spec.Sched.ServerWeights, want)
		}
	}
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"AUTOBYTE_SERVERS": "3", "AUTOBYTE_SERVER_WEIGHTS": "1:2"}, `AUTOBYTE_SERVER_WEIGHTS (AUTOBYTE_SERVERS=3): sched: server weights "1:2": 2 weights for 3 servers`},
		{map[string]string{"AUTOBYTE_SERVERS": "2", "AUTOBYTE_SERVER_WEIGHTS": "1:-1"}, `server 1's weight "-1"`},
		{map[string]string{"AUTOBYTE_SERVER_WEIGHTS": "1:2"}, `AUTOBYTE_SERVER_WEIGHTS="1:2": all-reduce has no parameter servers`},
	} {
		if _, err := ParseSettings(Request{Tensors: twoTensors}, envOf(c.env)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("env %v: error %v, want one containing %q", c.env, err, c.want)
		}
	}
}

func TestParseSettingsSharedMemory(t *testing.T) {
	for v, off := range map[string]bool{"": false, "1": false, "on": false, "0": true, "off": true, "false": true} {
		st, err := ParseSettings(Request{Tensors: twoTensors}, envOf(map[string]string{"AUTOBYTE_SHM": v}))
		if err != nil || st.Net.NoSharedMemory != off {
			t.Errorf("AUTOBYTE_SHM=%q: %v, no shared memory %v; want %v", v, err, st.Net.NoSharedMemory, off)
		}
	}
}

func TestParseSettingsRendezvousTimeout(t *testing.T) {
	for v, want := range map[string]time.Duration{"": 0, "90s": 90 * time.Second, "1h": time.Hour} {
		st, err := ParseSettings(Request{Tensors: twoTensors}, envOf(map[string]string{"AUTOBYTE_RENDEZVOUS_TIMEOUT": v}))
		if err != nil || st.Net.RendezvousTimeout != want {
			t.Errorf("AUTOBYTE_RENDEZVOUS_TIMEOUT=%q: %v, timeout %v; want %v (0: the cluster's default)", v, err, st.Net.RendezvousTimeout, want)
		}
	}
}

func TestParseSettingsWaitTimeout(t *testing.T) {
	for v, want := range map[string]time.Duration{"": DefaultWaitTimeout, "90s": 90 * time.Second, "1h": time.Hour, "0": 0, "0s": 0, "2.5": 2500 * time.Millisecond, " 60 ": time.Minute} {
		st, err := ParseSettings(Request{Tensors: twoTensors}, envOf(map[string]string{"AUTOBYTE_TIMEOUT": v}))
		if err != nil || st.WaitTimeout != want {
			t.Errorf("AUTOBYTE_TIMEOUT=%q: %v, timeout %v; want %v", v, err, st.WaitTimeout, want)
		}
	}
}

func TestParseSettingsErrors(t *testing.T) {
	multi := map[string]string{"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1234", "AUTOBYTE_TOKEN": "x"}
	cases := []struct {
		env     map[string]string
		tensors []Tensor
		want    string
	}{
		{map[string]string{"RANK": "x"}, twoTensors, `RANK="x"`},
		{map[string]string{"RANK": "3", "WORLD_SIZE": "2"}, twoTensors, "RANK=3 is out of range for WORLD_SIZE=2"},
		{map[string]string{"AUTOBYTE_ARCH": "ring"}, twoTensors, `AUTOBYTE_ARCH="ring"`},
		{map[string]string{"AUTOBYTE_ARCH": "ps"}, twoTensors, "needs AUTOBYTE_SERVERS >= 1"},
		{map[string]string{"AUTOBYTE_ARCH": "allreduce", "AUTOBYTE_SERVERS": "2"}, twoTensors, "AUTOBYTE_SERVERS=2"},
		{map[string]string{"AUTOBYTE_SCHEDULER": "lifo"}, twoTensors, `AUTOBYTE_SCHEDULER="lifo"`},
		{map[string]string{"AUTOBYTE_SCHEDULER": "fifo", "AUTOBYTE_PARTITION": "1MB"}, twoTensors, "apply to AUTOBYTE_SCHEDULER=bytescheduler"},
		{map[string]string{"AUTOBYTE_PARTITION": "lots"}, twoTensors, `AUTOBYTE_PARTITION="lots"`},
		{map[string]string{"AUTOBYTE_BANDWIDTH": "fast"}, twoTensors, `AUTOBYTE_BANDWIDTH="fast"`},
		{map[string]string{"AUTOBYTE_PEER_TIMEOUT": "-1s"}, twoTensors, `AUTOBYTE_PEER_TIMEOUT="-1s"`},
		{map[string]string{"AUTOBYTE_RENDEZVOUS_TIMEOUT": "forever"}, twoTensors, `AUTOBYTE_RENDEZVOUS_TIMEOUT: rendezvous timeout "forever"`},
		{map[string]string{"AUTOBYTE_LOG_LEVEL": "loud"}, twoTensors, `AUTOBYTE_LOG_LEVEL="loud"`},
		{map[string]string{"AUTOBYTE_TIMEOUT": "-5s"}, twoTensors, `AUTOBYTE_TIMEOUT="-5s": want a duration`},
		{map[string]string{"AUTOBYTE_TIMEOUT": "-1"}, twoTensors, `AUTOBYTE_TIMEOUT="-1"`},
		{map[string]string{"AUTOBYTE_TIMEOUT": "1e300"}, twoTensors, `AUTOBYTE_TIMEOUT="1e300"`},
		{map[string]string{"AUTOBYTE_TIMEOUT": "NaN"}, twoTensors, `AUTOBYTE_TIMEOUT="NaN"`},
		{map[string]string{"AUTOBYTE_TIMEOUT": "soon"}, twoTensors, `AUTOBYTE_TIMEOUT="soon"`},
		{map[string]string{"AUTOBYTE_SHM": "maybe"}, twoTensors, `AUTOBYTE_SHM="maybe"`},
		{map[string]string{"AUTOBYTE_PS_PULL": "yes"}, twoTensors, `AUTOBYTE_PS_PULL="yes"`},
		{map[string]string{"AUTOBYTE_COMPRESSION": "int8"}, twoTensors, `AUTOBYTE_COMPRESSION="int8"`},
		{map[string]string{"AUTOBYTE_COMPRESSION": "auto"}, twoTensors, `AUTOBYTE_COMPRESSION=auto: only AUTOBYTE_TUNER=autobyte`},
		{map[string]string{"AUTOBYTE_FUSION": "auto"}, twoTensors, `AUTOBYTE_FUSION=auto: only AUTOBYTE_TUNER=autobyte chooses the fusion`},
		{map[string]string{"AUTOBYTE_FUSION": "big"}, twoTensors, `AUTOBYTE_FUSION="big"`},
		{map[string]string{"AUTOBYTE_STATUS_FD": "2"}, twoTensors, `AUTOBYTE_STATUS_FD="2": want the number of an open file descriptor above 2`},
		{map[string]string{"AUTOBYTE_STATUS_FD": "pipe"}, twoTensors, `AUTOBYTE_STATUS_FD="pipe"`},
		{nil, []Tensor{{Name: "a", Layer: 0, Elems: 1, Wire: "float64"}}, `tensor 0 "a"`},
		{nil, []Tensor{{Name: "a", Layer: 0, Elems: 1, Iterations: "second"}}, `tensor 0 "a": iterations "second"`},
		{map[string]string{"WORLD_SIZE": "2"}, twoTensors, "MASTER_ADDR is not set"},
		{map[string]string{"WORLD_SIZE": "2", "MASTER_ADDR": "h"}, twoTensors, "MASTER_PORT is not set"},
		{map[string]string{"WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "99999"}, twoTensors, `MASTER_PORT="99999"`},
		{map[string]string{"WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1", "AUTOBYTE_MASTER_PORT": "70000"}, twoTensors, `AUTOBYTE_MASTER_PORT="70000"`},
		{map[string]string{"WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, twoTensors, "AUTOBYTE_TOKEN is not set"},
		{multi, nil, "no tensors"},
		{multi, []Tensor{{Name: "a", Layer: 0, Elems: 0}}, `tensor 0 "a": 0 elements`},
		{multi, []Tensor{{Name: "a", Layer: 1, Elems: 1}, {Name: "b", Layer: 1, Elems: 1}}, "layer 0 has no tensors"},
		{multi, []Tensor{{Name: "a", Layer: 1, Elems: 1}, {Name: "b", Layer: 0, Elems: 1}}, "out of layer order"},
		{multi, []Tensor{{Name: "a", Layer: 5, Elems: 1}}, "layer 5 out of range"},
		{multi, []Tensor{{Name: "a", Layer: 0, Elems: 1}, {Name: "a", Layer: 1, Elems: 1}}, "duplicate tensor name"},
	}
	for _, c := range cases {
		_, err := ParseSettings(Request{Tensors: c.tensors}, envOf(c.env))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("env %v tensors %v: error %v, want one containing %q", c.env, c.tensors, err, c.want)
		}
	}
}

// TestReportLostPeer: an engine that stops because it lost a peer names
// the peer on the supervisor's status pipe; any other stop writes nothing.
// Both reach the binding's own OnStop.
func TestReportLostPeer(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// The reporter owns (and closes) its own descriptor, as the plugin's
	// engine does the one the supervisor gave the script.
	fd, err := syscall.Dup(int(w.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	var seen []error
	stop := reportLostPeer(fd, func(err error) { seen = append(seen, err) })
	other := errors.New("worker 1: its training script raised an exception")
	stop(other)
	lost := fmt.Errorf("worker 1: lost parameter server 0: %w", &transport.PeerClosedError{Peer: "server 0 (127.0.0.1:1)", Reason: "disk full", Role: "server", Rank: 0})
	stop(lost)
	if len(seen) != 2 || seen[0] != other || seen[1] != lost {
		t.Fatalf("OnStop saw %v, want both errors in order", seen)
	}
	// The report closed the writer's descriptor: the pipe holds exactly
	// the one message.
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	var m supervise.Message
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("status pipe held %q: %v", b, err)
	}
	want := supervise.Lost{Role: "server", Rank: 0, Closed: true}
	if m.Kind != supervise.KindExit || m.Lost == nil || *m.Lost != want || m.Error != lost.Error() {
		t.Errorf("status message %+v (lost %+v), want an exit naming %+v with error %q", m, m.Lost, want, lost)
	}
}

func TestOpenBadRequest(t *testing.T) {
	for _, req := range []string{"", "{", `{"tensors": 3}`, `{"tensors": [], "extra": 1}`} {
		if _, err := Open(context.Background(), []byte(req), envOf(nil), Hooks{}); err == nil {
			t.Errorf("Open(%q) succeeded", req)
		}
	}
	bad := filepath.Join(t.TempDir(), "no", "dir", "rank-0.json")
	_, err := Open(context.Background(), []byte(`{"tensors":[{"name":"w","layer":0,"elems":4}]}`), envOf(map[string]string{"AUTOBYTE_TRACE": bad}), Hooks{})
	if err == nil || !strings.Contains(err.Error(), "engine-rank-0.json") {
		t.Errorf("Open with an unwritable AUTOBYTE_TRACE: %v, want an error naming engine-rank-0.json", err)
	}
}

// TestSessionsSum: two sessions (two workers of an all-reduce job) sum
// each other's gradients exactly, layer gates open, and an orderly close
// ends both.
func TestSessionsSum(t *testing.T) {
	sessions := runSessions(t, `{"AUTOBYTE_PARTITION":"16KB","AUTOBYTE_CREDIT":"64KB"}`, 3)
	if err := sessions[0].Post(0, 0, make([]float32, 3)); err == nil || !strings.Contains(err.Error(), "3 elements, want 1000") {
		t.Fatalf("posting a short gradient: %v", err)
	}
	closeSessions(t, sessions)
	if err := sessions[0].Close(true, ""); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

// TestSessionsTuned: rank 0 tunes itself from the binding's marks; the
// configuration changes while sums stay exact on both ranks.
func TestSessionsTuned(t *testing.T) {
	sessions := runSessions(t, `{"AUTOBYTE_PARTITION":"16KB","AUTOBYTE_CREDIT":"64KB","AUTOBYTE_TUNER":"autobyte","AUTOBYTE_LINK_RATE":"1Gbps"}`, 30)
	if !sessions[0].Tuning() || sessions[1].Tuning() {
		t.Fatalf("tuning on rank 0: %v, rank 1: %v; want only rank 0", sessions[0].Tuning(), sessions[1].Tuning())
	}
	rep, err := sessions[0].Report()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(rep), `"tuner":"autobyte"`) || strings.Count(string(rep), "from_iteration") < 2 {
		t.Fatalf("report %s: want the autobyte tuner and at least one configuration change in 30 iterations", rep)
	}
	if err := sessions[0].Mark(7, 1); err == nil {
		t.Fatal("an unknown mark was accepted")
	}
	closeSessions(t, sessions)
}

func closeSessions(t *testing.T, sessions []*Session) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(sessions))
	for r := range sessions {
		wg.Add(1)
		go func() { defer wg.Done(); errs[r] = sessions[r].Close(true, "") }()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d close: %v", r, err)
		}
	}
}

// runSessions opens two ring sessions with settings and runs iterations
// of exact sums through them (marking each step for a tuner).
func runSessions(t *testing.T, settings string, iterations int) []*Session {
	t.Helper()
	port, err := cluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	ts := []Tensor{{Name: "w0", Layer: 0, Elems: 1000}, {Name: "b0", Layer: 0, Elems: 7}, {Name: "w1", Layer: 1, Elems: 50_001}}
	req := `{"tensors":[{"name":"w0","layer":0,"elems":1000},{"name":"b0","layer":0,"elems":7},{"name":"w1","layer":1,"elems":50001}],"settings":` + settings + `}`
	// The context lives as long as the sessions: it bounds the job.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	sessions := make([]*Session, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			env := map[string]string{"RANK": strconv.Itoa(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
				"AUTOBYTE_MASTER_PORT": strconv.Itoa(port), "AUTOBYTE_TOKEN": "tok", "AUTOBYTE_LISTEN": "127.0.0.1:0"}
			sessions[r], errs[r] = Open(ctx, []byte(req), envOf(env), Hooks{})
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for iter := 0; iter < iterations; iter++ {
		for r := range 2 {
			if err := sessions[r].Mark(ForwardBegin, iter); err != nil {
				t.Fatal(err)
			}
			if iter > 0 {
				// The forward waits for the previous iteration's sums.
				for l := range 2 {
					if err := sessions[r].WaitLayer(l, iter-1); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := sessions[r].Mark(ForwardEnd, iter); err != nil {
				t.Fatal(err)
			}
		}
		grads := make([][][]float32, 2)
		for r := range 2 {
			for i, tn := range ts {
				g := make([]float32, tn.Elems)
				for j := range g {
					g[j] = float32((r+1)*1000 + i*10 + j%97 + iter)
				}
				grads[r] = append(grads[r], g)
			}
		}
		for r := range 2 {
			for i := range ts {
				if err := sessions[r].Post(i, iter, grads[r][i]); err != nil {
					t.Fatal(err)
				}
			}
			if err := sessions[r].Mark(BackwardEnd, iter); err != nil {
				t.Fatal(err)
			}
		}
		for r := range 2 {
			for l := range 2 {
				if err := sessions[r].WaitLayer(l, iter); err != nil {
					t.Fatal(err)
				}
			}
			for i, tn := range ts {
				for j := range tn.Elems {
					want := float32(1000+i*10+j%97+iter) + float32(2000+i*10+j%97+iter)
					if got := grads[r][i][j]; got != want {
						t.Fatalf("iteration %d rank %d tensor %d element %d = %v, want %v", iter, r, i, j, got, want)
					}
				}
			}
		}
	}
	return sessions
}
