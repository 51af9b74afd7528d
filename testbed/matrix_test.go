package testbed

import (
	"context"
	"fmt"
	"os"
	"testing"
)

// TestShapingMatrix measures TCP goodput against the shaped rate for the
// package's HTB setup and for alternatives (the numbers in docs/testbed.md).
// It takes about a minute, so it runs only with AUTOBYTE_TESTBED_MATRIX=1.
func TestShapingMatrix(t *testing.T) {
	if os.Getenv("AUTOBYTE_TESTBED_MATRIX") != "1" {
		t.Skip("set AUTOBYTE_TESTBED_MATRIX=1 to measure shaping accuracy")
	}
	requireRoot(t)
	type setup struct {
		name  string
		apply func(tb *Testbed, ns, dev string, rateBps float64) error
	}
	tbf := func(burst func(rateBps float64) int64) func(*Testbed, string, string, float64) error {
		return func(_ *Testbed, ns, dev string, rateBps float64) error {
			b := burst(rateBps)
			_, err := runTC(context.Background(), "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
				"rate", fmt.Sprintf("%dbit", int64(rateBps*8)), "burst", fmt.Sprint(b), "limit", fmt.Sprint(max(b, 3*gsoBytes)))
			return err
		}
	}
	htbBurst := func(burst int64) func(*Testbed, string, string, float64) error {
		return func(tb *Testbed, ns, dev string, rateBps float64) error {
			r, _, q := htbParams(rateBps)
			_, err := runTC(context.Background(), "-n", ns, "class", "change", "dev", dev, "parent", "1:", "classid", "1:1", "htb",
				"rate", fmt.Sprintf("%dbit", r), "ceil", fmt.Sprintf("%dbit", r),
				"burst", fmt.Sprint(burst), "cburst", fmt.Sprint(burst), "quantum", fmt.Sprint(q))
			return err
		}
	}
	setups := []setup{
		{"htb (package default)", nil},
		{"htb burst 2 frames", htbBurst(2 * frameBytes)},
		{"tbf burst rate/HZ(250)", tbf(func(r float64) int64 { return max(int64(r/250), 2*frameBytes) })},
		{"tbf burst max(rate/HZ, 64KiB GSO)", tbf(func(r float64) int64 { return max(int64(r/250), gsoBytes+frameBytes) })},
		{"tbf burst 10 frames", tbf(func(r float64) int64 { return 10 * frameBytes })},
	}
	for _, rate := range []float64{1e9 / 8, 100e6 / 8, 10e6 / 8} {
		for _, s := range setups {
			t.Run(fmt.Sprintf("%gMbit/%s", rate*8/1e6, s.name), func(t *testing.T) {
				tb := up(t, 2, rate, 0)
				if s.apply != nil {
					for _, d := range [][2]string{{tb.Hosts[0].Namespace, hostIf}, {tb.SwitchNS, tb.Hosts[1].SwitchPort}} {
						if err := s.apply(tb, d[0], d[1], rate); err != nil {
							t.Fatal(err)
						}
					}
				}
				n := int64(rate * 2) // about 2 s
				r := transfer(t, tb, n, 0, nil)
				secs := float64(r.LastNs-r.FirstNs) / 1e9
				got := float64(r.Bytes) / secs
				t.Logf("MATRIX | %s | %g Mbit/s | %.1f Mbit/s | %.1f%% | %d/%d bytes", s.name, rate*8/1e6, got*8/1e6, 100*got/rate, r.Bytes, n)
			})
		}
	}
}
