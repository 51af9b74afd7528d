package units

import (
	"math"
	"testing"
)

// The parsers read flags and environment variables: whatever they are
// given, they return an error or a value inside their contract, and never
// panic.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"4MB", "0.5MB", "512KiB", "1.5 GB", "100", "1e400MB", "-1KB", "9223372036854775807B",
		"10Gbps", "1MB/s", "100Mbit/s", "0bps", "NaNGbps", "50us", "1.5ms", "0", "-1s", "", " ", "KB", "1..2MB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if n, err := ParseBytes(s); err == nil && n <= 0 {
			t.Errorf("ParseBytes(%q) = %d, want > 0 or an error", s, n)
		}
		if r, err := ParseRate(s); err == nil && (r <= 0 || math.IsInf(r, 0) || math.IsNaN(r)) {
			t.Errorf("ParseRate(%q) = %v, want positive and finite or an error", s, r)
		}
		if d, err := ParseDuration(s); err == nil && (d < 0 || math.IsInf(d, 0) || math.IsNaN(d)) {
			t.Errorf("ParseDuration(%q) = %v, want >= 0 and finite or an error", s, d)
		}
	})
}
