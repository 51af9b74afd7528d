package sched

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// MaxWeightedServers is the most parameter servers a configuration can
// weigh: ServerWeights is a fixed-size value so that a Config stays
// comparable (tuners key their history by it) and travels in a fixed-size
// reconfiguration frame.
const MaxWeightedServers = 32

// ServerWeights are the relative shares of the bytes each parameter server
// is given (server i gets about weight[i]/sum of them; package placement
// decides). The zero value means no weights: pieces are placed by bytes
// alone, which is also what equal weights do. Otherwise the first n
// entries are >= 1 for a job of n servers and the rest are 0. The
// scheduling core carries them in a Config, so that they change through
// configuration epochs like a partition; it does not use them.
type ServerWeights [MaxWeightedServers]uint16

// WeightScale is the largest weight Weigh writes: weights are kept to
// about three significant digits.
const WeightScale = 1000

// Weighted reports whether w sets weights (is not the zero value).
func (w ServerWeights) Weighted() bool { return w != ServerWeights{} }

// Len is how many servers w weighs (0 for the zero value).
func (w ServerWeights) Len() int {
	n := 0
	for i, v := range w {
		if v != 0 {
			n = i + 1
		}
	}
	return n
}

// Validate reports whether w is the zero value or a run of weights >= 1
// followed by zeros.
func (w ServerWeights) Validate() error {
	n := w.Len()
	for i := range n {
		if w[i] == 0 {
			return fmt.Errorf("sched: server weights %v: server %d has weight 0 (every server of the job needs a weight >= 1)", w, i)
		}
	}
	return nil
}

// Shares returns the weights of servers 0..servers-1 as fractions summing
// to 1 (equal shares for the zero value), or an error if w weighs another
// number of servers.
func (w ServerWeights) Shares(servers int) ([]float64, error) {
	if servers < 1 {
		return nil, fmt.Errorf("sched: server weights for %d servers", servers)
	}
	out := make([]float64, servers)
	if !w.Weighted() {
		for i := range out {
			out[i] = 1 / float64(servers)
		}
		return out, nil
	}
	if n := w.Len(); n != servers {
		return nil, fmt.Errorf("sched: server weights %v weigh %d servers, the job has %d", w, n, servers)
	}
	var sum float64
	for i := range out {
		sum += float64(w[i])
	}
	for i := range out {
		out[i] = float64(w[i]) / sum
	}
	return out, nil
}

// Weigh returns weights proportional to shares (any non-negative numbers,
// one per server, at least one positive), scaled so that the largest is
// WeightScale; every server keeps a weight of at least 1, so none is
// starved of its measurements. Equal shares give the zero value: equal
// weights place as no weights do, and one spelling keeps them equal as
// Config keys.
func Weigh(shares []float64) (ServerWeights, error) {
	var w ServerWeights
	if len(shares) < 1 || len(shares) > MaxWeightedServers {
		return w, fmt.Errorf("sched: %d server shares: want 1 to %d", len(shares), MaxWeightedServers)
	}
	var top float64
	for i, s := range shares {
		if !(s >= 0) || math.IsInf(s, 0) {
			return w, fmt.Errorf("sched: server %d's share is %v: want a finite number >= 0", i, s)
		}
		top = max(top, s)
	}
	if top == 0 {
		return w, fmt.Errorf("sched: server shares %v are all 0", shares)
	}
	equal := true
	for i, s := range shares {
		w[i] = uint16(max(1, math.Round(s/top*WeightScale)))
		equal = equal && w[i] == w[0]
	}
	if equal {
		return ServerWeights{}, nil
	}
	return w, nil
}

// String is "1000:1000:250", or "" for the zero value.
func (w ServerWeights) String() string {
	n := w.Len()
	parts := make([]string, n)
	for i := range n {
		parts[i] = strconv.Itoa(int(w[i]))
	}
	return strings.Join(parts, ":")
}

// ParseServerWeights reads "4:4:1" (or "4,4,1"): one positive number per
// server, in server order, scaled as Weigh does.
func ParseServerWeights(s string) (ServerWeights, error) {
	fields := weightFields(s)
	if len(fields) == 0 {
		return ServerWeights{}, fmt.Errorf("sched: server weights %q: want one number per server, e.g. 4:4:1", s)
	}
	shares := make([]float64, len(fields))
	for i, f := range fields {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(v > 0) || math.IsInf(v, 0) {
			return ServerWeights{}, fmt.Errorf("sched: server weights %q: server %d's weight %q is not a number > 0", s, i, f)
		}
		shares[i] = v
	}
	return Weigh(shares)
}

// weightFields splits a weight list at its separators, ':' or ','.
func weightFields(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ':' || r == ',' })
}

// ParseServerWeightsFor is ParseServerWeights for a job of servers
// parameter servers: one weight each, no more, no fewer (equal weights
// give the zero value, so the count is checked on s itself).
func ParseServerWeightsFor(s string, servers int) (ServerWeights, error) {
	w, err := ParseServerWeights(s)
	if err != nil {
		return w, err
	}
	if n := len(weightFields(s)); n != servers {
		return ServerWeights{}, fmt.Errorf("sched: server weights %q: %d weights for %d servers", s, n, servers)
	}
	return w, nil
}

// MarshalJSON writes the weighed servers' weights as a list (null for the
// zero value).
func (w ServerWeights) MarshalJSON() ([]byte, error) {
	if !w.Weighted() {
		return []byte("null"), nil
	}
	return json.Marshal(w[:w.Len()])
}

// UnmarshalJSON reads what MarshalJSON writes.
func (w *ServerWeights) UnmarshalJSON(b []byte) error {
	var list []uint16
	if err := json.Unmarshal(b, &list); err != nil {
		return fmt.Errorf("sched: server weights: %w", err)
	}
	if len(list) > MaxWeightedServers {
		return fmt.Errorf("sched: %d server weights: at most %d", len(list), MaxWeightedServers)
	}
	*w = ServerWeights{}
	copy(w[:], list)
	return w.Validate()
}
