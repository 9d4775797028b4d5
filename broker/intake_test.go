package broker

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// ValidateIntake refuses unique states that name a state twice, as every
// broker checks them: the list is a set.
func TestValidateIntakeUniqueStates(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		states []string
		want   string
	}{
		{[]string{StateQueued, StateRunning, StateQueued}, `names "queued" twice`},
		{[]string{StateQueued, StateRunning, StateDone, StateDone}, `names "done" twice`},
		{[]string{StateQueued}, "must include queued and running"},
	} {
		err := ValidateIntake(SubmitRequest{Topic: "t", Task: "x", UniqueKey: "k", UniqueStates: c.states}, now)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("states %v: %v, want ErrInvalid saying %q", c.states, err, c.want)
		}
	}
	if err := ValidateIntake(SubmitRequest{Topic: "t", Task: "x", UniqueKey: "k", UniqueStates: []string{StateRunning, StateQueued, StateDone}}, now); err != nil {
		t.Errorf("states in any order: %v", err)
	}
}
