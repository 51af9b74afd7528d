package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/autobyte/autobyte/transport"
	"github.com/autobyte/autobyte/units"
)

// Member is one process of a job as it registers at the coordinator.
type Member struct {
	// Role is "worker" or "server".
	Role string `json:"role"`
	// Rank is the worker's rank or the server's index.
	Rank int `json:"rank"`
	// Addr is where the member accepts data connections ("" if none). A
	// member may give only ":port"; the coordinator fills in the host it
	// saw the member connect from.
	Addr string `json:"addr"`
	// Digest identifies the job configuration; every worker must agree.
	Digest string `json:"digest"`
	// ServerDigest, in the coordinator's own entry, is what servers must
	// send as their Digest (servers need not know the model); empty means
	// Digest.
	ServerDigest string `json:"server_digest,omitempty"`
	// Config describes the configuration the digest covers, by part (e.g.
	// "model", "scheduling"), for people: when a member's digest differs
	// from the coordinator's, the error names the parts that differ.
	Config map[string]string `json:"config,omitempty"`
}

// Table lists every member of the job.
type Table struct {
	Workers []Member `json:"workers"`
	Servers []Member `json:"servers"`
}

// Env is the rendezvous information in the usual launcher conventions.
type Env struct {
	MasterAddr string
	// MasterPort is MASTER_PORT: torch.distributed's port. torchrun's
	// agent, or a script's init_process_group, listens there, so autobyte
	// must not.
	MasterPort int
	// Port is where rank 0 listens for autobyte's own rendezvous:
	// AUTOBYTE_MASTER_PORT, else MASTER_PORT+1; 0 when neither is set.
	Port      int
	Rank      int
	WorldSize int
}

// FromEnv reads MASTER_ADDR, MASTER_PORT, AUTOBYTE_MASTER_PORT, RANK and
// WORLD_SIZE; a missing variable leaves its field as in def (Port follows
// MasterPort). Errors name the variable and value.
func FromEnv(def Env) (Env, error) { return FromLookup(def, os.Getenv) }

// FromLookup is FromEnv with the variables looked up by get (e.g. a
// binding's overrides before the environment).
func FromLookup(def Env, get func(string) string) (Env, error) {
	e := def
	if v := get("MASTER_ADDR"); v != "" {
		e.MasterAddr = v
	}
	for _, x := range []struct {
		name string
		dst  *int
	}{{"MASTER_PORT", &e.MasterPort}, {"RANK", &e.Rank}, {"WORLD_SIZE", &e.WorldSize}} {
		if v := get(x.name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return e, fmt.Errorf("environment %s=%q is not a non-negative integer", x.name, v)
			}
			*x.dst = n
		}
	}
	if v := get("AUTOBYTE_MASTER_PORT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 65535 {
			return e, fmt.Errorf("environment AUTOBYTE_MASTER_PORT=%q is not a port number (1-65535)", v)
		}
		e.Port = n
	} else if get("MASTER_PORT") != "" || e.Port == 0 && e.MasterPort != 0 {
		if e.MasterPort < 1 || e.MasterPort > 65534 {
			return e, fmt.Errorf("environment MASTER_PORT=%q: autobyte's rendezvous listens at MASTER_PORT+1, which must be a port number; set AUTOBYTE_MASTER_PORT to choose another", strconv.Itoa(e.MasterPort))
		}
		e.Port = e.MasterPort + 1
	}
	return e, nil
}

// DefaultRendezvousTimeout is how long a member waits for the whole job
// to gather before it gives up: torchrun's default, long enough for hosts
// that start minutes apart, short enough that a job missing a member does
// not wait forever.
const DefaultRendezvousTimeout = 10 * time.Minute

// ParseRendezvousTimeout reads a rendezvous timeout such as "10m" or
// "90s"; errors name the value.
func ParseRendezvousTimeout(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("rendezvous timeout %q: want a positive duration such as 10m or 90s", v)
	}
	return d, nil
}

// RendezvousTimeoutFrom reads AUTOBYTE_RENDEZVOUS_TIMEOUT through get: 0
// when it is unset, an error naming the variable when it is bad.
func RendezvousTimeoutFrom(get func(string) string) (time.Duration, error) {
	v := get("AUTOBYTE_RENDEZVOUS_TIMEOUT")
	if v == "" {
		return 0, nil
	}
	d, err := ParseRendezvousTimeout(v)
	if err != nil {
		return 0, fmt.Errorf("AUTOBYTE_RENDEZVOUS_TIMEOUT: %w", err)
	}
	return d, nil
}

// DefaultProgressInterval is how often a waiting member says what it
// waits for.
const DefaultProgressInterval = 30 * time.Second

// Patience bounds a rendezvous and reports on it while it waits.
type Patience struct {
	// Timeout ends the rendezvous with an error naming what is missing;
	// 0 means DefaultRendezvousTimeout, a negative value no timeout (the
	// wait ends with ctx).
	Timeout time.Duration
	// Every is how often Log hears what is still awaited; 0 means
	// DefaultProgressInterval.
	Every time.Duration
	// Log receives the progress messages (warn level); nil: none.
	Log *slog.Logger
}

// RendezvousTimeoutError is a rendezvous that did not complete in time.
type RendezvousTimeoutError struct {
	Timeout time.Duration
	// Waiting says what was still awaited, e.g. "worker 2 and server 0".
	Waiting string
	// Where is the coordinator's address.
	Where string
}

func (e *RendezvousTimeoutError) Error() string {
	return fmt.Sprintf("cluster: rendezvous at %s timed out after %v, still waiting for %s. A member did not start, or started with another MASTER_ADDR, MASTER_PORT or AUTOBYTE_MASTER_PORT; --rendezvous-timeout or AUTOBYTE_RENDEZVOUS_TIMEOUT waits longer", e.Where, e.Timeout, e.Waiting)
}

// watch bounds ctx by p's timeout and logs what waiting() says every
// p.Every until stop is called. The returned context's cause on timeout is
// a *RendezvousTimeoutError built from waiting() at that moment.
func (p Patience) watch(ctx context.Context, where string, waiting func() string) (context.Context, func()) {
	timeout, every := p.Timeout, p.Every
	if timeout == 0 {
		timeout = DefaultRendezvousTimeout
	}
	if every <= 0 {
		every = DefaultProgressInterval
	}
	ctx, cancel := context.WithCancelCause(ctx)
	start := time.Now()
	stopTimer := func() bool { return false }
	if timeout > 0 {
		timer := time.AfterFunc(timeout, func() {
			cancel(&RendezvousTimeoutError{Timeout: timeout, Waiting: waiting(), Where: where})
		})
		stopTimer = timer.Stop
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	if p.Log != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(every)
			defer tick.Stop()
			for {
				select {
				case <-done:
					return
				case <-ctx.Done():
					return
				case <-tick.C:
					p.Log.Warn("rendezvous: still waiting", "for", waiting(), "at", where,
						"waited", time.Since(start).Round(time.Second).String(), "timeout", timeout.String())
				}
			}
		}()
	}
	return ctx, func() {
		stopTimer()
		close(done)
		wg.Wait()
		cancel(nil)
	}
}

// rendezvousErr returns ctx's cause when ctx ended (a timeout names what
// is missing), else err.
func rendezvousErr(ctx context.Context, err error) error {
	var te *RendezvousTimeoutError
	if cause := context.Cause(ctx); errors.As(cause, &te) {
		return te
	}
	return err
}

// listMembers writes "worker 1, worker 3 and server 0".
func listMembers(names []string) string {
	switch len(names) {
	case 0:
		return "nobody"
	case 1:
		return names[0]
	}
	if len(names) > 8 {
		names = append(names[:8:8], fmt.Sprintf("%d more", len(names)-8))
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// Coordinate runs the rendezvous on rank 0's listener: it waits for the
// other workers-1 workers and every server, checks that they agree with
// self.Digest, and sends everyone the table. It returns the table and the
// control connections, workers by rank (index 0 is nil) and servers by
// index, which stay open for the job. It gives up after p's timeout with
// an error naming the members that did not register, and logs them every
// p.Every meanwhile.
func Coordinate(ctx context.Context, l *transport.Listener, self Member, workers, servers int, p Patience) (*Table, []*transport.Conn, []*transport.Conn, error) {
	t := &Table{Workers: make([]Member, workers), Servers: make([]Member, servers)}
	wconns := make([]*transport.Conn, workers)
	sconns := make([]*transport.Conn, servers)
	t.Workers[0] = self
	// The configuration is for the checks here; the table need not carry it.
	t.Workers[0].Config = nil
	var mu sync.Mutex // guards wconns and sconns against waiting()
	waiting := func() string {
		mu.Lock()
		defer mu.Unlock()
		var names []string
		for r := 1; r < workers; r++ {
			if wconns[r] == nil {
				names = append(names, fmt.Sprintf("worker %d", r))
			}
		}
		serverMissing := false
		for s := range servers {
			if sconns[s] == nil {
				names = append(names, fmt.Sprintf("server %d", s))
				serverMissing = true
			}
		}
		out := fmt.Sprintf("%s, of %s and %s", listMembers(names), units.FormatCount(workers, "worker"), units.FormatCount(servers, "server"))
		if serverMissing {
			// A script that opens the engine again (after shutdown(), or
			// for a DDP communication hook or join()) starts a new job,
			// which servers started by hand may have stopped serving.
			out += " (a server started by hand serves as many jobs as its --sessions says, 1 by default)"
		}
		return out
	}
	ctx, stop := p.watch(ctx, l.Addr().String(), waiting)
	defer stop()
	var all []*transport.Conn
	fail := func(err error) (*Table, []*transport.Conn, []*transport.Conn, error) {
		err = rendezvousErr(ctx, err)
		for _, c := range all {
			_ = c.CloseWithReason(err.Error())
		}
		return nil, nil, nil, err
	}
	for missing := workers - 1 + servers; missing > 0; missing-- {
		c, err := l.Accept(ctx)
		if err != nil {
			return fail(fmt.Errorf("cluster: rendezvous waiting for %d more members: %w", missing, err))
		}
		all = append(all, c)
		f, err := c.Recv()
		if err != nil {
			return fail(fmt.Errorf("cluster: rendezvous: %w", err))
		}
		if f.Kind != transport.KindControl || f.Aux != CtlHello {
			return fail(fmt.Errorf("cluster: rendezvous: %s sent a %v frame (subtype %d) instead of hello", c.Peer(), f.Kind, f.Aux))
		}
		var m Member
		if err := json.Unmarshal(f.Payload, &m); err != nil {
			return fail(fmt.Errorf("cluster: rendezvous: bad hello from %s: %w", c.Peer(), err))
		}
		want := self.Digest
		if m.Role == "server" && self.ServerDigest != "" {
			want = self.ServerDigest
		}
		if m.Digest != want {
			return fail(fmt.Errorf("cluster: %s %d runs a different job configuration (digest %s, rank 0 expects %s)%s: start every process with the same flags (and a training script with the same model)",
				m.Role, m.Rank, m.Digest, want, configDiff(m, self)))
		}
		m.Config = nil
		if host, port, err := net.SplitHostPort(m.Addr); err == nil && host == "" {
			if ra, ok := c.RemoteAddr().(*net.TCPAddr); ok {
				m.Addr = net.JoinHostPort(ra.IP.String(), port)
			}
		}
		var slot *Member
		var conn **transport.Conn
		switch {
		case m.Role == "worker" && m.Rank >= 1 && m.Rank < workers:
			slot, conn = &t.Workers[m.Rank], &wconns[m.Rank]
		case m.Role == "server" && m.Rank >= 0 && m.Rank < servers:
			slot, conn = &t.Servers[m.Rank], &sconns[m.Rank]
		default:
			return fail(fmt.Errorf("cluster: rendezvous: %s registered as %s %d, outside this job of %d workers and %d servers", c.Peer(), m.Role, m.Rank, workers, servers))
		}
		if *conn != nil {
			return fail(fmt.Errorf("cluster: rendezvous: two processes registered as %s %d", m.Role, m.Rank))
		}
		mu.Lock()
		*slot, *conn = m, c
		mu.Unlock()
	}
	payload, err := json.Marshal(t)
	if err != nil {
		return fail(err)
	}
	for _, c := range all {
		if err := c.Send(transport.Frame{Header: transport.Header{Kind: transport.KindControl, Aux: CtlTable, Length: uint32(len(payload))}, Payload: payload}); err != nil {
			return fail(fmt.Errorf("cluster: sending the table to %s: %w", c.Peer(), err))
		}
	}
	return t, wconns, sconns, nil
}

// Join registers self at the coordinator and returns the table and the
// control connection to rank 0, which stays open for the job. It gives up
// after p's timeout, saying whether rank 0 never answered or answered and
// was still waiting for other members, and logs which every p.Every.
func Join(ctx context.Context, coordinator string, self Member, cfg transport.Config, p Patience) (*Table, *transport.Conn, error) {
	var phase atomic.Pointer[string]
	dialing := "rank 0's autobyte engine to answer: none has yet"
	phase.Store(&dialing)
	ctx, stop := p.watch(ctx, coordinator, func() string { return *phase.Load() })
	defer stop()
	c, err := transport.Dial(ctx, coordinator, cfg)
	if err != nil {
		return nil, nil, rendezvousErr(ctx, fmt.Errorf("cluster: joining the job at %s: %w", coordinator, err))
	}
	registered := "the member table from rank 0: we registered, and rank 0 waits for other members (its log names them)"
	phase.Store(&registered)
	payload, err := json.Marshal(self)
	if err != nil {
		return nil, nil, err
	}
	if err := c.Send(transport.Frame{Header: transport.Header{Kind: transport.KindControl, Aux: CtlHello, Rank: uint32(self.Rank), Length: uint32(len(payload))}, Payload: payload}); err != nil {
		c.Close()
		return nil, nil, fmt.Errorf("cluster: joining the job at %s: %w", coordinator, err)
	}
	type result struct {
		f   transport.Frame
		err error
	}
	got := make(chan result, 1)
	go func() {
		f, err := c.Recv()
		got <- result{f, err}
	}()
	var r result
	select {
	case r = <-got:
	case <-ctx.Done():
		c.Close()
		return nil, nil, rendezvousErr(ctx, fmt.Errorf("cluster: waiting for the member table from %s: %w", coordinator, context.Cause(ctx)))
	}
	if r.err != nil {
		c.Close()
		return nil, nil, fmt.Errorf("cluster: waiting for the member table from %s: %w", coordinator, r.err)
	}
	if r.f.Kind != transport.KindControl || r.f.Aux != CtlTable {
		c.Close()
		return nil, nil, fmt.Errorf("cluster: coordinator %s sent a %v frame (subtype %d) instead of the table", coordinator, r.f.Kind, r.f.Aux)
	}
	var t Table
	if err := json.Unmarshal(r.f.Payload, &t); err != nil {
		c.Close()
		return nil, nil, fmt.Errorf("cluster: bad table from %s: %w", coordinator, err)
	}
	return &t, c, nil
}

// ErrNoCoordinator is returned when no rendezvous address is known.
var ErrNoCoordinator = errors.New("cluster: no coordinator address: set MASTER_ADDR and MASTER_PORT (autobyte's rank 0 listens at MASTER_PORT+1, or at AUTOBYTE_MASTER_PORT) or pass --master")

// configDiff names the parts of the configuration in which member m
// differs from the coordinator's own ("" when neither describes them).
func configDiff(m, coordinator Member) string {
	var d []string
	for _, part := range slices.Sorted(maps.Keys(m.Config)) {
		if own, ok := coordinator.Config[part]; ok && own != m.Config[part] {
			d = append(d, fmt.Sprintf("%s: %s %d has %s, rank 0 has %s", part, m.Role, m.Rank, m.Config[part], own))
		}
	}
	if len(d) == 0 {
		return ""
	}
	return "; " + strings.Join(d, "; ")
}
