// Package worker is the task runtime: a registry of task definitions and a
// pool that claims messages from a broker.Broker, runs their handlers and
// reports each attempt's outcome back to the broker.
//
// A Pool is made of parts, each a small type that owns its goroutines,
// which Start starts and Stop stops and waits for:
//
//   - the dispatcher (dispatch.go) claims up to as many messages as it has
//     free slots (slots) in a single broker.Claim call, at most two in
//     flight (exchanges), and hands them to the executor; it holds back a
//     suspect until it can run alone (isolation), and between claims it
//     waits for the broker's announcements (announcements);
//   - the executor (execute.go) runs handlers on Concurrency worker
//     goroutines, and offloaded tasks' attempts on goroutines of their
//     own; it decides each attempt's outcome, drains at Stop and abandons
//     the handlers that ignore their cancelled contexts;
//   - the completer (completer.go, outcomes.go) owns every write of an
//     outcome, with two collectors that take the workers' outcomes;
//   - the heartbeater (heartbeat.go) registers the worker, keeps its row
//     fresh, and unregisters it;
//   - the stray check (strays.go) requeues messages claimed for this
//     worker whose claim's answer never reached it;
//   - the cancels (cancel.go) carry cancel requests to running attempts.
//
// The Fleet (fleet.go), the pool's view of which tasks other live workers
// run, serves the executor's unknown-task policy (elsewhere.go) and the
// tasks_worker service (Pool.Fleet).
//
// Nacks the collectors write themselves; acks they leave to the
// dispatcher, which has the completer write every ack pending with its
// next claim, ahead of it (one transaction and one round trip with a
// broker.AckClaimer such as the PostgreSQL broker). A finishing handler
// frees a slot and so starts that claim at once: a lone completion is
// never held back by a timer, and a busy pool writes many acks per round
// trip. While one such exchange is in flight, a second one carries the
// acks of a whole batch (see dispatcher), so finished messages do not
// wait for the write in flight. A topic's concurrency limit counts a
// message until its outcome is written, so the claim that carries the
// acks sees their slots free, and a claim that comes back short while
// outcomes are being written is retried as soon as one of those writes
// returns, not after the idle interval.
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
