//go:build linux && !race

package transport

// Without the race detector the ring's atomics need no annotation; see
// shm_race_linux.go.
func raceReleaseRing() {}
func raceAcquireRing() {}
