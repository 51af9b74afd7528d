package proto

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/autobyte/autobyte/dtype"
)

// DecisionLog records what the machines of a job decided, in a form that
// does not depend on time: for each worker and each connection it sends
// pieces on (a server, or the ring), the order in which it started them,
// and the epochs it learned with the iteration each applies from. Two
// harnesses that drive the same machines through the same scenario must
// produce equal logs (see Diff). It is safe for concurrent use, since the
// runtime's workers record from their own goroutines.
type DecisionLog struct {
	mu sync.Mutex
	// lines[rank][conn] are the entries, in order.
	lines map[int]map[string][]string
}

// NewDecisionLog returns an empty log.
func NewDecisionLog() *DecisionLog { return &DecisionLog{lines: map[int]map[string][]string{}} }

// Record adds the decisions of one batch of worker rank's effects.
func (l *DecisionLog) Record(rank int, r *Ready) {
	if l == nil || len(r.Messages)+len(r.Epochs) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	conns := l.lines[rank]
	if conns == nil {
		conns = map[string][]string{}
		l.lines[rank] = conns
	}
	for _, m := range r.Messages {
		var conn, entry string
		p := m.Piece
		switch m.Kind {
		case Push:
			conn, entry = fmt.Sprintf("server %d", m.Server), fmt.Sprintf("it %d tensor %d piece %d/%d shard %d epoch %d", p.Iteration, p.Tensor, p.Index, p.Count, m.Shard, p.Epoch)
		case RingStart:
			conn, entry = "ring", fmt.Sprintf("it %d tensor %d piece %d/%d epoch %d", p.Iteration, p.Tensor, p.Index, p.Count, p.Epoch)
		default:
			continue // announcements repeat the leader's starts and epochs
		}
		conns[conn] = append(conns[conn], entry)
	}
	for _, e := range r.Epochs {
		line := fmt.Sprintf("epoch %d from %d partition %d credit %d %v", e.Number, e.From, e.Config.PartitionBytes, e.Config.CreditBytes, e.Config.Order)
		if e.Config.ServerWeights.Weighted() {
			line += " weights " + e.Config.ServerWeights.String()
		}
		if e.Config.Compression != dtype.F32 {
			line += " compression " + e.Config.Compression.String()
		}
		if e.Config.FusionBytes > 0 {
			line += fmt.Sprintf(" fusion %d", e.Config.FusionBytes)
		}
		conns["epochs"] = append(conns["epochs"], line)
	}
}

// streams returns the log's (rank, connection) streams in sorted order.
func (l *DecisionLog) streams() (keys []string, entries map[string][]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ranks []int
	for r := range l.lines {
		ranks = append(ranks, r)
	}
	slices.Sort(ranks)
	entries = map[string][]string{}
	for _, r := range ranks {
		var conns []string
		for c := range l.lines[r] {
			conns = append(conns, c)
		}
		slices.Sort(conns)
		for _, c := range conns {
			k := fmt.Sprintf("rank %d %s", r, c)
			keys = append(keys, k)
			entries[k] = slices.Clone(l.lines[r][c])
		}
	}
	return keys, entries
}

// Lines returns the log as text lines, "rank R CONN #i: entry", sorted by
// rank and connection and in order within a connection.
func (l *DecisionLog) Lines() []string {
	keys, entries := l.streams()
	var out []string
	for _, k := range keys {
		for i, e := range entries[k] {
			out = append(out, fmt.Sprintf("%s #%d: %s", k, i, e))
		}
	}
	return out
}

// Diff describes the first difference between two logs, stream by stream
// (rank and connection), or returns "" if they are equal.
func Diff(a, b *DecisionLog) string {
	ka, ea := a.streams()
	kb, eb := b.streams()
	for _, k := range ka {
		if _, ok := eb[k]; !ok {
			return fmt.Sprintf("%s: %d entries in the first log, none in the second", k, len(ea[k]))
		}
	}
	for _, k := range kb {
		if _, ok := ea[k]; !ok {
			return fmt.Sprintf("%s: %d entries in the second log, none in the first", k, len(eb[k]))
		}
	}
	for _, k := range ka {
		x, y := ea[k], eb[k]
		for i := range min(len(x), len(y)) {
			if x[i] != y[i] {
				return fmt.Sprintf("%s #%d differs:\n  %s\n  %s", k, i, x[i], y[i])
			}
		}
		if len(x) != len(y) {
			longer, name := x, "first"
			if len(y) > len(x) {
				longer, name = y, "second"
			}
			n := min(len(x), len(y))
			return fmt.Sprintf("%s: the %s log has %d more entries, from #%d: %s", k, name, len(longer)-n, n, strings.TrimSpace(longer[n]))
		}
	}
	return ""
}
