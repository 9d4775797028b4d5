package broker

import "slices"

// States are the message states, in the order a message may pass them.
var States = []string{StateQueued, StateRunning, StateDone, StateFailed, StateDead, StateCancelled}

// ValidateMessageFilter checks a ListMessages filter (an unknown state is
// invalid) and returns the limit it asks for: f.Limit, DefaultListLimit
// when not positive, MaxListLimit at most.
func ValidateMessageFilter(f MessageFilter) (int, error) {
	if f.State != "" && !slices.Contains(States, f.State) {
		return 0, Invalid("unknown message state %q (want one of %v)", f.State, States)
	}
	limit := f.Limit
	if limit <= 0 {
		limit = DefaultListLimit
	}
	return min(limit, MaxListLimit), nil
}
