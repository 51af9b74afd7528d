package tuneeval

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/autobyte/autobyte/tune"
)

// Plot writes NAME-time.png (iteration time over the run, one line per
// tuner) and NAME-config.png (partition and credit in force over the run,
// log scale, one line per tuner but fifo) into dir.
func Plot(s *ScenarioResult, dir string) error {
	name := s.Scenario.Name
	p := plot.New()
	p.Title.Text = name + ": iteration time"
	p.X.Label.Text = "iteration"
	p.X.Tick.Marker = iterationTicks{}
	p.Y.Label.Text = "iteration time (s)"
	p.Legend.Top = true
	for i, r := range s.Runs {
		xy := make(plotter.XYs, len(r.IterationTimesS))
		for k, t := range r.IterationTimesS {
			xy[k] = plotter.XY{X: float64(k), Y: t}
		}
		if err := addLine(p, i, legend(s, r), xy, plotter.NoStep); err != nil {
			return err
		}
	}
	addPhaseLines(p, s)
	if err := p.Save(10*vg.Inch, 5*vg.Inch, filepath.Join(dir, name+"-time.png")); err != nil {
		return err
	}

	part, cred := plot.New(), plot.New()
	part.Title.Text = name + ": configuration in force"
	part.Y.Label.Text = "partition (bytes)"
	cred.Y.Label.Text = "credit (bytes)"
	cred.X.Label.Text = "iteration"
	for _, q := range []*plot.Plot{part, cred} {
		q.Y.Scale = plot.LogScale{}
		q.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		q.X.Tick.Marker = iterationTicks{}
		q.Legend.Top = true
	}
	n := s.Scenario.Iterations
	for i, r := range s.Runs {
		if r.Tuner == Fifo {
			continue // whole tensors, no credit: nothing to draw on a log scale
		}
		pxy, cxy := make(plotter.XYs, n), make(plotter.XYs, n)
		for k := range n {
			c := tune.ConfigAt(r.Configs, k)
			pxy[k] = plotter.XY{X: float64(k), Y: float64(c.PartitionBytes)}
			cxy[k] = plotter.XY{X: float64(k), Y: float64(c.CreditBytes)}
		}
		if err := addLine(part, i, legend(s, r), pxy, plotter.PostStep); err != nil {
			return err
		}
		if err := addLine(cred, i, legend(s, r), cxy, plotter.PostStep); err != nil {
			return err
		}
	}
	addPhaseLines(part, s)
	addPhaseLines(cred, s)
	return saveStacked(filepath.Join(dir, name+"-config.png"), part, cred)
}

// saveStacked writes top above bottom, x axes aligned, as a PNG at path.
func saveStacked(path string, top, bottom *plot.Plot) error {
	img := vgimg.New(10*vg.Inch, 8*vg.Inch)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadTop: vg.Points(4), PadBottom: vg.Points(4), PadX: vg.Points(4), PadY: vg.Points(8)}
	canvases := plot.Align([][]*plot.Plot{{top}, {bottom}}, tiles, draw.New(img))
	top.Draw(canvases[0][0])
	bottom.Draw(canvases[1][0])
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func legend(s *ScenarioResult, r TunerRun) string {
	if r.Tuner == BO {
		last := r.Configs[len(r.Configs)-1]
		return fmt.Sprintf("bo (last change at %d: %s)", last.FromIteration, ConfigString(last.Config))
	}
	if r.Tuner == BestStatic {
		return "best static " + ConfigString(s.BestStaticConfig)
	}
	return r.Tuner
}

func addLine(p *plot.Plot, i int, name string, xy plotter.XYs, step plotter.StepKind) error {
	l, err := plotter.NewLine(xy)
	if err != nil {
		return err
	}
	l.StepStyle = step
	l.Color = plotutil.Color(i)
	l.Width = vg.Points(1.2)
	if i >= 4 {
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
	}
	p.Add(l)
	p.Legend.Add(name, l)
	return nil
}

// addPhaseLines marks the phase boundaries with grey vertical lines.
func addPhaseLines(p *plot.Plot, s *ScenarioResult) { addMarks(p, phaseStarts(s.Phases)) }

// phaseStarts are the iterations where phases after the first start.
func phaseStarts(phases []Phase) []int {
	var out []int
	for _, ph := range phases[1:] {
		out = append(out, ph.From)
	}
	return out
}

// addMarks draws a grey dotted vertical line at each iteration of marks.
func addMarks(p *plot.Plot, marks []int) {
	for _, m := range marks {
		x := float64(m)
		g := &plotter.Line{XYs: plotter.XYs{{X: x, Y: p.Y.Min}, {X: x, Y: p.Y.Max}}}
		g.Color = plotutil.Color(7)
		g.Dashes = []vg.Length{vg.Points(1), vg.Points(3)}
		g.Width = vg.Points(0.8)
		p.Add(g)
	}
}

// iterationTicks are gonum's default ticks labelled as whole iterations
// ("2500", not "2500.00").
type iterationTicks struct{}

func (iterationTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = strconv.FormatFloat(ts[i].Value, 'f', -1, 64)
		}
	}
	return ts
}
