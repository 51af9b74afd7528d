package trace

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

type doc struct {
	TraceEvents []map[string]any `json:"traceEvents"`
}

func parse(t *testing.T, b []byte) doc {
	t.Helper()
	var d doc
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("output is not valid JSON: %v\n%s", err, b)
	}
	if d.TraceEvents == nil {
		t.Fatalf("no traceEvents array in %s", b)
	}
	return d
}

func num(t *testing.T, v any) float64 {
	t.Helper()
	n, ok := v.(json.Number)
	if !ok {
		t.Fatalf("%v (%T) is not a number", v, v)
	}
	f, err := n.Float64()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestEmpty(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	if buf.Len() != 0 {
		t.Errorf("NewWriter wrote %q before any event", buf.String())
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	d := parse(t, buf.Bytes())
	if len(d.TraceEvents) != 0 {
		t.Errorf("got %d events, want 0", len(d.TraceEvents))
	}
}

func TestEvents(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(w.ProcessName(1, "gpu <0> & \"friends\""))
	must(w.ThreadName(1, 7, "stream 7"))
	must(w.Complete("matmul", "compute", 1, 7, 1.5, 0.25, map[string]any{"bytes": 4096, "layer": "fc1"}))
	must(w.Complete("idle", "", 1, 7, 2, 0, nil))
	must(w.Instant("barrier", "sync", 1, 7, 3e-6, nil))
	must(w.WriteEvent(Event{Name: "raw", Phase: 'X', TsUS: 10, DurUS: 5, PID: 2, TID: 3}))
	if w.Len() != 6 {
		t.Errorf("Len() = %d, want 6", w.Len())
	}
	must(w.Close())

	d := parse(t, buf.Bytes())
	ev := d.TraceEvents
	if len(ev) != 6 {
		t.Fatalf("got %d events, want 6:\n%s", len(ev), buf.Bytes())
	}
	count := map[string]int{}
	for _, e := range ev {
		count[e["ph"].(string)]++
	}
	if count["X"] != 3 || count["i"] != 1 || count["M"] != 2 {
		t.Errorf("phase counts = %v, want X:3 i:1 M:2", count)
	}

	// Metadata names.
	if ev[0]["name"] != "process_name" || num(t, ev[0]["pid"]) != 1 {
		t.Errorf("event 0 = %v, want process_name for pid 1", ev[0])
	}
	if got := ev[0]["args"].(map[string]any)["name"]; got != "gpu <0> & \"friends\"" {
		t.Errorf("process name = %q", got)
	}
	if ev[1]["name"] != "thread_name" || num(t, ev[1]["pid"]) != 1 || num(t, ev[1]["tid"]) != 7 {
		t.Errorf("event 1 = %v, want thread_name for pid 1 tid 7", ev[1])
	}
	if got := ev[1]["args"].(map[string]any)["name"]; got != "stream 7" {
		t.Errorf("thread name = %q", got)
	}
	if _, ok := ev[0]["dur"]; ok {
		t.Errorf("metadata event has dur: %v", ev[0])
	}

	// Complete event: seconds in, microseconds out.
	c := ev[2]
	if c["name"] != "matmul" || c["cat"] != "compute" || c["ph"] != "X" {
		t.Errorf("event 2 = %v", c)
	}
	if ts, dur := num(t, c["ts"]), num(t, c["dur"]); ts != 1.5e6 || dur != 0.25e6 {
		t.Errorf("matmul ts, dur = %g, %g; want 1.5e6, 2.5e5", ts, dur)
	}
	if num(t, c["pid"]) != 1 || num(t, c["tid"]) != 7 {
		t.Errorf("matmul pid/tid = %v/%v", c["pid"], c["tid"])
	}
	args := c["args"].(map[string]any)
	if num(t, args["bytes"]) != 4096 || args["layer"] != "fc1" {
		t.Errorf("matmul args = %v", args)
	}

	// Zero-duration complete event keeps its dur; empty cat and nil args are omitted.
	if _, ok := ev[3]["dur"]; !ok {
		t.Errorf("zero-duration event lacks dur: %v", ev[3])
	}
	if _, ok := ev[3]["cat"]; ok {
		t.Errorf("empty cat written: %v", ev[3])
	}
	if _, ok := ev[3]["args"]; ok {
		t.Errorf("nil args written: %v", ev[3])
	}

	// Instant.
	in := ev[4]
	if in["name"] != "barrier" || in["ph"] != "i" || num(t, in["ts"]) != 3 {
		t.Errorf("instant = %v", in)
	}
	if _, ok := in["dur"]; ok {
		t.Errorf("instant has dur: %v", in)
	}

	// Raw event.
	if r := ev[5]; num(t, r["ts"]) != 10 || num(t, r["dur"]) != 5 || num(t, r["pid"]) != 2 || num(t, r["tid"]) != 3 {
		t.Errorf("raw = %v", r)
	}
}

func TestManyEvents(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	const n = 20000
	for i := range n {
		if err := w.Complete(fmt.Sprint("op", i), "c", 1, i%4, float64(i)*1e-3, 1e-3, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if d := parse(t, buf.Bytes()); len(d.TraceEvents) != n {
		t.Errorf("got %d events, want %d", len(d.TraceEvents), n)
	}
}

// failWriter fails every write after the first ok bytes.
type failWriter struct {
	ok  int
	err error
}

func (f *failWriter) Write(p []byte) (int, error) {
	if len(p) <= f.ok {
		f.ok -= len(p)
		return len(p), nil
	}
	n := f.ok
	f.ok = 0
	return n, f.err
}

func TestWriteErrorPropagates(t *testing.T) {
	boom := errors.New("disk full")
	w := NewWriter(&failWriter{err: boom})
	if err := w.Complete("a", "", 1, 1, 0, 1, nil); err != nil {
		t.Fatalf("buffered write failed early: %v", err)
	}
	if err := w.Close(); !errors.Is(err, boom) {
		t.Errorf("Close() = %v, want %v", err, boom)
	}
	if err := w.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close() = %v, want ErrClosed", err)
	}
}

func TestWriteErrorSticky(t *testing.T) {
	boom := errors.New("broken pipe")
	w := NewWriter(&failWriter{ok: 10, err: boom})
	// Write enough to overflow the buffer and reach the failing writer.
	var err error
	big := strings.Repeat("x", 1000)
	for i := 0; i < 1000 && err == nil; i++ {
		err = w.Complete(big, "", 1, 1, 0, 1, nil)
	}
	if !errors.Is(err, boom) {
		t.Fatalf("write error = %v, want %v", err, boom)
	}
	if err := w.Instant("b", "", 1, 1, 0, nil); !errors.Is(err, boom) {
		t.Errorf("after failure Instant() = %v, want sticky %v", err, boom)
	}
	if err := w.ProcessName(1, "p"); !errors.Is(err, boom) {
		t.Errorf("after failure ProcessName() = %v, want sticky %v", err, boom)
	}
	if err := w.Flush(); !errors.Is(err, boom) {
		t.Errorf("after failure Flush() = %v, want sticky %v", err, boom)
	}
	if err := w.Close(); !errors.Is(err, boom) {
		t.Errorf("Close() = %v, want %v", err, boom)
	}
}

func TestFlushError(t *testing.T) {
	boom := errors.New("nope")
	w := NewWriter(&failWriter{err: boom})
	if err := w.ThreadName(1, 2, "t"); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); !errors.Is(err, boom) {
		t.Errorf("Flush() = %v, want %v", err, boom)
	}
}

func TestAfterClose(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	calls := map[string]func() error{
		"Complete":    func() error { return w.Complete("a", "", 1, 1, 0, 1, nil) },
		"Instant":     func() error { return w.Instant("a", "", 1, 1, 0, nil) },
		"ProcessName": func() error { return w.ProcessName(1, "p") },
		"ThreadName":  func() error { return w.ThreadName(1, 1, "t") },
		"WriteEvent":  func() error { return w.WriteEvent(Event{Name: "a", Phase: 'i'}) },
		"Flush":       w.Flush,
		"Close":       w.Close,
	}
	for name, f := range calls {
		err := f()
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close = %v, want ErrClosed", name, err)
		} else if !strings.Contains(err.Error(), "closed") {
			t.Errorf("%s after Close error %q does not say closed", name, err)
		}
	}
	parse(t, buf.Bytes())
}

func TestInvalidEvents(t *testing.T) {
	tests := []struct {
		name string
		f    func(w *Writer) error
		want string
	}{
		{"negative duration", func(w *Writer) error { return w.Complete("a", "", 1, 1, 0, -1, nil) }, `trace: event "a": negative duration -1 s`},
		{"no phase", func(w *Writer) error { return w.WriteEvent(Event{Name: "b"}) }, `trace: event "b": no phase`},
		{"NaN time", func(w *Writer) error { return w.Instant("c", "", 1, 1, nan(), nil) }, `trace: event "c": non-finite time`},
		{"bad args", func(w *Writer) error {
			return w.Instant("d", "", 1, 1, 0, map[string]any{"ch": make(chan int)})
		}, `trace: event "d": json: unsupported type: chan int`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			w := NewWriter(&buf)
			if err := w.ProcessName(1, "ok"); err != nil {
				t.Fatal(err)
			}
			err := tt.f(w)
			if err == nil || err.Error() != tt.want {
				t.Fatalf("error = %v, want %q", err, tt.want)
			}
			// Sticky.
			if err2 := w.ThreadName(1, 1, "t"); err2 != err {
				t.Errorf("next call error = %v, want sticky %v", err2, err)
			}
			// Close reports it but still leaves valid JSON with the good events.
			if err3 := w.Close(); err3 != err {
				t.Errorf("Close() = %v, want %v", err3, err)
			}
			if d := parse(t, buf.Bytes()); len(d.TraceEvents) != 1 {
				t.Errorf("got %d events, want 1", len(d.TraceEvents))
			}
		})
	}
}

func nan() float64 {
	var z float64
	return z / z
}
