package main

import (
	"github.com/spf13/cobra"

	"github.com/autobyte/autobyte/model"
)

func newModelsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "models",
		Short: "List the built-in model zoo",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var ps []*model.Profile
			for _, name := range model.Zoo() {
				p, err := model.Get(name)
				if err != nil {
					return err
				}
				ps = append(ps, p)
			}
			return model.WriteTable(cmd.OutOrStdout(), ps)
		},
	}
}
