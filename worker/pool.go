package worker

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
)

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
)

// ErrStopped is returned by Start on a pool that was stopped.
var ErrStopped = errors.New("worker pool stopped")

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

// Defaults of Options.
const (
	DefaultConcurrency       = 8
	DefaultHeartbeatInterval = 5 * time.Second
	DefaultClaimIdleInterval = 100 * time.Millisecond
	DefaultDrainTimeout      = 30 * time.Second
	DefaultAbandonAfter      = 5 * time.Second
)

// Timings that are not options.
const (
	// brokerCallTimeout bounds one broker call, so a hung connection
	// cannot hold a goroutine forever.
	brokerCallTimeout = 30 * time.Second
	// flushTimeout bounds how long Stop keeps retrying outcome writes
	// against a failing broker once the handlers are done.
	flushTimeout = 10 * time.Second
	// lastTryTimeout bounds a write once the pool has given up retrying.
	lastTryTimeout = 2 * time.Second
	// lockErrorRetryDelay is the requeue delay when a lock could not be
	// taken because the broker failed.
	lockErrorRetryDelay = time.Second
	// unknownTaskRetry is the longest requeue delay of a message whose task
	// is not registered here yet (Options.UnknownTaskGrace).
	unknownTaskRetry = 5 * time.Second
	// elsewhereRetry is the requeue delay of a message whose task another
	// live worker runs and this one does not: short, as the message may
	// come back to a worker that does not run it a few times before one
	// that does claims it.
	elsewhereRetry = time.Second
	// elsewhereTTL is how long the pool keeps its view of which tasks other
	// live workers run.
	elsewhereTTL = 5 * time.Second
	// unknownWaitRetry is the requeue delay of a message whose task no
	// live worker runs, while Options.UnknownTaskWait lasts.
	unknownWaitRetry = 5 * time.Second
	// maxAckBatch bounds one broker.Ack call.
	maxAckBatch = 256
	// collectors is how many goroutines write outcomes the dispatcher does
	// not take (nacks, and acks once it has stopped), so one slow write
	// does not hold up the rest.
	collectors = 2
	// Broker errors are retried after 100ms, doubling up to 5s.
	retryMin = 100 * time.Millisecond
	retryMax = 5 * time.Second
)

// Options configure a Pool. Zero values mean the defaults.
type Options struct {
	// WorkerID names this worker in the broker; default
	// "<host>-<pid>-<random6>".
	WorkerID string
	// Host and PID describe the process; default os.Hostname and
	// os.Getpid.
	Host string
	PID  int
	// Roles default to [broker.RoleWorker].
	Roles []string
	// Topics to claim from, in addition to every registered task's topic.
	Topics []string
	// Concurrency is how many handlers run at once; default 8.
	Concurrency int
	// HeartbeatInterval is how often the worker's row is stamped;
	// default 5s.
	HeartbeatInterval time.Duration
	// ClaimIdleInterval is how long the dispatcher waits after a claim
	// that found nothing; Wake cuts it short. Default 100ms.
	ClaimIdleInterval time.Duration
	// DrainTimeout is how long Stop lets running handlers finish before
	// cancelling them; default 30s, negative means cancel at once.
	DrainTimeout time.Duration
	// AbandonAfter is how long Stop waits, after cancelling, for handlers
	// to return before requeueing their messages anyway; default 5s.
	AbandonAfter time.Duration
	// Logger defaults to a null logger.
	Logger hclog.Logger
	// Observer is told about every attempt; may be nil.
	Observer Observer
	// Reporter, if set, gets one report per attempt (task reports).
	Reporter Reporter
	// StrayCheckInterval is how often the pool looks for strays: messages
	// running in the broker under its worker id that it does not hold,
	// because their claim's answer was lost (see checkStrays). Default
	// 30s; negative turns the check off. The check assumes that this pool
	// is the only one claiming under its worker id.
	StrayCheckInterval time.Duration
	// StrayAfter is how long a running message the pool does not hold must
	// stay so before the pool requeues it; default 60s. Shorter than the
	// time a claim's answer may take (30s), it would requeue messages on
	// their way to the pool.
	StrayAfter time.Duration
	// Strays, if set, is told how many strays each check requeued.
	Strays func(n int)
	// UnknownTaskGrace: for this long after Start, a message of a task the
	// registry does not know is requeued (every few seconds, its attempt
	// given back) instead of failed, for tasks registered after Start
	// (tasks of other plugins, found by polling) to show up. Default 0:
	// such a message fails at once.
	UnknownTaskGrace time.Duration
	// UnknownTaskWait: a message of a task that no live worker runs (not
	// this one, not another) is requeued (its attempt given back, every
	// unknownWaitRetry) until the task has been so for this long, as this
	// pool saw it, and fails as unknown only then: the only host that runs
	// it may be restarting, or its provider plugin. Default 0: such a
	// message fails at once.
	UnknownTaskWait time.Duration
}

type poolState int

const (
	stateNew poolState = iota
	stateRunning
	stateStopping
	stateStopped
)

// Pool claims messages and runs them. Create it with NewPool, then Start
// and Stop it once each.
type Pool struct {
	b    broker.Broker
	reg  *Registry
	opts Options
	log  hclog.Logger
	obs  Observer
	mobs MessageObserver // obs, when it implements MessageObserver

	mu      sync.Mutex
	state   poolState
	topics  []string
	stopped chan struct{} // closed when the pool is fully stopped

	wake        chan struct{} // Wake: claim now
	slotFreed   chan struct{} // a worker finished a message
	written     chan struct{} // an outcome write returned: the broker may have a free slot
	acksReady   chan struct{} // a collector left acks to the dispatcher
	acks        ackQueue
	jobs        chan broker.Message
	completions chan *completion
	abandon     chan struct{} // closed: stop waiting on handlers

	claimCtx  context.Context // cancelled: stop claiming
	stopClaim context.CancelFunc
	runCtx    context.Context // parent of handler contexts; cancelled: hard stop
	cancelRun context.CancelFunc
	giveUpCtx context.Context // cancelled: stop retrying broker writes
	giveUp    context.CancelFunc
	hbCtx     context.Context
	stopHB    context.CancelFunc

	dispatcherDone chan struct{}
	collectorDone  chan struct{}
	heartbeatDone  chan struct{}
	strayDone      chan struct{}
	workers        sync.WaitGroup

	elseMu    sync.Mutex
	elseTasks map[taskTopic]bool // what live workers elsewhere run (see RunsElsewhere)
	elseAt    time.Time
	// unknown: since when this pool finds no live worker running a task
	// on a topic (see UnknownTaskWait).
	unknown map[taskTopic]sighting

	startedAt  time.Time // when Start ran
	startTasks []string  // the tasks Start registered the worker with

	heldMu sync.Mutex
	held   map[broker.Claim]struct{} // claimed, outcome not yet written (see hold)
	// ranLost: claims whose task ran but whose outcome could not be
	// written; the stray check requeues them keeping the attempt.
	ranLost map[broker.Claim]struct{}

	backMu sync.Mutex
	back   map[broker.Claim]time.Duration // claims to requeue without running, with their delay (see giveBack)

	beatMu  sync.Mutex
	beatAt  time.Time // when the heartbeat (or the registration) last went through
	beatErr error     // the latest heartbeat's error; nil when it went through

	inflight atomic.Int64 // claimed and not yet handed to the collector
	pending  atomic.Int64 // handed to the collector, outcome not yet written
	running  atomic.Int64 // handlers running
	draining atomic.Bool
}

// NewPool returns a pool that runs reg's tasks from b. Nothing happens
// until Start.
func NewPool(b broker.Broker, reg *Registry, opts Options) *Pool {
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if opts.Host == "" {
		opts.Host, _ = os.Hostname()
		if opts.Host == "" {
			opts.Host = "unknown"
		}
	}
	if opts.PID == 0 {
		opts.PID = os.Getpid()
	}
	if opts.WorkerID == "" {
		opts.WorkerID = fmt.Sprintf("%s-%d-%s", opts.Host, opts.PID, randomSuffix())
	}
	if len(opts.Roles) == 0 {
		opts.Roles = []string{broker.RoleWorker}
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = DefaultConcurrency
	}
	if opts.HeartbeatInterval <= 0 {
		opts.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if opts.ClaimIdleInterval <= 0 {
		opts.ClaimIdleInterval = DefaultClaimIdleInterval
	}
	switch {
	case opts.DrainTimeout == 0:
		opts.DrainTimeout = DefaultDrainTimeout
	case opts.DrainTimeout < 0:
		opts.DrainTimeout = 0
	}
	if opts.AbandonAfter <= 0 {
		opts.AbandonAfter = DefaultAbandonAfter
	}
	if opts.StrayCheckInterval == 0 {
		opts.StrayCheckInterval = DefaultStrayCheckInterval
	}
	if opts.StrayAfter <= 0 {
		opts.StrayAfter = DefaultStrayAfter
	}
	obs := opts.Observer
	if obs == nil {
		obs = nopObserver{}
	}
	mobs, _ := obs.(MessageObserver)
	return &Pool{
		b:       b,
		reg:     reg,
		opts:    opts,
		log:     opts.Logger.With("worker_id", opts.WorkerID),
		obs:     obs,
		mobs:    mobs,
		stopped: make(chan struct{}),
		wake:    make(chan struct{}, 1),
	}
}

// randomSuffix returns 6 random hex digits.
func randomSuffix() string {
	var b [3]byte
	_, _ = crand.Read(b[:]) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b[:])
}

// WorkerID is the id this pool registers under.
func (p *Pool) WorkerID() string { return p.opts.WorkerID }

// Concurrency is the number of handlers that may run at once.
func (p *Pool) Concurrency() int { return p.opts.Concurrency }

// Topics lists the topics the pool claims from (known after Start).
func (p *Pool) Topics() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.topics...)
}

// Running is the number of handlers running now.
func (p *Pool) Running() int { return int(p.running.Load()) }

// Wake makes the dispatcher claim at once instead of waiting out its idle
// interval; call it after submitting a message locally. It never blocks.
func (p *Pool) Wake() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

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

	topics := map[string]bool{}
	for _, t := range p.reg.Topics() {
		topics[t] = true
	}
	for _, t := range p.opts.Topics {
		if err := broker.ValidateTopicName(t); err != nil {
			return fmt.Errorf("start worker pool: topic %q: %w", t, err)
		}
		topics[t] = true
	}
	if len(topics) == 0 {
		return errors.New("start worker pool: no topic to claim from: register a task or list topics in Options.Topics")
	}
	p.topics = sortedKeys(topics)

	info := p.info()
	if err := p.b.RegisterWorker(ctx, info); err != nil {
		return fmt.Errorf("start worker pool: register worker %s: %w", p.opts.WorkerID, err)
	}
	p.startTasks = info.Tasks
	p.beaten(nil)

	n := p.opts.Concurrency
	p.slotFreed = make(chan struct{}, 1)
	p.written = make(chan struct{}, 1)
	p.acksReady = make(chan struct{}, 1)
	p.acks = ackQueue{open: true}
	p.jobs = make(chan broker.Message, n)
	p.completions = make(chan *completion, 2*n)
	p.abandon = make(chan struct{})
	p.claimCtx, p.stopClaim = context.WithCancel(context.Background())
	p.runCtx, p.cancelRun = context.WithCancel(context.Background())
	p.giveUpCtx, p.giveUp = context.WithCancel(context.Background())
	p.hbCtx, p.stopHB = context.WithCancel(context.Background())
	p.dispatcherDone = make(chan struct{})
	p.collectorDone = make(chan struct{})
	p.heartbeatDone = make(chan struct{})
	p.strayDone = make(chan struct{})
	p.startedAt = time.Now()
	p.held = make(map[broker.Claim]struct{}, 2*n)
	p.ranLost = make(map[broker.Claim]struct{})

	go p.heartbeat()
	go p.checkStrays()
	var collecting sync.WaitGroup
	for range collectors {
		collecting.Go(p.collect)
	}
	go func() {
		collecting.Wait()
		close(p.collectorDone)
	}()
	p.workers.Add(n)
	for range n {
		go p.work()
	}
	go p.dispatch()
	p.state = stateRunning
	p.log.Info("worker pool started", "topics", p.topics, "concurrency", n)
	return nil
}

func (p *Pool) info() broker.WorkerInfo {
	return broker.WorkerInfo{
		ID:       p.opts.WorkerID,
		Host:     p.opts.Host,
		PID:      p.opts.PID,
		Roles:    append([]string(nil), p.opts.Roles...),
		Topics:   append([]string(nil), p.topics...),
		Capacity: p.opts.Concurrency,
		Tasks:    p.reg.Names(),
	}
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
	stopAfter := context.AfterFunc(ctx, p.giveUp)
	defer stopAfter()

	p.draining.Store(true)
	p.stopClaim()
	<-p.dispatcherDone // it closed jobs: the workers end when it is empty

	workersDone := make(chan struct{})
	go func() {
		p.workers.Wait()
		close(workersDone)
	}()
	// With a deadline, keep part of it for requeueing, flushing and
	// unregistering: a drain that used all of it would have the caller
	// kill the process before the messages are handed back.
	drain, grace := p.opts.DrainTimeout, p.opts.AbandonAfter
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		reserve := min(max(left/10, 50*time.Millisecond), 2*time.Second)
		drain = min(drain, left-reserve)
		grace = min(grace, max(reserve/2, 20*time.Millisecond))
	}
	if !waitFor(ctx, workersDone, drain) {
		p.log.Warn("drain time is up: cancelling running tasks and requeueing their messages",
			"running", p.running.Load(), "drained_for", drain.String())
		p.cancelRun()
		if !waitFor(context.Background(), workersDone, grace) {
			p.log.Error("tasks ignored cancellation: requeueing their messages; their goroutines run on until they return",
				"running", p.running.Load())
			close(p.abandon)
			// The workers may be blocked handing outcomes to a collector
			// that retries a dead broker: bound that too.
			t := time.AfterFunc(flushTimeout, p.giveUp)
			defer t.Stop()
			<-workersDone
		}
	}

	close(p.completions)
	t := time.AfterFunc(flushTimeout, p.giveUp)
	defer t.Stop()
	<-p.collectorDone

	p.stopHB()
	<-p.heartbeatDone
	<-p.strayDone
	p.cancelRun()
	p.giveUp()

	unregister := brokerCallTimeout
	if dl, ok := ctx.Deadline(); ok {
		unregister = min(unregister, max(time.Until(dl), lastTryTimeout))
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unregister)
	defer cancel()
	if err := p.b.UnregisterWorker(uctx, p.opts.WorkerID); err != nil && !errors.Is(err, broker.ErrNotFound) {
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

// dispatch claims messages while there are free slots and hands them to
// the workers, and writes the acks the collectors leave it with its
// claims. It closes jobs when it returns.
//
// A claim asks for as many messages as there are idle handlers, but the
// pool holds at most 2*Concurrency messages claimed and not yet written
// back (running in the broker), so slow outcome writes slow claiming down.
//
// A topic's concurrency limit counts a message as running until its
// outcome is written. The acks therefore go with the next claim, written
// before it (in one transaction when the broker is a broker.AckClaimer),
// so the claim sees the slots they free; a finishing handler frees a slot
// and so starts that claim at once. When a claim comes back short while
// this pool's outcomes are still being written, the next one goes out as
// soon as one of those writes returns rather than after the idle interval.
func (p *Pool) dispatch() {
	defer close(p.dispatcherDone)
	defer close(p.jobs)
	defer p.closeAcks()
	bo := retryBackoff()
	idle := time.NewTimer(0)
	<-idle.C
	n := p.opts.Concurrency
	// A suspect (see suspect) waits in held until it can run alone; alone
	// is set while it runs. Nothing is claimed while one is held or runs.
	var (
		held      *broker.Message
		heldSince time.Time
		alone     bool
	)
	hold := time.NewTimer(0)
	<-hold.C
	defer hold.Stop()
	defer func() {
		// Stopping: the workers requeue what was claimed and not run.
		if held != nil {
			p.inflight.Add(1)
			p.jobs <- *held
		}
	}()
	for p.claimCtx.Err() == nil {
		acks := p.takeAcks()
		inflight := int(p.inflight.Load())
		if alone && inflight == 0 {
			alone = false
		}
		if held != nil && inflight > 0 && time.Since(heldSince) >= suspectHoldMax {
			// The pool stayed busy (long tasks): rather than claim
			// nothing for as long, give the suspect back for a while,
			// for an idle worker, or for this one later.
			p.log.Info("giving back a message whose last worker died running it: this worker stays busy and would claim nothing until it is idle",
				"message_id", held.ID, "task", held.Task, "retry_in", suspectHoldMax.String())
			p.giveBackAfter(held.ClaimOf(), suspectHoldMax)
			p.inflight.Add(1)
			p.jobs <- *held
			held = nil
			inflight++
		}
		if !alone && held != nil && inflight == 0 {
			p.log.Info("running a message whose last worker died while running it on its own, so that if it kills this process too, nothing else is lost with it",
				"message_id", held.ID, "task", held.Task)
			p.inflight.Add(1)
			p.jobs <- *held
			held = nil
			alone, inflight = true, 1
		}
		free := min(n-inflight, 2*n-inflight-(int(p.pending.Load())-len(acks)))
		if alone || held != nil {
			free = 0
		}
		if free <= 0 && len(acks) == 0 {
			var holdOver <-chan time.Time
			if held != nil {
				hold.Reset(max(time.Until(heldSince.Add(suspectHoldMax)), 0))
				holdOver = hold.C
			}
			select {
			case <-p.slotFreed:
			case <-p.written:
			case <-p.acksReady:
			case <-holdOver:
			case <-p.claimCtx.Done():
			}
			continue
		}
		free = max(free, 0)
		if free > 0 {
			// A write that returns from here on may free a slot this claim
			// does not see: it signals afresh.
			select {
			case <-p.written:
			default:
			}
		}
		msgs, err := p.exchange(acks, free)
		// Whatever was claimed is ours to finish, even if we are stopping:
		// the workers requeue it.
		p.hold(msgs)
		for _, m := range msgs {
			if n > 1 && suspect(m) && p.runs(m.Task) {
				if held == nil {
					held, heldSince = &m, time.Now()
					continue
				}
				// One suspect is held at a time: held, the others
				// would die with it if it is the poison. They go back
				// at once (see handle), for any worker to take.
				p.giveBack(m.ClaimOf())
			}
			p.inflight.Add(1)
			p.jobs <- m
		}
		if err != nil {
			if p.claimCtx.Err() != nil {
				return
			}
			d := bo.next()
			p.log.Warn("claim failed; retrying", "error", err, "retry_in", d.String())
			idle.Reset(d)
			select {
			case <-idle.C:
			case <-p.claimCtx.Done():
				idle.Stop()
			}
			continue
		}
		bo.reset()
		if held != nil || free == 0 || len(msgs) == free {
			continue
		}
		// Short: the queues ran dry, or a concurrency limit binds. Our own
		// messages free the limit's slots as their outcomes are written.
		var written <-chan struct{}
		if p.inflight.Load()+p.pending.Load() > 0 {
			written = p.written
		}
		idle.Reset(p.opts.ClaimIdleInterval)
		select {
		case <-idle.C:
		case <-written:
			idle.Stop()
		case <-p.acksReady:
			idle.Stop()
		case <-p.wake:
			idle.Stop()
		case <-p.claimCtx.Done():
			idle.Stop()
		}
	}
}

// giveBack marks a claim that handle requeues at once without running it.
func (p *Pool) giveBack(c broker.Claim) { p.giveBackAfter(c, 0) }

// giveBackAfter is giveBack, the message available again after d.
func (p *Pool) giveBackAfter(c broker.Claim, d time.Duration) {
	p.backMu.Lock()
	defer p.backMu.Unlock()
	if p.back == nil {
		p.back = map[broker.Claim]time.Duration{}
	}
	p.back[c] = d
}

// takeBack reports whether c was marked by giveBack, with its delay, and
// unmarks it.
func (p *Pool) takeBack(c broker.Claim) (time.Duration, bool) {
	p.backMu.Lock()
	defer p.backMu.Unlock()
	d, ok := p.back[c]
	delete(p.back, c)
	return d, ok
}

// runs reports whether this pool has task registered. A suspect of a task
// it does not run is not held: handle requeues it (still marked) for a
// worker that runs it, which isolates it.
func (p *Pool) runs(task string) bool {
	_, ok := p.reg.Lookup(task)
	return ok
}

// suspect reports whether m's last claim ended with its worker dead (the
// reaper requeued it as an orphan). Such a message may be what killed that
// worker's process: the pool runs it alone, so that if it kills this one
// too, the messages running beside it are not orphaned with it, again and
// again until orphan_max_attempts dead-letters them with the poison.
func suspect(m broker.Message) bool {
	return strings.HasPrefix(m.LastError, broker.OrphanedErrorPrefix)
}

// exchange writes acks and claims up to max messages (none when max is 0)
// in one broker call when the broker is a broker.AckClaimer, else in an
// Ack and a Claim. The acks are finished (reported) once written; when they
// could not be written for a reason that may pass, they go back to the
// queue for the next call.
func (p *Pool) exchange(acks []*completion, max int) ([]broker.Message, error) {
	ctx, cancel := context.WithTimeout(p.claimCtx, brokerCallTimeout)
	defer cancel()
	req := broker.ClaimRequest{WorkerID: p.opts.WorkerID, Topics: p.topics, Max: max}
	if len(acks) == 0 {
		return p.b.Claim(ctx, req)
	}
	outcomes := make([]broker.Outcome, len(acks))
	for i, c := range acks {
		outcomes[i] = broker.Outcome{Claim: c.claim, Result: c.result}
	}
	var (
		errs []error
		msgs []broker.Message
		err  error
	)
	ac, both := p.b.(broker.AckClaimer)
	if both && max > 0 {
		errs, msgs, err = ac.AckAndClaim(ctx, outcomes, req)
	} else {
		errs, err = p.b.Ack(ctx, outcomes)
	}
	if err != nil && !permanent(err) {
		// The call may have committed all the same: when the acks come
		// back refused as stale, acked checks whether they went through.
		for _, c := range acks {
			c.resent = true
		}
		p.requeueAcks(acks)
		return nil, err
	}
	if errors.Is(err, broker.ErrInvalid) {
		// The broker refused an outcome, and the whole call with it:
		// write them one by one, so that only that one fails (acked).
		if len(acks) > 1 {
			p.log.Warn("the broker refused a batch of outcomes; writing them one by one", "error", err)
			for _, c := range acks {
				p.ackAll([]*completion{c})
			}
		} else {
			p.acked(acks, nil, err)
		}
		p.finish(acks, false)
		if max == 0 {
			return nil, nil
		}
		cctx, ccancel := context.WithTimeout(p.claimCtx, brokerCallTimeout)
		defer ccancel()
		return p.b.Claim(cctx, req)
	}
	p.acked(acks, errs, err)
	p.finish(acks, false)
	if err != nil || both || max == 0 {
		return msgs, err
	}
	return p.b.Claim(ctx, req)
}

// ackQueue holds the acks the collectors leave to the dispatcher.
type ackQueue struct {
	mu    sync.Mutex
	items []*completion
	open  bool // the dispatcher runs and takes acks
}

// leaveAcks gives acks to the dispatcher; false when it has stopped (the
// caller writes them).
func (p *Pool) leaveAcks(acks []*completion) bool {
	p.acks.mu.Lock()
	if !p.acks.open {
		p.acks.mu.Unlock()
		return false
	}
	p.acks.items = append(p.acks.items, acks...)
	p.acks.mu.Unlock()
	select {
	case p.acksReady <- struct{}{}:
	default:
	}
	return true
}

func (p *Pool) takeAcks() []*completion {
	p.acks.mu.Lock()
	defer p.acks.mu.Unlock()
	acks := p.acks.items
	p.acks.items = nil
	return acks
}

func (p *Pool) requeueAcks(acks []*completion) {
	p.acks.mu.Lock()
	p.acks.items = append(acks, p.acks.items...)
	p.acks.mu.Unlock()
}

// closeAcks stops the queue, as the dispatcher ends, and writes what is
// left in it; from then on the collectors write their acks themselves.
func (p *Pool) closeAcks() {
	p.acks.mu.Lock()
	p.acks.open = false
	acks := p.acks.items
	p.acks.items = nil
	p.acks.mu.Unlock()
	if len(acks) > 0 {
		// Stop waits for this before its own bounds start: bound it here,
		// or a broker that does not answer would hold Stop for ever.
		stop, cancel := context.WithTimeout(p.giveUpCtx, flushTimeout)
		defer cancel()
		p.ackAllUntil(stop, acks)
		p.finish(acks, true)
	}
}

// work runs messages until jobs is closed and empty.
func (p *Pool) work() {
	defer p.workers.Done()
	for m := range p.jobs {
		c := p.handle(m)
		p.pending.Add(1)
		p.completions <- c
		p.inflight.Add(-1)
		select {
		case p.slotFreed <- struct{}{}:
		default:
		}
	}
}

// completion is the outcome of one attempt, for the collector to write.
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
	notRan  bool // with requeue: the task never ran (NackRequest.NotRun)
	resent  bool // ack: written again after a call whose answer was lost
	delay   time.Duration
	errText string
	started time.Time
	dur     time.Duration
	// For the attempt's report: the message as claimed, the handler's
	// context (nil when the handler never ran) and whether it timed out.
	msg      broker.Message
	tc       *TaskContext
	timedOut bool
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

// handle runs one message and says how it ended.
func (p *Pool) handle(m broker.Message) (out *completion) {
	p.obs.TaskStarted(m.Topic)
	c := &completion{claim: m.ClaimOf(), topic: m.Topic, task: m.Task, started: time.Now(), msg: m}
	log := &msgLogger{base: p.log, m: &c.msg}
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

	// Only suspects are given back (see dispatch): the others skip the lock.
	if suspect(m) {
		if d, ok := p.takeBack(c.claim); ok {
			return c.notRun(d, "this worker runs another such message alone, or stays busy; requeued for a worker that can run it alone", StatusDeferred)
		}
	}
	if p.draining.Load() {
		return c.notRun(0, "worker stopped", StatusStopped)
	}
	t, ok := p.reg.Lookup(m.Task)
	if !ok {
		if wait := p.opts.UnknownTaskGrace - time.Since(p.startedAt); wait > 0 {
			wait = min(wait, unknownTaskRetry)
			log.Info("claimed a message of a task not registered yet; requeueing it", "retry_in", wait.String())
			return c.notRun(wait, fmt.Sprintf("task %q is not registered in worker %s yet (it started moments ago); requeued", m.Task, p.opts.WorkerID)+p.carriedWait(m), StatusDeferred)
		}
		runs, err := p.RunsElsewhere(m.Task, m.Topic)
		if err != nil {
			// Failing it over a passing error would lose it.
			return c.notRun(elsewhereRetry, fmt.Sprintf("task %q is not registered in worker %s, and which tasks other workers run could not be read (%v); requeued", m.Task, p.opts.WorkerID, err)+p.carriedWait(m), StatusDeferred)
		}
		if runs {
			p.knownAgain(m.Task, m.Topic)
			log.Info("claimed a message of a task this worker does not run but another live worker does; requeueing it for that one",
				"retry_in", elsewhereRetry.String())
			return c.notRun(elsewhereRetry, fmt.Sprintf("task %q is not registered in worker %s; another live worker runs it; requeued", m.Task, p.opts.WorkerID), StatusDeferred)
		}
		if since, wait, first := p.unknownWait(m.Task, m.Topic, unknownSinceOf(m)); wait > 0 {
			if first {
				log.Warn("no live worker runs this task: its messages wait for one (the host or plugin that runs it may be restarting) and fail as unknown if none comes",
					"wait", p.opts.UnknownTaskWait.String())
			}
			return c.notRun(min(wait, unknownWaitRetry), p.waitNote(m, since), StatusDeferred)
		}
		log.Warn("claimed a message of an unknown task; ending it")
		return c.fail(fmt.Sprintf("unknown task %q: no task of that name is registered in worker %s", m.Task, p.opts.WorkerID), false, 0)
	}
	maxAttempts := m.MaxAttempts
	if maxAttempts <= 0 {
		maxAttempts = t.MaxAttempts
	}
	attempt := max(m.Attempts, 1)

	if name := t.lockName(m.Payload); name != "" {
		lctx, cancel := context.WithTimeout(p.runCtx, brokerCallTimeout)
		got, err := p.b.AcquireLock(lctx, name, p.opts.WorkerID, c.claim)
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
	}

	tc := &TaskContext{
		Payload: m.Payload, MessageID: m.ID, Task: m.Task, Topic: m.Topic,
		Attempt: attempt, MaxAttempts: maxAttempts,
		onLog: func(line string) { log.Debug("task log", "line", line) },
	}
	res, abandoned, timedOut := p.run(t, tc, log)
	c.dur = time.Since(c.started)
	c.tc, c.timedOut = tc, timedOut

	switch {
	case abandoned:
		return c.requeueNow("worker stopped (the task ignored cancellation)", StatusStopped)
	case res.err == nil:
		body, err := marshalResult(res.value)
		if err == nil {
			c.ack, c.result, c.status = true, body, StatusDone
			return c
		}
		res.err = fmt.Errorf("the task's result cannot be stored: %w", err)
	case p.runCtx.Err() != nil:
		// Hard stop: the failure is most likely the cancellation itself.
		// The worker's stop cut the attempt short, not the task: it gives
		// the attempt back, so a deploy does not use up a message's
		// max_attempts (nor show more attempts than it allows).
		return c.notRun(0, "worker stopped before the task finished; requeued", StatusStopped)
	}

	msg := res.err.Error()
	if timedOut {
		msg = fmt.Sprintf("timed out after %s: %s", t.Timeout, msg)
	}
	if msg == "" {
		msg = "task failed"
	}
	if attempt < maxAttempts {
		d := t.retryDelay(attempt, res.err)
		log.Warn("task failed; retrying", "error", msg, "max_attempts", maxAttempts, "retry_in", d.String())
		return c.fail(msg, true, d)
	}
	log.Warn("task failed for good", "error", msg, "max_attempts", maxAttempts)
	return c.fail(msg, false, 0)
}

// run calls the handler in its own goroutine, so a handler that ignores
// cancellation can be abandoned, and turns a panic into an error.
func (p *Pool) run(t Task, tc *TaskContext, log *msgLogger) (res handlerResult, abandoned, timedOut bool) {
	var (
		ctx    context.Context
		cancel context.CancelFunc
	)
	if t.Timeout > 0 {
		ctx, cancel = context.WithTimeout(p.runCtx, t.Timeout)
	} else {
		ctx, cancel = context.WithCancel(p.runCtx)
	}
	defer cancel()
	p.running.Add(1)
	defer p.running.Add(-1)

	done := make(chan handlerResult, 1) // buffered: an abandoned handler never blocks
	go func() {
		defer func() {
			if r := recover(); r != nil {
				log.Error("task panicked", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
				done <- handlerResult{err: fmt.Errorf("panic: %v", r)}
			}
		}()
		v, err := t.Handler(ctx, tc)
		done <- handlerResult{value: v, err: err}
	}()
	select {
	case res = <-done:
	case <-p.abandon:
		return handlerResult{}, true, false
	}
	timedOut = res.err != nil && t.Timeout > 0 && errors.Is(ctx.Err(), context.DeadlineExceeded) && p.runCtx.Err() == nil
	return res, false, timedOut
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

func (c *completion) requeueNow(reason, status string) *completion {
	return c.requeueAfter(0, reason, status)
}

// RunsElsewhere reports whether a live worker other than this one has
// registered task and claims from topic, so that a message of it that this
// worker does not know waits for that one instead of failing as unknown
// (several hosts on one broker need not run the same plugins), or the
// error reading the broker's worker list. A worker that runs the task but
// does not claim the topic would never take the message: that does not
// count. Live is a heartbeat within three heartbeat intervals (at least
// 15s), by the broker's clock; every registered worker counts when the
// broker cannot tell (memory). The answer is kept for a few seconds.
func (p *Pool) RunsElsewhere(task, topic string) (bool, error) {
	p.elseMu.Lock()
	defer p.elseMu.Unlock()
	if p.elseTasks == nil || time.Since(p.elseAt) >= elsewhereTTL {
		tasks, err := p.tasksElsewhere()
		if err != nil {
			p.log.Warn("could not read which tasks other workers run", "task", task, "error", err)
			return false, err
		}
		p.elseTasks, p.elseAt = tasks, time.Now()
	}
	return p.elseTasks[taskTopic{task, topic}], nil
}

// suspectHoldMax bounds how long a pool holds a suspect (see suspect)
// waiting for what it runs to finish, claiming nothing meanwhile; then the
// suspect goes back to the queue for as long. A variable for tests.
var suspectHoldMax = 30 * time.Second

// sighting is when the pool first and last found no live worker running
// a task on a topic.
type sighting struct{ first, last time.Time }

// sightingGap: a task last found unknown longer ago than this was run
// meanwhile, as far as this pool can tell (while none runs it, its
// messages come back every unknownWaitRetry, to this worker or another):
// the wait starts afresh.
const sightingGap = 2 * time.Minute

// unknownWait returns since when no live worker runs task on topic, and
// how much longer its messages wait for one (Options.UnknownTaskWait),
// and whether this starts the wait. carried is the time a message says
// the wait began (see unknownSinceOf; zero for none): the wait outlives
// this process's restarts and counts what other workers saw.
func (p *Pool) unknownWait(task, topic string, carried time.Time) (time.Time, time.Duration, bool) {
	if p.opts.UnknownTaskWait <= 0 {
		return time.Time{}, 0, false
	}
	p.elseMu.Lock()
	defer p.elseMu.Unlock()
	key, now := taskTopic{task, topic}, time.Now()
	s, seen := p.unknown[key]
	if !seen || now.Sub(s.last) > sightingGap {
		if p.unknown == nil {
			p.unknown = map[taskTopic]sighting{}
		}
		s, seen = sighting{first: now}, false
	}
	if !carried.IsZero() && carried.Before(s.first) && now.Sub(carried) < p.opts.UnknownTaskWait+sightingGap {
		s.first = carried
	}
	s.last = now
	p.unknown[key] = s
	return s.first, p.opts.UnknownTaskWait - now.Sub(s.first), !seen
}

// unknownSince finds the start of the wait in the last error of a message
// that waited for a worker already (see handle).
var unknownSince = regexp.MustCompile(`no live worker runs task .* since (\S+); requeued to wait`)

// waitNote is the error of a message requeued to wait for a worker that
// runs its task, since since; unknownSince reads since back from it.
func (p *Pool) waitNote(m broker.Message, since time.Time) string {
	return fmt.Sprintf("no live worker runs task %q on topic %q since %s; requeued to wait up to %s for one",
		m.Task, m.Topic, since.UTC().Format(time.RFC3339), p.opts.UnknownTaskWait)
}

// carriedWait keeps, in the error of a message requeued for another
// reason before its wait is decided (this worker's start-up grace, a
// worker list that could not be read), when its wait for a worker that
// runs its task began: "" when it was not waiting.
func (p *Pool) carriedWait(m broker.Message) string {
	since := unknownSinceOf(m)
	if since.IsZero() {
		return ""
	}
	return "; before that, " + p.waitNote(m, since)
}

// unknownSinceOf returns when m's wait for a worker that runs its task
// began, as its last error says; zero when it does not say.
func unknownSinceOf(m broker.Message) time.Time {
	sub := unknownSince.FindStringSubmatch(m.LastError)
	if sub == nil {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339, sub[1])
	if err != nil {
		return time.Time{}
	}
	return t
}

// knownAgain notes that a live worker runs task on topic (again).
func (p *Pool) knownAgain(task, topic string) {
	p.elseMu.Lock()
	delete(p.unknown, taskTopic{task, topic})
	p.elseMu.Unlock()
}

// taskTopic is a task a worker runs and a topic it claims from.
type taskTopic struct{ task, topic string }

func (p *Pool) tasksElsewhere() (map[taskTopic]bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), brokerCallTimeout)
	defer cancel()
	ws, err := p.b.Workers(ctx)
	if err != nil {
		return nil, err
	}
	var live []string
	r, canTell := p.b.(broker.OrphanReclaimer)
	if canTell {
		if live, err = r.LiveWorkers(ctx, max(3*p.opts.HeartbeatInterval, 15*time.Second)); err != nil {
			return nil, err
		}
	}
	tasks := map[taskTopic]bool{}
	for _, w := range ws {
		if w.ID == p.opts.WorkerID || (canTell && !slices.Contains(live, w.ID)) {
			continue
		}
		for _, t := range w.Tasks {
			for _, topic := range w.Topics {
				tasks[taskTopic{t, topic}] = true
			}
		}
	}
	return tasks, nil
}

// notRun requeues a message whose task never ran, giving its attempt back
// (broker.NackRequest.NotRun).
func (c *completion) notRun(d time.Duration, reason, status string) *completion {
	c.notRan = true
	if suspect(c.msg) {
		// It did not run here: it stays a suspect (see suspect).
		reason = broker.OrphanedErrorPrefix + " its last worker died running it; requeued without running: " + reason
	}
	return c.requeueAfter(d, reason, status)
}

func (c *completion) requeueAfter(d time.Duration, reason, status string) *completion {
	c.requeue, c.delay, c.errText, c.status = true, min(max(d, 0), broker.MaxDelay), reason, status
	return c
}

func (c *completion) fail(reason string, requeue bool, d time.Duration) *completion {
	c.requeue, c.delay, c.errText, c.status = requeue, min(max(d, 0), broker.MaxDelay), reason, StatusFailed
	return c
}

// collect writes outcomes: every ack that is pending when it looks goes in
// one broker.Ack call; it never waits for more to come. Several collectors
// run, so one batch gathers while another is written.
func (p *Pool) collect() {
	for c := range p.completions {
		batch := []*completion{c}
	more:
		for len(batch) < maxAckBatch {
			select {
			case c, ok := <-p.completions:
				if !ok {
					break more
				}
				batch = append(batch, c)
			default:
				break more
			}
		}
		p.flush(batch)
	}
}

// flush writes a batch of outcomes: nacks one by one, acks in one call,
// or, while the dispatcher runs, by handing them to it for its next claim.
func (p *Pool) flush(batch []*completion) {
	var acks, rest []*completion
	for _, c := range batch {
		switch {
		case c.lost:
		case c.ack:
			acks = append(acks, c)
			continue
		default:
			p.nack(c)
		}
		rest = append(rest, c)
	}
	if len(acks) > 0 && !p.leaveAcks(acks) {
		p.ackAll(acks)
		rest = append(rest, acks...)
	}
	if len(rest) > 0 {
		p.finish(rest, true)
	}
}

// finish reports attempts whose outcomes were written (or given up on).
// signal tells the dispatcher: a write it did not see returned.
func (p *Pool) finish(batch []*completion, signal bool) {
	p.unhold(batch)
	p.pending.Add(-int64(len(batch)))
	if signal {
		select {
		case p.written <- struct{}{}:
		default:
		}
	}
	for _, c := range batch {
		p.obs.TaskFinished(c.topic, c.task, c.status, c.dur)
		if p.mobs != nil {
			p.mobs.MessageFinished(c.claim.ID, c.topic, c.task, c.status)
		}
		if p.opts.Reporter != nil {
			if r, ok := p.report(c); ok {
				p.opts.Reporter.Report(r)
			}
		}
	}
}

// Reporter receives one report per attempt whose handler ran (or whose
// claim was lost), after the attempt's outcome was written. Report is
// called from the pool's goroutines and must not block.
type Reporter interface {
	Report(broker.Report)
}

// report builds the attempt's report; false when there is nothing to
// report (the handler never ran: lock deferred, stopped before start).
func (p *Pool) report(c *completion) (broker.Report, bool) {
	r := broker.Report{
		MessageID: c.msg.ID, Task: c.task, Topic: c.topic, Schedule: c.msg.Headers["schedule"],
		Attempt: max(c.msg.Attempts, 1), Worker: p.opts.WorkerID,
		StartedAt: c.started, EndedAt: c.started.Add(c.dur), Duration: c.dur.Seconds(),
		Error: c.errText,
	}
	switch {
	case c.status == StatusLost:
		r.Status = broker.ReportLost
		if r.Error == "" {
			r.Error = "claim lost: the message was reclaimed from this worker; its outcome was discarded"
		}
	case c.status == StatusSkipped:
		r.Status, r.Result = broker.ReportSkipped, c.result
	case c.tc == nil:
		if c.status != StatusFailed {
			return broker.Report{}, false
		}
		r.Status = broker.ReportError // unknown task
	case c.status == StatusDone:
		r.Status, r.Result = broker.ReportSuccess, c.result
	case c.status == StatusStopped:
		r.Status = broker.ReportCancelled
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

// ackAll writes acks in one Ack call, retrying as retry does.
func (p *Pool) ackAll(acks []*completion) {
	p.ackAllUntil(p.giveUpCtx, acks)
}

// ackAllUntil is ackAll, giving up when stop is done too.
func (p *Pool) ackAllUntil(stop context.Context, acks []*completion) {
	outcomes := make([]broker.Outcome, len(acks))
	for i, c := range acks {
		outcomes[i] = broker.Outcome{Claim: c.claim, Result: c.result}
	}
	var errs []error
	tries := 0
	err := p.retryUntil(stop, "ack", func(ctx context.Context) error {
		if tries++; tries == 2 { // the first call may have committed
			for _, c := range acks {
				c.resent = true
			}
		}
		var err error
		errs, err = p.b.Ack(ctx, outcomes)
		return err
	})
	p.acked(acks, errs, err)
}

// acked records the answer of an Ack: err for all, or errs one by one.
func (p *Pool) acked(acks []*completion, errs []error, err error) {
	for i := range acks {
		e := err
		if e == nil && i < len(errs) {
			e = errs[i]
		}
		if e != nil && acks[i].resent && errors.Is(e, broker.ErrClaimLost) && p.ackedEarlier(acks[i]) {
			continue
		}
		if errors.Is(e, broker.ErrInvalid) {
			p.refuseResult(acks[i], e)
			continue
		}
		if e != nil {
			p.lose(acks[i], "ack", e)
		}
	}
}

// refuseResult ends c failed, for good, when the broker refused its
// result (a value out of the store's range, say, that CheckJSON cannot
// see): left running, the message would be taken back and run again for
// ever.
func (p *Pool) refuseResult(c *completion, err error) {
	p.log.Warn("the broker refused a task's result; the attempt fails", "message_id", c.claim.ID, "task", c.task, "error", err)
	c.ack, c.result = false, nil
	c.fail(fmt.Sprintf("the task's result cannot be stored: %v", err), false, 0)
	p.nack(c)
}

// ackedEarlier reports whether c's message is done under c's own claim:
// an earlier write of the ack, whose answer was lost, committed after all,
// so the attempt is done rather than lost. A done message keeps who
// claimed it and when, and a claim of the same message by anyone since,
// this worker included, would show another claim time.
func (p *Pool) ackedEarlier(c *completion) bool {
	ctx, cancel := context.WithTimeout(context.Background(), brokerCallTimeout)
	defer cancel()
	m, err := p.b.GetMessage(ctx, c.claim.ID)
	return err == nil && m.State == broker.StateDone && m.ClaimedBy == p.opts.WorkerID &&
		m.ClaimedAt != nil && c.msg.ClaimedAt != nil && m.ClaimedAt.Equal(*c.msg.ClaimedAt)
}

func (p *Pool) nack(c *completion) {
	req := broker.NackRequest{Claim: c.claim, Requeue: c.requeue, Delay: c.delay, Error: c.errText, NotRun: c.notRan}
	if err := p.retry("nack", func(ctx context.Context) error { return p.b.Nack(ctx, req) }); err != nil {
		p.lose(c, "nack", err)
	}
}

// lose records that an attempt's outcome was not written.
func (p *Pool) lose(c *completion, op string, err error) {
	c.status = StatusLost
	if errors.Is(err, broker.ErrClaimLost) {
		p.log.Warn("claim lost: the message was taken back from this worker; its outcome is discarded",
			"op", op, "message_id", c.claim.ID, "task", c.task, "topic", c.topic)
		return
	}
	if !c.notRan {
		// It ran: when the stray check takes the message back, the
		// attempt stays counted.
		p.heldMu.Lock()
		p.ranLost[c.claim] = struct{}{}
		p.heldMu.Unlock()
	}
	p.log.Error("could not record a task's outcome; the message stays running until it is reclaimed",
		"op", op, "message_id", c.claim.ID, "task", c.task, "topic", c.topic, "error", err)
}

// retry calls f until it succeeds, fails for good (claim lost, not found,
// invalid, broker closed) or the pool gives up. It backs off between tries.
func (p *Pool) retry(op string, f func(ctx context.Context) error) error {
	return p.retryUntil(p.giveUpCtx, op, f)
}

// retryUntil is retry, giving up when stop is done too. A try has
// brokerCallTimeout; once stop is done, one more try is made and a try
// still running gets lastTryTimeout more, so giving up takes that long at
// most even when the broker does not answer.
func (p *Pool) retryUntil(stop context.Context, op string, f func(ctx context.Context) error) error {
	bo := retryBackoff()
	for {
		var (
			ctx    context.Context
			cancel context.CancelFunc
		)
		if stop.Err() != nil {
			ctx, cancel = context.WithTimeout(context.Background(), lastTryTimeout)
		} else {
			ctx, cancel = context.WithTimeout(context.Background(), brokerCallTimeout)
		}
		cut := context.AfterFunc(stop, func() { time.AfterFunc(lastTryTimeout, cancel) })
		err := f(ctx)
		cut()
		cancel()
		if err == nil || permanent(err) {
			return err
		}
		if stop.Err() != nil {
			return fmt.Errorf("%w (gave up retrying: the pool is stopping)", err)
		}
		d := bo.next()
		p.log.Warn("broker write failed; retrying", "op", op, "error", err, "retry_in", d.String())
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-stop.Done():
			t.Stop()
		}
	}
}

// permanent reports whether a failed broker write would fail again: the
// claim is lost, the message gone, the request invalid or the broker
// closed.
func permanent(err error) bool {
	return errors.Is(err, broker.ErrClaimLost) || errors.Is(err, broker.ErrNotFound) ||
		errors.Is(err, broker.ErrInvalid) || errors.Is(err, broker.ErrClosed)
}

// heartbeat stamps the worker's row every HeartbeatInterval. If the row is
// gone (purged while this process looked dead), it registers again.
func (p *Pool) heartbeat() {
	defer close(p.heartbeatDone)
	bo := &backoff{min: retryMin, max: min(retryMax, p.opts.HeartbeatInterval)}
	wait := p.opts.HeartbeatInterval
	registered := p.startTasks
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-p.hbCtx.Done():
			return
		}
		ctx, cancel := context.WithTimeout(p.hbCtx, brokerCallTimeout)
		var err error
		if info := p.info(); !slices.Equal(info.Tasks, registered) {
			// Tasks were registered since (other plugins' tasks, found
			// by polling): say so, so that other workers know.
			if err = p.b.RegisterWorker(ctx, info); err == nil {
				registered = info.Tasks
			}
		} else {
			err = p.b.Heartbeat(ctx, p.opts.WorkerID)
			if errors.Is(err, broker.ErrNotFound) {
				p.log.Warn("worker row is gone; registering again")
				err = p.b.RegisterWorker(ctx, info)
			}
		}
		cancel()
		if err != nil && p.hbCtx.Err() != nil {
			return
		}
		p.beaten(err)
		if err != nil {
			wait = bo.next()
			p.log.Warn("heartbeat failed; retrying", "error", err, "retry_in", wait.String())
		} else {
			bo.reset()
			wait = p.opts.HeartbeatInterval
		}
		t.Reset(wait)
	}
}

// beaten records the outcome of a heartbeat.
func (p *Pool) beaten(err error) {
	p.beatMu.Lock()
	defer p.beatMu.Unlock()
	p.beatErr = err
	if err == nil {
		p.beatAt = time.Now()
	}
}

// LastHeartbeat returns when this pool's worker last stamped its
// heartbeat (or registered), and the error of the latest try when it
// failed (nil when it went through). A worker whose heartbeats fail looks
// dead to the others once orphan_reclaim_after passes, and its broker
// writes are likely failing too. Zero before Start.
func (p *Pool) LastHeartbeat() (time.Time, error) {
	p.beatMu.Lock()
	defer p.beatMu.Unlock()
	return p.beatAt, p.beatErr
}

// backoff doubles from min to max, with +-20% jitter so that workers that
// lost the database together do not come back in lockstep.
type backoff struct {
	min, max, cur time.Duration
}

func retryBackoff() *backoff { return &backoff{min: retryMin, max: retryMax} }

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	jitter := time.Duration((rand.Float64()*0.4 - 0.2) * float64(b.cur))
	return b.cur + jitter
}

func (b *backoff) reset() { b.cur = 0 }

type nopObserver struct{}

func (nopObserver) TaskStarted(string)                                 {}
func (nopObserver) TaskFinished(string, string, string, time.Duration) {}
