package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/autobyte/autobyte/testbed"
)

// bigProfile writes a profile of n tensors of 16 Mi fp32 parameters
// (64 MiB each), no compute, and returns its path and the model's bytes.
func bigProfile(t testing.TB, n int) (string, int64) {
	t.Helper()
	type tensor struct {
		Name   string `json:"name"`
		Params int64  `json:"params"`
	}
	type layer struct {
		Name      string   `json:"name"`
		ForwardS  float64  `json:"forward_s"`
		BackwardS float64  `json:"backward_s"`
		Tensors   []tensor `json:"tensors"`
	}
	const params = 16 << 20
	p := struct {
		Name          string  `json:"name"`
		BatchSize     int     `json:"batch_size"`
		Device        string  `json:"device"`
		BytesPerParam int     `json:"bytes_per_param"`
		Layers        []layer `json:"layers"`
	}{Name: fmt.Sprintf("big%d", n), BatchSize: 1, Device: "none", BytesPerParam: 4}
	for i := 0; i < n; i++ {
		p.Layers = append(p.Layers, layer{Name: fmt.Sprintf("l%d", i), Tensors: []tensor{{Name: fmt.Sprintf("t%d", i), Params: params}}})
	}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), p.Name+".json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, int64(n) * params * 4
}

// launchReport is the part of 'autobyte launch --json' used here.
type launchReport struct {
	IterationTimesS []float64 `json:"iteration_times_s"`
	BytesSent       int64     `json:"bytes_sent"`
	WallS           float64   `json:"wall_s"`
}

// psRun is one measured launch.
type psRun struct {
	rep          launchReport
	pushBps      float64 // model bytes × iterations / sum of iteration times
	steadyBps    float64 // the same without the first iteration
	cpuS, wallS  float64 // user+system CPU of launch and its children; wall
	modelBytes   int64
	iterationsOK bool
}

// runPSLoopback runs one worker and one server on unshaped loopback with
// the big profile and returns the push rates it measured.
func runPSLoopback(t testing.TB, profile string, modelBytes int64, iterations int, extra ...string) psRun {
	t.Helper()
	args := append([]string{"launch", "--workers=1", "--servers=1", "--profile=" + profile, "--scheduler=bytescheduler",
		"--partition=16MB", "--credit=64MB", "--iterations=" + strconv.Itoa(iterations), "--verify=none", "--json"}, extra...)
	cmd := execCommand(args...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("autobyte %v: %v\n%s", args, err, stderrOf(err))
	}
	var r psRun
	if err := json.Unmarshal(out, &r.rep); err != nil {
		t.Fatalf("launch printed %q: %v", out, err)
	}
	r.modelBytes = modelBytes
	ts := r.rep.IterationTimesS
	r.iterationsOK = len(ts) == iterations
	var sum float64
	for _, x := range ts {
		sum += x
	}
	if sum > 0 {
		r.pushBps = float64(modelBytes) * float64(len(ts)) / sum
	}
	if len(ts) > 1 && sum-ts[0] > 0 {
		r.steadyBps = float64(modelBytes) * float64(len(ts)-1) / (sum - ts[0])
	}
	r.cpuS = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	r.wallS = r.rep.WallS
	return r
}

// rawTCP sends n bytes over a loopback TCP connection in 16 MiB writes to a
// receiver reading into a reused 16 MiB buffer and returns bytes/s.
func rawTCP(t testing.TB, n int64) float64 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan int64, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer c.Close()
		m, _ := io.CopyBuffer(io.Discard, struct{ io.Reader }{c}, make([]byte, 16<<20))
		got <- m
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	began := time.Now()
	for left := n; left > 0; {
		k := min(left, int64(len(buf)))
		if _, err := c.Write(buf[:k]); err != nil {
			t.Fatal(err)
		}
		left -= k
	}
	c.Close()
	if m := <-got; m != n {
		t.Fatalf("raw TCP: received %d of %d bytes", m, n)
	}
	return float64(n) / time.Since(began).Seconds()
}

const gb = 1e9

// BenchmarkPSLoopback: one worker pushing a 512 MiB model of 64 MiB
// tensors through one parameter server on unshaped loopback (one launch of
// b.N iterations, at least 2), then raw TCP moving the same bytes in the
// same run. It reports the push rate over the whole run ("push-MB/s") and
// without the first iteration ("steady-push-MB/s"), the raw TCP rate, the
// ratios and the CPU of all processes per GB pushed; docs/runtime-tests.md
// has the numbers (-benchtime 10x -count 3).
func BenchmarkPSLoopback(b *testing.B) {
	profile, model := bigProfile(b, 8)
	iterations := max(b.N, 2)
	r := runPSLoopback(b, profile, model, iterations)
	if !r.iterationsOK {
		b.Fatalf("launch reported %d iteration times, want %d", len(r.rep.IterationTimesS), iterations)
	}
	raw := rawTCP(b, model*int64(iterations))
	b.ReportMetric(r.pushBps/1e6, "push-MB/s")
	b.ReportMetric(r.steadyBps/1e6, "steady-push-MB/s")
	b.ReportMetric(raw/1e6, "raw-TCP-MB/s")
	b.ReportMetric(r.pushBps/raw, "ratio")
	b.ReportMetric(r.steadyBps/raw, "steady-ratio")
	b.ReportMetric(r.cpuS/(float64(model)*float64(iterations)/gb), "CPU-s/GB")
}

// BenchmarkRawTCPLoopback is the raw TCP reference for BenchmarkPSLoopback.
func BenchmarkRawTCPLoopback(b *testing.B) {
	const n = 512 << 20
	b.SetBytes(n)
	for i := 0; i < b.N; i++ {
		rawTCP(b, n)
	}
}

// testbedGoodput runs one worker and one server in their own testbed hosts
// at 1 Gbit/s (launch creates and removes the testbed) and returns the push
// goodput, model bytes per steady-state iteration, as a share of the link
// rate.
func testbedGoodput(tb testing.TB, tag int, partition, credit string) float64 {
	const iterations, rateBps = 3, 125e6
	profile, model := bigProfile(tb, 2)
	name := fmt.Sprintf("e%06x", (os.Getpid()*16+tag)&0xffffff)
	tb.Cleanup(func() { _ = testbed.Down(context.Background(), name) })
	r := runPSLoopback(tb, profile, model, iterations, "--bandwidth=1Gbps", "--testbed="+name, "--partition="+partition, "--credit="+credit)
	if !r.iterationsOK {
		tb.Fatalf("launch reported %d iteration times, want %d", len(r.rep.IterationTimesS), iterations)
	}
	if _, err := testbed.Load(name); err == nil {
		tb.Errorf("launch left testbed %s behind", name)
	}
	return r.steadyBps / rateBps
}

// TestPSTestbedGoodput: the push goodput of one worker and one server on
// the testbed (ps defaults: partition 4 MB, credit 16 MB) is bounded by the
// shaped rate and is not far below it. Its target (>= 90 %) is a speed
// target, measured by BenchmarkPSTestbedGoodput with the results in
// docs/runtime-tests.md; this test asserts what holds on a loaded machine
// too: shaping applies (at most TCP's framing ceiling, 95.6 %, plus 1 %
// for the clock) and the pipeline keeps the link mostly busy (>= 50 %).
func TestPSTestbedGoodput(t *testing.T) {
	requireRoot(t)
	share := testbedGoodput(t, 0, "4MB", "16MB")
	t.Logf("push goodput %.1f %% of 1 Gbit/s", 100*share)
	if share > 0.966 {
		t.Errorf("push goodput is %.1f %% of the shaped rate, above TCP's ceiling of 95.6 %%: the link is not shaped", 100*share)
	}
	if share < 0.5 {
		t.Errorf("push goodput is %.1f %% of the shaped rate, want at least 50 %%", 100*share)
	}
}

// BenchmarkPSTestbedGoodput reports the push goodput ("goodput-%" of
// 1 Gbit/s) with the ps defaults and with 16 MB pieces, whose last answer
// (0.13 s at 1 Gbit/s) drains after the last push of each iteration, so
// they come out lower; run as root with -benchtime 1x -count 3
// (docs/runtime-tests.md). The target with the defaults is >= 90 %; TCP
// over Ethernet framing tops out at 95.6 %.
func BenchmarkPSTestbedGoodput(b *testing.B) {
	requireRoot(b)
	for i, c := range []struct{ partition, credit string }{{"4MB", "16MB"}, {"16MB", "64MB"}} {
		b.Run("partition="+c.partition, func(b *testing.B) {
			var share float64
			for k := 0; k < b.N; k++ {
				share = testbedGoodput(b, 1+4*i+k%4, c.partition, c.credit)
			}
			b.ReportMetric(100*share, "goodput-%")
		})
	}
}
