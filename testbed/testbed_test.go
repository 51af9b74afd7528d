package testbed

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// requireRoot skips t when the testbed cannot be built here, unless CI=true:
// CI runs as root and must run these tests, so there it fails instead.
func requireRoot(t *testing.T) {
	t.Helper()
	if err := Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true but the testbed is unavailable: %v", err)
		}
		t.Logf("ROOT-ONLY TEST NOT RUN: %s needs root (and ip, tc, network namespaces) to build a testbed: %v", t.Name(), err)
		t.Skipf("skipping: needs root for a testbed (ip, tc, netns; CI=true makes this a failure): %v", err)
	}
}

// requireNetem is requireRoot plus the netem qdisc, which delays need.
func requireNetem(t *testing.T) {
	t.Helper()
	requireRoot(t)
	if err := DelayAvailable(context.Background()); err != nil {
		// A kernel built without netem cannot emulate delay, and no install
		// step can add it (the machines here have no loadable modules). This
		// is a property of the kernel, not a missing package, so CI skips
		// too, saying why; TestDelayWithoutNetem covers the refusal.
		t.Skipf("skipping: this kernel cannot delay packets: %v", err)
	}
}

// uniqueName is a fresh testbed name, "t" + 6 hex digits.
func uniqueName() string {
	b := make([]byte, 3)
	rand.Read(b)
	return "t" + hex.EncodeToString(b)
}

// up builds a testbed with a unique name and removes it when t ends.
func up(t *testing.T, hosts int, rateBps, delayS float64) *Testbed {
	t.Helper()
	name := uniqueName()
	t.Cleanup(func() {
		if err := Down(context.Background(), name); err != nil {
			t.Errorf("Down(%q): %v", name, err)
		}
	})
	tb, err := Up(context.Background(), Options{Name: name, Hosts: hosts, RateBps: rateBps, DelayS: delayS})
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	return tb
}

func netnsList(t *testing.T) []string {
	t.Helper()
	out, err := runIP(context.Background(), "netns", "list")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names
}

func hasPrefix(list []string, prefix string) []string {
	var out []string
	for _, s := range list {
		if strings.HasPrefix(s, prefix) {
			out = append(out, s)
		}
	}
	return out
}

func TestOptionsValidation(t *testing.T) {
	good := Options{Name: "ab", Hosts: 2, RateBps: 1e6, DelayS: 0, Subnet: "10.211.0"}
	cases := []struct {
		mut  func(*Options)
		want string // substring naming the value
	}{
		{func(o *Options) { o.Hosts = 0 }, "hosts 0"},
		{func(o *Options) { o.Hosts = 201 }, "hosts 201"},
		{func(o *Options) { o.RateBps = 0 }, "rate 0"},
		{func(o *Options) { o.RateBps = -5 }, "rate -5"},
		{func(o *Options) { o.DelayS = -0.001 }, "delay -0.001"},
		{func(o *Options) { o.Name = "Bad" }, `name "Bad"`},
		{func(o *Options) { o.Name = "toolongname" }, `name "toolongname"`},
		{func(o *Options) { o.Name = "a_b" }, `name "a_b"`},
		{func(o *Options) { o.Subnet = "8.8.8" }, `subnet "8.8.8"`},
		{func(o *Options) { o.Subnet = "10.211" }, `subnet "10.211"`},
		{func(o *Options) { o.Subnet = "10.211.300" }, `subnet "10.211.300"`},
		{func(o *Options) { o.Congestion = "Cubic" }, `congestion control "Cubic"`},
		{func(o *Options) { o.Congestion = "cubic; reboot" }, `congestion control "cubic; reboot"`},
		{func(o *Options) { o.Congestion = "a_name_of_16_chr" }, `congestion control "a_name_of_16_chr"`},
	}
	for _, c := range cases {
		o := good
		c.mut(&o)
		err := o.validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("validate(%+v) = %v, want error containing %q", o, err, c.want)
		}
		// Up rejects before touching anything (no root needed).
		if _, err := Up(context.Background(), o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Up(%+v) = %v, want error containing %q", o, err, c.want)
		}
	}
	o := Options{Hosts: 1, RateBps: 1}
	o.RateBps = 125e6
	if err := o.validate(); err != nil || o.Name != DefaultName || o.Subnet != DefaultSubnet || o.Congestion != DefaultCongestion {
		t.Errorf("defaults: %+v, %v", o, err)
	}
	if err := Down(context.Background(), "BAD!"); err == nil {
		t.Error("Down accepted an invalid name")
	}
	if _, err := Load("BAD!"); err == nil {
		t.Error("Load accepted an invalid name")
	}
}

func TestHTBParams(t *testing.T) {
	// 1 Gbit/s: burst is one 4 ms tick (500 kB) >= rate/HZ for any HZ >= 250.
	rate, burst, q := htbParams(125e6)
	if rate != 1e9 || burst != 500000 || q != 200000 {
		t.Errorf("1 Gbit/s: rate %d burst %d quantum %d", rate, burst, q)
	}
	// 10 Mbit/s: a tick is 5 kB.
	rate, burst, q = htbParams(1.25e6)
	if rate != 10e6 || burst != 5000 || q != 125000 {
		t.Errorf("10 Mbit/s: rate %d burst %d quantum %d", rate, burst, q)
	}
	// 100 kbit/s: two frames.
	rate, burst, q = htbParams(12.5e3)
	if rate != 100e3 || burst != 2*frameBytes || q != frameBytes {
		t.Errorf("10 Mbit/s: rate %d burst %d quantum %d", rate, burst, q)
	}
}

func TestAvailable(t *testing.T) {
	err := Available()
	t.Logf("Available() = %v", err)
	if os.Geteuid() != 0 && err == nil {
		t.Error("Available() = nil for a non-root user")
	}
	if os.Getenv("CI") == "true" && err != nil {
		t.Errorf("CI=true but Available() = %v", err)
	}
	if err == nil {
		t.Logf("DelayAvailable() = %v", DelayAvailable(context.Background()))
		if slices.ContainsFunc(netnsList(t), func(s string) bool { return strings.HasPrefix(s, "abprobe-") }) {
			t.Error("DelayAvailable left its probe namespace behind")
		}
	}
}

// reachable checks a TCP connection (or ping, if installed) from host a to b.
func reachable(t *testing.T, tb *Testbed, a, b int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if ping, err := exec.LookPath("ping"); err == nil {
		if out, err := tb.Command(ctx, a, ping, "-c1", "-W1", tb.Hosts[b].IP).CombinedOutput(); err != nil {
			t.Errorf("ping h%d -> h%d (%s): %v\n%s", a, b, tb.Hosts[b].IP, err, out)
		}
		return
	}
	port := 7000 + b
	startServer(t, ctx, tb, b, port, "echo")
	cmd := helperCmd(t, ctx, tb, a, "rtt", fmt.Sprintf("%s=%s:%d", addrEnv, tb.Hosts[b].IP, port), countEnv+"=3")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("TCP h%d -> h%d (%s): %v", a, b, tb.Hosts[b].IP, err)
	}
	var r rttReport
	if err := json.Unmarshal(out, &r); err != nil || len(r.RTTsNs) != 3 {
		t.Fatalf("TCP h%d -> h%d: bad report %q: %v", a, b, out, err)
	}
}

func TestUpConnectDown(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	const k = 3
	tb := up(t, k, 125e6, 0)

	// K host namespaces plus the switch, exactly.
	want := []string{tb.SwitchNS}
	for i := range k {
		want = append(want, fmt.Sprintf("%s-h%d", tb.Name, i))
	}
	got := hasPrefix(netnsList(t), tb.Name+"-")
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("namespaces %v, want %v", got, want)
	}
	for i, h := range tb.Hosts {
		if h.IP != fmt.Sprintf("10.211.0.%d", i+1) || h.Namespace != want[i] {
			t.Errorf("host %d: %+v", i, h)
		}
	}

	// The state file round-trips.
	ld, err := Load(tb.Name)
	if err != nil {
		t.Fatal(err)
	}
	if ld.SwitchNS != tb.SwitchNS || len(ld.Hosts) != k || ld.Hosts[2] != tb.Hosts[2] {
		t.Errorf("Load = %+v, want %+v", ld, tb)
	}

	// Every host runs the default congestion control, whatever the root
	// namespace's is, and the state records it.
	if ld.Congestion != DefaultCongestion {
		t.Errorf("state congestion %q, want %q", ld.Congestion, DefaultCongestion)
	}
	for i, h := range tb.Hosts {
		if got := congestionOf(t, tb, i); got != DefaultCongestion {
			t.Errorf("%s: tcp_congestion_control %q, want %q", h.Namespace, got, DefaultCongestion)
		}
	}

	// Lo is up in every namespace, and hosts reach each other.
	for _, ns := range want {
		out, err := runIP(ctx, "-n", ns, "-o", "link", "show", "lo")
		if err != nil || !strings.Contains(out, "UP") {
			t.Errorf("lo in %s not up: %q %v", ns, out, err)
		}
	}
	reachable(t, tb, 0, 1)
	reachable(t, tb, 2, 0)

	// Both directions of each host link are shaped.
	for _, dev := range [][2]string{{tb.Hosts[0].Namespace, "eth0"}, {tb.SwitchNS, "h0"}} {
		out, err := runTC(ctx, "-n", dev[0], "class", "show", "dev", dev[1])
		if err != nil || !strings.Contains(out, "rate 1Gbit") {
			t.Errorf("%s/%s class: %q %v", dev[0], dev[1], out, err)
		}
	}

	// Up twice fails clearly and leaves the first testbed intact.
	_, err = Up(ctx, Options{Name: tb.Name, Hosts: 1, RateBps: 1e6})
	if err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("second Up = %v, want 'already exists'", err)
	}
	if n := len(hasPrefix(netnsList(t), tb.Name+"-")); n != k+1 {
		t.Errorf("after failed Up: %d namespaces, want %d", n, k+1)
	}

	// Command on a bad host fails naming the host.
	if err := tb.Command(ctx, k, "true").Run(); err == nil || !strings.Contains(err.Error(), "host 3") {
		t.Errorf("Command(host %d) = %v", k, err)
	}

	// Down removes everything and is idempotent.
	if err := Down(ctx, tb.Name); err != nil {
		t.Fatal(err)
	}
	if left := hasPrefix(netnsList(t), tb.Name+"-"); len(left) > 0 {
		t.Errorf("after Down: namespaces %v remain", left)
	}
	if _, err := os.Stat(StatePath(tb.Name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Down: state file: %v", err)
	}
	if err := Down(ctx, tb.Name); err != nil {
		t.Errorf("second Down: %v", err)
	}
	if _, err := Load(tb.Name); err == nil || !strings.Contains(err.Error(), "not up") {
		t.Errorf("Load after Down = %v", err)
	}
	// Set on a torn-down testbed names the failing command.
	err = tb.Set(ctx, 0, 1e6, 0)
	t.Logf("Set after Down: %v", err)
	if err == nil || !strings.Contains(err.Error(), "tc -n "+tb.Hosts[0].Namespace) {
		t.Errorf("Set after Down = %v", err)
	}
}

func TestUpCleansUpOnFailure(t *testing.T) {
	requireRoot(t)
	name := uniqueName()
	t.Cleanup(func() { upHook = nil; Down(context.Background(), name) })
	upHook = func(i int) error {
		if i == 1 {
			return errors.New("injected failure")
		}
		return nil
	}
	_, err := Up(context.Background(), Options{Name: name, Hosts: 3, RateBps: 1e6})
	if err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("Up = %v, want the injected failure", err)
	}
	if left := hasPrefix(netnsList(t), name+"-"); len(left) > 0 {
		t.Errorf("failed Up left namespaces %v", left)
	}
	if _, err := os.Stat(StatePath(name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("failed Up left state file: %v", err)
	}
}

// TestWithAlgorithm: the edit of the allowed list adds a missing name at
// the end and leaves a list that has it as it is.
func TestWithAlgorithm(t *testing.T) {
	for _, c := range []struct {
		list, algo, want string
		missing          bool
	}{
		{"reno bbr\n", "cubic", "reno bbr cubic", true},
		{"reno cubic bbr", "cubic", "reno cubic bbr", false},
		{"", "reno", "reno", true},
		{"renoX", "reno", "renoX reno", true}, // whole names only
	} {
		got, missing := withAlgorithm(c.list, c.algo)
		if got != c.want || missing != c.missing {
			t.Errorf("withAlgorithm(%q, %q) = %q, %v; want %q, %v", c.list, c.algo, got, missing, c.want, c.missing)
		}
	}
}

// TestCongestion: a testbed's hosts use the algorithm asked for, not the
// root namespace's; a name the kernel does not know fails naming it and
// what the kernel offers, and leaves nothing behind.
func TestCongestion(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	root := strings.TrimSpace(readFile(t, "/proc/sys/net/ipv4/tcp_congestion_control"))
	// The default, unless the root namespace has it already. On a host
	// that defaults to another, namespaces may not select it until Up
	// allows it (tcp_allowed_congestion_control holds reno and the root's
	// default), and its module may not be loaded yet.
	want := DefaultCongestion
	if root == want {
		want = "reno" // built into every kernel
	}
	name := uniqueName()
	t.Cleanup(func() { Down(context.Background(), name) })
	tb, err := Up(ctx, Options{Name: name, Hosts: 2, RateBps: 1e6, Congestion: want})
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range tb.Hosts {
		if got := congestionOf(t, tb, i); got != want {
			t.Errorf("%s: tcp_congestion_control %q, want %q (root namespace: %q)", h.Namespace, got, want, root)
		}
	}
	if allowed := strings.Fields(readFile(t, allowedCongestionSysctl)); !slices.Contains(allowed, want) {
		t.Errorf("%s after Up: %q, want %q in it", allowedCongestionSysctl, allowed, want)
	}
	if got := strings.TrimSpace(readFile(t, "/proc/sys/net/ipv4/tcp_congestion_control")); got != root {
		t.Errorf("root namespace's congestion control changed from %q to %q", root, got)
	}
	// SetCongestion changes every host of a running testbed and its state.
	if err := tb.SetCongestion(ctx, root); err != nil {
		t.Fatal(err)
	}
	for i, h := range tb.Hosts {
		if got := congestionOf(t, tb, i); got != root {
			t.Errorf("after SetCongestion(%q): %s has %q", root, h.Namespace, got)
		}
	}
	if ld, err := Load(name); err != nil || ld.Congestion != root {
		t.Errorf("state after SetCongestion(%q): %+v, %v", root, ld, err)
	}
	if err := tb.SetCongestion(ctx, "no such"); err == nil || !strings.Contains(err.Error(), `"no such"`) {
		t.Errorf("SetCongestion(\"no such\") = %v, want an error naming it", err)
	}
	if err := Down(ctx, name); err != nil {
		t.Fatal(err)
	}

	_, err = Up(ctx, Options{Name: name, Hosts: 2, RateBps: 1e6, Congestion: "nosuchalgo"})
	if err == nil || !strings.Contains(err.Error(), `"nosuchalgo"`) || !strings.Contains(err.Error(), "offers: ") {
		t.Fatalf("Up with an unknown algorithm = %v, want an error naming it and what the kernel offers", err)
	}
	if left := hasPrefix(netnsList(t), name+"-"); len(left) > 0 {
		t.Errorf("failed Up left namespaces %v", left)
	}
}

// congestionOf is the TCP congestion control of tb's host.
func congestionOf(t *testing.T, tb *Testbed, host int) string {
	t.Helper()
	out, err := tb.Command(context.Background(), host, "cat", congestionSysctl).Output()
	if err != nil {
		t.Fatalf("reading %s in host %d: %v", congestionSysctl, host, err)
	}
	return strings.TrimSpace(string(out))
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// transfer moves traffic from host 0 to host 1 (nbytes, or for secs seconds
// if nbytes is 0), calling during (if not nil) once the sender runs, and
// returns the sink's report.
func transfer(t *testing.T, tb *Testbed, nbytes int64, secs float64, during func()) sinkReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const port = 5201
	sink, out := startServer(t, ctx, tb, 1, port, "sink")
	send := helperCmd(t, ctx, tb, 0, "send", fmt.Sprintf("%s=%s:%d", addrEnv, tb.Hosts[1].IP, port),
		fmt.Sprintf("%s=%d", bytesEnv, nbytes), fmt.Sprintf("%s=%g", secsEnv, secs))
	if err := send.Start(); err != nil {
		t.Fatal(err)
	}
	if during != nil {
		during()
	}
	if err := send.Wait(); err != nil {
		t.Fatalf("sender: %v", err)
	}
	var r sinkReport
	if err := json.NewDecoder(out).Decode(&r); err != nil {
		t.Fatalf("sink report: %v", err)
	}
	sink.Wait()
	return r
}

// rateOver is the sink's goodput (bytes/s) between times a and b (seconds
// since the first byte), from its samples.
func rateOver(r sinkReport, a, b float64) float64 {
	at := func(s float64) (float64, float64) { // first sample at or after s
		for _, p := range r.Samples {
			if float64(p[0])/1e9 >= s {
				return float64(p[0]) / 1e9, float64(p[1])
			}
		}
		p := r.Samples[len(r.Samples)-1]
		return float64(p[0]) / 1e9, float64(p[1])
	}
	ta, ba := at(a)
	tb, bb := at(b)
	return (bb - ba) / (tb - ta)
}

func checkThroughput(t *testing.T, rateBps float64, nbytes int64) {
	requireRoot(t)
	tb := up(t, 2, rateBps, 0)
	r := transfer(t, tb, nbytes, 0, nil)
	if r.Bytes != nbytes {
		t.Fatalf("sink got %d bytes, want %d", r.Bytes, nbytes)
	}
	secs := float64(r.LastNs-r.FirstNs) / 1e9
	got := float64(r.Bytes) / secs
	ratio := got / rateBps
	t.Logf("shaped %.1f Mbit/s, measured TCP goodput %.1f Mbit/s (%.1f%%) moving %.1f MB in %.2f s",
		rateBps*8/1e6, got*8/1e6, 100*ratio, float64(nbytes)/1e6, secs)
	if ratio < 0.85 || ratio > 1.05 {
		t.Errorf("goodput %.1f Mbit/s is %.1f%% of the shaped %.1f Mbit/s, want 85..105%%", got*8/1e6, 100*ratio, rateBps*8/1e6)
	}
}

func TestThroughput1Gbit(t *testing.T)   { checkThroughput(t, 1e9/8, 50e6) }
func TestThroughput100Mbit(t *testing.T) { checkThroughput(t, 100e6/8, 30e6) }
func TestThroughput10Mbit(t *testing.T)  { checkThroughput(t, 10e6/8, 2.5e6) }

func TestSetMidTransfer(t *testing.T) {
	requireRoot(t)
	const before, after = 100e6 / 8, 25e6 / 8
	tb := up(t, 2, before, 0)
	var setErr error
	r := transfer(t, tb, 0, 3.5, func() {
		time.Sleep(1600 * time.Millisecond)
		// Lower host 1's rate: its download is shaped on h1 in the switch.
		setErr = tb.Set(context.Background(), 1, after, 0)
	})
	if setErr != nil {
		t.Fatalf("Set: %v", setErr)
	}
	// The connection survived (the sender finished without error) and the
	// rate followed the change.
	r1, r2 := rateOver(r, 0.5, 1.4), rateOver(r, 2.2, 3.3)
	t.Logf("before Set: shaped %.0f Mbit/s, measured %.1f; after: shaped %.0f, measured %.1f",
		before*8/1e6, r1*8/1e6, after*8/1e6, r2*8/1e6)
	if q := r1 / before; q < 0.85 || q > 1.05 {
		t.Errorf("before Set: %.1f%% of shaped rate", 100*q)
	}
	if q := r2 / after; q < 0.85 || q > 1.05 {
		t.Errorf("after Set: %.1f%% of shaped rate", 100*q)
	}
	ld, err := Load(tb.Name)
	if err != nil || ld.Hosts[1].RateBps != after || ld.Hosts[0].RateBps != before {
		t.Errorf("state after Set: %+v, %v", ld, err)
	}
	if err := tb.Set(context.Background(), 2, after, 0); err == nil || !strings.Contains(err.Error(), "host 2") {
		t.Errorf("Set(host 2) = %v", err)
	}
	if err := tb.Set(context.Background(), 0, -1, 0); err == nil || !strings.Contains(err.Error(), "rate -1") {
		t.Errorf("Set(rate -1) = %v", err)
	}
}

// rttMin returns the smallest TCP echo round trip from host 0 to host 1.
func rttMin(t *testing.T, tb *Testbed, port int) (connect, best time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	startServer(t, ctx, tb, 1, port, "echo")
	out, err := helperCmd(t, ctx, tb, 0, "rtt", fmt.Sprintf("%s=%s:%d", addrEnv, tb.Hosts[1].IP, port), countEnv+"=10").Output()
	if err != nil {
		t.Fatalf("rtt: %v", err)
	}
	var r rttReport
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatal(err)
	}
	best = time.Duration(slices.Min(r.RTTsNs))
	return time.Duration(r.ConnectNs), best
}

func TestDelay(t *testing.T) {
	requireNetem(t)
	const delay = 5e-3 // one-way host to host
	tb := up(t, 2, 1e9/8, delay)
	conn, rtt := rttMin(t, tb, 7100)
	t.Logf("one-way delay %.1f ms configured: TCP connect %v, min echo RTT %v", delay*1e3, conn, rtt)
	if rtt < 9500*time.Microsecond || rtt > 20*time.Millisecond {
		t.Errorf("RTT %v, want about %v (9.5..20 ms)", rtt, time.Duration(2*delay*float64(time.Second)))
	}
	// Set changes the delay in place.
	if err := tb.Set(context.Background(), 0, 1e9/8, 0); err != nil {
		t.Fatal(err)
	}
	if err := tb.Set(context.Background(), 1, 1e9/8, 0); err != nil {
		t.Fatal(err)
	}
	_, rtt = rttMin(t, tb, 7101)
	if rtt > 3*time.Millisecond {
		t.Errorf("RTT %v after setting delay 0", rtt)
	}
}

func TestDelayWithoutNetem(t *testing.T) {
	requireRoot(t)
	if DelayAvailable(context.Background()) == nil {
		t.Skip("netem present; covered by TestDelay")
	}
	name := uniqueName()
	t.Cleanup(func() { Down(context.Background(), name) })
	_, err := Up(context.Background(), Options{Name: name, Hosts: 2, RateBps: 1e6, DelayS: 0.005})
	if err == nil || !strings.Contains(err.Error(), "netem") || !strings.Contains(err.Error(), "delay 0.005") {
		t.Errorf("Up with a delay and no netem = %v", err)
	}
	if left := hasPrefix(netnsList(t), name+"-"); len(left) > 0 {
		t.Errorf("failed Up left namespaces %v", left)
	}
	tb := up(t, 1, 1e6, 0)
	if err := tb.Set(context.Background(), 0, 1e6, 0.001); err == nil || !strings.Contains(err.Error(), "netem") {
		t.Errorf("Set with a delay and no netem = %v", err)
	}
}
