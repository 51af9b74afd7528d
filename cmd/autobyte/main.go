// Command autobyte schedules and configures gradient communication for
// distributed DNN training; see the README for a tour.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	root := newRoot()
	if err := root.Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "autobyte: %v\n", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "autobyte",
		Short: "Communication scheduling with automatic configuration for data-parallel DNN training",
		// Errors are printed once, as one line, by main.
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newSimCmd(), newModelsCmd(), newDemoCmd(), newSweepCmd(), newServerCmd(), newWorkerCmd(), newLaunchCmd(), newTestbedCmd())
	root.AddCommand(newTuneCmd(), newProbeCmd(), newPlotCmd())
	return root
}
