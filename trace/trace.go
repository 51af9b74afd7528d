// Package trace owns writing Chrome trace-event JSON timelines, as read by
// chrome://tracing and Perfetto (the "JSON Array/Object format"); it knows
// nothing of what the events mean.
//
// A Writer streams events to an io.Writer as they are added, producing
//
//	{"traceEvents":[
//	{...},
//	{...}
//	]}
//
// so that traces with millions of events never sit in memory. Times are
// given to the Writer's convenience methods in seconds and written in
// microseconds, the unit of the trace-event format.
package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
)

// Trace-event phases written by this package.
const (
	PhaseComplete = 'X' // a span with a start time and duration
	PhaseInstant  = 'i' // a point in time
	PhaseMetadata = 'M' // process and thread names
)

// ErrClosed is returned by Writer methods called after Close.
var ErrClosed = errors.New("trace: writer is closed")

// Event is one trace event. TsUS and DurUS are in microseconds; DurUS is
// written only for complete ('X') events. Args is optional and must be
// encodable by encoding/json.
type Event struct {
	Name  string
	Cat   string
	Phase byte // 'X' complete, 'i' instant, 'M' metadata; other trace-event phases are passed through
	TsUS  float64
	DurUS float64
	PID   int
	TID   int
	Args  map[string]any
}

// jsonEvent is the wire form of an Event.
type jsonEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"`
	Dur  *float64       `json:"dur,omitempty"`
	PID  int            `json:"pid"`
	TID  int            `json:"tid"`
	S    string         `json:"s,omitempty"`
	Args map[string]any `json:"args,omitempty"`
}

// Writer streams trace events as a JSON object {"traceEvents":[...]} to an
// underlying io.Writer. Output is buffered; Close writes the closing
// brackets and flushes. Close does not close the underlying io.Writer.
//
// The first error (from encoding an event or from the underlying writer)
// is sticky: every later call returns it. If the error did not come from
// the underlying writer, Close still completes the document so the output
// stays valid JSON, and returns the error.
//
// A Writer is not safe for concurrent use.
type Writer struct {
	bw      *bufio.Writer
	buf     bytes.Buffer
	enc     *json.Encoder
	n       int   // events written
	err     error // first error, sticky
	ioErr   bool  // err came from the underlying writer; output is broken
	started bool  // header written
	closed  bool
}

// NewWriter returns a Writer that writes a trace to w. Nothing is written
// until the first event or Close.
func NewWriter(w io.Writer) *Writer {
	tw := &Writer{bw: bufio.NewWriterSize(w, 64<<10)}
	tw.enc = json.NewEncoder(&tw.buf)
	tw.enc.SetEscapeHTML(false)
	return tw
}

// Len reports the number of events written so far.
func (w *Writer) Len() int { return w.n }

// Complete writes a complete ('X') event spanning [startS, startS+durS)
// seconds on thread tid of process pid. durS must not be negative and
// times must be finite. args may be nil.
func (w *Writer) Complete(name, cat string, pid, tid int, startS, durS float64, args map[string]any) error {
	if err := w.check(); err != nil {
		return err
	}
	if durS < 0 {
		return w.fail(fmt.Errorf("trace: event %q: negative duration %g s", name, durS), false)
	}
	return w.WriteEvent(Event{
		Name: name, Cat: cat, Phase: PhaseComplete,
		TsUS: startS * 1e6, DurUS: durS * 1e6,
		PID: pid, TID: tid, Args: args,
	})
}

// Instant writes an instant ('i') event at atS seconds, scoped to thread
// tid of process pid. args may be nil.
func (w *Writer) Instant(name, cat string, pid, tid int, atS float64, args map[string]any) error {
	return w.WriteEvent(Event{
		Name: name, Cat: cat, Phase: PhaseInstant,
		TsUS: atS * 1e6, PID: pid, TID: tid, Args: args,
	})
}

// ProcessName writes a metadata event naming process pid.
func (w *Writer) ProcessName(pid int, name string) error {
	return w.WriteEvent(Event{
		Name: "process_name", Phase: PhaseMetadata, PID: pid,
		Args: map[string]any{"name": name},
	})
}

// ThreadName writes a metadata event naming thread tid of process pid.
func (w *Writer) ThreadName(pid, tid int, name string) error {
	return w.WriteEvent(Event{
		Name: "thread_name", Phase: PhaseMetadata, PID: pid, TID: tid,
		Args: map[string]any{"name": name},
	})
}

// WriteEvent writes e as given. Its phase must be set and its times
// finite.
func (w *Writer) WriteEvent(e Event) error {
	if err := w.check(); err != nil {
		return err
	}
	if e.Phase == 0 {
		return w.fail(fmt.Errorf("trace: event %q: no phase", e.Name), false)
	}
	if !finite(e.TsUS) || !finite(e.DurUS) {
		return w.fail(fmt.Errorf("trace: event %q: non-finite time", e.Name), false)
	}
	je := jsonEvent{
		Name: e.Name, Cat: e.Cat, Ph: string(rune(e.Phase)),
		Ts: e.TsUS, PID: e.PID, TID: e.TID, Args: e.Args,
	}
	if e.Phase == PhaseComplete {
		d := e.DurUS
		je.Dur = &d
	}
	if e.Phase == PhaseInstant {
		je.S = "t"
	}
	w.buf.Reset()
	if err := w.enc.Encode(&je); err != nil {
		return w.fail(fmt.Errorf("trace: event %q: %w", e.Name, err), false)
	}
	b := bytes.TrimSuffix(w.buf.Bytes(), []byte("\n"))
	sep := ",\n"
	if !w.started {
		sep = "{\"traceEvents\":[\n"
		w.started = true
	}
	if _, err := w.bw.WriteString(sep); err != nil {
		return w.fail(err, true)
	}
	if _, err := w.bw.Write(b); err != nil {
		return w.fail(err, true)
	}
	w.n++
	return nil
}

// Flush writes any buffered output to the underlying io.Writer. The output
// is not valid JSON until Close.
func (w *Writer) Flush() error {
	if err := w.check(); err != nil {
		return err
	}
	if err := w.bw.Flush(); err != nil {
		return w.fail(err, true)
	}
	return nil
}

// Close ends the traceEvents array and the enclosing object and flushes
// buffered output. It returns the Writer's first error, if any. Calling
// Close again, or any other method after Close, returns ErrClosed.
func (w *Writer) Close() error {
	if w.closed {
		return ErrClosed
	}
	w.closed = true
	if w.ioErr {
		return w.err
	}
	tail := "\n]}\n"
	if !w.started {
		tail = "{\"traceEvents\":[]}\n"
		w.started = true
	}
	if _, err := w.bw.WriteString(tail); err != nil {
		return w.fail(err, true)
	}
	if err := w.bw.Flush(); err != nil {
		return w.fail(err, true)
	}
	return w.err
}

// check returns the error that a write must fail with, if any.
func (w *Writer) check() error {
	if w.closed {
		return ErrClosed
	}
	return w.err
}

// fail records err as the sticky error if it is the first, and returns
// the sticky error. io marks errors from the underlying writer.
func (w *Writer) fail(err error, io bool) error {
	if w.err == nil {
		w.err = err
	}
	if io {
		w.ioErr = true
	}
	return w.err
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }
