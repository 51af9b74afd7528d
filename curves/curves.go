// Package curves draws per-step series that runs report (a training
// script's losses, for instance) as line plots, one line per run, so runs
// can be compared at a glance (docs/pytorch.md's loss curves).
//
// It reads the JSON result line the examples print (the last line of a
// file that is a JSON object holding the field) and knows nothing of how
// the runs were made.
package curves

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Series is one run's values, step by step.
type Series struct {
	Name   string
	Values []float64
}

// Read returns field (an array of numbers) of the last line of file that
// is a JSON object holding it.
func Read(file, field string) ([]float64, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("curves: %w", err)
	}
	defer f.Close()
	var found []float64
	ok := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var obj map[string]json.RawMessage
		if json.Unmarshal([]byte(line), &obj) != nil {
			continue
		}
		raw, has := obj[field]
		if !has {
			continue
		}
		var vs []float64
		if err := json.Unmarshal(raw, &vs); err != nil {
			return nil, fmt.Errorf("curves: %s: field %q is not an array of numbers: %w", file, field, err)
		}
		found, ok = vs, true
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("curves: reading %s: %w", file, err)
	}
	if !ok {
		return nil, fmt.Errorf("curves: %s has no JSON line with field %q", file, field)
	}
	if len(found) == 0 {
		return nil, fmt.Errorf("curves: %s: field %q is empty", file, field)
	}
	return found, nil
}

// Plot draws the series into a PNG at out, steps on the x axis.
func Plot(out, title, ylabel string, series []Series) error {
	if len(series) == 0 {
		return fmt.Errorf("curves: nothing to plot")
	}
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "step"
	p.Y.Label.Text = ylabel
	p.Legend.Top = true
	for i, s := range series {
		xy := make(plotter.XYs, len(s.Values))
		for k, v := range s.Values {
			xy[k] = plotter.XY{X: float64(k + 1), Y: v}
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			return fmt.Errorf("curves: series %q: %w", s.Name, err)
		}
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i)
		p.Add(l)
		p.Legend.Add(s.Name, l)
	}
	if err := p.Save(9*vg.Inch, 5*vg.Inch, out); err != nil {
		return fmt.Errorf("curves: %w", err)
	}
	return nil
}
