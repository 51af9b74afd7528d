package sched

import "testing"

// FuzzParseServerWeights: --server-weights parses into weights that pass
// their own Validate and give one share per server summing to 1 (or, for
// equal weights, into no weights), or into an error; never a panic.
func FuzzParseServerWeights(f *testing.F) {
	for _, s := range []string{"4:4:1", "4,4,1", "1", "", ":", "0:1", "-1:2", "1e9:1", "NaN:1", "1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		w, err := ParseServerWeights(s)
		if err != nil {
			return
		}
		if err := w.Validate(); err != nil {
			t.Fatalf("ParseServerWeights(%q) = %v, which Validate refuses: %v", s, w, err)
		}
		if !w.Weighted() {
			return // equal weights: spelled as none, and valid for any number of servers
		}
		shares, err := w.Shares(w.Len())
		if err != nil {
			t.Fatalf("ParseServerWeights(%q) = %v: Shares(%d): %v", s, w, w.Len(), err)
		}
		sum := 0.0
		for _, x := range shares {
			if !(x > 0) {
				t.Fatalf("ParseServerWeights(%q): share %v, want > 0", s, x)
			}
			sum += x
		}
		if sum < 1-1e-9 || sum > 1+1e-9 {
			t.Fatalf("ParseServerWeights(%q): shares %v sum to %v, want 1", s, shares, sum)
		}
	})
}
