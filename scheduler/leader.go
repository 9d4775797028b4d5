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
	// Renew is how often the lease is renewed or tried; default (and at
	// most) TTL/3. A term's work stops half a renewal period before the
	// lease could run out (see run), so with TTL/3 one renewal may fail
	// and the next still keep the term.
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

	// validUntil is when this process stops leading unless a renewal
	// lands first: the time its last successful renewal was sent, plus
	// the TTL, less the margin (see run). A leader that was paused past it
	// (SIGSTOP, a VM freeze) may no longer lead, and must not say it does
	// before its loop has noticed.
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
	if opts.Renew <= 0 || opts.Renew > opts.TTL/3 {
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

// renewal is the answer of one TryLease.
type renewal struct {
	lease broker.Lease
	held  bool
	err   error
}

// margin is how long before the lease can run out a term's work is
// stopped: half a renewal period, for the work to see its context end and
// for the timer that ends it to fire late on a loaded machine.
func (l *Leader) margin() time.Duration { return l.opts.Renew / 2 }

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

	// stepDown fires when the lease can no longer be known held: the
	// last renewal that was answered held was sent at s, and the lease
	// it wrote lasts the TTL from a moment after s (the store's clock
	// stamped it once the write arrived), so by this process's monotonic
	// clock it is certainly held until s+TTL and no later. The work stops
	// a margin before that, whether or not a renewal is still on its way:
	// a renewal that hangs must not keep the term going past the lease.
	stepDown := time.NewTimer(time.Hour)
	stepDown.Stop()
	defer stepDown.Stop()
	var deadline time.Time // while cur != nil: when stepDown fires
	lose := func() {
		term := cur.fence.Term
		l.log.Error("leadership lost: the lease could not be renewed in time", "lease", l.opts.Name, "term", term,
			"lease_left", time.Until(deadline.Add(l.margin())).Round(time.Millisecond).String())
		stopping := time.Now()
		endTerm(false)
		// The work's context ended above; a statement of it that hangs
		// returns when its driver gives up on it. Fenced, it cannot land
		// under a later term.
		took := time.Since(stopping)
		say := l.log.Info
		if took > l.margin() {
			say = l.log.Warn
		}
		say("the term's work stopped", "lease", l.opts.Name, "term", term, "took", took.Round(time.Millisecond).String())
	}
	// stepping is stepDown's channel while a term runs, nil otherwise.
	stepping := func() <-chan time.Time {
		if cur == nil {
			return nil
		}
		return stepDown.C
	}

	t := time.NewTicker(l.opts.Renew)
	defer t.Stop()
	for {
		sent := time.Now()
		answer := make(chan renewal, 1)
		go func() {
			// A renewal that has not answered within a lease's length is
			// given up (a connection that hangs must not hold the
			// campaign; the lease would be over anyway), and the next goes
			// out on a fresh connection. Not shorter: a renewal waits,
			// rightly, for this leader's own fenced transaction (a reaper
			// pass, a schedule fire) that holds the lease row, and must not
			// depose it. The term does not wait for it: stepDown ends the
			// term at its deadline meanwhile.
			tctx, tcancel := context.WithTimeout(ctx, l.opts.TTL)
			defer tcancel()
			lease, held, err := l.leaser.TryLease(tctx, l.opts.Name, l.opts.Holder, l.opts.TTL)
			answer <- renewal{lease, held, err}
		}()
		var r renewal
	waiting:
		for {
			select {
			case r = <-answer:
				break waiting
			case <-stepping():
				lose()
			}
		}
		// A renewal answered held lets the term go on until this
		// deadline; one answered that late is no renewal at all (a term
		// running ends at its deadline, which has passed).
		renewed := sent.Add(l.opts.TTL - l.margin())
		late := r.err == nil && r.held && !time.Now().Before(renewed)
		switch {
		case r.err != nil && ctx.Err() != nil:
			return
		case r.err != nil:
			l.log.Warn("lease renewal failed", "lease", l.opts.Name, "error", r.err)
		case late:
			l.log.Warn("a lease renewal answered too late to act on", "lease", l.opts.Name, "took", time.Since(sent).Round(time.Millisecond).String())
		case r.held && cur != nil && r.lease.Term == cur.fence.Term:
			deadline = renewed
			stepDown.Reset(time.Until(deadline))
			l.mu.Lock()
			l.validUntil = deadline
			l.mu.Unlock()
		case r.held:
			endTerm(false)
			cur = &term{fence: broker.Fence{Name: l.opts.Name, Holder: l.opts.Holder, Term: r.lease.Term}, done: make(chan struct{})}
			l.log.Info("elected leader", "lease", l.opts.Name, "term", r.lease.Term)
			fence := cur.fence
			deadline = renewed
			stepDown.Reset(time.Until(deadline))
			l.mu.Lock()
			l.current = &fence
			l.validUntil = deadline
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
				l.log.Warn("leadership lost to another process", "lease", l.opts.Name, "term", cur.fence.Term,
					"holder", r.lease.Holder, "holder_term", r.lease.Term)
				endTerm(false)
			}
		}
	next:
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				break next
			case <-stepping():
				lose()
			}
		}
	}
}

// IsNotLeader reports whether err says a fenced write came too late.
func IsNotLeader(err error) bool { return errors.Is(err, broker.ErrNotLeader) }
