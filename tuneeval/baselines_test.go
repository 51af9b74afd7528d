package tuneeval

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBaselinesReproduce: an evaluation that reuses an earlier one's
// baselines gives the report a full evaluation gives (but for where the
// baselines came from), and refuses baselines that a changed simulator, a
// changed scenario or a missing scenario would make wrong. The tampered
// fifo run is the negative control of the simulator check.
func TestBaselinesReproduce(t *testing.T) {
	dir := t.TempDir()
	only := "alexnet-ps-2w-steady"
	full, err := Evaluate(Options{Out: dir, Quick: true, Parallel: 2, Only: only})
	if err != nil {
		t.Fatal(err)
	}
	if err := Write(full, dir); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "results.json")
	var log strings.Builder
	again, err := Evaluate(Options{Out: dir, Quick: true, Parallel: 2, Only: only, Baselines: path, Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	if want := "1 scenarios, 5 simulations (then 0 oracle runs)"; !strings.Contains(log.String(), want) {
		t.Errorf("with --baselines the log says %q, want only the 5 tuners run (%q)", log.String(), want)
	}
	if again.Baselines != path {
		t.Errorf("report's baselines %q, want %q", again.Baselines, path)
	}
	canon := func(r *Report) []byte {
		c := *r
		c.ElapsedS, c.Parallel, c.Baselines = 0, 0, ""
		js, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	if !bytes.Equal(canon(full), canon(again)) {
		t.Errorf("with --baselines the report differs from a full evaluation:\n%s\n%s", canon(full), canon(again))
	}
	var md strings.Builder
	if err := WriteMarkdown(&md, again); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "`"+path+"` (`--baselines`)") {
		t.Errorf("results.md does not say where the baselines came from:\n%s", md.String())
	}

	// Tampered copies of the baselines.
	tamper := func(name string, edit func(*Report)) string {
		var rep Report
		js, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(js, &rep); err != nil {
			t.Fatal(err)
		}
		edit(&rep)
		out, err := json.Marshal(rep)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, out, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct {
		path, want string
	}{
		{tamper("sim-changed.json", func(r *Report) { r.Scenarios[0].Run(Fifo).IterationTimesS[3] *= 1.01 }),
			"fifo's run now takes"},
		{tamper("scenario-changed.json", func(r *Report) { r.Scenarios[0].Scenario.Bandwidth = "1Gbps" }),
			"scenario " + only + " is defined otherwise there"},
		{tamper("no-scenario.json", func(r *Report) { r.Scenarios = nil }),
			"holds no scenario " + only},
		{tamper("no-oracle.json", func(r *Report) { r.Scenarios[0].Runs = r.Scenarios[0].Runs[:len(Tuners)-1] }),
			"has no complete oracle run"},
		{filepath.Join(dir, "missing.json"), "missing.json"},
	} {
		_, err := Evaluate(Options{Out: dir, Quick: true, Parallel: 2, Only: only, Baselines: c.path})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("baselines %s: error %v, want one containing %q", filepath.Base(c.path), err, c.want)
		}
	}
}
