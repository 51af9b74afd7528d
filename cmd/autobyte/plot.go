package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/autobyte/autobyte/curves"
)

func newPlotCmd() *cobra.Command {
	var out, title, field, ylabel string
	cmd := &cobra.Command{
		Use:   "plot --out FILE.png NAME=RESULT ...",
		Short: "Draw per-step series (e.g. a training script's losses) of several runs as one line plot",
		Long: `Reads FIELD (default "losses", what the examples print with --losses) from the
last JSON line of each RESULT file and draws one line per run, named NAME.

  autobyte plot --out losses.png --title "torch_cnn, 4 workers" ddp=ddp.json autobyte-bf16=ab.json`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return fmt.Errorf("--out must name the PNG to write")
			}
			var ss []curves.Series
			for _, a := range args {
				name, file, ok := strings.Cut(a, "=")
				if !ok || name == "" || file == "" {
					return fmt.Errorf("run %q: want NAME=RESULT_FILE", a)
				}
				vs, err := curves.Read(file, field)
				if err != nil {
					return err
				}
				ss = append(ss, curves.Series{Name: name, Values: vs})
			}
			if ylabel == "" {
				ylabel = field
			}
			if err := curves.Plot(out, title, ylabel, ss); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (%d runs)\n", out, len(ss))
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&out, "out", "", "PNG file to write")
	fs.StringVar(&title, "title", "", "plot title")
	fs.StringVar(&field, "field", "losses", "JSON field holding the per-step values")
	fs.StringVar(&ylabel, "ylabel", "", "y axis label (default: the field)")
	return cmd
}
