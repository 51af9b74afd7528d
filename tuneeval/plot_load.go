package tuneeval

import (
	"fmt"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/autobyte/autobyte/tune"
)

// LoadRun is one run of a parameter-server job for PlotLoad: its
// iteration times and the configurations in force (their server weights).
type LoadRun struct {
	Name            string
	IterationTimesS []float64
	Configs         []tune.ConfigChange
}

// PlotLoad writes a PNG to path: the runs' iteration times over the run
// (top) and each server's share of the bytes in each run (bottom: one
// colour per run, one line per server, the first run's servers solid and
// the others' dashed), with grey lines at the iterations in marks (where
// a link changes).
func PlotLoad(path, title string, servers int, runs []LoadRun, marks []int) error {
	if servers < 1 {
		return fmt.Errorf("tuneeval: load plot of %d servers", servers)
	}
	times, shares := plot.New(), plot.New()
	times.Title.Text = title
	times.Y.Label.Text = "iteration time (s)"
	shares.Y.Label.Text = "share of the bytes"
	shares.X.Label.Text = "iteration"
	for _, p := range []*plot.Plot{times, shares} {
		p.X.Tick.Marker = iterationTicks{}
		p.Legend.Top = true
	}
	shares.Y.Min, shares.Y.Max = 0, 1
	for i, r := range runs {
		xy := make(plotter.XYs, len(r.IterationTimesS))
		for k, t := range r.IterationTimesS {
			xy[k] = plotter.XY{X: float64(k), Y: t}
		}
		if err := addLine(times, i, r.Name, xy, plotter.NoStep); err != nil {
			return err
		}
		per := make([]plotter.XYs, servers)
		for k := range r.IterationTimesS {
			sh, err := tune.ConfigAt(r.Configs, k).ServerWeights.Shares(servers)
			if err != nil {
				return fmt.Errorf("tuneeval: %s, iteration %d: %w", r.Name, k, err)
			}
			for s := range per {
				per[s] = append(per[s], plotter.XY{X: float64(k), Y: sh[s]})
			}
		}
		for s, xy := range per {
			l, err := plotter.NewLine(xy)
			if err != nil {
				return err
			}
			l.StepStyle = plotter.PostStep
			l.Color = plotutil.Color(i)
			l.Width = vg.Points(1.2)
			if i > 0 {
				l.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
			}
			shares.Add(l)
			if s == 0 {
				shares.Legend.Add(r.Name+" (one line per server)", l)
			}
		}
	}
	addMarks(times, marks)
	addMarks(shares, marks)
	return saveStacked(path, times, shares)
}
