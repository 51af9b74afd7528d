package observe

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/autobyte/autobyte/sched"
)

func TestTraceAndMetrics(t *testing.T) {
	m := NewMetrics("worker", 3)
	path := filepath.Join(t.TempDir(), "rank-3.json")
	o, err := New(path, 3, m)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	p := sched.Piece{PieceID: sched.PieceID{Iteration: 1, Tensor: 2, Index: 0}, Layer: 1, Count: 1, Bytes: 4000, Epoch: 2}
	o.Compute("FW l0", 1, t0, t0.Add(time.Millisecond))
	o.PieceStarted(p, t0, t0.Add(2*time.Millisecond), 4000)
	o.PieceDone(p, t0.Add(2*time.Millisecond), t0.Add(5*time.Millisecond), 0)
	o.Iteration(0, 10*time.Millisecond)
	names := map[string]float64{}
	for _, e := range closeAndRead(t, o, path) {
		if e.Ph == "X" {
			names[e.Name] = e.Dur
		}
	}
	for name, want := range map[string]float64{"FW l0": 1000, "QUEUE": 2000, "COMMUNICATION": 3000} {
		if got, ok := names[name]; !ok || got < want*0.99 || got > want*1.01 {
			t.Errorf("trace event %q duration %v µs (present %v), want %v", name, got, ok, want)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := m.Serve(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`autobyte_pieces_total{rank="3",role="worker"} 1`,
		`autobyte_piece_bytes_total{rank="3",role="worker"} 4000`,
		`autobyte_config_epoch{rank="3",role="worker"} 2`,
		`autobyte_credit_in_use_bytes{rank="3",role="worker"} 0`,
		`autobyte_last_iteration_seconds{rank="3",role="worker"} 0.01`,
		`autobyte_piece_queue_seconds_count{rank="3",role="worker"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestBadTracePath(t *testing.T) {
	if _, err := New(filepath.Join(t.TempDir(), "no", "dir", "t.json"), 0, nil); err == nil || !strings.Contains(err.Error(), "t.json") {
		t.Errorf("New with an unwritable path: %v, want an error naming it", err)
	}
	m := NewMetrics("worker", 0)
	if _, err := m.Serve(context.Background(), "256.0.0.1:99999"); err == nil {
		t.Error("Serve on a bad address should fail")
	}
}

// TestAlignClock: after AlignClock(ref, 1000), an event at ref+2ms is
// written at 1000.002 s of the other clock.
func TestAlignClock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.json")
	o, err := New(path, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	ref := time.Now()
	o.AlignClock(ref, 1000)
	p := sched.Piece{PieceID: sched.PieceID{Iteration: 1, Tensor: 0}, Layer: 3, Count: 1, Bytes: 4}
	o.PieceStarted(p, ref.Add(2*time.Millisecond), ref.Add(3*time.Millisecond), 4)
	for _, e := range closeAndRead(t, o, path) {
		if e.Name != "QUEUE" {
			continue
		}
		if want := 1000.002e6; e.Ts < want-1 || e.Ts > want+1 {
			t.Errorf("QUEUE at %v µs, want %v", e.Ts, want)
		}
		if e.Args["layer"] != 3.0 {
			t.Errorf("QUEUE args %v, want layer 3", e.Args)
		}
		return
	}
	t.Fatal("no QUEUE event in the trace")
}

type traceEvent struct {
	Name string         `json:"name"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"`
	Dur  float64        `json:"dur"`
	Args map[string]any `json:"args"`
}

// closeAndRead closes o and returns the events of its trace at path.
func closeAndRead(t *testing.T, o *Observer, path string) []traceEvent {
	t.Helper()
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		TraceEvents []traceEvent `json:"traceEvents"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("trace is not JSON: %v", err)
	}
	return doc.TraceEvents
}
