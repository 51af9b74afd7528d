// Package units owns parsing and formatting of byte sizes, data rates and
// durations given on the command line, and the formatting of counts ("3
// servers"); it knows nothing of models or networks.
//
// Parsers accept a number (integer, decimal or exponent form) optionally
// followed by spaces and a unit, and return errors that quote the offending
// input. Formatters produce short human-readable strings with at most one
// decimal place, using decimal (1000-step) prefixes.
package units

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// byteUnits maps lower-cased size units to their multiplier in bytes.
var byteUnits = map[string]float64{
	"":    1,
	"b":   1,
	"kb":  1e3,
	"mb":  1e6,
	"gb":  1e9,
	"tb":  1e12,
	"kib": 1 << 10,
	"mib": 1 << 20,
	"gib": 1 << 30,
	"tib": 1 << 40,
}

const byteUnitList = "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"

const rateUnitList = "bps, Kbps, Mbps, Gbps, Tbps, Kb/s, Mb/s, Gb/s, B/s, KB/s, MB/s, GB/s, TB/s, KiB/s, MiB/s, GiB/s, TiB/s"

// maxInt64Float is 2^63, the smallest float64 that does not fit in an int64.
const maxInt64Float = 9223372036854775808.0

// splitNumber splits s (already trimmed) into a leading number and the
// remaining unit text, with surrounding spaces removed from the unit. The
// number is an optional sign, digits with an optional decimal point and an
// optional exponent ("1e3", "2.5E-1").
func splitNumber(s string) (num, unit string) {
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	digits := 0
	for i < len(s) && (isDigit(s[i]) || s[i] == '.') {
		if isDigit(s[i]) {
			digits++
		}
		i++
	}
	if digits > 0 && i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		j := i + 1
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		if j < len(s) && isDigit(s[j]) {
			for j < len(s) && isDigit(s[j]) {
				j++
			}
			i = j
		}
	}
	return s[:i], strings.TrimSpace(s[i:])
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// parseQuantity splits s into its number and its unit text and parses the
// number, the steps ParseBytes and ParseRate share. kind ("size", "rate")
// and s are used for error messages; the unit is left to the caller.
func parseQuantity(kind, s string) (v float64, unit string, err error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, "", fmt.Errorf("%s %q: empty", kind, s)
	}
	num, unit := splitNumber(t)
	if num == "" || num == "+" || num == "-" {
		return 0, "", fmt.Errorf("%s %q: missing number", kind, s)
	}
	v, err = strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, "", fmt.Errorf("%s %q: invalid number %q", kind, s, num)
	}
	return v, unit, nil
}

// ParseBytes parses a byte size such as "4MB", "0.5MB", "512KiB", "1.5 GB",
// "100B" or "100" (a plain number is bytes). Units are case-insensitive:
// B, KB, MB, GB, TB are decimal (powers of 1000) and KiB, MiB, GiB, TiB are
// binary (powers of 1024). Fractional values are allowed and the result is
// rounded to the nearest byte; it must be positive and fit in an int64.
func ParseBytes(s string) (int64, error) {
	v, unit, err := parseQuantity("size", s)
	if err != nil {
		return 0, err
	}
	mult, ok := byteUnits[strings.ToLower(unit)]
	if !ok {
		return 0, fmt.Errorf("size %q: unknown unit %q (want %s)", s, unit, byteUnitList)
	}
	if v <= 0 {
		return 0, fmt.Errorf("size %q: must be > 0", s)
	}
	b := math.Round(v * mult)
	if math.IsInf(b, 0) || b >= maxInt64Float {
		return 0, fmt.Errorf("size %q: too large (max %d bytes)", s, int64(math.MaxInt64))
	}
	if b < 1 {
		return 0, fmt.Errorf("size %q: rounds to 0 bytes, must be > 0", s)
	}
	return int64(b), nil
}

// rateMultiplier returns the number of bytes per second that one unit of
// the rate unit u stands for. Bit units are "bps" or "b/s" with an optional
// K, M, G or T prefix (any case): "10Gbps", "10gbps", "1Mb/s". Byte units
// are "B/s" with an optional decimal (KB/s, MB/s, ...) or binary (KiB/s,
// MiB/s, ...) prefix. The b/B letter is case-sensitive: b is a bit, B a
// byte. Forms such as "MBps" are rejected as ambiguous.
func rateMultiplier(u string) (float64, bool) {
	power := 0 // decimal or binary prefix exponent: K=1, M=2, G=3, T=4
	binary := false
	if len(u) > 0 {
		switch u[0] {
		case 'k', 'K':
			power = 1
		case 'm', 'M':
			power = 2
		case 'g', 'G':
			power = 3
		case 't', 'T':
			power = 4
		}
		if power > 0 {
			u = u[1:]
			if len(u) > 0 && u[0] == 'i' {
				binary = true
				u = u[1:]
			}
		}
	}
	if len(u) == 0 {
		return 0, false
	}
	base := 1000.0
	if binary {
		base = 1024
	}
	scale := math.Pow(base, float64(power))
	rest := strings.ToLower(u[1:])
	switch u[0] {
	case 'b': // bits
		if binary || (rest != "ps" && rest != "/s") {
			return 0, false
		}
		return scale / 8, true
	case 'B': // bytes
		if rest != "/s" {
			return 0, false
		}
		return scale, true
	}
	return 0, false
}

// ParseRate parses a data rate and returns it in BYTES per second.
//
// Bit rates use bps, Kbps, Mbps, Gbps or Tbps (decimal; the prefix letter
// is case-insensitive, so "10gbps" == "10Gbps" == 1.25e9 B/s) or the
// equivalent b/s spelling ("1Mb/s" == 125000 B/s). Byte rates use B/s,
// KB/s, MB/s, GB/s, TB/s (decimal) or KiB/s, MiB/s, GiB/s, TiB/s (binary):
// "1MB/s" == 1e6 B/s. A lower-case b always means bits and an upper-case B
// bytes. A unit is required and the rate must be positive and finite.
func ParseRate(s string) (float64, error) {
	v, unit, err := parseQuantity("rate", s)
	if err != nil {
		return 0, err
	}
	if unit == "" {
		return 0, fmt.Errorf("rate %q: missing unit (want %s)", s, rateUnitList)
	}
	mult, ok := rateMultiplier(unit)
	if !ok {
		if strings.HasSuffix(unit, "Bps") {
			return 0, fmt.Errorf("rate %q: ambiguous unit %q (use B/s forms such as MB/s for bytes, or bps forms such as Mbps for bits)", s, unit)
		}
		return 0, fmt.Errorf("rate %q: unknown unit %q (want %s)", s, unit, rateUnitList)
	}
	if v <= 0 {
		return 0, fmt.Errorf("rate %q: must be > 0", s)
	}
	r := v * mult
	if math.IsInf(r, 0) {
		return 0, fmt.Errorf("rate %q: too large", s)
	}
	return r, nil
}

// ParseDuration parses a Go duration such as "50us", "1.5ms", "2s" or "0"
// (see time.ParseDuration) and returns it in seconds. The duration must not
// be negative.
func ParseDuration(s string) (float64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("duration %q: empty", s)
	}
	d, err := time.ParseDuration(t)
	if err != nil {
		return 0, fmt.Errorf("duration %q: invalid (want e.g. 0, 50us, 1.5ms, 2s)", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("duration %q: must be >= 0", s)
	}
	return d.Seconds(), nil
}

// human formats v in the largest unit whose scale does not exceed |v|, with
// at most one decimal place. scales must be ascending and names parallel to
// it; if rounding pushes the value to 1000 or more, the next unit is used.
func human(v float64, scales []float64, names []string) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return strconv.FormatFloat(v, 'f', -1, 64) + " " + names[0]
	}
	a := math.Abs(v)
	i := 0
	for i+1 < len(scales) && a >= scales[i+1] {
		i++
	}
	if i+1 < len(scales) && math.Abs(math.Round(v/scales[i]*10)/10) >= 1000 {
		i++
	}
	return oneDecimal(v/scales[i]) + " " + names[i]
}

// oneDecimal formats x with at most one decimal place, dropping a trailing
// ".0" and avoiding "-0".
func oneDecimal(x float64) string {
	s := strconv.FormatFloat(x, 'f', 1, 64)
	s = strings.TrimSuffix(s, ".0")
	if s == "-0" {
		s = "0"
	}
	return s
}

var (
	byteScales = []float64{1, 1e3, 1e6, 1e9, 1e12, 1e15, 1e18}
	byteNames  = []string{"B", "KB", "MB", "GB", "TB", "PB", "EB"}
	rateScales = []float64{1, 1e3, 1e6, 1e9, 1e12, 1e15}
	rateNames  = []string{"bps", "Kbps", "Mbps", "Gbps", "Tbps", "Pbps"}
	secScales  = []float64{1e-9, 1e-6, 1e-3, 1}
	secNames   = []string{"ns", "µs", "ms", "s"}
)

// FormatBytes formats n bytes with decimal prefixes and at most one decimal
// place: "256 B", "4 MB", "553.4 MB".
func FormatBytes(n int64) string {
	if n > -1000 && n < 1000 {
		return strconv.FormatInt(n, 10) + " B"
	}
	return human(float64(n), byteScales, byteNames)
}

// FormatRate formats a rate given in bytes per second as bits per second
// with decimal prefixes and at most one decimal place: "10 Gbps",
// "2.5 Gbps", "800 Mbps".
func FormatRate(bytesPerS float64) string {
	return human(bytesPerS*8, rateScales, rateNames)
}

// FormatCount formats n of a thing named by a regular noun: "1 server",
// "3 servers", "0 workers".
func FormatCount(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// FormatSeconds formats a duration in seconds using s, ms, µs or ns with at
// most one decimal place: "13 s", "95.2 ms", "50 µs". Values of a second
// or more are always shown in seconds; zero is "0 s".
func FormatSeconds(s float64) string {
	if s == 0 {
		return "0 s"
	}
	if math.IsNaN(s) || math.IsInf(s, 0) {
		return strconv.FormatFloat(s, 'f', -1, 64) + " s"
	}
	return human(s, secScales, secNames)
}
