package worker

import (
	"errors"
	"fmt"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// This file owns the outcomes a handler may ask for besides success and an
// ordinary failure: Snooze, Permanent and CancelTask, and how the executor
// reads them (outcomeOf).

// Snooze is what a handler returns to run its task again after d without
// using an attempt: what it waits for (a rate limit, a file not there
// yet) is not a failure. The message goes back to the queue, available
// after d, its attempt given back; its last error says it snoozed. The
// attempt's status is StatusSnoozed and its report's broker.ReportSnoozed.
//
// d must be between 0 and broker.MaxDelay: a snooze out of that range
// fails the attempt as an error would, with an error that says why.
func Snooze(d time.Duration) error {
	return &outcomeError{kind: outcomeSnooze, after: d, msg: fmt.Sprintf("snoozed: run again in %s", d)}
}

// Permanent wraps err, a failure that no retry can mend (a payload the
// task cannot use, say), so that the task fails at once whatever attempts
// are left: it ends failed, or dead when its topic dead-letters, with
// err's text as its last error. errors.Is and errors.As see err through
// it. A nil err reads "task failed permanently".
func Permanent(err error) error {
	msg := "task failed permanently"
	if err != nil && err.Error() != "" {
		msg = err.Error()
	}
	return &outcomeError{kind: outcomePermanent, err: err, msg: msg}
}

// CancelTask is what a handler returns to end its task cancelled (the work
// is no longer wanted): it is never retried, and reason becomes its last
// error ("cancelled by the task" when empty). The attempt's status is
// StatusCancelled, as for a cancel requested from outside (see
// Pool.CancelRunning).
func CancelTask(reason string) error {
	if reason == "" {
		reason = "cancelled by the task"
	}
	return &outcomeError{kind: outcomeCancel, msg: reason}
}

type outcomeKind int

const (
	outcomeSnooze outcomeKind = iota + 1
	outcomePermanent
	outcomeCancel
)

// outcomeError is what Snooze, Permanent and CancelTask return; the
// executor finds it in a handler's error with errors.As, so wrapping it
// keeps its meaning.
type outcomeError struct {
	kind  outcomeKind
	after time.Duration // snooze
	err   error         // permanent
	msg   string
}

func (e *outcomeError) Error() string { return e.msg }
func (e *outcomeError) Unwrap() error { return e.err }

// outcomeOf returns the outcome err asks for, or nil for an ordinary
// failure.
func outcomeOf(err error) *outcomeError {
	var oe *outcomeError
	if errors.As(err, &oe) {
		return oe
	}
	return nil
}

// checkSnooze refuses a snooze the brokers cannot keep: a negative one or
// one beyond broker.MaxDelay.
func checkSnooze(d time.Duration) error {
	if d < 0 || d > broker.MaxDelay {
		return fmt.Errorf("the task asked to snooze for %s, which is out of range: a snooze is from 0 to %s", d, broker.MaxDelay)
	}
	return nil
}
