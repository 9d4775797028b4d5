// Package worker is the task runtime: a registry of task definitions and a
// pool that claims messages from a broker.Broker, runs their handlers and
// reports each attempt's outcome back to the broker.
//
// A Pool has three kinds of goroutines, all owned by it and stopped and
// awaited by Stop: one dispatcher that claims up to as many messages as it
// has free slots in a single broker.Claim call (at most two in flight), Concurrency worker
// goroutines that run handlers, and the completer, which owns every write
// of an outcome, with two collectors that take the workers' outcomes.
// Nacks the collectors write themselves; acks they leave to the
// dispatcher, which has the completer write every ack pending with its
// next claim, ahead of it (one transaction and one round trip with a
// broker.AckClaimer such as the PostgreSQL broker). A finishing handler frees a slot and so starts
// that claim at once: a lone completion is never held back by a timer, and
// a busy pool writes many acks per round trip. While one such exchange is
// in flight, a second one carries the acks of a whole batch (see
// dispatch), so finished messages do not wait for the write in flight. A topic's concurrency limit
// counts a message until its outcome is written, so the claim that carries
// the acks sees their slots free, and a claim that comes back short while
// outcomes are being written is retried as soon as one of those writes
// returns, not after the idle interval. A heartbeat goroutine keeps the
// worker's row fresh, and a stray check requeues messages claimed for this
// worker whose claim's answer never reached it (see strayCheck).
//
// Delivery is at least once. A worker whose claim was taken from it (the
// reaper requeued the message, an operator forced it) learns so from
// broker.ErrClaimLost when it acks or nacks; that attempt is recorded as
// "lost" and never as the task's outcome, because the message now belongs
// to someone else.
//
// A handler ends its attempt by returning a result (done) or an error
// (failed: retried after the task's backoff while attempts remain), or
// one of three outcomes: Snooze (run again after a delay, the attempt
// given back), Permanent (failed, no further attempt) and CancelTask
// (cancelled, never retried). A task of a provider plugin returns the same
// three from package capability; tasks_worker turns them into these.
//
// A running attempt is cancelled by CancelRunning: its handler's context
// is cancelled with cause ErrCancelRequested and the attempt ends
// cancelled (broker.NackRequest.Cancel), unless the handler returned
// success first, whose ack wins. The pool learns of cancels asked of the
// broker by other processes from Broker.CancelRequests, polled at each
// heartbeat, and, when the broker is a broker.CancelNotifier (PostgreSQL),
// from its notices at once.
//
// Stop drains: it stops claiming, lets running handlers finish for up to
// Options.DrainTimeout, then cancels their contexts and puts their messages
// back in the queue, so a deploy leaves nothing running under a dead owner.
// Go cannot kill a goroutine: a handler that ignores its context is
// abandoned (its message requeued, its result ignored) and keeps running
// until it returns or the process exits.
//
// Options.Reporter gets one report per attempt once its outcome is written.
// ReportWriter is the one the tasks_worker plugin uses: a StoringReporter
// into the pool's broker, so each report rides on its attempt's outcome and
// the broker stores both in one transaction; the writer itself stores only
// the reports of lost attempts, off the workers' path, many per
// transaction, and counts what it cannot store rather than slow the tasks
// down.
package worker
