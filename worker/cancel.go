package worker

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
)

// This file owns the cancellation of running attempts: the pool's record
// of the attempts it runs (attempts), the cancels that carry requests to
// them (Pool.CancelRunning, and the broker's requests: cancels.poll after
// each heartbeat, cancels.watch when the broker announces them), and how
// a cancel request that comes before its handler starts is kept for it
// (early).

// ErrCancelRequested is the cause (context.Cause) of a handler's context
// cancelled because someone asked to cancel its task (Pool.CancelRunning):
// a handler that must tell it from a stopping pool or a timeout checks
// context.Cause(ctx) against it. Whatever the handler then returns, its
// attempt ends cancelled, unless it returned success, which wins.
var ErrCancelRequested = errors.New("task cancel requested")

// earlyCancelKeep bounds how long a cancel request for a message the pool
// holds but has not started is kept for its handler.
const earlyCancelKeep = 2 * brokerCallTimeout

// attempts are the attempts the pool runs, by message id.
type attempts struct {
	mu      sync.Mutex
	running map[int64]*attempt
	// early: cancel requests for messages held but not running yet (their
	// handler is about to start), by when they came.
	early map[int64]time.Time
	// abandoning: Stop gave up on the running handlers (abandon); no
	// handler starts any more.
	abandoning bool
	// stopped: Stop cancelled every handler's context (stopAll); one
	// that starts from then on starts cancelled.
	stopped bool
}

// attempt is one running handler's cancellation, and its fate at Stop.
type attempt struct {
	cancel    context.CancelCauseFunc
	ctx       context.Context // the handler's
	requested bool            // guarded by attempts.mu
	// requestedAt is when the cancel was requested; warned says the
	// handler's overrun was logged (both guarded by attempts.mu).
	requestedAt time.Time
	warned      bool
	c           *completion
	// state: attemptRunning until the handler returns (finish) or Stop
	// gives up on it (abandon), whichever comes first.
	state atomic.Int32
}

const (
	attemptRunning int32 = iota
	attemptFinished
	attemptAbandoned
)

// finish records that a's handler returned; false when Stop abandoned it
// first (its outcome is written: the result must be dropped).
func (a *attempt) finish() bool {
	return a.state.CompareAndSwap(attemptRunning, attemptFinished)
}

// start records that the handler of c's message starts under a context
// that cancel cancels; requested says a cancel request came for it
// already, stopping that Stop abandons handlers already: either way the
// handler must not run.
func (as *attempts) start(c *completion, ctx context.Context, cancel context.CancelCauseFunc) (a *attempt, requested, stopping bool) {
	id := c.claim.ID
	as.mu.Lock()
	defer as.mu.Unlock()
	if as.abandoning {
		return nil, false, true
	}
	if as.running == nil {
		as.running = map[int64]*attempt{}
	}
	a = &attempt{cancel: cancel, ctx: ctx, c: c}
	if as.stopped {
		cancel(context.Canceled)
	}
	if at, ok := as.early[id]; ok {
		delete(as.early, id)
		a.requested, a.requestedAt = true, at
	}
	as.running[id] = a
	return a, a.requested, false
}

// stopAll cancels the context of every running handler, and of every
// one that starts from now on, for Stop's hard stop. A handler's context
// is not a child of a context of the pool's: the thousands of attempts a
// pool may have out at once would all register with, and contend on, that
// one parent.
func (as *attempts) stopAll() {
	as.mu.Lock()
	defer as.mu.Unlock()
	as.stopped = true
	for _, a := range as.running {
		a.cancel(context.Canceled)
	}
}

// abandon gives up on every running handler, for Stop: it returns the
// completions of those that had not returned yet, which their workers no
// longer write (see attempt.finish), and from then on no handler starts.
func (as *attempts) abandon() []*completion {
	as.mu.Lock()
	defer as.mu.Unlock()
	as.abandoning = true
	var out []*completion
	for _, a := range as.running {
		if a.state.CompareAndSwap(attemptRunning, attemptAbandoned) {
			out = append(out, a.c)
		}
	}
	return out
}

// end forgets a's handler, which returned (or was abandoned), and says
// whether a cancel was requested while it ran.
func (as *attempts) end(id int64, a *attempt) (requested bool) {
	as.mu.Lock()
	defer as.mu.Unlock()
	if as.running[id] == a {
		delete(as.running, id)
	}
	return a.requested
}

// cancel cancels the running attempt of message id; running is false
// when none runs, first false when its cancel was requested already.
func (as *attempts) cancel(id int64) (running, first bool) {
	as.mu.Lock()
	a := as.running[id]
	if a != nil {
		first = !a.requested
		if first {
			a.requested, a.requestedAt = true, time.Now()
		}
	}
	as.mu.Unlock()
	if a == nil {
		return false, false
	}
	a.cancel(ErrCancelRequested)
	return true, first
}

// overrun is one handler that runs on past its timeout or a cancel
// request: its slot stays held until it returns.
type overrun struct {
	id    int64
	task  string
	since time.Time // when its timeout passed or its cancel was requested
}

// overrunning lists the handlers that run on past their timeout or a
// cancel request, and marks those past warnAfter as warned, returning
// them in warn too (each once). It costs what the pool runs, not more.
func (as *attempts) overrunning(now time.Time, warnAfter time.Duration) (all, warn []overrun) {
	as.mu.Lock()
	defer as.mu.Unlock()
	for id, a := range as.running {
		if a.state.Load() != attemptRunning || a.ctx == nil || a.ctx.Err() == nil {
			continue
		}
		var since time.Time
		if a.requested {
			since = a.requestedAt
		} else if dl, ok := a.ctx.Deadline(); ok && !now.Before(dl) {
			since = dl
		} else {
			continue // the pool stops: its drain says so
		}
		o := overrun{id: id, task: a.c.task, since: since}
		all = append(all, o)
		if !a.warned && now.Sub(since) >= warnAfter {
			a.warned = true
			warn = append(warn, o)
		}
	}
	return all, warn
}

// overrunWarnAfter is how long a handler may run on past its timeout or a
// cancel request before the pool logs it.
const overrunWarnAfter = 2 * time.Second

// keepEarly keeps a cancel request for message id, held by the pool but
// not running yet, for its handler's start.
func (as *attempts) keepEarly(id int64) {
	as.mu.Lock()
	defer as.mu.Unlock()
	now := time.Now()
	if as.early == nil {
		as.early = map[int64]time.Time{}
	}
	for k, at := range as.early {
		if now.Sub(at) > earlyCancelKeep {
			delete(as.early, k)
		}
	}
	as.early[id] = now
}

// forgetEarly drops a kept cancel request for message id, whose outcome
// is written.
func (as *attempts) forgetEarly(id int64) {
	as.mu.Lock()
	delete(as.early, id)
	as.mu.Unlock()
}

// cancels carries cancel requests to the attempts the pool runs: those
// asked for through this process (Pool.CancelRunning), those the broker
// announces (broker.CancelNotifier: watch, a goroutine the pool starts in
// Start and stops in Stop), and those the heartbeat finds in the broker
// after each beat (poll). It also tells of handlers that run on past
// their timeout or a cancel request (overrunning).
type cancels struct {
	b        broker.Broker
	workerID string
	log      hclog.Logger
	attempts *attempts
	claims   *holdings
	ctx      context.Context // cancelled: stop watching
	cancel   context.CancelFunc
	done     chan struct{} // closed: watch returned
	started  bool          // watch runs (the pool calls start, then stop)
}

func newCancels(b broker.Broker, workerID string, log hclog.Logger, as *attempts, claims *holdings) *cancels {
	c := &cancels{b: b, workerID: workerID, log: log, attempts: as, claims: claims, done: make(chan struct{})}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c
}

// start watches the broker's cancel notices, when it announces them.
func (c *cancels) start() {
	if cn, ok := c.b.(broker.CancelNotifier); ok {
		c.started = true
		go c.watch(cn.CancelNotices())
	}
}

// stop stops watching and waits for it. It may be called more than once,
// and before start.
func (c *cancels) stop() {
	c.cancel()
	if c.started {
		<-c.done
	}
}

// request cancels the attempt of message id that the pool runs, or keeps
// the request for its handler when the pool holds the message and has not
// started it yet (see Pool.CancelRunning); false when the pool holds no
// such message.
func (c *cancels) request(id int64) bool {
	if running, first := c.attempts.cancel(id); running {
		if first {
			c.log.Info("cancel requested: cancelling the running task", "message_id", id)
		}
		return true
	}
	if !c.claims.holdsID(id) {
		return false
	}
	c.attempts.keepEarly(id)
	// The handler may have started between the two looks.
	if running, _ := c.attempts.cancel(id); running {
		c.attempts.forgetEarly(id)
	}
	c.log.Debug("cancel requested for a task claimed and not running", "message_id", id)
	return true
}

// poll asks the broker which of the messages running under this worker
// have a cancel request, and cancels those the pool holds, within
// brokerCallTimeout; stop is the heartbeat's context. The heartbeat calls
// it after each beat: it is how a cancel asked for in another process
// reaches a pool whose broker announces none, or whose announcement was
// missed.
func (c *cancels) poll(stop context.Context) {
	ctx, cancel := context.WithTimeout(stop, brokerCallTimeout)
	defer cancel()
	claims, err := c.b.CancelRequests(ctx, c.workerID)
	if err != nil {
		if stop.Err() == nil {
			c.log.Warn("could not ask the broker for cancel requests; asking again at the next heartbeat", "error", err)
		}
		return
	}
	for _, cl := range claims {
		if held, _ := c.claims.holds(cl); held {
			c.request(cl.ID)
		}
	}
}

// watch cancels, as they are announced, the attempts the pool runs whose
// cancel is requested, until stop.
func (c *cancels) watch(notices <-chan int64) {
	defer close(c.done)
	for {
		select {
		case <-c.ctx.Done():
			return
		case id := <-notices:
			c.request(id)
		}
	}
}

// overrunning is how many handlers run on past their timeout or a cancel
// request now (see Pool.Overrunning).
func (c *cancels) overrunning() int {
	all, _ := c.attempts.overrunning(time.Now(), time.Duration(1<<62))
	return len(all)
}

// warnOverruns logs each handler that has run on for overrunWarnAfter
// past its timeout or a cancel request, once; the heartbeat calls it.
func (c *cancels) warnOverruns() {
	now := time.Now()
	_, warn := c.attempts.overrunning(now, overrunWarnAfter)
	for _, o := range warn {
		c.log.Warn("a task runs on past its timeout or cancel; its slot stays held until it returns (its topic's concurrency limit counts it)",
			"message_id", o.id, "task", o.task, "overrun", now.Sub(o.since).Round(time.Millisecond).String())
	}
}
