package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/autobyte/autobyte/testbed"
	"github.com/autobyte/autobyte/units"
)

func newTestbedCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "testbed",
		Short: "Emulate several hosts on this machine: network namespaces, veth, a bridge and tc shaping (root)",
		Long: `testbed builds hosts as network namespaces NAME-h0, NAME-h1, ... joined by veth
pairs to a bridge in NAME-sw, with a tc rate (and, where the kernel has netem,
a delay) per host and direction. 'autobyte launch --testbed NAME' runs each
process in its own host. See docs/testbed.md.`,
	}
	var name, rate, delay, congestion string
	var hosts int
	up := &cobra.Command{
		Use:   "up",
		Short: "Create a testbed",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := units.ParseRate(rate)
			if err != nil {
				return fmt.Errorf("--rate: %w", err)
			}
			d, err := units.ParseDuration(delay)
			if err != nil {
				return fmt.Errorf("--delay: %w", err)
			}
			t, err := testbed.Up(context.Background(), testbed.Options{Name: name, Hosts: hosts, RateBps: r, DelayS: d, Congestion: congestion})
			if err != nil {
				return err
			}
			for _, h := range t.Hosts {
				fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s\t%s\n", h.Namespace, h.IP, units.FormatRate(h.RateBps))
			}
			return nil
		},
	}
	up.Flags().StringVar(&name, "name", "ab", "testbed name (namespaces NAME-h0.., NAME-sw)")
	up.Flags().IntVar(&hosts, "hosts", 6, "number of hosts")
	up.Flags().StringVar(&rate, "rate", "1Gbps", "each host's rate per direction")
	up.Flags().StringVar(&delay, "delay", "0", "one-way delay between two hosts (needs netem in the kernel)")
	up.Flags().StringVar(&congestion, "congestion", testbed.DefaultCongestion, "every host's TCP congestion control (one the kernel offers: cubic, bbr, reno, ...)")

	var downName string
	down := &cobra.Command{
		Use:   "down",
		Short: "Remove a testbed (idempotent)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return testbed.Down(context.Background(), downName)
		},
	}
	down.Flags().StringVar(&downName, "name", "ab", "testbed name")

	var setName, setRate, setDelay string
	var host int
	set := &cobra.Command{
		Use:   "set",
		Short: "Change one host's rate (and delay) while traffic flows",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, err := testbed.Load(setName)
			if err != nil {
				return err
			}
			if host < 0 || host >= len(t.Hosts) {
				return fmt.Errorf("--host %d out of range: testbed %q has %d hosts", host, setName, len(t.Hosts))
			}
			r, d := t.Hosts[host].RateBps, t.Hosts[host].DelayS
			if setRate != "" {
				if r, err = units.ParseRate(setRate); err != nil {
					return fmt.Errorf("--rate: %w", err)
				}
			}
			if setDelay != "" {
				if d, err = units.ParseDuration(setDelay); err != nil {
					return fmt.Errorf("--delay: %w", err)
				}
			}
			return t.Set(context.Background(), host, r, d)
		},
	}
	set.Flags().StringVar(&setName, "name", "ab", "testbed name")
	set.Flags().IntVar(&host, "host", 0, "host index")
	set.Flags().StringVar(&setRate, "rate", "", "new rate (default: unchanged)")
	set.Flags().StringVar(&setDelay, "delay", "", "new delay (default: unchanged)")
	root.AddCommand(up, down, set)
	return root
}
