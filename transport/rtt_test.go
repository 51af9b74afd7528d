package transport

import (
	"slices"
	"testing"
	"time"
)

// TestRoundTrip: after a ping-pong over loopback the kernel's round trips
// are positive, the minimum is at most the smoothed estimate and at most
// (with slack for the clocks) the shortest round trip the application
// measured, and a closed connection is refused naming its peer.
func TestRoundTrip(t *testing.T) {
	srv, cli := pair(t, testConfig("server", 0), testConfig("worker", 1))
	var app []time.Duration
	for i := range 20 {
		start := time.Now()
		if err := cli.Send(Frame{Header: Header{Kind: KindControl, Key: uint32(i)}, Payload: []byte("ping")}); err != nil {
			t.Fatal(err)
		}
		if _, err := srv.Recv(); err != nil {
			t.Fatal(err)
		}
		if err := srv.Send(Frame{Header: Header{Kind: KindControl, Key: uint32(i)}, Payload: []byte("pong")}); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Recv(); err != nil {
			t.Fatal(err)
		}
		app = append(app, time.Since(start))
	}
	fastest := slices.Min(app)
	for _, c := range []*Conn{cli, srv} {
		rt, err := c.RoundTrip()
		if err != nil {
			t.Fatalf("%s: %v", c.Peer(), err)
		}
		if rt.Min <= 0 || rt.Smoothed < rt.Min || rt.Min > 2*fastest+200*time.Microsecond {
			t.Errorf("%s: kernel round trip min %v, smoothed %v; the application's fastest ping-pong took %v", c.Peer(), rt.Min, rt.Smoothed, fastest)
		}
		t.Logf("%s: min %v, smoothed %v, application's fastest %v", c.Peer(), rt.Min, rt.Smoothed, fastest)
	}
	cli.Close()
	if _, err := cli.RoundTrip(); err == nil {
		t.Error("RoundTrip on a closed connection did not fail")
	} else {
		mustContain(t, err, "round trip", cli.Peer())
	}
}
