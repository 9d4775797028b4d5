package worker

import (
	"encoding/json"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// This file owns the outcome of one attempt (completion), as the executor
// decides it and the completer writes it, and the ways of deciding it.

// completion is the outcome of one attempt, for the completer to write.
type completion struct {
	claim  broker.Claim
	topic  string
	task   string
	status string
	// Exactly one of: ack (with result), nack, or lost (nothing to write).
	ack     bool
	result  json.RawMessage
	lost    bool
	requeue bool
	cancel  bool // the message ends cancelled (NackRequest.Cancel)
	notRan  bool // with requeue: the attempt is given back (NackRequest.NotRun)
	suspect bool // with notRan: the message stays a suspect (NackRequest.Suspect)
	// waitingSince, with requeue: when the message began to wait for a
	// worker that runs its task (NackRequest.WaitingSince).
	waitingSince *time.Time
	resent       bool // ack: written again after a call whose answer was lost
	delay        time.Duration
	errText      string
	started      time.Time
	dur          time.Duration
	// For the attempt's report: the message as claimed, the handler's
	// context (nil when the handler never ran) and whether it timed out.
	msg      *broker.Message // the claim's, shared: never changed
	tc       *TaskContext
	timedOut bool
	// The attempt's logger and handler context live here, so an attempt
	// allocates one object for the three.
	logger  msgLogger
	taskCtx TaskContext
}

// notRun requeues a message whose task never ran, giving its attempt back
// (broker.NackRequest.NotRun).
func (c *completion) notRun(d time.Duration, reason, status string) *completion {
	c.notRan = true
	if suspect(*c.msg) {
		// It did not run here: it stays a suspect (see suspect), and its
		// error still says why for the people who read it.
		c.suspect = true
		reason = broker.OrphanedErrorPrefix + " its last worker died running it; requeued without running: " + reason
	}
	return c.requeueAfter(d, reason, status)
}

// snooze requeues a message whose task asked to run again after d
// (Snooze): its attempt is given back, as the task did not fail.
func (c *completion) snooze(d time.Duration, reason string) *completion {
	c.notRan = true
	return c.requeueAfter(d, reason, StatusSnoozed)
}

// The last error of a task cancelled on request (CancelRunning).
const (
	cancelledWhileRunning = "cancelled: a cancel was requested while the task ran"
	cancelledBeforeRun    = "cancelled: a cancel was requested before the task ran"
)

// cancelled ends the message cancelled, never retried, with reason as its
// last error.
func (c *completion) cancelled(reason string) *completion {
	c.cancel = true
	return c.nackWith(false, 0, reason, StatusCancelled)
}

func (c *completion) requeueNow(reason, status string) *completion {
	return c.requeueAfter(0, reason, status)
}

func (c *completion) requeueAfter(d time.Duration, reason, status string) *completion {
	return c.nackWith(true, d, reason, status)
}

func (c *completion) fail(reason string, requeue bool, d time.Duration) *completion {
	return c.nackWith(requeue, d, reason, StatusFailed)
}

// nackWith makes c a nack: requeued after d (bounded by broker.MaxDelay)
// or ended, with reason as the message's last error.
func (c *completion) nackWith(requeue bool, d time.Duration, reason, status string) *completion {
	c.requeue, c.delay, c.errText, c.status = requeue, min(max(d, 0), broker.MaxDelay), reason, status
	return c
}

// waiting marks c, a requeue, as a message waiting for a worker that runs
// its task since since (nil: not waiting).
func (c *completion) waiting(since *time.Time) *completion {
	c.waitingSince = since
	return c
}
