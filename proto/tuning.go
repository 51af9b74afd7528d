package proto

import (
	"fmt"

	"github.com/autobyte/autobyte/tune"
)

// Schedule is the one rule for a tuner's proposal p made after observing
// iteration k, given the history of changes so far (starting with
// iteration 0's configuration): it must apply from iteration k+tune.Lead or
// later (by then some workers may already be posting k+1's gradients,
// which keep the partitioning they were cut with), after the last change,
// and be a valid configuration. Otherwise it is refused with an error
// naming the tuner and the values; nothing is clamped, so a tuner's trial
// is measured at the iterations it planned.
func Schedule(history []tune.ConfigChange, p tune.Proposal, k int, tuner string) (tune.ConfigChange, error) {
	if earliest := k + tune.Lead; p.FromIteration < earliest {
		return tune.ConfigChange{}, fmt.Errorf("tuner %s proposed a configuration from iteration %d after iteration %d: too late, it must apply from iteration %d or later",
			tuner, p.FromIteration, k, earliest)
	}
	if n := len(history); n > 0 && p.FromIteration <= history[n-1].FromIteration {
		return tune.ConfigChange{}, fmt.Errorf("tuner %s proposed a configuration from iteration %d after iteration %d: it must come after the change from iteration %d",
			tuner, p.FromIteration, k, history[n-1].FromIteration)
	}
	if err := p.Config.Validate(); err != nil {
		return tune.ConfigChange{}, fmt.Errorf("tuner %s proposed an invalid configuration from iteration %d: %w", tuner, p.FromIteration, err)
	}
	return tune.ConfigChange{FromIteration: p.FromIteration, Config: p.Config}, nil
}
