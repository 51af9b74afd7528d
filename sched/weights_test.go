package sched

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
)

// TestWeigh: shares become weights scaled to WeightScale, every server
// keeps at least 1, equal shares are the zero value, and bad shares are
// refused by name.
func TestWeigh(t *testing.T) {
	w, err := Weigh([]float64{4, 4, 1, 0})
	if err != nil {
		t.Fatal(err)
	}
	if want := (ServerWeights{1000, 1000, 250, 1}); w != want {
		t.Errorf("Weigh(4,4,1,0) = %v, want %v", w, want)
	}
	shares, err := w.Shares(4)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(shares[2]-250.0/2251) > 1e-12 {
		t.Errorf("shares %v: server 2 should have 250/2251", shares)
	}
	if w, err := Weigh([]float64{3, 3, 3}); err != nil || w.Weighted() {
		t.Errorf("equal shares gave %v, %v; want the zero value", w, err)
	}
	if _, err := w.Shares(3); err == nil || !strings.Contains(err.Error(), "weigh 4 servers, the job has 3") {
		t.Errorf("Shares(3) of 4 weights: %v", err)
	}
	for _, bad := range [][]float64{nil, {0, 0}, {1, -1}, {math.NaN()}, {math.Inf(1)}, make([]float64, MaxWeightedServers+1)} {
		if w, err := Weigh(bad); err == nil {
			t.Errorf("Weigh(%v) = %v, want an error", bad, w)
		}
	}
}

// TestParseServerWeights: the CLI spelling, its round trip through
// String and JSON, and errors that name the item.
func TestParseServerWeights(t *testing.T) {
	w, err := ParseServerWeights("4:4:1")
	if err != nil {
		t.Fatal(err)
	}
	if w.String() != "1000:1000:250" {
		t.Errorf("4:4:1 reads as %s", w)
	}
	b, err := json.Marshal(Config{Order: OrderPriority, ServerWeights: w})
	if err != nil {
		t.Fatal(err)
	}
	var back Config
	if err := json.Unmarshal(b, &back); err != nil || back.ServerWeights != w {
		t.Errorf("JSON %s read back as %v (%v)", b, back.ServerWeights, err)
	}
	if b, _ := json.Marshal(Config{}); strings.Contains(string(b), "ServerWeights") {
		t.Errorf("unweighted configuration writes its weights: %s", b)
	}
	for in, want := range map[string]string{"": "want one number", "4:x": `server 1's weight "x"`, "1:0": `server 1's weight "0"`} {
		if _, err := ParseServerWeights(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseServerWeights(%q) = %v, want an error naming %q", in, err, want)
		}
	}
	// For a job: one weight per server, counted as written (equal weights
	// parse to the zero value, which would hide a wrong count).
	if w, err := ParseServerWeightsFor("4:4:1", 3); err != nil || w.String() != "1000:1000:250" {
		t.Errorf("ParseServerWeightsFor(4:4:1, 3) = %v, %v", w, err)
	}
	if w, err := ParseServerWeightsFor("2:2", 2); err != nil || w.Weighted() {
		t.Errorf("ParseServerWeightsFor(2:2, 2) = %v, %v; want the zero value (even)", w, err)
	}
	for _, c := range []struct {
		in      string
		servers int
		want    string
	}{{"1:1:1", 2, `"1:1:1": 3 weights for 2 servers`}, {"1:2", 3, `"1:2": 2 weights for 3 servers`}, {"1:x", 2, `server 1's weight "x"`}} {
		if _, err := ParseServerWeightsFor(c.in, c.servers); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseServerWeightsFor(%q, %d) = %v, want an error naming %q", c.in, c.servers, err, c.want)
		}
	}
	if err := (Config{ServerWeights: ServerWeights{5, 0, 5}}).Validate(); err == nil || !strings.Contains(err.Error(), "server 1 has weight 0") {
		t.Errorf("a weight hole validates: %v", err)
	}
	if err := json.Unmarshal([]byte(`{"ServerWeights":[1,0,2]}`), &back); err == nil {
		t.Error("JSON with a weight hole decodes")
	}
}
