package transport

import "time"

// RoundTrip is the kernel's measurement of the connection's round-trip
// time (Linux TCP_INFO), for the tuner's statistics: the runtime sends no
// probes of its own.
type RoundTrip struct {
	// Smoothed is TCP's smoothed estimate (tcpi_rtt): it includes the time
	// segments wait in the path's queues, so it grows under load.
	Smoothed time.Duration
	// Min is the smallest round trip TCP has seen (tcpi_min_rtt): the
	// path's latency without queueing.
	Min time.Duration
}
