package sim

import (
	"math"
	"strconv"
	"testing"

	"github.com/autobyte/autobyte/units"
)

// FuzzParseSteps: a trace flag's value parses into steps whose iterations
// are >= 0 and strictly increasing and whose values are positive and
// finite, or into an error; never a panic.
func FuzzParseSteps(f *testing.F) {
	for _, s := range []string{"0:10Gbps,300:2Gbps,600:10Gbps", "0:1,200:2", " 5 : 1Gbps ", "", "0:", ":1Gbps", "1:1Gbps,1:2Gbps",
		"-1:1Gbps", "99999999999999999999:1Gbps", "0:1Gbps,,", "0:1e309Gbps", "0:NaN", "0:-Inf", "0:-2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for name, parse := range map[string]func(string) (float64, error){"rate": units.ParseRate, "float": func(v string) (float64, error) { return strconv.ParseFloat(v, 64) }} {
			steps, err := ParseSteps(s, parse)
			if err != nil {
				continue
			}
			for i, st := range steps {
				if st.Iteration < 0 || (i > 0 && st.Iteration <= steps[i-1].Iteration) {
					t.Errorf("ParseSteps(%q, %s): iterations %v, want >= 0 and strictly increasing", s, name, steps)
				}
				if !(st.Value > 0) || math.IsInf(st.Value, 0) {
					t.Errorf("ParseSteps(%q, %s): value %v, want positive and finite", s, name, st.Value)
				}
			}
		}
	})
}
