package job

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/autobyte/autobyte/proto"
	"github.com/autobyte/autobyte/sched"
)

// TestConformanceIsTimingFree checks the premise of TestConformance: in
// its profile, with each of its scenarios' configurations, the order in
// which a worker starts pieces does not depend on the order in which the
// pieces in flight finish. Each layer is posted at once (its backward
// takes 200 ms, its pieces a few ms), so the check posts one layer at a
// time and tries every order of completions until the layer is done. A
// real ring or server finishes concurrent pieces in any order; a
// configuration that fails this check makes TestConformance flaky (strict
// admission with 8,000 bytes of credit did: 3,333 elements cut in pieces
// of 2,668 and 2,664 bytes let a smaller, later piece overtake a larger one
// whenever a small piece finished first).
func TestConformanceIsTimingFree(t *testing.T) {
	for _, c := range conformanceScenarios() {
		cfgs := []sched.Config{c.cfg}
		if c.change != nil {
			cfgs = append(cfgs, *c.change)
		}
		for _, cfg := range cfgs {
			if err := timingFree(cfg); err != nil {
				t.Errorf("%s, configuration %+v: %v", c.name, cfg, err)
			}
		}
	}
	// Negative control: the check catches the configuration that made
	// TestConformance flaky.
	flaky := sched.Config{PartitionBytes: 3_000, CreditBytes: 8_000, Order: sched.OrderPriority, Admission: sched.AdmitStrict}
	if err := timingFree(flaky); err == nil || !strings.Contains(err.Error(), "layer 1") {
		t.Errorf("strict admission with 8,000 bytes of credit: %v, want layer 1 found timing-dependent", err)
	}
}

// timingFree explores, layer by layer in backward order, every order in
// which in-flight pieces can finish, and returns an error naming the first
// layer where two orders start pieces differently.
func timingFree(cfg sched.Config) error {
	cfg.ServerWeights = sched.ServerWeights{} // placement does not order starts; one server suffices
	p := conformanceProfile()
	var tensors []proto.Tensor
	var layerTensors [][]int
	for l, layer := range p.Layers {
		var ids []int
		for _, tn := range layer.Tensors {
			ids = append(ids, len(tensors))
			tensors = append(tensors, proto.Tensor{Layer: l, Bytes: 4 * tn.Params, ElemBytes: 4, Compressible: true})
		}
		layerTensors = append(layerTensors, ids)
	}
	newWorker := func() (*proto.Worker, error) {
		return proto.New(proto.Config{Rank: 0, Workers: 1, Arch: proto.PS, Servers: 1, Tensors: tensors, Sched: cfg,
			Plans: proto.NewPlans()})
	}
	// replay posts layers down to l (each earlier one finished in start
	// order), then finishes pieces by choices (indices into the sorted
	// in-flight pieces), and returns layer l's starts and what is in flight.
	replay := func(l int, choices []int) (started []string, inflight []sched.PieceID, err error) {
		w, err := newWorker()
		if err != nil {
			return nil, nil, err
		}
		collect := func() {
			rd := w.Ready()
			for _, s := range rd.Started {
				started = append(started, fmt.Sprint(s.Piece.PieceID))
				inflight = append(inflight, s.Piece.PieceID)
			}
		}
		finish := func(i int) error {
			id := inflight[i]
			inflight = slices.Delete(inflight, i, i+1)
			return w.Answered(id)
		}
		for k := len(p.Layers) - 1; k >= l; k-- {
			started, inflight = nil, nil
			for _, tn := range layerTensors[k] {
				if err := w.Post(tn, 0); err != nil {
					return nil, nil, err
				}
			}
			collect()
			if k == l {
				break
			}
			for len(inflight) > 0 {
				if err := finish(0); err != nil {
					return nil, nil, err
				}
				collect()
			}
		}
		for _, i := range choices {
			slices.SortFunc(inflight, func(a, b sched.PieceID) int {
				return cmp.Or(cmp.Compare(a.Tensor, b.Tensor), cmp.Compare(a.Index, b.Index))
			})
			if err := finish(i); err != nil {
				return nil, nil, err
			}
			collect()
		}
		return started, inflight, nil
	}
	for l := len(p.Layers) - 1; l >= 0; l-- {
		var first string
		seen := map[string]string{} // state (what started, what is in flight) -> start order that reached it
		var walk func(choices []int) error
		walk = func(choices []int) error {
			started, inflight, err := replay(l, choices)
			if err != nil {
				return err
			}
			order := strings.Join(started, " ")
			set := slices.Clone(started)
			slices.Sort(set)
			fly := make([]string, len(inflight))
			for i, id := range inflight {
				fly[i] = fmt.Sprint(id)
			}
			slices.Sort(fly)
			state := strings.Join(set, " ") + " | " + strings.Join(fly, " ")
			if prev, ok := seen[state]; ok {
				if prev != order {
					return fmt.Errorf("layer %d: pieces started as %s or as %s", l, prev, order)
				}
				return nil
			}
			seen[state] = order
			if len(inflight) == 0 {
				if first == "" {
					first = order
				} else if first != order {
					return fmt.Errorf("layer %d: pieces started as %s or as %s", l, first, order)
				}
				return nil
			}
			for i := range inflight {
				if err := walk(append(slices.Clone(choices), i)); err != nil {
					return err
				}
			}
			return nil
		}
		if err := walk(nil); err != nil {
			return err
		}
	}
	return nil
}
