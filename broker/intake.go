package broker

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// This file holds the intake rules beyond the basic submit: unique keys,
// priorities and run-at times (see SubmitRequest).

// Priority bounds: a higher priority is claimed first; 0 is the default.
const (
	MinPriority = -100
	MaxPriority = 100
)

// MaxUniqueKeyLen bounds a unique key, in bytes.
const MaxUniqueKeyLen = 200

// MaxRunAtPast is how far in the past a run-at time may be: an older one
// is refused as a likely mistake (a wrong date or time zone). A run-at time
// in the past, within that bound, makes the message available at once.
const MaxRunAtPast = 24 * time.Hour

// stateCancelled is the cancelled state's name, accepted among unique
// states (it is a state of its own in brokers that cancel).
const stateCancelled = "cancelled"

// uniqueStateNames are the states a unique key may be held in, in the
// order UniqueStates returns them.
var uniqueStateNames = []string{StateQueued, StateRunning, StateDone, StateFailed, StateDead, stateCancelled}

// DefaultUniqueStates are the states a message holds its unique key in
// when its submit names none: while it waits and while it runs.
var DefaultUniqueStates = []string{StateQueued, StateRunning}

// ErrDuplicate: a submit's unique key is held by another message; nothing
// was stored. The error is a *DuplicateError naming that message.
var ErrDuplicate = errors.New("duplicate: the unique key is held by another task")

// DuplicateError is the error of a submit refused as a duplicate: ID is
// the message that holds Key.
type DuplicateError struct {
	ID  int64
	Key string
}

func (e *DuplicateError) Error() string {
	return fmt.Sprintf("duplicate: unique key %q is held by task %d", e.Key, e.ID)
}

// Is makes errors.Is(err, ErrDuplicate) true.
func (e *DuplicateError) Is(target error) bool { return target == ErrDuplicate }

// DuplicateOf returns the id of the message a submit error says holds its
// unique key, and true, when err is a duplicate; 0 and false otherwise.
func DuplicateOf(err error) (int64, bool) {
	var d *DuplicateError
	if errors.As(err, &d) {
		return d.ID, true
	}
	return 0, false
}

// Submitted is the outcome of one request of SubmitBatch: the new
// message's id, or, when Duplicate is set, the id of the message that
// holds the request's unique key (nothing was stored for it).
type Submitted struct {
	ID        int64 `json:"id"`
	Duplicate bool  `json:"duplicate,omitempty"`
}

// UniqueStates returns the states req's message holds its unique key in,
// in a fixed order without repeats: req.UniqueStates, or
// DefaultUniqueStates when it names none. Nil when req has no unique key.
func UniqueStates(req SubmitRequest) []string {
	if req.UniqueKey == "" {
		return nil
	}
	if len(req.UniqueStates) == 0 {
		return slices.Clone(DefaultUniqueStates)
	}
	out := make([]string, 0, len(req.UniqueStates))
	for _, s := range uniqueStateNames {
		if slices.Contains(req.UniqueStates, s) {
			out = append(out, s)
		}
	}
	return out
}

// HoldsKey reports whether a message in state, submitted with the unique
// states states, holds its unique key.
func HoldsKey(state string, states []string) bool { return slices.Contains(states, state) }

// AvailableAt returns when req's message becomes available, submitted at
// now: its RunAt (now when that is past), or now plus its Delay.
func (req SubmitRequest) AvailableAt(now time.Time) time.Time {
	if !req.RunAt.IsZero() {
		if req.RunAt.Before(now) {
			return now
		}
		return req.RunAt
	}
	return now.Add(req.Delay)
}

// ValidateIntake checks the unique key, priority and run-at fields of req
// at now, as ValidateSubmit does.
func ValidateIntake(req SubmitRequest, now time.Time) error {
	if req.Priority < MinPriority || req.Priority > MaxPriority {
		return Invalid("priority is %d, it must be between %d and %d (higher runs first)", req.Priority, MinPriority, MaxPriority)
	}
	if !req.RunAt.IsZero() {
		if req.Delay != 0 {
			return Invalid("run_at and delay_seconds are both set; give one of them")
		}
		if req.RunAt.Before(now.Add(-MaxRunAtPast)) {
			return Invalid("run_at %s is more than 24 hours in the past", req.RunAt.UTC().Format(time.RFC3339))
		}
		if d := req.RunAt.Sub(now); d > MaxDelay {
			return Invalid("run_at %s is %s away, the limit is %s (%s)", req.RunAt.UTC().Format(time.RFC3339), d.Round(time.Second), MaxDelay, maxDelayText)
		}
	}
	if req.UniqueKey == "" {
		if req.UniqueFor != 0 || len(req.UniqueStates) > 0 {
			return Invalid("unique_for_seconds or unique_states without a unique_key")
		}
		return nil
	}
	if len(req.UniqueKey) > MaxUniqueKeyLen {
		return Invalid("unique_key is %d bytes long, the limit is %d", len(req.UniqueKey), MaxUniqueKeyLen)
	}
	if req.UniqueFor < 0 {
		return Invalid("unique_for_seconds is negative")
	}
	if req.UniqueFor > MaxDelay {
		return Invalid("unique_for_seconds is %s, the limit is %s (%s)", req.UniqueFor, MaxDelay, maxDelayText)
	}
	for i, s := range req.UniqueStates {
		if !slices.Contains(uniqueStateNames, s) {
			return Invalid("unique_states: unknown state %q (the states are %v)", s, uniqueStateNames)
		}
		if slices.Contains(req.UniqueStates[:i], s) {
			return Invalid("unique_states %v names %q twice; name each state once", req.UniqueStates, s)
		}
	}
	if len(req.UniqueStates) > 0 && (!slices.Contains(req.UniqueStates, StateQueued) || !slices.Contains(req.UniqueStates, StateRunning)) {
		return Invalid("unique_states %v must include queued and running: a task that waits or runs always holds its key", req.UniqueStates)
	}
	return nil
}

// FirstOfKey returns, for each request of a batch, the index of the first
// request with the same unique key, or -1 when it has none or is that
// first one. Duplicates within one batch collapse to the first.
func FirstOfKey(reqs []SubmitRequest) []int {
	out := make([]int, len(reqs))
	var seen map[string]int
	for i, r := range reqs {
		out[i] = -1
		if r.UniqueKey == "" {
			continue
		}
		if seen == nil {
			seen = make(map[string]int)
		}
		if j, ok := seen[r.UniqueKey]; ok {
			out[i] = j
			continue
		}
		seen[r.UniqueKey] = i
	}
	return out
}

// HasUniqueKey reports whether any of reqs has a unique key.
func HasUniqueKey(reqs []SubmitRequest) bool {
	return slices.ContainsFunc(reqs, func(r SubmitRequest) bool { return r.UniqueKey != "" })
}
