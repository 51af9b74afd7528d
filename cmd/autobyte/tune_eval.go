package main

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/autobyte/autobyte/internal/outfile"
	"github.com/autobyte/autobyte/tuneeval"
)

func newTuneEvalCmd() *cobra.Command {
	var o tuneeval.Options
	cmd := &cobra.Command{
		Use:   "eval",
		Short: "Run every tuner on a scenario suite in the simulator; write a results table and plots",
		Long: `eval simulates every scenario of the suite (zoo models on parameter servers and
ring all-reduce, steady and changing bandwidth, a straggler) under fifo,
ByteScheduler's defaults, bo (ByteScheduler's one-shot Bayesian optimisation,
trials scaled by --bo-trial), autobyte (the meta-network tuner), the best static
configuration in hindsight and a per-phase oracle (both over the autobyte
tuner's candidate grid). It writes results.md, results.json and, per scenario,
NAME-time.png and NAME-config.png into --out. See docs/tuner-eval.md.`,
		Example: `  autobyte tune eval --out eval/
  autobyte tune eval --quick --out /tmp/eval
  autobyte tune eval --links --random 4 --seed 7 --out eval-links-heldout/
  autobyte tune eval --links --baselines eval-links/results.json --out eval-links-2/   # tuners only
  autobyte tune eval --long --out eval-long/   # BO at its released timing, 3,000-iteration runs`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Log = cmd.ErrOrStderr()
			// Refused before the evaluation, not after it.
			if err := outfile.CheckDir(o.Out); err != nil {
				return fmt.Errorf("--out: %w", err)
			}
			rep, err := tuneeval.Evaluate(o)
			if err != nil {
				return err
			}
			if err := tuneeval.Write(rep, o.Out); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "tune eval: %d scenarios in %.0f s; wrote %s/results.md, results.json and plots\n", len(rep.Scenarios), rep.ElapsedS, o.Out)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.Out, "out", "tune-eval", "directory for results.md, results.json and the PNG plots")
	fs.BoolVar(&o.Quick, "quick", false, "run the small quick suite (2 short scenarios) instead of the default one")
	fs.BoolVar(&o.Links, "links", false, "run the link suite (8 parameter-server jobs where one or two server links slow 4-10x for a third of the run; the static baselines search server weights too) instead of the default one")
	fs.IntVar(&o.Random, "random", 0, "with --links: run this many link scenarios drawn from --seed (tuneeval.RandomLinkSuite, the held-out check) instead of the link suite")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of --random's scenarios")
	fs.BoolVar(&o.Long, "long", false, "run the long suite (2 scenarios of 3,000 iterations; bo at its released 100-iteration trials, frozen after 1,650) instead of the default one")
	fs.IntVar(&o.Parallel, "parallel", runtime.GOMAXPROCS(0), "simulations run at once")
	fs.IntVar(&o.BOTrial, "bo-trial", 0, "bo: iterations per trial (0: 20, a fifth of ByteScheduler's 100; 6 with --quick; 100 with --long); the apply delay is max(2, this/10)")
	fs.StringVar(&o.Only, "only", "", "comma-separated scenario names to run (default all)")
	fs.StringVar(&o.Baselines, "baselines", "", "results.json of an earlier evaluation of these scenarios: reuse its best static and oracle runs and run only the tuners (after a change to a tuner; refused if the simulator's runs differ)")
	return cmd
}
