package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
)

// This file owns the Pool: its state, its lifecycle (Start, Stop) and
// the parts it is made of, each a type that owns its goroutines: the
// heartbeater (heartbeat.go), the stray check (strays.go), the cancels
// (cancel.go), the completer (completer.go), the executor (execute.go)
// and the dispatcher (dispatch.go). Start starts them in that order; Stop
// stops the dispatcher, drains the executor, then stops the completer and
// the others, and waits for each.

// ErrStopped is returned by Start on a pool that was stopped.
var ErrStopped = errors.New("worker pool stopped")

// brokerCallTimeout bounds one broker call, so a hung connection cannot
// hold a goroutine forever.
const brokerCallTimeout = 30 * time.Second

type poolState int

const (
	stateNew poolState = iota
	stateRunning
	stateStopping
	stateStopped
)

// Pool claims messages and runs them. Create it with NewPool, then Start
// and Stop it once each. It holds its parts and their shared records (the
// claims it holds, the claims to give back), and answers for them.
type Pool struct {
	b    broker.Broker
	reg  *Registry
	opts Options
	log  hclog.Logger
	obs  Observer

	mu      sync.Mutex
	state   poolState
	topics  topicSet      // what the pool claims from
	stopped chan struct{} // closed when the pool is fully stopped

	disp *dispatcher // the claim loop
	exec *executor   // runs what it claims
	out  *completer  // writes every outcome

	hb      *heartbeater // the worker's row in the broker
	strays  *strayCheck
	cancels *cancels

	fleet   *Fleet        // who else runs a task
	unknown *unknownTasks // the messages of tasks not registered here

	claims holdings  // claimed, outcome not yet written (see hold)
	back   giveBacks // claims to requeue without running
}

// NewPool returns a pool that runs reg's tasks from b. Nothing happens
// until Start.
func NewPool(b broker.Broker, reg *Registry, opts Options) *Pool {
	opts = opts.withDefaults()
	obs := opts.Observer
	if obs == nil {
		obs = nopObserver{}
	}
	p := &Pool{
		b:       b,
		reg:     reg,
		opts:    opts,
		log:     opts.Logger.With("worker_id", opts.WorkerID),
		obs:     obs,
		stopped: make(chan struct{}),
		topics:  topicSet{reg: reg, extra: opts.Topics},
	}
	n := opts.Concurrency
	p.claims.init(2 * n)
	p.out = newCompleter(b, p.log, opts.WorkerID, obs, opts.Reporter, &p.claims, n)
	p.fleet = newFleet(b, opts.WorkerID, opts.HeartbeatInterval, p.log)
	p.unknown = &unknownTasks{fleet: p.fleet, workerID: opts.WorkerID, grace: opts.UnknownTaskGrace, wait: opts.UnknownTaskWait}
	p.exec = newExecutor(p, &p.back, p.unknown)
	p.disp = newDispatcher(p, &p.back)
	p.cancels = newCancels(b, opts.WorkerID, p.log, &p.exec.attempts, &p.claims)
	p.hb = newHeartbeater(p, p.cancels)
	p.strays = newStrayCheck(p)
	return p
}

// LastHeartbeat returns when this pool's worker last stamped its
// heartbeat (or registered), and the error of the latest try when it
// failed (nil when it went through). A worker whose heartbeats fail looks
// dead to the others once orphan_reclaim_after passes, and its broker
// writes are likely failing too. Zero before Start.
func (p *Pool) LastHeartbeat() (time.Time, error) { return p.hb.last() }

// Overrunning is how many handlers run on past their timeout or a cancel
// request now: each keeps its slot, and its topic's concurrency limit
// counts it, until it returns (for a provider plugin's task, until the
// plugin says its handler returned).
func (p *Pool) Overrunning() int { return p.cancels.overrunning() }

// CancelRunning cancels the attempt of message id that this pool runs:
// its handler's context is cancelled with cause ErrCancelRequested
// (across the plugin boundary, for a provider plugin's task), and the
// attempt ends cancelled (StatusCancelled) — never retried — unless the
// handler returns success first, in which case the ack wins. A message
// the pool has claimed but whose handler has not started yet is cancelled
// before it runs. It returns false when the pool holds no such message.
//
// The tasks_worker plugin calls it when a cancel is asked for through
// this process; a cancel asked for elsewhere reaches the pool through the
// broker (its cancel notices, or the heartbeat's Broker.CancelRequests).
func (p *Pool) CancelRunning(id int64) bool { return p.cancels.request(id) }

// Fleet is the pool's view of the other live workers sharing its broker:
// which tasks they run, on which topics.
func (p *Pool) Fleet() *Fleet { return p.fleet }

// WorkerID is the id this pool registers under.
func (p *Pool) WorkerID() string { return p.opts.WorkerID }

// Concurrency is the number of handlers that may run at once.
func (p *Pool) Concurrency() int { return p.opts.Concurrency }

// Topics lists the topics the pool claims from (known after Start). It
// grows when tasks of a new topic are registered (other plugins' tasks).
func (p *Pool) Topics() []string { return p.topics.list() }

// Running is the number of handlers running now.
func (p *Pool) Running() int { return int(p.exec.running.Load()) }

// Wake makes the dispatcher claim at once instead of waiting out its idle
// interval; call it after submitting a message locally. It never blocks.
func (p *Pool) Wake() { p.disp.wakeUp() }

// Start registers the worker with the broker and starts claiming. ctx
// bounds the registration only: the pool runs until Stop.
func (p *Pool) Start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch p.state {
	case stateRunning:
		return errors.New("worker pool already started")
	case stateStopping, stateStopped:
		return ErrStopped
	}

	for _, t := range p.opts.Topics {
		if err := broker.ValidateTopicName(t); err != nil {
			return fmt.Errorf("start worker pool: topic %q: %w", t, err)
		}
	}
	topics := p.topics.wanted()
	if len(topics) == 0 {
		return errors.New("start worker pool: no topic to claim from: register a task or list topics in Options.Topics")
	}
	p.topics.set(topics)

	if err := p.hb.register(ctx); err != nil {
		return fmt.Errorf("start worker pool: register worker %s: %w", p.opts.WorkerID, err)
	}

	p.unknown.started = time.Now()

	p.hb.start()
	p.strays.start()
	p.cancels.start()
	p.out.start()
	p.exec.start()
	p.disp.start()
	p.state = stateRunning
	p.log.Info("worker pool started", "topics", topics, "concurrency", p.opts.Concurrency)
	return nil
}

// Stop stops claiming, lets running handlers finish for up to
// Options.DrainTimeout (or until ctx is done), then cancels the rest and
// requeues their messages, writes every outcome and unregisters the
// worker. It may be called before Start, and more than once: a second call
// waits for the first to finish (or for its own ctx).
func (p *Pool) Stop(ctx context.Context) error {
	p.mu.Lock()
	switch p.state {
	case stateNew:
		p.state = stateStopped
		close(p.stopped)
		p.mu.Unlock()
		return nil
	case stateStopping, stateStopped:
		done := p.stopped
		p.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
		}
		return nil
	}
	p.state = stateStopping
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.state = stateStopped
		p.mu.Unlock()
		close(p.stopped)
	}()

	// When the caller's deadline passes, writes are tried once more and
	// no longer retried.
	stopAfter := context.AfterFunc(ctx, p.out.giveUp)
	defer stopAfter()

	p.exec.draining.Store(true)
	p.disp.stop() // it closed jobs: the workers end when it is empty
	release := p.exec.drain(ctx)
	defer release()

	p.out.stop()

	p.hb.stop()
	p.strays.stop()
	p.cancels.stop()
	p.exec.hardStop()

	if err := p.hb.unregister(ctx); err != nil {
		p.log.Error("could not unregister worker", "error", err)
		return fmt.Errorf("stop worker pool: unregister worker %s: %w", p.opts.WorkerID, err)
	}
	p.log.Info("worker pool stopped")
	return nil
}

// waitFor waits up to d for done; false if d or ctx ran out first.
func waitFor(ctx context.Context, done <-chan struct{}, d time.Duration) bool {
	select {
	case <-done:
		return true
	default:
	}
	if d <= 0 {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	case <-ctx.Done():
		return false
	}
}
