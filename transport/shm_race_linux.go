//go:build linux && race

package transport

import (
	"runtime"
	"unsafe"
)

// The race detector does not see atomics on memory outside the Go heap, so
// it cannot know that a consumer's copy out of a shared-memory ring happens
// after the producer's copy in. The runtime solves the same problem for
// file descriptors with one global token released on every write and
// acquired on every read; the rings do likewise.
var shmSync uint64

func raceReleaseRing() { runtime.RaceReleaseMerge(unsafe.Pointer(&shmSync)) }
func raceAcquireRing() { runtime.RaceAcquire(unsafe.Pointer(&shmSync)) }
