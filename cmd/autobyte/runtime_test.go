package main

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

// TestRendezvousTimeoutPrecedence: a given --rendezvous-timeout wins over
// AUTOBYTE_RENDEZVOUS_TIMEOUT, even when it equals the flag's default; the
// variable sets the timeout when the flag is not given.
func TestRendezvousTimeoutPrecedence(t *testing.T) {
	parse := func(args ...string) (time.Duration, error) {
		var n netFlags
		cmd := &cobra.Command{Use: "x"}
		n.register(cmd)
		if err := cmd.Flags().Parse(args); err != nil {
			t.Fatal(err)
		}
		return n.rendezvous()
	}
	t.Setenv("AUTOBYTE_RENDEZVOUS_TIMEOUT", "")
	if d, err := parse(); err != nil || d != 10*time.Minute {
		t.Errorf("neither given: %v, %v; want the default 10m", d, err)
	}
	t.Setenv("AUTOBYTE_RENDEZVOUS_TIMEOUT", "90s")
	if d, err := parse(); err != nil || d != 90*time.Second {
		t.Errorf("variable 90s, no flag: %v, %v; want 90s", d, err)
	}
	if d, err := parse("--rendezvous-timeout=10m"); err != nil || d != 10*time.Minute {
		t.Errorf("flag 10m (the default) beside the variable's 90s: %v, %v; want the flag's 10m", d, err)
	}
	if _, err := parse("--rendezvous-timeout=0s"); err == nil || !strings.Contains(err.Error(), "--rendezvous-timeout must be > 0") {
		t.Errorf("flag 0s: %v, want an error naming the flag", err)
	}
	t.Setenv("AUTOBYTE_RENDEZVOUS_TIMEOUT", "soon")
	if _, err := parse(); err == nil || !strings.Contains(err.Error(), `AUTOBYTE_RENDEZVOUS_TIMEOUT: rendezvous timeout "soon"`) {
		t.Errorf("variable soon: %v, want an error naming it", err)
	}
}
