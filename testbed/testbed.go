// Package testbed owns the network namespaces, veth pairs, Linux bridge and tc
// shaping that let a multi-host run (parameter servers, workers) execute on one
// machine while its traffic crosses a real, shaped network. It knows nothing
// of training: it makes hosts, shapes their links and runs commands in them.
//
// A testbed named NAME is a switch namespace NAME-sw holding a bridge br0 and
// K host namespaces NAME-h0..NAME-h{K-1}. Host i has eth0 (SUBNET.(i+1)/24)
// whose veth peer hi sits in NAME-sw, enslaved to br0. Each host's link is
// shaped in both directions: its upload on eth0 (egress of the host) and its
// download on hi (the bridge's egress toward the host). See docs/testbed.md.
//
// Everything is created inside namespaces with the testbed's prefix; the root
// namespace's interfaces, routes, addresses and firewall are never touched.
// It drives iproute2's ip and tc and must run as root.
package testbed

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// DefaultName is the testbed name used when Options.Name is empty.
const DefaultName = "ab"

// DefaultSubnet is the /24 prefix (first three octets) used when
// Options.Subnet is empty. Host i gets DefaultSubnet.(i+1).
const DefaultSubnet = "10.211.0"

// MaxHosts is the largest number of hosts a testbed may have.
const MaxHosts = 200

// DefaultCongestion is the TCP congestion control every host uses when
// Options.Congestion is empty: Linux's own default. A host namespace would
// otherwise inherit whatever this machine's root namespace uses (BBR on
// some), and that changes how flows share a shaped link enough to move
// iteration times by 20% (docs/runtime.md, "The simulator predicts real
// runs"), so a testbed names its choice rather than inheriting it.
const DefaultCongestion = "cubic"

// StateDir holds one JSON state file per testbed, testbed-NAME.json.
var StateDir = "/run/autobyte"

// Options configure Up.
type Options struct {
	// Name is the testbed name, [a-z0-9-]{1,8}; "" means DefaultName.
	Name string
	// Hosts is the number of host namespaces, 1..MaxHosts.
	Hosts int
	// RateBps is every host's link rate in bytes per second, applied to its
	// upload and to its download separately (full duplex). > 0.
	RateBps float64
	// DelayS is the one-way host-to-host latency in seconds added when both
	// hosts have this delay: half is applied on the sender's upload and half
	// on the receiver's download, so an RTT is 2*DelayS. >= 0. A delay > 0
	// needs the kernel's netem qdisc.
	DelayS float64
	// Subnet is the first three octets of a private IPv4 /24 used only inside
	// the testbed's namespaces; "" means DefaultSubnet.
	Subnet string
	// Congestion is the TCP congestion control algorithm of every host
	// (net.ipv4.tcp_congestion_control in its namespace), e.g. "cubic",
	// "bbr", "reno"; "" means DefaultCongestion. The kernel must offer it.
	// A namespace other than the root's may only select an algorithm of
	// net.ipv4.tcp_allowed_congestion_control, which holds only reno and
	// the root's default on a host that does not default to cubic: Up adds
	// the algorithm to that list when it is missing (a host-wide setting
	// that only lets namespaces and unprivileged sockets select it) and
	// leaves it there.
	Congestion string
}

// Host is one emulated host.
type Host struct {
	Index     int    `json:"index"`
	Namespace string `json:"namespace"`
	// IP is the address of eth0 in Namespace (without prefix length).
	IP string `json:"ip"`
	// SwitchPort is the host's veth peer in the switch namespace.
	SwitchPort string  `json:"switch_port"`
	RateBps    float64 `json:"rate_bps"`
	DelayS     float64 `json:"delay_s"`
}

// Testbed is a running testbed, as created by Up or read by Load.
type Testbed struct {
	Name     string `json:"name"`
	Subnet   string `json:"subnet"`
	SwitchNS string `json:"switch_ns"`
	Bridge   string `json:"bridge"`
	// Netem records whether the host links carry a netem leaf (delay
	// support); without it, Set accepts only a zero delay.
	Netem bool `json:"netem"`
	// Congestion is the hosts' TCP congestion control (Options.Congestion);
	// empty when a state file does not record it.
	Congestion string `json:"congestion,omitempty"`
	Hosts      []Host `json:"hosts"`

	mu sync.Mutex // serialises Set and the state-file rewrite
}

const (
	hostIf   = "eth0"
	bridgeIf = "br0"
	// linkMTU is the veth MTU; shaping parameters are derived from it.
	linkMTU = 1500
	// frameBytes is the largest frame on the link (MTU + Ethernet header).
	frameBytes = linkMTU + 14
	// gsoBytes is the largest GSO/TSO super-packet a veth hands the qdisc.
	gsoBytes = 65536
	// kernelHZ is the tick rate the burst is sized for; 1000 is the largest
	// common CONFIG_HZ, so sizing for 250 (4 ms) is conservative for all.
	kernelHZ = 250
	// netemLimit is the netem queue length in packets; it must hold at least
	// rate*delay worth of packets or netem drops.
	netemLimit = 100000
	// fifoLimit is the leaf queue length in packets when netem is absent.
	fifoLimit = 1000
)

// upHook, if set (by tests), runs after each host is built; an error makes
// Up fail there, to exercise the cleanup.
var upHook func(host int) error

var nameRE = regexp.MustCompile(`^[a-z0-9-]{1,8}$`)

// congestionRE: the kernel's algorithm names are at most 15 characters
// (TCP_CA_NAME_MAX less the NUL) of lower case, digits and '_'.
var congestionRE = regexp.MustCompile(`^[a-z0-9_]{1,15}$`)

// tool paths, resolved once.
var (
	toolOnce       sync.Once
	ipPath, tcPath string
	toolErr        error
)

func findTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("testbed: %s (iproute2) not found in PATH, /usr/sbin or /sbin", name)
}

func tools() (ip, tc string, err error) {
	toolOnce.Do(func() {
		var e1, e2 error
		ipPath, e1 = findTool("ip")
		tcPath, e2 = findTool("tc")
		toolErr = errors.Join(e1, e2)
	})
	return ipPath, tcPath, toolErr
}

// Available returns nil if this process can build a testbed: it runs as root,
// ip and tc are installed and the kernel supports network namespaces.
// Otherwise the error says everything that is missing. It changes nothing.
func Available() error {
	var errs []error
	if uid := os.Geteuid(); uid != 0 {
		errs = append(errs, fmt.Errorf("testbed: must run as root (euid is %d)", uid))
	}
	if _, _, err := tools(); err != nil {
		errs = append(errs, err)
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		errs = append(errs, fmt.Errorf("testbed: kernel lacks network namespaces: %v", err))
	}
	return errors.Join(errs...)
}

// DelayAvailable returns nil if the kernel has the netem qdisc, which delays
// need. It probes by creating and deleting a temporary namespace
// "abprobe-PID" and adding netem to its loopback; nothing else is touched.
func DelayAvailable(ctx context.Context) error {
	if err := Available(); err != nil {
		return err
	}
	ns := fmt.Sprintf("abprobe-%d", os.Getpid())
	if _, err := runIP(ctx, "netns", "add", ns); err != nil {
		return err
	}
	defer runIP(context.WithoutCancel(ctx), "netns", "del", ns) //nolint:errcheck
	return probeNetem(ctx, ns)
}

// probeNetem tries a netem qdisc on ns's loopback and removes it.
func probeNetem(ctx context.Context, ns string) error {
	if _, err := runTC(ctx, "-n", ns, "qdisc", "add", "dev", "lo", "root", "handle", "1:", "netem", "delay", "0us"); err != nil {
		return fmt.Errorf("%w (the kernel lacks the netem qdisc, sch_netem, which a delay > 0 needs)", err)
	}
	_, err := runTC(ctx, "-n", ns, "qdisc", "del", "dev", "lo", "root")
	return err
}

// CommandError is a failed ip or tc invocation.
type CommandError struct {
	Args   []string // the full command line
	Err    error
	Stderr string
}

func (e *CommandError) Error() string {
	msg := fmt.Sprintf("testbed: `%s` failed: %v", strings.Join(e.Args, " "), e.Err)
	if e.Stderr != "" {
		msg += ": " + e.Stderr
	}
	return msg
}

func (e *CommandError) Unwrap() error { return e.Err }

func run(ctx context.Context, path string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, path, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), &CommandError{Args: append([]string{filepath.Base(path)}, args...), Err: err, Stderr: strings.TrimSpace(stderr.String())}
	}
	return stdout.String(), nil
}

func runIP(ctx context.Context, args ...string) (string, error) {
	ip, _, err := tools()
	if err != nil {
		return "", err
	}
	return run(ctx, ip, args...)
}

func runTC(ctx context.Context, args ...string) (string, error) {
	_, tc, err := tools()
	if err != nil {
		return "", err
	}
	return run(ctx, tc, args...)
}

// validate fills defaults into o and checks it.
func (o *Options) validate() error {
	if o.Name == "" {
		o.Name = DefaultName
	}
	if o.Subnet == "" {
		o.Subnet = DefaultSubnet
	}
	if o.Congestion == "" {
		o.Congestion = DefaultCongestion
	}
	if err := checkName(o.Name); err != nil {
		return err
	}
	if err := checkCongestion(o.Congestion); err != nil {
		return err
	}
	if o.Hosts < 1 || o.Hosts > MaxHosts {
		return fmt.Errorf("testbed: hosts %d out of range 1..%d", o.Hosts, MaxHosts)
	}
	if err := checkShape(o.RateBps, o.DelayS); err != nil {
		return err
	}
	return checkSubnet(o.Subnet)
}

func checkCongestion(algo string) error {
	if !congestionRE.MatchString(algo) {
		return fmt.Errorf("testbed: congestion control %q invalid: want a kernel algorithm name such as cubic, bbr or reno", algo)
	}
	return nil
}

func checkName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("testbed: name %q invalid: want 1..8 of [a-z0-9-]", name)
	}
	return nil
}

func checkShape(rateBps, delayS float64) error {
	if !(rateBps > 0) || math.IsInf(rateBps, 0) {
		return fmt.Errorf("testbed: rate %g bytes/s invalid: want a finite rate > 0", rateBps)
	}
	if rateBps*8 < 8000 || rateBps*8 > 100e9 {
		return fmt.Errorf("testbed: rate %g bytes/s (%g bit/s) out of range 8 kbit/s..100 Gbit/s", rateBps, rateBps*8)
	}
	if !(delayS >= 0) || delayS > 10 {
		return fmt.Errorf("testbed: delay %g s invalid: want 0 <= delay <= 10 s", delayS)
	}
	return nil
}

// checkSubnet accepts "a.b.c" inside 10/8, 172.16/12 or 192.168/16.
func checkSubnet(s string) error {
	parts := strings.Split(s, ".")
	ip := net.ParseIP(s + ".0").To4()
	if len(parts) != 3 || ip == nil {
		return fmt.Errorf("testbed: subnet %q invalid: want three octets such as %q", s, DefaultSubnet)
	}
	if !ip.IsPrivate() {
		return fmt.Errorf("testbed: subnet %q is not private (want 10.x.y, 172.16-31.x or 192.168.x)", s)
	}
	return nil
}

// SwitchNamespace is the switch namespace of testbed name.
func SwitchNamespace(name string) string { return name + "-sw" }

// HostNamespace is host i's namespace in testbed name.
func HostNamespace(name string, i int) string { return fmt.Sprintf("%s-h%d", name, i) }

// StatePath is testbed name's state file.
func StatePath(name string) string { return filepath.Join(StateDir, "testbed-"+name+".json") }

// ownNamespaces lists the existing namespaces that belong to testbed name:
// exactly NAME-sw and NAME-h<digits>.
func ownNamespaces(ctx context.Context, name string) ([]string, error) {
	out, err := runIP(ctx, "netns", "list")
	if err != nil {
		return nil, err
	}
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(name) + `-(sw|h[0-9]+)$`)
	var own []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line) // "NAME (id: 3)"
		if len(f) > 0 && re.MatchString(f[0]) {
			own = append(own, f[0])
		}
	}
	return own, nil
}

// Up creates testbed o.Name. It fails if the testbed (its state file or any
// of its namespaces) already exists, if Available fails, or if a delay is
// asked for and the kernel lacks netem. On a failure part-way it removes
// everything it created.
func Up(ctx context.Context, o Options) (_ *Testbed, err error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if err := Available(); err != nil {
		return nil, err
	}
	if _, err := os.Stat(StatePath(o.Name)); err == nil {
		return nil, fmt.Errorf("testbed: %q already exists (state file %s); run Down first", o.Name, StatePath(o.Name))
	}
	if own, err := ownNamespaces(ctx, o.Name); err != nil {
		return nil, err
	} else if len(own) > 0 {
		return nil, fmt.Errorf("testbed: %q already exists (namespaces %s); run Down first", o.Name, strings.Join(own, ", "))
	}

	t := &Testbed{Name: o.Name, Subnet: o.Subnet, SwitchNS: SwitchNamespace(o.Name), Bridge: bridgeIf, Congestion: o.Congestion}
	var created []string
	defer func() {
		if err != nil {
			// Tear down exactly what this call made; a cancelled ctx must not
			// stop the cleanup.
			cctx := context.WithoutCancel(ctx)
			for i := len(created) - 1; i >= 0; i-- {
				runIP(cctx, "netns", "del", created[i]) //nolint:errcheck
			}
			os.Remove(StatePath(o.Name))
		}
	}()
	addNS := func(ns string) error {
		if _, err := runIP(ctx, "netns", "add", ns); err != nil {
			return err
		}
		created = append(created, ns)
		_, err := runIP(ctx, "-n", ns, "link", "set", "lo", "up")
		return err
	}

	sw := t.SwitchNS
	if err := addNS(sw); err != nil {
		return nil, err
	}
	if _, err := runIP(ctx, "-n", sw, "link", "add", bridgeIf, "type", "bridge"); err != nil {
		return nil, err
	}
	if _, err := runIP(ctx, "-n", sw, "link", "set", bridgeIf, "up"); err != nil {
		return nil, err
	}
	if probeNetem(ctx, sw) == nil {
		t.Netem = true
	} else if o.DelayS > 0 {
		return nil, fmt.Errorf("testbed: delay %g s needs the netem qdisc (sch_netem), which this kernel lacks; use delay 0", o.DelayS)
	}

	for i := 0; i < o.Hosts; i++ {
		h := Host{
			Index:      i,
			Namespace:  HostNamespace(o.Name, i),
			IP:         fmt.Sprintf("%s.%d", o.Subnet, i+1),
			SwitchPort: fmt.Sprintf("h%d", i),
			RateBps:    o.RateBps,
			DelayS:     o.DelayS,
		}
		if err := addNS(h.Namespace); err != nil {
			return nil, err
		}
		steps := [][]string{
			{"-n", h.Namespace, "link", "add", hostIf, "mtu", strconv.Itoa(linkMTU), "type", "veth", "peer", "name", h.SwitchPort, "mtu", strconv.Itoa(linkMTU), "netns", sw},
			{"-n", h.Namespace, "addr", "add", h.IP + "/24", "dev", hostIf},
			{"-n", h.Namespace, "link", "set", hostIf, "up"},
			{"-n", sw, "link", "set", h.SwitchPort, "master", bridgeIf},
			{"-n", sw, "link", "set", h.SwitchPort, "up"},
		}
		for _, s := range steps {
			if _, err := runIP(ctx, s...); err != nil {
				return nil, err
			}
		}
		t.Hosts = append(t.Hosts, h)
		if err := t.setCongestion(ctx, i, o.Congestion); err != nil {
			return nil, err
		}
		if err := t.shape(ctx, h, false); err != nil {
			return nil, err
		}
		if upHook != nil {
			if err := upHook(i); err != nil {
				return nil, err
			}
		}
	}
	if err := t.save(); err != nil {
		return nil, err
	}
	return t, nil
}

// congestionSysctl is the per-namespace default congestion control; new
// sockets in the namespace use it. congestionAvailableSysctl lists the
// algorithms the kernel has loaded.
const (
	congestionSysctl          = "/proc/sys/net/ipv4/tcp_congestion_control"
	congestionAvailableSysctl = "/proc/sys/net/ipv4/tcp_available_congestion_control"
)

// readTrimmed is the content of a sysctl file without its newline, or
// "(unreadable: ERR)".
func readTrimmed(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(unreadable: %v)", err)
	}
	return strings.TrimSpace(string(b))
}

// allowedCongestionSysctl lists the algorithms a namespace other than the
// root's may make its default (the kernel refuses any other with EPERM).
const allowedCongestionSysctl = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"

// allowCongestion adds algo to the allowed list (see Options.Congestion)
// if it is missing, and says whether it added it.
func allowCongestion(algo string) (added bool, err error) {
	cur, err := os.ReadFile(allowedCongestionSysctl)
	if err != nil {
		return false, fmt.Errorf("testbed: reading %s: %w", allowedCongestionSysctl, err)
	}
	list, missing := withAlgorithm(string(cur), algo)
	if !missing {
		return false, nil
	}
	if err := os.WriteFile(allowedCongestionSysctl, []byte(list), 0o644); err != nil {
		return false, fmt.Errorf("testbed: allowing TCP congestion control %q in namespaces (%s, now %q): %w",
			algo, allowedCongestionSysctl, strings.TrimSpace(string(cur)), err)
	}
	return true, nil
}

// withAlgorithm is the space-separated list of algorithms with algo added
// at the end, and whether it was missing.
func withAlgorithm(list, algo string) (string, bool) {
	names := strings.Fields(list)
	if slices.Contains(names, algo) {
		return strings.Join(names, " "), false
	}
	return strings.Join(append(names, algo), " "), true
}

// setCongestion makes algo the TCP congestion control of host. The write
// goes through a process inside the host (the sysctl is per namespace);
// the kernel loads the algorithm's module if it has one and refuses a name
// it does not know, and the error then lists the ones it offers. A write
// the namespace refuses for an algorithm the kernel offers (loaded before,
// or by that write: a fresh host's cubic, when it defaults to another) is
// tried once more after allowCongestion has allowed it.
func (t *Testbed) setCongestion(ctx context.Context, host int, algo string) error {
	ns := t.Hosts[host].Namespace
	var stderr bytes.Buffer
	write := func() error {
		stderr.Reset()
		cmd := t.Command(ctx, host, "tee", congestionSysctl)
		cmd.Stdin = strings.NewReader(algo)
		cmd.Stderr = &stderr
		return cmd.Run()
	}
	err := write()
	if err != nil && slices.Contains(strings.Fields(readTrimmed(congestionAvailableSysctl)), algo) {
		added, aerr := allowCongestion(algo)
		if aerr != nil {
			return aerr
		}
		if added {
			err = write()
		}
	}
	if err != nil {
		return fmt.Errorf("testbed: setting TCP congestion control %q in %s: %v: %s (this kernel offers: %s; namespaces may select: %s)",
			algo, ns, err, strings.TrimSpace(stderr.String()), readTrimmed(congestionAvailableSysctl), readTrimmed(allowedCongestionSysctl))
	}
	got, err := t.Command(ctx, host, "cat", congestionSysctl).Output()
	if err != nil {
		return fmt.Errorf("testbed: reading TCP congestion control in %s: %w", ns, err)
	}
	if g := strings.TrimSpace(string(got)); g != algo {
		return fmt.Errorf("testbed: TCP congestion control in %s is %q after setting %q", ns, g, algo)
	}
	return nil
}

// Down removes testbed name: its namespaces (which takes their veths, bridge
// and qdiscs with them) and its state file. Removing a testbed that does not
// exist is not an error.
func Down(ctx context.Context, name string) error {
	if name == "" {
		name = DefaultName
	}
	if err := checkName(name); err != nil {
		return err
	}
	own, err := ownNamespaces(ctx, name)
	if err != nil {
		return err
	}
	var errs []error
	// Hosts first, then the switch, so no veth peer outlives its namespace
	// for longer than needed (deleting either end removes the pair).
	for i := len(own) - 1; i >= 0; i-- {
		if _, err := runIP(ctx, "netns", "del", own[i]); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(StatePath(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("testbed: remove state file: %w", err))
	}
	return errors.Join(errs...)
}

// Load reads the state file Up wrote for testbed name.
func Load(name string) (*Testbed, error) {
	if name == "" {
		name = DefaultName
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(StatePath(name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("testbed: %q is not up (no state file %s)", name, StatePath(name))
	} else if err != nil {
		return nil, fmt.Errorf("testbed: read state of %q: %w", name, err)
	}
	t := new(Testbed)
	if err := json.Unmarshal(b, t); err != nil {
		return nil, fmt.Errorf("testbed: state file %s: %w", StatePath(name), err)
	}
	if t.Name != name {
		return nil, fmt.Errorf("testbed: state file %s names testbed %q, want %q", StatePath(name), t.Name, name)
	}
	return t, nil
}

func (t *Testbed) save() error {
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(StateDir, 0o755); err != nil {
		return fmt.Errorf("testbed: state dir: %w", err)
	}
	tmp := StatePath(t.Name) + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("testbed: write state: %w", err)
	}
	if err := os.Rename(tmp, StatePath(t.Name)); err != nil {
		return fmt.Errorf("testbed: write state: %w", err)
	}
	return nil
}

// Set changes host's rate (bytes per second, both directions) and delay
// (seconds, see Options.DelayS) in place with tc change, so connections
// through the host survive. It updates the state file.
func (t *Testbed) Set(ctx context.Context, host int, rateBps, delayS float64) error {
	if err := checkShape(rateBps, delayS); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if host < 0 || host >= len(t.Hosts) {
		return fmt.Errorf("testbed: host %d out of range 0..%d of testbed %q", host, len(t.Hosts)-1, t.Name)
	}
	if delayS > 0 && !t.Netem {
		return fmt.Errorf("testbed: delay %g s needs the netem qdisc (sch_netem), which this kernel lacks; use delay 0", delayS)
	}
	h := t.Hosts[host]
	h.RateBps, h.DelayS = rateBps, delayS
	if err := t.shape(ctx, h, true); err != nil {
		return err
	}
	t.Hosts[host] = h
	return t.save()
}

// SetCongestion makes algo the TCP congestion control of every host (see
// Options.Congestion); connections opened afterwards use it. It updates
// the state file.
func (t *Testbed) SetCongestion(ctx context.Context, algo string) error {
	if err := checkCongestion(algo); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for h := range t.Hosts {
		if err := t.setCongestion(ctx, h, algo); err != nil {
			return err
		}
	}
	t.Congestion = algo
	return t.save()
}

// Shaping. Each shaped device (eth0 in the host, hi in the switch) has
//
//	root htb 1: default 1 -> class 1:1 (rate = ceil = RateBps)
//	   -> leaf 10: netem delay DelayS/2   (or pfifo when netem is absent)
//
// HTB rather than TBF at the root: HTB's deficit is kept with a
// high-resolution timer and it charges GSO super-packets by their on-wire
// size, so a burst well below a 64 KiB TSO segment still gives the exact
// long-run rate; TBF must have burst >= the largest (GSO) packet or it drops
// or segments it, and burst >= rate/HZ or it cannot reach the rate.

// htbParams returns the class's rate, burst and quantum for rateBps.
func htbParams(rateBps float64) (rateBit, burst, quantum int64) {
	rateBit = int64(math.Round(rateBps * 8))
	// One tick's worth of bytes, so a late timer or a batch of dequeues does
	// not lose rate, and at least two frames. HTB lets a packet larger than
	// the bucket (a 64 KiB GSO packet) through by going into debt, so unlike
	// TBF it needs no GSO-sized burst; a smaller burst keeps the start of a
	// transfer at low rates honest.
	burst = max(int64(rateBps/kernelHZ), 2*frameBytes)
	// quantum only matters between sibling classes; keep it in tc's sane
	// range to avoid the "quantum is big" warning.
	quantum = min(max(int64(rateBps/10), frameBytes), 200000)
	return
}

func (t *Testbed) shape(ctx context.Context, h Host, change bool) error {
	for _, dev := range []struct{ ns, ifc string }{{h.Namespace, hostIf}, {t.SwitchNS, h.SwitchPort}} {
		if err := t.shapeDev(ctx, dev.ns, dev.ifc, h.RateBps, h.DelayS, change); err != nil {
			return fmt.Errorf("%w (shaping host %d: %s in %s)", err, h.Index, dev.ifc, dev.ns)
		}
	}
	return nil
}

func (t *Testbed) shapeDev(ctx context.Context, ns, dev string, rateBps, delayS float64, change bool) error {
	rate, burst, quantum := htbParams(rateBps)
	verb := "replace"
	if change {
		verb = "change"
	}
	if !change {
		if _, err := runTC(ctx, "-n", ns, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "1"); err != nil {
			return err
		}
	}
	class := []string{"-n", ns, "class", verb, "dev", dev, "parent", "1:", "classid", "1:1", "htb",
		"rate", fmt.Sprintf("%dbit", rate), "ceil", fmt.Sprintf("%dbit", rate),
		"burst", fmt.Sprintf("%db", burst), "cburst", fmt.Sprintf("%db", burst),
		"quantum", strconv.FormatInt(quantum, 10)}
	if _, err := runTC(ctx, class...); err != nil {
		return err
	}
	var leaf []string
	if t.Netem {
		half := int64(math.Round(delayS / 2 * 1e6))
		leaf = []string{"netem", "delay", fmt.Sprintf("%dus", half), "limit", strconv.Itoa(netemLimit)}
	} else {
		if change {
			return nil // pfifo has nothing to change
		}
		leaf = []string{"pfifo", "limit", strconv.Itoa(fifoLimit)}
	}
	_, err := runTC(ctx, append([]string{"-n", ns, "qdisc", verb, "dev", dev, "parent", "1:1", "handle", "10:"}, leaf...)...)
	return err
}

// Command returns a command that runs name with args inside host's
// namespace (`ip netns exec NS name args...`). An out-of-range host yields a
// command whose Run fails with an error naming the host.
func (t *Testbed) Command(ctx context.Context, host int, name string, args ...string) *exec.Cmd {
	ip, _, err := tools()
	if err != nil {
		cmd := exec.CommandContext(ctx, "ip")
		cmd.Err = err
		return cmd
	}
	if host < 0 || host >= len(t.Hosts) {
		cmd := exec.CommandContext(ctx, ip)
		cmd.Err = fmt.Errorf("testbed: host %d out of range 0..%d of testbed %q", host, len(t.Hosts)-1, t.Name)
		return cmd
	}
	return exec.CommandContext(ctx, ip, append([]string{"netns", "exec", t.Hosts[host].Namespace, name}, args...)...)
}

// HostIP returns host's address, or "" if host is out of range.
func (t *Testbed) HostIP(host int) string {
	if host < 0 || host >= len(t.Hosts) {
		return ""
	}
	return t.Hosts[host].IP
}
