package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
)

// This file owns the executor: the worker goroutines, which run the
// messages the dispatcher hands them and hand each attempt's outcome to
// the completer, and how one message is run (handle, run). The pool starts
// the workers in Start; they end once the dispatcher closes jobs, and Stop
// waits for them (drain), cancelling (runCtx) and then abandoning
// (abandon) handlers that outlast the drain. A handler runs on its
// worker's goroutine: no goroutine, channel or switch per attempt.

// lockErrorRetryDelay is the requeue delay when a lock could not be
// taken because the broker failed.
const lockErrorRetryDelay = time.Second

// executor runs the messages the dispatcher hands it (give) on
// Concurrency worker goroutines, and offloaded attempts on goroutines of
// their own (offload), and hands each attempt's outcome to the completer.
// It keeps the counts the dispatcher's slots are read from (inflight,
// offloaded) and the record of the attempts it runs (attempts), through
// which cancels reach them.
type executor struct {
	b        broker.Broker
	reg      *Registry
	log      hclog.Logger
	obs      Observer
	workerID string
	n        int        // Options.Concurrency
	slots    func() int // Options.OffloadSlots; nil: offload none
	drainFor time.Duration
	grace    time.Duration // Options.AbandonAfter
	out      *completer
	back     *giveBacks    // the suspects the dispatcher gives back
	unknown  *unknownTasks // the messages of tasks not registered here

	jobs      chan *broker.Message
	backlog   []*broker.Message    // given past what jobs holds, in order: the dispatcher's goroutine's alone (give, feed)
	offJobs   chan *broker.Message // offloaded attempts, to an idle offloader
	jobsDone  chan struct{}        // closed with jobs: the dispatcher has stopped
	slotFreed chan struct{}        // a worker finished a message
	runCtx    context.Context      // cancelled: hard stop (hardStop), which cancels every handler's context too
	cancelRun context.CancelFunc
	workers   sync.WaitGroup
	attempts  attempts // the handlers running, for cancels

	inflight  atomic.Int64 // claimed and not yet handed to the completer
	offloaded atomic.Int64 // of inflight, run on goroutines of their own (offload)
	running   atomic.Int64 // handlers running
	draining  atomic.Bool  // Stop began: what has not started does not run
}

func newExecutor(p *Pool, back *giveBacks, unknown *unknownTasks) *executor {
	n := p.opts.Concurrency
	e := &executor{
		b: p.b, reg: p.reg, log: p.log, obs: p.obs, workerID: p.opts.WorkerID, n: n, slots: p.opts.OffloadSlots,
		drainFor: p.opts.DrainTimeout, grace: p.opts.AbandonAfter, out: p.out, back: back, unknown: unknown,
		jobs:      make(chan *broker.Message, n),
		offJobs:   make(chan *broker.Message),
		jobsDone:  make(chan struct{}),
		slotFreed: make(chan struct{}, 1),
	}
	e.runCtx, e.cancelRun = context.WithCancel(context.Background())
	return e
}

// start starts the workers.
func (e *executor) start() {
	e.workers.Add(e.n)
	for range e.n {
		go e.work()
	}
}

// give hands a claimed message to the workers: an attempt of an offloaded
// task goes out at once while the offload slots have room (offload), any
// other waits in jobs for a worker, or, past what jobs holds, in the
// backlog, which feed moves into jobs as workers free up. A claim sized
// for offloaded attempts (slots.extra) may bring more in-process messages
// than there are idle workers: they wait there, never blocking the
// dispatcher. Called by the dispatcher's goroutine alone.
func (e *executor) give(m *broker.Message) {
	e.inflight.Add(1)
	if e.offload(m) {
		return
	}
	if len(e.backlog) == 0 {
		select {
		case e.jobs <- m:
			return
		default:
		}
	}
	e.backlog = append(e.backlog, m)
}

// feed moves what the backlog holds into jobs, in order, while jobs has
// room. Called by the dispatcher's goroutine alone.
func (e *executor) feed() {
	for len(e.backlog) > 0 {
		select {
		case e.jobs <- e.backlog[0]:
			e.backlog[0] = nil
			e.backlog = e.backlog[1:]
		default:
			return
		}
	}
	e.backlog = nil
}

// backlogged reports whether messages wait in the backlog.
func (e *executor) backlogged() bool { return len(e.backlog) > 0 }

// requeueBacklog gives back, as a stopping worker does, the messages that
// still wait in the backlog when the dispatcher stops: only Stop stops it,
// once draining is set, so handle requeues each without running it.
func (e *executor) requeueBacklog() {
	for _, m := range e.backlog {
		if c := e.handle(m); c != nil {
			e.handed(c)
		}
	}
	e.backlog = nil
}

// offloadable reports whether m is of an offloaded task (Task.Offload).
func (e *executor) offloadable(m *broker.Message) bool {
	t, ok := e.reg.Lookup(m.Task)
	return ok && t.Offload
}

// offloadSlots is how many offloaded attempts may be out at once now
// (Options.OffloadSlots).
func (e *executor) offloadSlots() int {
	if e.slots == nil {
		return 0
	}
	return e.slots()
}

// closeJobs tells the workers that nothing more comes, as the dispatcher
// stops: they end once they have run what jobs holds.
func (e *executor) closeJobs() {
	close(e.jobs)
	close(e.jobsDone)
}

// drain waits for the workers to finish what they hold, for up to
// Options.DrainTimeout, then cancels the handlers still running and, after
// Options.AbandonAfter more, gives up on those that ignore it (abandon).
// With a deadline on ctx it keeps part of it for what Stop does next.
// When it abandons handlers, the completer's writes are bounded from then
// on, Stop's flush included: the caller calls the returned func once that
// is done. Call it once the dispatcher has stopped.
func (e *executor) drain(ctx context.Context) (release func()) {
	workersDone := make(chan struct{})
	go func() {
		e.workers.Wait()
		close(workersDone)
	}()
	// With a deadline, keep part of it for requeueing, flushing and
	// unregistering: a drain that used all of it would have the caller
	// kill the process before the messages are handed back.
	drain, grace := e.drainFor, e.grace
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		reserve := min(max(left/10, 50*time.Millisecond), 2*time.Second)
		drain = min(drain, left-reserve)
		grace = min(grace, max(reserve/2, 20*time.Millisecond))
	}
	if waitFor(ctx, workersDone, drain) {
		return func() {}
	}
	e.log.Warn("drain time is up: cancelling running tasks and requeueing their messages",
		"running", e.running.Load(), "drained_for", drain.String())
	e.hardStop()
	if waitFor(context.Background(), workersDone, grace) {
		return func() {}
	}
	e.log.Error("tasks ignored cancellation: requeueing their messages; their goroutines run on until they return",
		"running", e.running.Load())
	// The workers (and the requeues below) may be blocked handing
	// outcomes to a collector that retries a dead broker: bound
	// that too.
	t := time.AfterFunc(flushTimeout, e.out.giveUp)
	e.abandon()
	<-workersDone
	return func() { t.Stop() }
}

// hardStop cancels runCtx and the context of every handler, running or
// about to start.
func (e *executor) hardStop() {
	e.cancelRun()
	e.attempts.stopAll()
}

// abandon gives up on the handlers still running at Stop, which ignored
// their cancelled contexts: each one's message is requeued, as a stopped
// attempt, and its worker is counted out of workers (it runs on until the
// handler returns, then drops the result: see run).
func (e *executor) abandon() {
	for _, c := range e.attempts.abandon() {
		c.dur = time.Since(c.started)
		c.tc = &c.taskCtx
		e.out.add(c.requeueNow("worker stopped (the task ignored cancellation)", StatusStopped))
		e.inflight.Add(-1)
		e.workers.Done()
	}
}

// work runs messages until jobs is closed and empty, or until Stop
// abandons the handler it runs (which counts it out of workers then).
func (e *executor) work() {
	for m := range e.jobs {
		if e.offload(m) {
			e.freed()
			continue
		}
		c := e.handle(m)
		if c == nil {
			return
		}
		e.handed(c)
	}
	e.workers.Done()
}

// handed hands an attempt's outcome to the completer and frees its slot.
func (e *executor) handed(c *completion) {
	e.out.add(c)
	e.inflight.Add(-1)
	e.freed()
}

// freed tells the dispatcher a worker is free.
func (e *executor) freed() {
	select {
	case e.slotFreed <- struct{}{}:
	default:
	}
}

// offload runs m on a goroutine of its own when its task is offloaded
// (Task.Offload) and Options.OffloadSlots has room: the worker is free for
// the next message at once. The goroutine counts among the workers Stop
// waits for; while it runs, m does not count against Concurrency (see
// slots), so the pool claims past it for offloaded attempts, as many
// as their slots admit. Without room, the worker runs m itself, and the
// claims wait for it as for any handler.
func (e *executor) offload(m *broker.Message) bool {
	if e.slots == nil {
		return false
	}
	if !e.offloadable(m) || e.offloaded.Load() >= int64(e.slots()) {
		return false
	}
	e.offloaded.Add(1)
	select {
	case e.offJobs <- m: // an offloader waits for one
		return true
	default:
	}
	e.workers.Add(1)
	go e.offloader(m)
	return true
}

// offloaderIdle is how long an offloader waits for another attempt before
// it ends: a busy pool reuses its offloaders (and their grown stacks)
// rather than start a goroutine per attempt.
const offloaderIdle = time.Second

// offloader runs offloaded attempts, m first, until none comes for
// offloaderIdle or the dispatcher ends.
func (e *executor) offloader(m *broker.Message) {
	idle := time.NewTimer(offloaderIdle)
	defer idle.Stop()
	for {
		c := e.handle(m)
		e.offloaded.Add(-1)
		if c == nil {
			return // abandoned by Stop, which counted it out of workers
		}
		e.handed(c)
		idle.Reset(offloaderIdle)
		select {
		case m = <-e.offJobs:
		case <-idle.C:
			e.workers.Done()
			return
		case <-e.jobsDone:
			e.workers.Done()
			return
		}
	}
}

// msgLogger logs about one message, with its id, task, topic and attempt;
// it builds the logger that carries them on first use, as most attempts
// log nothing.
type msgLogger struct {
	base hclog.Logger
	m    *broker.Message
	l    hclog.Logger
	once sync.Once
}

func (ml *msgLogger) get() hclog.Logger {
	ml.once.Do(func() {
		ml.l = ml.base.With("message_id", ml.m.ID, "task", ml.m.Task, "topic", ml.m.Topic, "attempt", ml.m.Attempts)
	})
	return ml.l
}

func (ml *msgLogger) Debug(msg string, args ...any) {
	if ml.base.IsDebug() {
		ml.get().Debug(msg, args...)
	}
}
func (ml *msgLogger) Info(msg string, args ...any)  { ml.get().Info(msg, args...) }
func (ml *msgLogger) Warn(msg string, args ...any)  { ml.get().Warn(msg, args...) }
func (ml *msgLogger) Error(msg string, args ...any) { ml.get().Error(msg, args...) }

type handlerResult struct {
	value any
	err   error
}

// handle runs one message and says how it ended: nil when Stop abandoned
// its handler, and wrote its outcome itself (see run).
func (e *executor) handle(m *broker.Message) (out *completion) {
	e.obs.TaskStarted(m.Topic)
	c := &completion{claim: m.ClaimOf(), topic: m.Topic, task: m.Task, started: time.Now(), msg: m}
	c.logger = msgLogger{base: e.log, m: m}
	log := &c.logger
	// The handler's panics are caught where it runs (run); this catches
	// those of the task's other code: its lock key, its backoff, its
	// result's MarshalJSON. Left alone, one would end the process and
	// orphan every message it runs, on every worker that claims it.
	defer func() {
		if r := recover(); r != nil {
			log.Error("task code panicked outside its handler", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			if c.dur == 0 {
				c.dur = time.Since(c.started)
			}
			c.ack, c.result, c.lost = false, nil, false
			out = c.fail(fmt.Sprintf("panic in the task's code outside its handler (lock key, backoff or result encoding): %v", r), false, 0)
		}
	}()

	// Only suspects are given back (see isolation): the others skip the lock.
	if back := e.back.outcome(c); back != nil {
		return back
	}
	if e.draining.Load() {
		return c.notRun(0, "worker stopped", StatusStopped)
	}
	t, ok := e.reg.Lookup(m.Task)
	if !ok {
		return e.unknown.decide(c, log)
	}
	maxAttempts := m.MaxAttempts
	if maxAttempts <= 0 {
		maxAttempts = t.MaxAttempts
	}
	attempt := max(m.Attempts, 1)
	if out := e.lock(t, c); out != nil {
		return out
	}

	tc := &c.taskCtx
	tc.Payload, tc.MessageID, tc.Task, tc.Topic, tc.Headers = m.Payload, m.ID, m.Task, m.Topic, m.Headers
	tc.Attempt, tc.MaxAttempts, tc.log = attempt, maxAttempts, log
	r := e.run(t, c)
	if r.abandoned {
		// Stop wrote the outcome and counted this worker out: c is its.
		return nil
	}
	c.dur = time.Since(c.started)
	if r.ran {
		c.tc, c.timedOut = tc, r.timedOut
	}
	return e.outcome(t, c, r, attempt, maxAttempts)
}

// lock takes the lock of c's message when its task has one (Task.LockKey,
// NonConcurrent): nil when it has none or took it, else c's outcome.
func (e *executor) lock(t Task, c *completion) *completion {
	name := t.lockName(c.msg.Payload)
	if name == "" {
		return nil
	}
	log := &c.logger
	lctx, cancel := context.WithTimeout(e.runCtx, brokerCallTimeout)
	got, err := e.b.AcquireLock(lctx, name, e.workerID, c.claim)
	cancel()
	switch {
	case errors.Is(err, broker.ErrClaimLost):
		log.Warn("claim lost before the task ran", "lock", name)
		c.lost, c.status = true, StatusLost
		return c
	case err != nil:
		log.Warn("could not take the task's lock; requeueing", "lock", name, "error", err)
		return c.notRun(lockErrorRetryDelay, fmt.Sprintf("could not take lock %q: %v", name, err), StatusDeferred)
	case !got && t.OnLockConflict == LockRequeue:
		log.Debug("lock held; requeueing", "lock", name, "retry_in", t.LockRetryDelay.String())
		return c.notRun(t.LockRetryDelay, fmt.Sprintf("lock %q is held by another message; retrying in %s", name, t.LockRetryDelay), StatusDeferred)
	case !got:
		log.Info("lock held; skipping the message", "lock", name)
		c.ack, c.result, c.status = true, json.RawMessage(`{"skipped":"lock held"}`), StatusSkipped
		return c
	}
	return nil
}

// outcome decides how c's attempt ended, as run says: done, cancelled,
// given back by a stopping pool, or failed (failure).
func (e *executor) outcome(t Task, c *completion, r runResult, attempt, maxAttempts int) *completion {
	log := &c.logger
	res := r.handlerResult
	switch {
	case r.stopped:
		return c.notRun(0, "worker stopped before the task started", StatusStopped)
	case !r.ran:
		log.Info("task cancelled before it ran")
		return c.cancelled(cancelledBeforeRun)
	case res.err == nil:
		// Success wins over a cancel request that came too late.
		body, err := marshalResult(res.value)
		if err == nil {
			c.ack, c.result, c.status = true, body, StatusDone
			return c
		}
		res.err = fmt.Errorf("the task's result cannot be stored: %w", err)
	case r.cancelled:
		log.Info("task cancelled while it ran", "error", res.err.Error())
		return c.cancelled(cancelledWhileRunning)
	case e.runCtx.Err() != nil:
		// Hard stop: the failure is most likely the cancellation itself.
		// The worker's stop cut the attempt short, not the task: it gives
		// the attempt back, so a deploy does not use up a message's
		// max_attempts (nor show more attempts than it allows).
		return c.notRun(0, "worker stopped before the task finished; requeued", StatusStopped)
	}
	return failure(t, c, res.err, r.timedOut, attempt, maxAttempts)
}

// failure is the outcome of c's attempt, which failed with err: as err
// asks (Snooze, Permanent, CancelTask), else retried after the task's
// backoff while attempts remain, else failed for good.
func failure(t Task, c *completion, err error, timedOut bool, attempt, maxAttempts int) *completion {
	log := &c.logger
	msg := err.Error()
	if timedOut {
		msg = fmt.Sprintf("timed out after %s: %s", t.Timeout, msg)
	}
	if msg == "" {
		msg = "task failed"
	}
	if oe := outcomeOf(err); oe != nil {
		switch oe.kind {
		case outcomeSnooze:
			if err := checkSnooze(oe.after); err != nil {
				msg = err.Error()
				break
			}
			log.Debug("task snoozed", "retry_in", oe.after.String())
			return c.snooze(oe.after, msg)
		case outcomePermanent:
			log.Warn("task failed permanently; no further attempt", "error", msg, "max_attempts", maxAttempts)
			return c.fail(msg, false, 0)
		case outcomeCancel:
			log.Info("task cancelled itself", "reason", msg)
			return c.cancelled(msg)
		}
	}
	if attempt < maxAttempts {
		d := t.retryDelay(attempt, err)
		log.Warn("task failed; retrying", "error", msg, "max_attempts", maxAttempts, "retry_in", d.String())
		return c.fail(msg, true, d)
	}
	log.Warn("task failed for good", "error", msg, "max_attempts", maxAttempts)
	return c.fail(msg, false, 0)
}

// pastDeadline reports whether ctx's deadline has passed: its Err says so,
// or the clock does. A handler that failed because a context of its own
// with the same deadline ended (a gRPC call's, say) can return before
// ctx's own timer has fired; its failure is still the timeout's.
func pastDeadline(ctx context.Context) bool {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// runResult is how run ended.
type runResult struct {
	handlerResult
	// ran: the handler was called (false: a cancel request came before it
	// started, or the pool was abandoning handlers already).
	ran bool
	// stopped: the pool was abandoning handlers before this one started,
	// which then never ran.
	stopped bool
	// abandoned: Stop gave up on the handler while it ran and wrote its
	// outcome (see attempts.abandon); the worker has nothing left to do.
	abandoned bool
	timedOut  bool
	// cancelled: a cancel request came while it ran (CancelRunning), or
	// before it started (with ran false).
	cancelled bool
}

// run calls the handler of c's attempt on the worker's own goroutine and
// turns a panic into an error. A handler that ignores cancellation at
// Stop is abandoned by Stop itself (attempts.abandon), which requeues its
// message and counts its worker out: this goroutine then runs on until
// the handler returns, and drops its result.
func (e *executor) run(t Task, c *completion) (r runResult) {
	tc := &c.taskCtx
	base, cancelBase := context.WithCancelCause(context.Background())
	defer cancelBase(nil)
	ctx := base
	if t.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(base, t.Timeout)
		defer cancel()
	}
	a, requested, stopping := e.attempts.start(c, ctx, cancelBase)
	if stopping {
		return runResult{stopped: true}
	}
	defer func() { r.cancelled = e.attempts.end(c.claim.ID, a) }()
	if requested {
		return runResult{}
	}
	e.running.Add(1)
	defer e.running.Add(-1)

	res := callHandler(ctx, t, tc, &c.logger)
	if !a.finish() {
		return runResult{ran: true, abandoned: true}
	}
	timedOut := res.err != nil && t.Timeout > 0 && pastDeadline(ctx) && base.Err() == nil && e.runCtx.Err() == nil
	return runResult{handlerResult: res, ran: true, timedOut: timedOut}
}

// callHandler calls t's handler and turns a panic into an error.
func callHandler(ctx context.Context, t Task, tc *TaskContext, log *msgLogger) (res handlerResult) {
	defer func() {
		if r := recover(); r != nil {
			log.Error("task panicked", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			res = handlerResult{err: fmt.Errorf("panic: %v", r)}
		}
	}()
	v, err := t.Handler(ctx, tc)
	return handlerResult{value: v, err: err}
}

func marshalResult(v any) (json.RawMessage, error) {
	switch r := v.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		if len(r) == 0 {
			return nil, nil
		}
		if err := checkResult(r); err != nil {
			return nil, err
		}
		return r, nil
	}
	body, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return body, checkResult(body)
}

// checkResult refuses a result the brokers would refuse, or that is too
// large to write with the other outcomes of a batch (broker.MaxResultSize).
func checkResult(body []byte) error {
	if len(body) > broker.MaxResultSize {
		return fmt.Errorf("the result is %d bytes of JSON, the limit is %d: store large data elsewhere and return a reference to it",
			len(body), broker.MaxResultSize)
	}
	return broker.CheckJSON(body)
}
