package tune_test

import (
	"math"
	"os"
	"testing"

	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/tune"
)

// FuzzParseMeta: a weights file (tune train --out, autobyte's --meta)
// parses into a network whose predictions are finite, or into an error;
// never a panic.
func FuzzParseMeta(f *testing.F) {
	shipped, err := os.ReadFile("weights.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(shipped)
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"layers":[{"w":[[1]],"b":[0]}]}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := tune.ParseMeta(data)
		if err != nil {
			return
		}
		s := tune.Stats{IterationTimeS: 0.5, ForwardS: 0.1, BackwardS: 0.2, BandwidthBps: 1.25e9, GoodputBps: 1e9, QueueDelayS: 0.01, Overlap: 0.5, InFlightBytes: 16e6}
		for _, c := range []sched.Config{{PartitionBytes: 4e6, CreditBytes: 16e6}, {PartitionBytes: 256e3, CreditBytes: 1e9}} {
			if p := m.PredictLog(s, c); math.IsNaN(p) || math.IsInf(p, 0) {
				t.Fatalf("weights %.200q: prediction %v for %+v", data, p, c)
			}
		}
	})
}
