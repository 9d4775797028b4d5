package worker

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// This file owns the worker's heartbeat: the goroutine that keeps its row
// in the broker fresh (and its list of tasks current), and what it last
// achieved (LastHeartbeat). The pool starts it in Start and stops and
// waits for it in Stop (hbCtx, heartbeatDone).

// beat is the outcome of the latest heartbeat.
type beat struct {
	mu  sync.Mutex
	at  time.Time // when the heartbeat (or the registration) last went through
	err error     // the latest heartbeat's error; nil when it went through
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
			// by polling): claim their topics too, and say so, so that
			// other workers know.
			p.refreshTopics(ctx)
			info = p.info()
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
		p.warnOverruns()
		if err == nil {
			ctx, cancel := context.WithTimeout(p.hbCtx, brokerCallTimeout)
			p.pollCancels(ctx)
			cancel()
		}
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

// refreshTopics adds the topics of tasks registered since Start to those
// the pool claims from, creating them in the broker (with no settings of
// their own) so their gauges show, and wakes the dispatcher to claim from
// them. A topic is never dropped: its messages still need this worker.
func (p *Pool) refreshTopics(ctx context.Context) {
	added := p.topics.added()
	if len(added) == 0 {
		return
	}
	for _, t := range added {
		if _, err := p.b.SetTopic(ctx, t, broker.TopicPatch{}); err != nil {
			p.log.Warn("could not create the topic of a task registered since the start; claiming from it anyway", "topic", t, "error", err)
		}
	}
	topics := p.topics.widen(added)
	p.log.Info("claiming from the topics of tasks registered since the start", "added", added, "topics", topics)
	p.Wake()
}

// beaten records the outcome of a heartbeat.
func (p *Pool) beaten(err error) {
	p.beat.mu.Lock()
	defer p.beat.mu.Unlock()
	p.beat.err = err
	if err == nil {
		p.beat.at = time.Now()
	}
}

// LastHeartbeat returns when this pool's worker last stamped its
// heartbeat (or registered), and the error of the latest try when it
// failed (nil when it went through). A worker whose heartbeats fail looks
// dead to the others once orphan_reclaim_after passes, and its broker
// writes are likely failing too. Zero before Start.
func (p *Pool) LastHeartbeat() (time.Time, error) {
	p.beat.mu.Lock()
	defer p.beat.mu.Unlock()
	return p.beat.at, p.beat.err
}
