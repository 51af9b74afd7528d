package cluster

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/autobyte/autobyte/internal/syncbuf"
	"github.com/autobyte/autobyte/transport"
)

func testConfig(role string, rank int) transport.Config {
	return transport.Config{Token: "t", Role: role, Rank: rank, PeerTimeout: 3 * time.Second}
}

// rank0Listener listens on a free loopback port as worker 0 until the
// test ends.
func rank0Listener(t *testing.T) *transport.Listener {
	t.Helper()
	l, err := transport.Listen("127.0.0.1:0", testConfig("worker", 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// TestRendezvousTimeoutNamesMissing: rank 0 of a job of 3 workers and 1
// server, joined by worker 1 only, gives up after its timeout with an
// error naming worker 2 and server 0 (and not worker 1), logs them while
// it waits, and tells worker 1 why the job ended.
func TestRendezvousTimeoutNamesMissing(t *testing.T) {
	l := rank0Listener(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	joined := make(chan error, 1)
	go func() {
		_, c, err := Join(ctx, l.Addr().String(), Member{Role: "worker", Rank: 1, Digest: "d"}, testConfig("worker", 1), Patience{})
		if c != nil {
			c.Close()
		}
		joined <- err
	}()
	var logs syncbuf.Buffer
	p := Patience{Timeout: 600 * time.Millisecond, Every: 100 * time.Millisecond, Log: slog.New(slog.NewTextHandler(&logs, nil))}
	start := time.Now()
	_, _, _, err := Coordinate(ctx, l, Member{Role: "worker", Rank: 0, Digest: "d"}, 3, 1, p)
	took := time.Since(start)
	var te *RendezvousTimeoutError
	if !errors.As(err, &te) {
		t.Fatalf("Coordinate: got %v, want a *RendezvousTimeoutError", err)
	}
	if want := "still waiting for worker 2 and server 0, of 3 workers and 1 server (a server started by hand serves as many jobs as its --sessions says, 1 by default)."; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
	if took < p.Timeout || took > p.Timeout+3*time.Second {
		t.Errorf("Coordinate gave up after %v, want about %v", took, p.Timeout)
	}
	if got := logs.String(); !strings.Contains(got, "still waiting") || !strings.Contains(got, "worker 2 and server 0") {
		t.Errorf("no progress message naming the missing members; logged:\n%s", got)
	}
	if err := <-joined; err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Errorf("worker 1's Join: got %v, want rank 0's timeout as the reason", err)
	}
}

// unusedAddr is a loopback address on a free port: nobody listens there.
func unusedAddr(t *testing.T) string {
	t.Helper()
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// TestJoinTimeoutWithoutCoordinator: a member whose rank 0 never listens
// gives up after its timeout and says that rank 0 is not listening.
func TestJoinTimeoutWithoutCoordinator(t *testing.T) {
	addr := unusedAddr(t)
	start := time.Now()
	_, _, err := Join(context.Background(), addr, Member{Role: "server", Rank: 0, Digest: "d"}, testConfig("server", 0), Patience{Timeout: 400 * time.Millisecond})
	var te *RendezvousTimeoutError
	if !errors.As(err, &te) || !strings.Contains(err.Error(), "rank 0's autobyte engine to answer: none has yet") || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Join: got %v, want a timeout naming %s and saying rank 0 is not listening", err, addr)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Join gave up after %v, want about 400ms", took)
	}
}

// TestJoinWithoutTimeout: a negative timeout waits until ctx ends (a
// server waiting for a training script's next job), and the error is ctx's,
// not a rendezvous timeout.
func TestJoinWithoutTimeout(t *testing.T) {
	addr := unusedAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err := Join(ctx, addr, Member{Role: "server", Rank: 0, Digest: "d"}, testConfig("server", 0), Patience{Timeout: -1})
	var te *RendezvousTimeoutError
	if err == nil || errors.As(err, &te) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Join without a timeout: %v, want ctx's deadline", err)
	}
	if took := time.Since(start); took < 500*time.Millisecond {
		t.Errorf("Join without a timeout gave up after %v, before ctx ended", took)
	}
}

// TestRendezvousWithinTimeout: a job that gathers before the timeout is
// not disturbed by it, and the watcher stops (no progress message after).
func TestRendezvousWithinTimeout(t *testing.T) {
	l := rank0Listener(t)
	ctx := context.Background()
	go func() {
		time.Sleep(250 * time.Millisecond) // joins after a progress message or two
		_, c, err := Join(ctx, l.Addr().String(), Member{Role: "worker", Rank: 1, Digest: "d"}, testConfig("worker", 1), Patience{Timeout: 5 * time.Second})
		if err == nil {
			c.Close()
		}
	}()
	var logs syncbuf.Buffer
	p := Patience{Timeout: 5 * time.Second, Every: 100 * time.Millisecond, Log: slog.New(slog.NewTextHandler(&logs, nil))}
	table, wconns, _, err := Coordinate(ctx, l, Member{Role: "worker", Rank: 0, Digest: "d"}, 2, 0, p)
	if err != nil {
		t.Fatal(err)
	}
	defer wconns[1].Close()
	if len(table.Workers) != 2 || table.Workers[1].Rank != 1 {
		t.Errorf("table %+v", table)
	}
	before := logs.String()
	if !strings.Contains(before, "worker 1, of 2 workers and 0 servers") {
		t.Errorf("want a progress message naming worker 1 while it was late; logged:\n%s", before)
	}
	time.Sleep(300 * time.Millisecond)
	if after := logs.String(); after != before {
		t.Errorf("progress messages after the rendezvous completed:\n%s", after[len(before):])
	}
}

func TestListMembers(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want string
	}{
		{nil, "nobody"},
		{[]string{"worker 1"}, "worker 1"},
		{[]string{"worker 1", "server 0"}, "worker 1 and server 0"},
		{[]string{"a", "b", "c"}, "a, b and c"},
		{[]string{"1", "2", "3", "4", "5", "6", "7", "8", "9", "10"}, "1, 2, 3, 4, 5, 6, 7, 8 and 2 more"},
	} {
		if got := listMembers(c.in); got != c.want {
			t.Errorf("listMembers(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestParseRendezvousTimeout(t *testing.T) {
	if d, err := ParseRendezvousTimeout("90s"); err != nil || d != 90*time.Second {
		t.Errorf("90s: %v, %v", d, err)
	}
	for _, bad := range []string{"", "0s", "-1m", "ten minutes", "10"} {
		if _, err := ParseRendezvousTimeout(bad); err == nil || !strings.Contains(err.Error(), strconv.Quote(bad)) {
			t.Errorf("%q: got %v, want an error naming the value", bad, err)
		}
	}
}
