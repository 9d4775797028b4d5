package worker

import (
	"fmt"
	"reflect"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// This file owns what the pool tells the outside about each attempt once
// its outcome is written: the Status constants, the Observer,
// MessageObserver and Reporter interfaces, and the attempt's report.

// Attempt statuses, as reported to Observer.TaskFinished.
const (
	// StatusDone: the handler succeeded and the ack was stored.
	StatusDone = "done"
	// StatusFailed: the handler returned an error, panicked or timed
	// out, or the task is unknown; the message was retried or ended.
	StatusFailed = "failed"
	// StatusLost: the claim was no longer ours when the outcome was
	// written (broker.ErrClaimLost), or the outcome could not be written
	// at all. The attempt's result was discarded.
	StatusLost = "lost"
	// StatusSkipped: the task's lock was held and its policy is
	// LockSkip; the message ended done without running.
	StatusSkipped = "skipped"
	// StatusDeferred: the task's lock was held (policy LockRequeue) or
	// could not be taken; the message went back to the queue.
	StatusDeferred = "deferred"
	// StatusStopped: the pool stopped before or while running it; the
	// message went back to the queue.
	StatusStopped = "stopped"
	// StatusSnoozed: the handler asked to run again later (Snooze); the
	// message went back to the queue for that long, its attempt given
	// back.
	StatusSnoozed = "snoozed"
	// StatusCancelled: a cancel was requested (Pool.CancelRunning) before
	// the handler returned success, or the handler cancelled its task
	// (CancelTask); the message ended cancelled and is not retried.
	StatusCancelled = "cancelled"
)

// Observer is told about every claimed message, for metrics: TaskStarted
// when the pool starts handling it and TaskFinished, with one of the Status
// constants, once its outcome is written. Calls come from several
// goroutines and must not block.
type Observer interface {
	TaskStarted(topic string)
	TaskFinished(topic, task, status string, duration time.Duration)
}

// MessageObserver is an optional extension of Observer: an Observer that
// also implements it is told which message each finished attempt was, right
// after TaskFinished. Both are called once the outcome is written: for
// StatusDone and StatusSkipped, after the broker.Ack that marks the message
// done has returned (committed, for the SQL brokers). Calls come from
// several goroutines and must not block.
type MessageObserver interface {
	MessageFinished(id int64, topic, task, status string)
}

// Reporter receives one report per attempt whose handler ran (or whose
// claim was lost), after the attempt's outcome was written. Report is
// called from the pool's goroutines and must not block.
//
// A Reporter that is a StoringReporter storing into the pool's broker
// gets only the reports that have no outcome to ride on: the others are
// stored by the broker with their outcomes.
type Reporter interface {
	Report(broker.Report)
}

// StoringReporter is an optional extension of Reporter, for a Reporter
// that stores reports in a broker.ScheduleStore (ReportWriter is one).
// When ReportStore is the pool's own broker, the pool gives each attempt's
// report to the broker with the attempt's outcome (broker.Outcome.Report,
// broker.NackRequest.Report), and the broker stores it in the transaction
// that writes the outcome, only when the outcome applies: no kill, crash
// or full queue can separate the two. Report then gets only the reports
// that have no outcome to ride on, those of StatusLost: a claim that was
// lost before the task ran or when its outcome was written (the outcome
// did not apply), or an outcome that could not be written at all.
type StoringReporter interface {
	Reporter
	ReportStore() broker.ScheduleStore
}

// storesInto reports whether r stores its reports in b (see
// StoringReporter).
func storesInto(r Reporter, b broker.Broker) bool {
	sr, ok := r.(StoringReporter)
	if !ok {
		return false
	}
	store := sr.ReportStore()
	if store == nil || !reflect.TypeOf(store).Comparable() || !reflect.TypeOf(b).Comparable() {
		return false
	}
	return any(store) == any(b)
}

type nopObserver struct{}

func (nopObserver) TaskStarted(string)                                 {}
func (nopObserver) TaskFinished(string, string, string, time.Duration) {}

// reportKey is the key of the attempt's reports (broker.ReportKey): the
// report stored with its outcome and one stored again for the same attempt
// (its outcome's answer was lost) are one.
func (c *completion) reportKey() string {
	at := c.started
	if c.msg.ClaimedAt != nil {
		at = *c.msg.ClaimedAt
	}
	return broker.ReportKey(at, c.claim.Token)
}

// report builds the attempt's report, as worker ran it; false when there
// is nothing to report (the handler never ran and the attempt was given
// back: lock deferred, stopped before start). An attempt that ends its
// message without its handler (an unknown task, a cancel before the start)
// is reported: its claim counted it, and every attempt a message counts
// has its report.
func (c *completion) report(worker string) (broker.Report, bool) {
	r := broker.Report{
		MessageID: c.msg.ID, Task: c.task, Topic: c.topic, Schedule: c.msg.Headers["schedule"],
		Attempt: max(c.msg.Attempts, 1), Worker: worker,
		StartedAt: c.started, EndedAt: c.started.Add(c.dur), Duration: c.dur.Seconds(),
		Error: c.errText,
		Key:   c.reportKey(),
	}
	switch {
	case c.status == StatusLost:
		r.Status = broker.ReportLost
		if r.Error == "" {
			r.Error = "claim lost: the message was reclaimed from this worker; its outcome was discarded"
		}
	case c.status == StatusSkipped:
		r.Status, r.Result = broker.ReportSkipped, c.result
	case c.tc == nil && c.status == StatusCancelled:
		r.Status = broker.ReportCancelled
	case c.tc == nil:
		if c.status != StatusFailed {
			return broker.Report{}, false
		}
		r.Status = broker.ReportError // unknown task
	case c.status == StatusDone:
		r.Status, r.Result = broker.ReportSuccess, c.result
	case c.status == StatusStopped, c.status == StatusCancelled:
		r.Status = broker.ReportCancelled
	case c.status == StatusSnoozed:
		r.Status = broker.ReportSnoozed
	case c.timedOut:
		r.Status = broker.ReportTimeout
	default:
		r.Status = broker.ReportFailed
	}
	if c.tc != nil {
		logs, dropped := c.tc.Logs()
		if dropped > 0 {
			logs = append(logs, fmt.Sprintf("(%d more lines dropped)", dropped))
		}
		r.Logs, r.Progress = logs, c.tc.Progress()
		if r.Status == broker.ReportSuccess {
			r.Progress = 1
		}
	}
	return r, true
}
