package main

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/autobyte/autobyte/tuneeval"
	"github.com/autobyte/autobyte/units"
)

func newTuneGapCmd() *cobra.Command {
	var costs, only string
	var parallel, random int
	var seed uint64
	var asJSON, links bool
	cmd := &cobra.Command{
		Use:   "gap",
		Short: "How much a per-phase oracle gains over the best static configuration (no tuner runs)",
		Long: `gap simulates every candidate of the autobyte tuner's grid for the whole run of
each scenario, picks the best static configuration in hindsight and the
per-phase oracle exactly as 'tune eval' does, and runs the oracle: the most any
tuner could gain by following the changes. It runs the changing scenarios of
tune eval's suite and three more with a 100 -> 10 -> 100 Gbps swing
(tuneeval.GapSuite), under each --message-cost (the simulator's fixed time per
message; scripts/message-cost.sh measures the runtime's). With --random N it
runs N scenarios drawn from --seed over a wider space instead
(tuneeval.RandomGapSuite: zoo models, 2-16 workers, 1-100 Gbps, compute 1/4-4x,
a 2-20x bandwidth drop or a 2-8x compute slowdown). With --links it runs the
link suite (tune eval --links: server links that slow down; the candidates
include server weights) and the job scripts/testbed-slow-server.sh runs on the
testbed. It prints one Markdown row per scenario and cost and a summary, or
JSON.`,
		Example: `  autobyte tune gap --message-cost 0,15us
  autobyte tune gap --message-cost 15us --only vgg16-ps-8w-bw10x --json
  autobyte tune gap --random 40 --seed 1 --message-cost 0,15us`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if parallel < 1 {
				return fmt.Errorf("--parallel must be >= 1, got %d", parallel)
			}
			var cs []string
			for _, c := range strings.Split(costs, ",") {
				c = strings.TrimSpace(c)
				if _, err := units.ParseDuration(c); err != nil {
					return fmt.Errorf("--message-cost: %w", err)
				}
				cs = append(cs, c)
			}
			if random < 0 {
				return fmt.Errorf("--random must be >= 0, got %d", random)
			}
			if links && random > 0 {
				return fmt.Errorf("--links and --random choose different suites; give at most one")
			}
			suite := tuneeval.GapSuite()
			switch {
			case random > 0:
				suite = tuneeval.RandomGapSuite(random, seed)
			case links:
				suite = append(tuneeval.LinkSuite(), tuneeval.TestbedLinkScenario())
			}
			suite, err := tuneeval.Select(suite, only)
			if err != nil {
				return err
			}
			start := time.Now()
			var out []*tuneeval.GapResult
			if !asJSON {
				writeGapHeader(cmd.OutOrStdout())
			}
			for _, c := range cs {
				for _, s := range suite {
					s.MessageCost = c
					g, err := tuneeval.Gap(s, parallel)
					if err != nil {
						return err
					}
					fmt.Fprintf(cmd.ErrOrStderr(), "tune gap: %s at %s per message: oracle %+.1f%% (%.0f s)\n", s.Name, c, g.OracleVsBestStaticPct, time.Since(start).Seconds())
					out = append(out, g)
					if !asJSON {
						writeGapRow(cmd.OutOrStdout(), g)
					}
				}
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(out)
			}
			writeGapSummary(cmd.OutOrStdout(), out)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&costs, "message-cost", "0", "comma-separated fixed processing times per message, e.g. 0,15us (each runs the whole list of scenarios)")
	fs.StringVar(&only, "only", "", "comma-separated scenario names to run (default all)")
	fs.IntVar(&parallel, "parallel", runtime.GOMAXPROCS(0), "simulations run at once")
	fs.BoolVar(&asJSON, "json", false, "print one JSON array")
	fs.IntVar(&random, "random", 0, "run this many scenarios drawn from --seed (tuneeval.RandomGapSuite) instead of the gap suite")
	fs.Uint64Var(&seed, "seed", 1, "seed of --random's scenarios")
	fs.BoolVar(&links, "links", false, "run the link suite and the testbed's slow-server job instead of the gap suite")
	return cmd
}

func writeGapHeader(w io.Writer) {
	fmt.Fprintln(w, "| scenario | message cost | bytescheduler | best static | oracle | oracle vs best static | best static config | oracle configs |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---|---|")
}

func writeGapRow(w io.Writer, g *tuneeval.GapResult) {
	var cfgs []string
	for _, c := range g.OracleConfigs {
		cfgs = append(cfgs, tuneeval.ConfigString(c))
	}
	fmt.Fprintf(w, "| %s | %s | %.4f | %.4f | %.4f | %+.1f%% | %s | %s |\n", g.Scenario.Name, units.FormatSeconds(g.MessageCostS),
		g.ByteSchedulerMeanS, g.BestStaticMeanS, g.OracleMeanS, g.OracleVsBestStaticPct, tuneeval.ConfigString(g.BestStaticConfig),
		strings.Join(cfgs, " → "))
}

// writeGapSummary prints, per message cost, the median and the largest
// gain of the oracle over the best static configuration and how many
// scenarios reach the 15% the acceptance asks of the tuner.
func writeGapSummary(w io.Writer, gs []*tuneeval.GapResult) {
	byCost := map[float64][]*tuneeval.GapResult{}
	var costs []float64
	for _, g := range gs {
		if _, ok := byCost[g.MessageCostS]; !ok {
			costs = append(costs, g.MessageCostS)
		}
		byCost[g.MessageCostS] = append(byCost[g.MessageCostS], g)
	}
	fmt.Fprintln(w)
	for _, c := range costs {
		s := tuneeval.SummarizeGaps(byCost[c])
		fmt.Fprintf(w, "At %s per message, %d scenarios: oracle vs best static median %+.1f%%, best %+.1f%% (%s); %d at -15%% or better.\n",
			units.FormatSeconds(c), s.N, s.MedianPct, s.BestPct, s.BestName, s.AtLeast15)
	}
}
