// Command libautobyte is the worker engine as a C shared library, for
// language bindings loaded in the training process (the PyTorch plugin
// loads it with ctypes):
//
//	go build -buildmode=c-shared -o python/autobyte/libautobyte.so ./cmd/libautobyte
//
// A process has at most one session. Every call returns 0 on success and
// -1 on failure, with the reason available from ab_last_error. Calls block
// only the calling thread (ctypes releases Python's GIL around them).
//
// Gradient memory is the caller's: ab_post hands the engine a pointer, the
// engine sends from it and writes the sum over all workers back into it, and
// the caller must not touch or free it until ab_wait_layer returned for the
// tensor's layer and iteration. No copy is made on the Go side.
//
// ab_post, ab_wait_layer and ab_last_error are C (handoff.c), so that the
// training thread never enters the Go runtime on its hot path: ab_post
// queues and returns (its errors: bad arguments at once, the engine's at a
// later call), the engine's goroutine drains the queue (drain below).
package main

/*
#include <stdint.h>
#include <stdlib.h>
#include "handoff.h"
*/
import "C"

import (
	"context"
	"errors"
	"os"
	"sync"
	"time"
	"unsafe"

	"github.com/autobyte/autobyte/bridge"
	"github.com/autobyte/autobyte/worker"
)

// open is the process's session: at most one.
type open struct {
	s       *bridge.Session
	wake    *os.File // the eventfd handoff.c writes when the queue stops being empty
	drained chan struct{}
	// The clocks at the start: waits measured in C (CLOCK_MONOTONIC) are
	// reported to the tuner as times of Go's clock.
	wall0 time.Time
	mono0 int64
}

var (
	mu      sync.Mutex
	session *open
)

func fail(err error) C.int {
	setError(err.Error())
	return -1
}

func setError(msg string) {
	cs := C.CString(msg)
	C.abh_set_error(cs)
	C.free(unsafe.Pointer(cs))
}

// stop tells handoff.c that the engine stopped (or refused a post): the
// training thread's next post or wait fails with err.
func stop(err error) {
	cs := C.CString(err.Error())
	C.abh_stop(cs)
	C.free(unsafe.Pointer(cs))
}

func current() (*open, error) {
	mu.Lock()
	defer mu.Unlock()
	if session == nil {
		return nil, errors.New("libautobyte: no session (call ab_open first, or the session was closed)")
	}
	return session, nil
}

// ab_open joins the job described by the JSON request (see
// bridge.Request) and the environment, and starts the engine.
//
//export ab_open
func ab_open(req *C.char, n C.int) C.int {
	mu.Lock()
	defer mu.Unlock()
	if session != nil {
		return fail(errors.New("libautobyte: a session is already open in this process"))
	}
	if req == nil || n < 0 {
		return fail(errors.New("libautobyte: ab_open: no request"))
	}
	o := &open{drained: make(chan struct{})}
	// The engine may open a layer or stop before Open returns; handoff.c
	// is open before it, and o.s is not needed by the hooks.
	hooks := bridge.Hooks{
		OnOpen: func(layer, iteration int) { C.abh_opened(C.int(layer), C.int(iteration)) },
		OnStop: stop,
	}
	r, err := bridge.DecodeRequest(C.GoBytes(unsafe.Pointer(req), n))
	if err != nil {
		return fail(err)
	}
	layers := 0
	elems := make([]C.int64_t, max(len(r.Tensors), 1)) // copied by abh_open
	for i, t := range r.Tensors {
		elems[i] = C.int64_t(t.Elems)
		layers = max(layers, t.Layer+1)
	}
	fd := C.abh_open(C.int(len(r.Tensors)), &elems[0], C.int(layers))
	if fd < 0 {
		return -1 // handoff.c set the error
	}
	o.wake = os.NewFile(uintptr(fd), "libautobyte-handoff")
	s, err := bridge.OpenRequest(context.Background(), r, os.Getenv, hooks)
	if err != nil {
		_ = o.wake.Close()
		C.abh_close()
		return fail(err)
	}
	C.abh_set_wait_limit(C.int64_t(s.WaitTimeout().Nanoseconds()))
	if s.Tuning() {
		C.abh_record_waits(1)
	}
	o.s = s
	o.wall0, o.mono0 = time.Now(), int64(C.abh_now())
	go o.drain()
	session = o
	return 0
}

// drain hands the queued gradients to the engine until the session closes,
// each run of one iteration as one event.
func (o *open) drain() {
	defer close(o.drained)
	var word [8]byte
	buf := make([]C.abh_post, 256)
	var posts []worker.Posting
	for {
		if _, err := o.wake.Read(word[:]); err != nil {
			return // closed by ab_close
		}
		// Until the queue is empty: a post into the empty queue wakes
		// the next read.
		for n := len(buf); n == len(buf); {
			n = int(C.abh_take(&buf[0], C.int(len(buf))))
			for i := 0; i < n; {
				k := int(buf[i].iteration)
				posts = posts[:0]
				for ; i < n && int(buf[i].iteration) == k; i++ {
					p := buf[i]
					posts = append(posts, worker.Posting{Tensor: int(p.tensor), Grad: unsafe.Slice((*float32)(unsafe.Pointer(p.data)), int(p.n))})
				}
				if err := o.s.PostAll(k, posts); err != nil {
					stop(err)
				}
			}
		}
	}
}

// reportWaits hands the waits handoff.c recorded to the tuner.
func (o *open) reportWaits() {
	var buf [2 * 256]C.int64_t
	for {
		n := int(C.abh_take_waits(&buf[0], 256))
		for i := range n {
			from := o.wall0.Add(time.Duration(int64(buf[2*i]) - o.mono0))
			to := o.wall0.Add(time.Duration(int64(buf[2*i+1]) - o.mono0))
			o.s.Waited(from, to)
		}
		if n < 256 {
			return
		}
	}
}

// ab_tuning returns 1 if this session tunes itself (rank 0 with a tuner):
// the binding must then report its steps with ab_mark.
//
//export ab_tuning
func ab_tuning() C.int {
	o, err := current()
	if err != nil || !o.s.Tuning() {
		return 0
	}
	return 1
}

// ab_mark reports event (0 forward begins, 1 forward ends, 2 backward
// ends) of iteration; a forward end runs the tuner.
//
//export ab_mark
func ab_mark(event, iteration C.int) C.int {
	o, err := current()
	if err != nil {
		return fail(err)
	}
	o.reportWaits()
	if err := o.s.Mark(int(event), int(iteration)); err != nil {
		return fail(err)
	}
	return 0
}

// ab_report copies the session's report (JSON, see bridge.Session.Report)
// into buf of size n, NUL-terminated, and returns its full length (-1 on
// failure).
//
//export ab_report
func ab_report(buf *C.char, n C.int) C.int {
	o, err := current()
	if err != nil {
		return fail(err)
	}
	r, err := o.s.Report()
	if err != nil {
		return fail(err)
	}
	return copyOut(buf, n, r)
}

// ab_close ends the session: ok != 0 says goodbye to every peer; otherwise
// the peers are told reason (may be NULL) as this worker's failure.
//
//export ab_close
func ab_close(ok C.int, reason *C.char) C.int {
	mu.Lock()
	o := session
	session = nil
	mu.Unlock()
	if o == nil {
		return 0
	}
	why := ""
	if reason != nil {
		why = C.GoString(reason)
	}
	err := o.s.Close(ok != 0, why)
	_ = o.wake.Close()
	<-o.drained
	C.abh_close()
	if err != nil {
		return fail(err)
	}
	return 0
}

// copyOut copies b into the caller's buffer buf of size n, truncated and
// NUL-terminated, and returns b's full length.
func copyOut(buf *C.char, n C.int, b []byte) C.int {
	if buf != nil && n > 0 {
		dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(n))
		k := copy(dst[:n-1], b)
		dst[k] = 0
	}
	return C.int(len(b))
}

func main() {}
