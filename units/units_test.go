package units

import (
	"math"
	"strings"
	"testing"
)

func TestParseBytes(t *testing.T) {
	tests := []struct {
		in   string
		want int64
	}{
		{"4MB", 4_000_000},
		{"0.5MB", 500_000},
		{"512KiB", 512 * 1024},
		{"1.5 GB", 1_500_000_000},
		{"100B", 100},
		{"100", 100},
		{" 100 ", 100},
		{"4mb", 4_000_000},
		{"4Mb", 4_000_000},
		{"1kb", 1000},
		{"1KB", 1000},
		{"2TB", 2_000_000_000_000},
		{"1MiB", 1 << 20},
		{"1gib", 1 << 30},
		{"1TiB", 1 << 40},
		{"1.5KiB", 1536},
		{"1e3", 1000},
		{"2.5e-3MB", 2500},
		{"+7B", 7},
		{"1.4B", 1},
		{"1.6B", 2},
		{"0.5B", 1}, // rounds half away from zero
		{".5KB", 500},
		{"9223372036854775000", 9223372036854774784}, // float64 precision
	}
	for _, tt := range tests {
		got, err := ParseBytes(tt.in)
		if err != nil {
			t.Errorf("ParseBytes(%q): unexpected error %v", tt.in, err)
			continue
		}
		if got != tt.want {
			t.Errorf("ParseBytes(%q) = %d, want %d", tt.in, got, tt.want)
		}
	}
}

func TestParseBytesErrors(t *testing.T) {
	tests := []parseError{
		{"", `size "": empty`},
		{"   ", `size "   ": empty`},
		{"4XB", `size "4XB": unknown unit "XB" (want B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)`},
		{"4 PB", `size "4 PB": unknown unit "PB" (want B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)`},
		{"4MB/s", `size "4MB/s": unknown unit "MB/s" (want B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)`},
		{"-1MB", `size "-1MB": must be > 0`},
		{"0", `size "0": must be > 0`},
		{"0MB", `size "0MB": must be > 0`},
		{"0.4B", `size "0.4B": rounds to 0 bytes, must be > 0`},
		{"MB", `size "MB": missing number`},
		{"-MB", `size "-MB": missing number`},
		{"NaN", `size "NaN": missing number`},
		{"Inf", `size "Inf": missing number`},
		{"+Inf", `size "+Inf": missing number`},
		{"1.2.3MB", `size "1.2.3MB": invalid number "1.2.3"`},
		{".MB", `size ".MB": invalid number "."`},
		{"1e400", `size "1e400": invalid number "1e400"`},
		{"1e10TB", `size "1e10TB": too large (max 9223372036854775807 bytes)`},
		{"9223372036854775807", `size "9223372036854775807": too large (max 9223372036854775807 bytes)`},
		{"1e300TiB", `size "1e300TiB": too large (max 9223372036854775807 bytes)`},
	}
	checkParseErrors(t, "ParseBytes", ParseBytes, tests)
}

func TestParseRate(t *testing.T) {
	tests := []struct {
		in   string
		want float64
	}{
		{"10Gbps", 1.25e9},
		{"10gbps", 1.25e9},
		{"10 Gbps", 1.25e9},
		{"2.5Gbps", 2.5e9 / 8},
		{"800Mbps", 1e8},
		{"800mbps", 1e8},
		{"8kbps", 1000},
		{"8Kbps", 1000},
		{"8bps", 1},
		{"1Tbps", 1.25e11},
		{"1Mb/s", 125000},
		{"1mb/s", 125000},
		{"1Gb/s", 1.25e8},
		{"8b/s", 1},
		{"1MB/s", 1e6},
		{"1mB/s", 1e6},
		{"1B/s", 1},
		{"1KB/s", 1e3},
		{"1kB/s", 1e3},
		{"1GB/s", 1e9},
		{"1TB/s", 1e12},
		{"1KiB/s", 1024},
		{"1MiB/s", 1 << 20},
		{"1GiB/s", 1 << 30},
		{"1TiB/s", 1 << 40},
		{"1MB/S", 1e6},
		{"0.5 MB/s", 5e5},
		{"1e2Mbps", 1.25e7},
	}
	for _, tt := range tests {
		got, err := ParseRate(tt.in)
		if err != nil {
			t.Errorf("ParseRate(%q): unexpected error %v", tt.in, err)
			continue
		}
		if math.Abs(got-tt.want) > 1e-9*tt.want {
			t.Errorf("ParseRate(%q) = %g, want %g", tt.in, got, tt.want)
		}
	}
}

func TestParseRateErrors(t *testing.T) {
	const want = "(want bps, Kbps, Mbps, Gbps, Tbps, Kb/s, Mb/s, Gb/s, B/s, KB/s, MB/s, GB/s, TB/s, KiB/s, MiB/s, GiB/s, TiB/s)"
	tests := []parseError{
		{"", `rate "": empty`},
		{" ", `rate " ": empty`},
		{"10", `rate "10": missing unit ` + want},
		{"10G", `rate "10G": unknown unit "G" ` + want},
		{"10Gbit", `rate "10Gbit": unknown unit "Gbit" ` + want},
		{"10GBPS", `rate "10GBPS": unknown unit "GBPS" ` + want},
		{"10Xbps", `rate "10Xbps": unknown unit "Xbps" ` + want},
		{"10Gibps", `rate "10Gibps": unknown unit "Gibps" ` + want},
		{"10Gib/s", `rate "10Gib/s": unknown unit "Gib/s" ` + want},
		{"10MB", `rate "10MB": unknown unit "MB" ` + want},
		{"10MiB", `rate "10MiB": unknown unit "MiB" ` + want},
		{"10 /s", `rate "10 /s": unknown unit "/s" ` + want},
		{"10MBps", `rate "10MBps": ambiguous unit "MBps" (use B/s forms such as MB/s for bytes, or bps forms such as Mbps for bits)`},
		{"10Bps", `rate "10Bps": ambiguous unit "Bps" (use B/s forms such as MB/s for bytes, or bps forms such as Mbps for bits)`},
		{"0Gbps", `rate "0Gbps": must be > 0`},
		{"-1MB/s", `rate "-1MB/s": must be > 0`},
		{"Gbps", `rate "Gbps": missing number`},
		{"NaNGbps", `rate "NaNGbps": missing number`},
		{"1..2Gbps", `rate "1..2Gbps": invalid number "1..2"`},
		{"1e400Gbps", `rate "1e400Gbps": invalid number "1e400"`},
		{"1e308TB/s", `rate "1e308TB/s": too large`},
	}
	checkParseErrors(t, "ParseRate", ParseRate, tests)
}

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in   string
		want float64
	}{
		{"0", 0},
		{"0s", 0},
		{"50us", 50e-6},
		{"50µs", 50e-6},
		{"1.5ms", 1.5e-3},
		{"2s", 2},
		{" 2s ", 2},
		{"1m30s", 90},
		{"100ns", 100e-9},
	}
	for _, tt := range tests {
		got, err := ParseDuration(tt.in)
		if err != nil {
			t.Errorf("ParseDuration(%q): unexpected error %v", tt.in, err)
			continue
		}
		if math.Abs(got-tt.want) > 1e-12 {
			t.Errorf("ParseDuration(%q) = %g, want %g", tt.in, got, tt.want)
		}
	}
}

func TestParseDurationErrors(t *testing.T) {
	tests := []parseError{
		{"", `duration "": empty`},
		{"  ", `duration "  ": empty`},
		{"5", `duration "5": invalid (want e.g. 0, 50us, 1.5ms, 2s)`},
		{"5 s", `duration "5 s": invalid (want e.g. 0, 50us, 1.5ms, 2s)`},
		{"abc", `duration "abc": invalid (want e.g. 0, 50us, 1.5ms, 2s)`},
		{"3000000h", `duration "3000000h": invalid (want e.g. 0, 50us, 1.5ms, 2s)`},
		{"-1ms", `duration "-1ms": must be >= 0`},
	}
	checkParseErrors(t, "ParseDuration", ParseDuration, tests)
}

func TestFormatBytes(t *testing.T) {
	tests := []struct {
		in   int64
		want string
	}{
		{0, "0 B"},
		{256, "256 B"},
		{999, "999 B"},
		{1000, "1 KB"},
		{1500, "1.5 KB"},
		{4_000_000, "4 MB"},
		{553_400_000, "553.4 MB"},
		{553_449_999, "553.4 MB"},
		{999_960, "1 MB"}, // would round to 1000.0 KB
		{999_949, "999.9 KB"},
		{1_000_000_000_000, "1 TB"},
		{math.MaxInt64, "9.2 EB"},
		{-256, "-256 B"},
		{-4_000_000, "-4 MB"},
	}
	for _, tt := range tests {
		if got := FormatBytes(tt.in); got != tt.want {
			t.Errorf("FormatBytes(%d) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestFormatRate(t *testing.T) {
	tests := []struct {
		in   float64 // bytes per second
		want string
	}{
		{1.25e9, "10 Gbps"},
		{2.5e9 / 8, "2.5 Gbps"},
		{1e8, "800 Mbps"},
		{0, "0 bps"},
		{1, "8 bps"},
		{0.01, "0.1 bps"},
		{125, "1 Kbps"},
		{1.25e11, "1 Tbps"},
		{1.25e14, "1 Pbps"},
		{math.Inf(1), "+Inf bps"},
	}
	for _, tt := range tests {
		if got := FormatRate(tt.in); got != tt.want {
			t.Errorf("FormatRate(%g) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestFormatCount(t *testing.T) {
	for n, want := range map[int]string{0: "0 servers", 1: "1 server", 2: "2 servers", 1000: "1000 servers"} {
		if got := FormatCount(n, "server"); got != want {
			t.Errorf("FormatCount(%d, server) = %q, want %q", n, got, want)
		}
	}
}

func TestFormatSeconds(t *testing.T) {
	tests := []struct {
		in   float64
		want string
	}{
		{0, "0 s"},
		{13, "13 s"},
		{3600, "3600 s"},
		{1.25, "1.2 s"},
		{0.0952, "95.2 ms"},
		{50e-6, "50 µs"},
		{1.5e-3, "1.5 ms"},
		{0.99996, "1 s"},
		{100e-9, "100 ns"},
		{1e-12, "0 ns"},
		{-0.5, "-500 ms"},
		{math.NaN(), "NaN s"},
	}
	for _, tt := range tests {
		if got := FormatSeconds(tt.in); got != tt.want {
			t.Errorf("FormatSeconds(%g) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestRoundTrip checks that formatted values parse back to close values.
func TestRoundTrip(t *testing.T) {
	for _, n := range []int64{1, 999, 4_000_000, 553_400_000, 2_000_000_000_000} {
		s := FormatBytes(n)
		got, err := ParseBytes(strings.ReplaceAll(s, " ", ""))
		if err != nil || got != n {
			t.Errorf("ParseBytes(FormatBytes(%d) = %q) = %d, %v", n, s, got, err)
		}
	}
	for _, r := range []float64{1.25e9, 1e8, 125} {
		s := FormatRate(r)
		got, err := ParseRate(s)
		if err != nil || math.Abs(got-r) > 1e-9*r {
			t.Errorf("ParseRate(FormatRate(%g) = %q) = %g, %v", r, s, got, err)
		}
	}
}

// parseError is an input a parser must refuse, with its exact error
// message.
type parseError struct {
	in   string
	want string
}

// checkParseErrors checks that parse, called name in the messages, refuses
// every input with exactly its error message.
func checkParseErrors[T any](t *testing.T, name string, parse func(string) (T, error), tests []parseError) {
	t.Helper()
	for _, tt := range tests {
		got, err := parse(tt.in)
		if err == nil {
			t.Errorf("%s(%q) = %v, want error %q", name, tt.in, got, tt.want)
			continue
		}
		if err.Error() != tt.want {
			t.Errorf("%s(%q) error = %q, want %q", name, tt.in, err, tt.want)
		}
	}
}
