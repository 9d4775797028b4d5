package capability

import (
	"errors"
	"fmt"
	"time"

	"github.com/taskhost/taskhost/capability/internal/pb"
)

// Outcome says how a task's attempt ended when it returned an error. It
// travels in the final RunTaskEvent (its outcome and snooze_seconds
// fields), from a provider plugin through the host to tasks_worker, which
// ends the attempt accordingly.
type Outcome int

const (
	// OutcomeError is a failure: the attempt is retried after the task's
	// backoff while attempts remain. An error that is not one of the others
	// is one, and so is every error of a plugin built before outcomes
	// existed.
	OutcomeError Outcome = iota
	// OutcomeSnooze runs the task again after TaskError.Snooze, without
	// using an attempt (see Snooze).
	OutcomeSnooze
	// OutcomePermanent fails the task for good: no further attempt (see
	// Permanent).
	OutcomePermanent
	// OutcomeCancel ends the task cancelled; it is never retried (see
	// CancelTask).
	OutcomeCancel
)

func (o Outcome) String() string {
	switch o {
	case OutcomeError:
		return "error"
	case OutcomeSnooze:
		return "snooze"
	case OutcomePermanent:
		return "permanent"
	case OutcomeCancel:
		return "cancel"
	}
	return fmt.Sprintf("outcome(%d)", int(o))
}

// TaskError is a task's own failure, as opposed to a transport failure:
// what a provider's RunTask returned, as the caller of Client.RunTask or
// HostServices.RunTask gets it. Outcome says how the attempt ends (the
// zero value, OutcomeError, is an ordinary failure), and Snooze, with
// OutcomeSnooze, how long to wait before the next run.
//
// A provider makes one with Snooze, Permanent or CancelTask, or returns a
// TaskError it got from another plugin's task (errors.As finds it through
// wrapping), whose outcome then passes on.
type TaskError struct {
	Msg     string
	Outcome Outcome
	Snooze  time.Duration
	// RetryAfter, with OutcomeError, is the least delay before the retry,
	// whatever the task's backoff says (see RetryAfter).
	RetryAfter time.Duration
	err        error // what Permanent or RetryAfter wrapped, for errors.Is and errors.As
}

func (e *TaskError) Error() string { return e.Msg }

// Unwrap returns the error Permanent or RetryAfter was given, or nil.
func (e *TaskError) Unwrap() error { return e.err }

// RetryAfter is what a provider's RunTask returns for a failure whose
// retry must wait at least d, whatever the task's backoff says: what it
// failed on needs time (a service restarting, a rate limit). The attempt
// counts as a failure, retried while attempts remain. The host checks d
// as it checks a snooze's delay.
func RetryAfter(err error, d time.Duration) error {
	msg := "task failed"
	if err != nil && err.Error() != "" {
		msg = err.Error()
	}
	return &TaskError{Msg: msg, Outcome: OutcomeError, RetryAfter: d, err: err}
}

// Snooze is what a provider's RunTask returns to run the task again after
// d, without using an attempt: what it waits for (a rate limit, a file
// not there yet) is not a failure. The host checks d: a negative one, or
// one beyond the longest delay a task may wait (a year), fails the attempt
// as an error would, saying why.
func Snooze(d time.Duration) error {
	return &TaskError{Msg: fmt.Sprintf("snoozed: run again in %s", d), Outcome: OutcomeSnooze, Snooze: d}
}

// Permanent is what a provider's RunTask returns for a failure that no
// retry can mend (a payload it cannot use, say): the task fails at once,
// whatever attempts are left, with err's text as its error. A nil err
// reads "task failed permanently".
func Permanent(err error) error {
	msg := "task failed permanently"
	if err != nil && err.Error() != "" {
		msg = err.Error()
	}
	return &TaskError{Msg: msg, Outcome: OutcomePermanent, err: err}
}

// CancelTask is what a provider's RunTask returns to end its task
// cancelled (the work is no longer wanted): it is not retried, and reason
// becomes its last error ("cancelled by the task" when empty).
func CancelTask(reason string) error {
	if reason == "" {
		reason = "cancelled by the task"
	}
	return &TaskError{Msg: reason, Outcome: OutcomeCancel}
}

// finalEvent is the last event of a task's stream: its result, or the
// error err and how the attempt ended. A TaskError found in err's chain
// gives the outcome; any other error is OutcomeError. The error text is
// never empty, so that a host built before outcomes existed, which reads
// the error field alone, treats the attempt as failed rather than done.
func finalEvent(res []byte, err error) *pb.RunTaskEvent {
	final := &pb.RunTaskEvent{Done: true, ResultJson: res}
	if err == nil {
		return final
	}
	final.Error = err.Error()
	var te *TaskError
	if errors.As(err, &te) {
		switch te.Outcome {
		case OutcomeSnooze:
			final.Outcome, final.SnoozeSeconds = pb.TaskOutcome_OUTCOME_SNOOZE, te.Snooze.Seconds()
		case OutcomePermanent:
			final.Outcome = pb.TaskOutcome_OUTCOME_PERMANENT
		case OutcomeCancel:
			final.Outcome = pb.TaskOutcome_OUTCOME_CANCEL
		default:
			final.RetryAfterSeconds = te.RetryAfter.Seconds()
		}
	}
	if final.Error == "" {
		final.Error = "task failed"
	}
	return final
}

// taskErrorOf is the TaskError a final event with an error stands for. An
// outcome this side does not know (a newer plugin's) is an error, as the
// protocol says of an unset one. A snooze that is not a number reads as
// -1ns and one too long for a time.Duration as the longest one, so that
// the host refuses both as out of range.
func taskErrorOf(ev *pb.RunTaskEvent) *TaskError {
	te := &TaskError{Msg: ev.Error}
	switch ev.Outcome {
	case pb.TaskOutcome_OUTCOME_SNOOZE:
		te.Outcome = OutcomeSnooze
		te.Snooze = secondsToDuration(ev.SnoozeSeconds)
	case pb.TaskOutcome_OUTCOME_PERMANENT:
		te.Outcome = OutcomePermanent
	case pb.TaskOutcome_OUTCOME_CANCEL:
		te.Outcome = OutcomeCancel
	default:
		te.RetryAfter = secondsToDuration(ev.RetryAfterSeconds)
	}
	return te
}
