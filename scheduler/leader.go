package scheduler

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
)

// BeatLease is the name of the beat's lease.
const BeatLease = "beat"

// LeaderOptions configure a Leader.
type LeaderOptions struct {
	// Name of the lease; default BeatLease.
	Name string
	// Holder is this process's worker id.
	Holder string
	// TTL is how long a lease lasts without renewal: a standby takes over
	// within it after the leader dies. Default 15s.
	TTL time.Duration
	// Renew is how often the lease is renewed or tried; default TTL/3.
	Renew time.Duration
	// OnElected runs (in its own goroutine) when this process becomes the
	// leader; its context is cancelled when leadership is lost or the
	// Leader stops. The fence names the term for leader-only writes.
	OnElected func(ctx context.Context, fence broker.Fence)
	Logger    hclog.Logger
}

// Leader campaigns for a lease and runs OnElected while it holds it.
type Leader struct {
	leaser broker.Leaser
	opts   LeaderOptions
	log    hclog.Logger

	mu      sync.Mutex
	current *broker.Fence
	cancel  context.CancelFunc
	done    chan struct{}
	started bool
	stopped bool

	// validUntil is when the lease runs out by this process's clock: the
	// time its last successful renewal was sent, plus the TTL. A leader
	// that was paused past it (SIGSTOP, a VM freeze) may no longer lead,
	// and must not say it does before its loop has noticed.
	validUntil time.Time
}

// NewLeader returns a leader for leaser; call Start.
func NewLeader(leaser broker.Leaser, opts LeaderOptions) *Leader {
	if opts.Name == "" {
		opts.Name = BeatLease
	}
	if opts.TTL <= 0 {
		opts.TTL = 15 * time.Second
	}
	if opts.Renew <= 0 || opts.Renew >= opts.TTL {
		opts.Renew = opts.TTL / 3
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	return &Leader{leaser: leaser, opts: opts, log: opts.Logger, done: make(chan struct{})}
}

// Fence returns the fence of the current term while this process leads
// (and its lease has not run out by this process's clock).
func (l *Leader) Fence() (broker.Fence, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.current == nil || !time.Now().Before(l.validUntil) {
		return broker.Fence{}, false
	}
	return *l.current, true
}

// Start begins campaigning. It returns at once.
func (l *Leader) Start(ctx context.Context) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started || l.stopped {
		return
	}
	l.started = true
	ctx, l.cancel = context.WithCancel(context.WithoutCancel(ctx))
	go l.run(ctx)
}

// Stop stops campaigning, ends the term's work and releases the lease so a
// standby takes over at once. Safe to call twice and before Start.
func (l *Leader) Stop(ctx context.Context) {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return
	}
	l.stopped = true
	started := l.started
	cancel := l.cancel
	l.mu.Unlock()
	if !started {
		return
	}
	cancel()
	select {
	case <-l.done:
	case <-ctx.Done():
	}
}

// term is one period of leadership: the work's context and its end.
type term struct {
	fence  broker.Fence
	cancel context.CancelFunc
	done   chan struct{}
}

func (l *Leader) run(ctx context.Context) {
	defer close(l.done)
	var cur *term
	endTerm := func(release bool) {
		if cur == nil {
			return
		}
		cur.cancel()
		<-cur.done
		ended := cur
		cur = nil
		l.mu.Lock()
		l.current = nil
		l.mu.Unlock()
		if release {
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := l.leaser.ReleaseLease(rctx, l.opts.Name, l.opts.Holder, ended.fence.Term); err != nil {
				l.log.Warn("could not release the lease; a standby takes over when it expires", "error", err)
			}
			cancel()
		}
	}
	defer endTerm(true)

	t := time.NewTicker(l.opts.Renew)
	defer t.Stop()
	lastRenew := time.Time{}
	for {
		sent := time.Now()
		// A renewal that has not answered within a lease's length is given
		// up (a connection that hangs must not hold the campaign; the
		// lease would be over anyway), and the next goes out on a fresh
		// connection. Not shorter: a renewal waits, rightly, for this
		// leader's own fenced transaction (a reaper pass, a schedule
		// fire) that holds the lease row, and must not depose it.
		tctx, tcancel := context.WithTimeout(ctx, l.opts.TTL)
		lease, held, err := l.leaser.TryLease(tctx, l.opts.Name, l.opts.Holder, l.opts.TTL)
		tcancel()
		switch {
		case err != nil && ctx.Err() != nil:
			return
		case err != nil:
			l.log.Warn("lease renewal failed", "lease", l.opts.Name, "error", err)
			// Without a renewal the lease runs out: stop acting as leader
			// before it can, so two leaders never act at once.
			if cur != nil && time.Since(lastRenew) > l.opts.TTL-l.opts.Renew {
				l.log.Error("leadership lost: the lease could not be renewed in time", "term", cur.fence.Term)
				endTerm(false)
			}
		case held && cur != nil && lease.Term == cur.fence.Term:
			lastRenew = time.Now()
			l.mu.Lock()
			l.validUntil = sent.Add(l.opts.TTL)
			l.mu.Unlock()
		case held:
			endTerm(false)
			lastRenew = time.Now()
			cur = &term{fence: broker.Fence{Name: l.opts.Name, Holder: l.opts.Holder, Term: lease.Term}, done: make(chan struct{})}
			l.log.Info("elected leader", "lease", l.opts.Name, "term", lease.Term)
			fence := cur.fence
			l.mu.Lock()
			l.current = &fence
			l.validUntil = sent.Add(l.opts.TTL)
			l.mu.Unlock()
			var termCtx context.Context
			termCtx, cur.cancel = context.WithCancel(ctx)
			go func(ctx context.Context, f broker.Fence, done chan struct{}) {
				defer close(done)
				if l.opts.OnElected != nil {
					l.opts.OnElected(ctx, f)
				}
			}(termCtx, fence, cur.done)
		default:
			if cur != nil {
				l.log.Warn("leadership lost to another process", "lease", l.opts.Name, "holder", lease.Holder, "term", lease.Term)
				endTerm(false)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// IsNotLeader reports whether err says a fenced write came too late.
func IsNotLeader(err error) bool { return errors.Is(err, broker.ErrNotLeader) }
