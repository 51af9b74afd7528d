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
package main

/*
#include <stdint.h>
*/
import "C"

import (
	"context"
	"errors"
	"os"
	"sync"
	"unsafe"

	"github.com/autobyte/autobyte/bridge"
)

var (
	mu      sync.Mutex
	session *bridge.Session
	// lastErr is per process, like errno without threads: bindings call
	// from one thread at a time per session in practice, and a racing
	// reader at worst sees a newer error.
	errMu   sync.Mutex
	lastErr string
)

func fail(err error) C.int {
	errMu.Lock()
	lastErr = err.Error()
	errMu.Unlock()
	return -1
}

func current() (*bridge.Session, error) {
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
	s, err := bridge.Open(context.Background(), C.GoBytes(unsafe.Pointer(req), n), os.Getenv)
	if err != nil {
		return fail(err)
	}
	session = s
	return 0
}

// ab_post hands over n float32 elements at data as tensor's gradient of
// iteration.
//
//export ab_post
func ab_post(tensor, iteration C.int, data *C.float, n C.int64_t) C.int {
	s, err := current()
	if err != nil {
		return fail(err)
	}
	if data == nil || n < 0 {
		return fail(errors.New("libautobyte: ab_post: no data"))
	}
	grad := unsafe.Slice((*float32)(unsafe.Pointer(data)), int(n))
	if err := s.Post(int(tensor), int(iteration), grad); err != nil {
		return fail(err)
	}
	return 0
}

// ab_wait_layer blocks until every tensor of layer of iteration is summed.
//
//export ab_wait_layer
func ab_wait_layer(layer, iteration C.int) C.int {
	s, err := current()
	if err != nil {
		return fail(err)
	}
	if err := s.WaitLayer(int(layer), int(iteration)); err != nil {
		return fail(err)
	}
	return 0
}

// ab_tuning returns 1 if this session tunes itself (rank 0 with a tuner):
// the binding must then report its steps with ab_mark.
//
//export ab_tuning
func ab_tuning() C.int {
	s, err := current()
	if err != nil || !s.Tuning() {
		return 0
	}
	return 1
}

// ab_mark reports event (0 forward begins, 1 forward ends, 2 backward
// ends) of iteration; a forward end runs the tuner.
//
//export ab_mark
func ab_mark(event, iteration C.int) C.int {
	s, err := current()
	if err != nil {
		return fail(err)
	}
	if err := s.Mark(int(event), int(iteration)); err != nil {
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
	s, err := current()
	if err != nil {
		return fail(err)
	}
	r, err := s.Report()
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
	s := session
	session = nil
	mu.Unlock()
	if s == nil {
		return 0
	}
	why := ""
	if reason != nil {
		why = C.GoString(reason)
	}
	if err := s.Close(ok != 0, why); err != nil {
		return fail(err)
	}
	return 0
}

// ab_last_error copies the last error (NUL-terminated, truncated to fit)
// into buf of size n and returns its full length.
//
//export ab_last_error
func ab_last_error(buf *C.char, n C.int) C.int {
	errMu.Lock()
	msg := lastErr
	errMu.Unlock()
	return copyOut(buf, n, []byte(msg))
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
