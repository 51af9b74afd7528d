package tuneeval

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/autobyte/autobyte/internal/outfile"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/units"
)

// Write writes results.md, results.json and the plots of every scenario
// (NAME-time.png, NAME-config.png, and NAME-load.png where server weights
// were searched) into dir, creating it.
func Write(rep *Report, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	var md strings.Builder
	if err := WriteMarkdown(&md, rep); err != nil {
		return err
	}
	if err := outfile.WriteFile(filepath.Join(dir, "results.md"), []byte(md.String()), 0o644); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	js, err := json.MarshalIndent(rep, "", " ")
	if err != nil {
		return err
	}
	if err := outfile.WriteFile(filepath.Join(dir, "results.json"), append(js, '\n'), 0o644); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	for i := range rep.Scenarios {
		sr := &rep.Scenarios[i]
		if err := Plot(sr, dir); err != nil {
			return fmt.Errorf("plots of %s: %w", sr.Scenario.Name, err)
		}
		if sr.StaticCandidates > len(Candidates()) { // server weights were searched
			if err := PlotScenarioLoad(sr, filepath.Join(dir, sr.Scenario.Name+"-load.png")); err != nil {
				return fmt.Errorf("load plot of %s: %w", sr.Scenario.Name, err)
			}
		}
	}
	return nil
}

// PlotScenarioLoad draws autobyte's, the best static configuration's and
// the oracle's iteration times and server shares over the scenario
// (PlotLoad).
func PlotScenarioLoad(sr *ScenarioResult, path string) error {
	var runs []LoadRun
	for _, name := range []string{AutoByte, BestStatic, OracleName} {
		if r := sr.Run(name); r != nil {
			runs = append(runs, LoadRun{Name: legend(sr, *r), IterationTimesS: r.IterationTimesS, Configs: r.Configs})
		}
	}
	return PlotLoad(path, sr.Scenario.Name+": iteration time and server shares", sr.Scenario.Servers, runs, phaseStarts(sr.Phases))
}

// ConfigString is "PARTITION/CREDIT", with " wW0:W1:..." for server
// weights, "fifo" for the unscheduled configuration.
func ConfigString(c sched.Config) string {
	if c == (sched.Config{}) {
		return "fifo"
	}
	f := func(b int64, zero string) string {
		if b == 0 {
			return zero
		}
		return strings.ReplaceAll(units.FormatBytes(b), " ", "")
	}
	out := f(c.PartitionBytes, "whole") + "/" + f(c.CreditBytes, "∞")
	if c.ServerWeights.Weighted() {
		out += " w" + c.ServerWeights.String()
	}
	if c.FusionBytes > 0 {
		out += " fused" + f(c.FusionBytes, "")
	}
	return out
}

// WriteMarkdown writes the results table, the per-phase table and the
// acceptance summary.
func WriteMarkdown(w io.Writer, rep *Report) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# autobyte tune eval: %s suite\n\n", rep.Suite)
	fmt.Fprintf(&b, "%d scenarios; best static and oracle over the autobyte grid (%d configurations); bo trials of %d iterations + %d apply delay (15 trials: %d iterations of exploration); %.0f s on %d goroutines.\n\n",
		len(rep.Scenarios), rep.Candidates, rep.BOTrial, rep.BOApplyDelay, 15*(rep.BOTrial+rep.BOApplyDelay), rep.ElapsedS, rep.Parallel)
	if rep.Baselines != "" {
		fmt.Fprintf(&b, "The best static and oracle runs are those of an earlier evaluation, `%s` (`--baselines`); its fifo and ByteScheduler runs came out the same again, so the simulator has not changed since.\n\n", rep.Baselines)
	}
	b.WriteString("Mean iteration time over the whole run, in seconds. `vs best static`: autobyte's mean relative to the best static configuration in hindsight. `vs oracle`: autobyte's steady-state time (last quarter of each phase) relative to the per-phase oracle's, worst phase. `settle`: iterations autobyte took after each change to stay within 5% of its phase's steady value. `autobyte+compression` may also turn bfloat16 compression on (`--compression auto`); every other column, the best static and the oracle included, sends float32.\n\n")
	b.WriteString("| scenario | fifo | bytescheduler | bo | autobyte | autobyte+compression | best static | oracle | autobyte vs best static | oracle vs best static | autobyte vs oracle (settled) | settle after changes | best static | oracle configs | bo last config (frozen after exploring) |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|\n")
	for _, s := range rep.Scenarios {
		fmt.Fprintf(&b, "| %s |", s.Scenario.Name)
		for _, t := range Tuners {
			fmt.Fprintf(&b, " %.4f |", s.Run(t).MeanIterationTimeS)
		}
		fmt.Fprintf(&b, " %+.1f%% | %+.1f%% | %+.1f%% | %s | %s | %s | %s |\n", s.AutoVsBestStaticPct, s.OracleVsBestStaticPct, s.AutoVsOraclePct,
			settleString(s), ConfigString(s.BestStaticConfig), configsString(s.OracleConfigs), boFrozen(s))
	}
	b.WriteString("\nPer phase: steady-state time (s) of autobyte, oracle and best static, and iterations for autobyte to settle.\n\n")
	b.WriteString("| scenario | phase | autobyte | oracle | best static | bo | autobyte vs oracle | autobyte settle |\n|---|---|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range rep.Scenarios {
		ab, or, bs, bo := s.Run(AutoByte), s.Run(OracleName), s.Run(BestStatic), s.Run(BO)
		for p, ph := range s.Phases {
			fmt.Fprintf(&b, "| %s | %d–%d | %.4f | %.4f | %.4f | %.4f | %+.1f%% | %d |\n", s.Scenario.Name, ph.From, ph.To,
				ab.PhaseSteadyS[p], or.PhaseSteadyS[p], bs.PhaseSteadyS[p], bo.PhaseSteadyS[p], pct(ab.PhaseSteadyS[p], or.PhaseSteadyS[p]), ab.SettleIterations[p])
		}
	}
	b.WriteString("\n## Against the acceptance\n\n")
	worst, worstName := math.Inf(-1), ""
	var changing, gain15, reach15 []string
	bestOracle, bestOracleName := math.Inf(1), ""
	var oracleMiss, settleMiss []string
	for _, s := range rep.Scenarios {
		if s.AutoVsBestStaticPct > worst {
			worst, worstName = s.AutoVsBestStaticPct, s.Scenario.Name
		}
		if s.Scenario.Changing() {
			changing = append(changing, s.Scenario.Name)
			if s.AutoVsBestStaticPct <= -15 {
				gain15 = append(gain15, s.Scenario.Name)
			}
			if s.OracleVsBestStaticPct <= -15 {
				reach15 = append(reach15, s.Scenario.Name)
			}
			if s.OracleVsBestStaticPct < bestOracle {
				bestOracle, bestOracleName = s.OracleVsBestStaticPct, s.Scenario.Name
			}
		}
		if s.AutoVsOraclePct > 5 {
			oracleMiss = append(oracleMiss, fmt.Sprintf("%s (%+.1f%%)", s.Scenario.Name, s.AutoVsOraclePct))
		}
		if s.AutoSettleMax > 30 {
			settleMiss = append(settleMiss, fmt.Sprintf("%s (%d)", s.Scenario.Name, s.AutoSettleMax))
		}
	}
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**not met**"
	}
	fmt.Fprintf(&b, "- never more than 3%% worse than the best static: %s (worst %+.1f%%, %s)\n", verdict(worst <= 3), worst, worstName)
	fmt.Fprintf(&b, "- at least 15%% better than the best static where conditions change: %s (%d of %d changing scenarios)", verdict(len(gain15) == len(changing)), len(gain15), len(changing))
	if len(changing) > 0 {
		fmt.Fprintf(&b, "; the per-phase oracle itself is at least 15%% better in %d of them (at best %+.1f%%, %s)", len(reach15), bestOracle, bestOracleName)
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "- within 5%% of the per-phase oracle once settled: %s%s\n", verdict(len(oracleMiss) == 0), listed(oracleMiss))
	fmt.Fprintf(&b, "- settles within 30 iterations after a change: %s%s\n", verdict(len(settleMiss) == 0), listed(settleMiss))
	_, err := io.WriteString(w, b.String())
	return err
}

func listed(xs []string) string {
	if len(xs) == 0 {
		return ""
	}
	return " (missed: " + strings.Join(xs, ", ") + ")"
}

func settleString(s ScenarioResult) string {
	if len(s.Phases) < 2 {
		return "–"
	}
	var out []string
	for _, n := range s.Run(AutoByte).SettleIterations[1:] {
		out = append(out, fmt.Sprint(n))
	}
	return strings.Join(out, ", ")
}

func configsString(cs []sched.Config) string {
	var out []string
	for _, c := range cs {
		out = append(out, ConfigString(c))
	}
	return strings.Join(out, " → ")
}

// boFrozen is BO's last configuration and the iteration it applied from.
func boFrozen(s ScenarioResult) string {
	cs := s.Run(BO).Configs
	last := cs[len(cs)-1]
	return fmt.Sprintf("%s from %d", ConfigString(last.Config), last.FromIteration)
}
