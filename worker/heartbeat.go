package worker

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
)

// This file owns the worker's row in the broker: its registration, the
// heartbeat that keeps it fresh (and its list of tasks current), what the
// heartbeat last achieved (LastHeartbeat), and its removal at Stop.

// heartbeater registers the worker, stamps its row every
// HeartbeatInterval, and unregisters it. After each beat that goes
// through it has the pool's cancels look for cancel requests, and it
// warns of overrunning handlers. The pool starts its goroutine in Start
// and stops it in Stop.
type heartbeater struct {
	b       broker.Broker
	log     hclog.Logger
	opts    *Options // WorkerID, Host, PID, Roles, Concurrency, HeartbeatInterval
	reg     *Registry
	topics  *topicSet
	wake    func() // makes the dispatcher claim (new topics)
	cancels *cancels
	beat    beat     // the latest heartbeat
	tasks   []string // the tasks the worker is registered with; the goroutine's once started
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{}
	started bool // start ran (the pool calls start, then stop)
}

// beat is the outcome of the latest heartbeat.
type beat struct {
	mu  sync.Mutex
	at  time.Time // when the heartbeat (or the registration) last went through
	err error     // the latest heartbeat's error; nil when it went through
}

func newHeartbeater(p *Pool, c *cancels) *heartbeater {
	h := &heartbeater{
		b: p.b, log: p.log, opts: &p.opts, reg: p.reg, topics: &p.topics, wake: p.Wake, cancels: c,
		done: make(chan struct{}),
	}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	return h
}

// info is the worker's row as the broker keeps it.
func (h *heartbeater) info() broker.WorkerInfo {
	return broker.WorkerInfo{
		ID:       h.opts.WorkerID,
		Host:     h.opts.Host,
		PID:      h.opts.PID,
		Roles:    append([]string(nil), h.opts.Roles...),
		Topics:   h.topics.list(),
		Capacity: h.opts.Concurrency,
		Tasks:    h.reg.Names(),
	}
}

// register registers the worker with the broker, which counts as its
// first heartbeat.
func (h *heartbeater) register(ctx context.Context) error {
	info := h.info()
	if err := h.b.RegisterWorker(ctx, info); err != nil {
		return err
	}
	h.tasks = info.Tasks
	h.beaten(nil)
	return nil
}

// start starts the heartbeat; call it once the worker is registered.
func (h *heartbeater) start() {
	h.started = true
	go h.run()
}

// stop stops the heartbeat and waits for it. It may be called more than
// once, and before start.
func (h *heartbeater) stop() {
	h.cancel()
	if h.started {
		<-h.done
	}
}

// unregister removes the worker's row, within ctx's deadline (at least
// lastTryTimeout) and brokerCallTimeout. A row already gone is no error.
func (h *heartbeater) unregister(ctx context.Context) error {
	unregister := brokerCallTimeout
	if dl, ok := ctx.Deadline(); ok {
		unregister = min(unregister, max(time.Until(dl), lastTryTimeout))
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unregister)
	defer cancel()
	if err := h.b.UnregisterWorker(uctx, h.opts.WorkerID); err != nil && !errors.Is(err, broker.ErrNotFound) {
		return err
	}
	return nil
}

// run stamps the worker's row every HeartbeatInterval. If the row is
// gone (purged while this process looked dead), it registers again.
func (h *heartbeater) run() {
	defer close(h.done)
	bo := &backoff{min: retryMin, max: min(retryMax, h.opts.HeartbeatInterval)}
	wait := h.opts.HeartbeatInterval
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-h.ctx.Done():
			return
		}
		err := h.stamp()
		if err != nil && h.ctx.Err() != nil {
			return
		}
		h.beaten(err)
		h.cancels.warnOverruns()
		if err == nil {
			h.cancels.poll(h.ctx)
		}
		if err != nil {
			wait = bo.next()
			h.log.Warn("heartbeat failed; retrying", "error", err, "retry_in", wait.String())
		} else {
			bo.reset()
			wait = h.opts.HeartbeatInterval
		}
		t.Reset(wait)
	}
}

// stamp is one heartbeat: the worker's row stamped, or registered again
// with the tasks registered since, or afresh when it is gone.
func (h *heartbeater) stamp() error {
	ctx, cancel := context.WithTimeout(h.ctx, brokerCallTimeout)
	defer cancel()
	info := h.info()
	if !slices.Equal(info.Tasks, h.tasks) {
		// Tasks were registered since (other plugins' tasks, found
		// by polling): claim their topics too, and say so, so that
		// other workers know.
		h.refreshTopics(ctx)
		info = h.info()
		err := h.b.RegisterWorker(ctx, info)
		if err == nil {
			h.tasks = info.Tasks
		}
		return err
	}
	err := h.b.Heartbeat(ctx, h.opts.WorkerID)
	if errors.Is(err, broker.ErrNotFound) {
		h.log.Warn("worker row is gone; registering again")
		err = h.b.RegisterWorker(ctx, info)
	}
	return err
}

// refreshTopics adds the topics of tasks registered since Start to those
// the pool claims from, creating them in the broker (with no settings of
// their own) so their gauges show, and wakes the dispatcher to claim from
// them. A topic is never dropped: its messages still need this worker.
func (h *heartbeater) refreshTopics(ctx context.Context) {
	added := h.topics.added()
	if len(added) == 0 {
		return
	}
	for _, t := range added {
		if _, err := h.b.SetTopic(ctx, t, broker.TopicPatch{}); err != nil {
			h.log.Warn("could not create the topic of a task registered since the start; claiming from it anyway", "topic", t, "error", err)
		}
	}
	topics := h.topics.widen(added)
	h.log.Info("claiming from the topics of tasks registered since the start", "added", added, "topics", topics)
	h.wake()
}

// beaten records the outcome of a heartbeat.
func (h *heartbeater) beaten(err error) {
	h.beat.mu.Lock()
	defer h.beat.mu.Unlock()
	h.beat.err = err
	if err == nil {
		h.beat.at = time.Now()
	}
}

// last is when the latest heartbeat went through, and the latest one's
// error (see Pool.LastHeartbeat).
func (h *heartbeater) last() (time.Time, error) {
	h.beat.mu.Lock()
	defer h.beat.mu.Unlock()
	return h.beat.at, h.beat.err
}
