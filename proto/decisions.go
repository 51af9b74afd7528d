package proto

import (
	"fmt"
	"slices"
	"strings"
	"sync"
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
		conns["epochs"] = append(conns["epochs"], fmt.Sprintf("epoch %d from %d partition %d credit %d %v", e.Number, e.From, e.Config.PartitionBytes, e.Config.CreditBytes, e.Config.Order))
	}
}

// Lines returns the log as text lines, "rank R conn C: entry", sorted by
// rank and connection and in order within a connection.
func (l *DecisionLog) Lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ranks []int
	for r := range l.lines {
		ranks = append(ranks, r)
	}
	slices.Sort(ranks)
	var out []string
	for _, r := range ranks {
		var conns []string
		for c := range l.lines[r] {
			conns = append(conns, c)
		}
		slices.Sort(conns)
		for _, c := range conns {
			for i, e := range l.lines[r][c] {
				out = append(out, fmt.Sprintf("rank %d %s #%d: %s", r, c, i, e))
			}
		}
	}
	return out
}

// Diff describes the first difference between two logs, or returns "" if
// they are equal.
func Diff(a, b *DecisionLog) string {
	la, lb := a.Lines(), b.Lines()
	for i := range min(len(la), len(lb)) {
		if la[i] != lb[i] {
			return fmt.Sprintf("entry %d differs:\n  %s\n  %s", i, la[i], lb[i])
		}
	}
	if len(la) != len(lb) {
		longer, name := la, "first"
		if len(lb) > len(la) {
			longer, name = lb, "second"
		}
		n := min(len(la), len(lb))
		return fmt.Sprintf("the %s log has %d more entries, from: %s", name, len(longer)-n, strings.TrimSpace(longer[n]))
	}
	return ""
}
