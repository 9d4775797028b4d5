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

// This file owns the stray check (strayCheck), a goroutine the pool starts
// in Start and stops in Stop, and the record of the claims the pool holds
// (holdings), which it compares with the broker's.

// Defaults of the stray check (Options.StrayCheckInterval, StrayAfter).
const (
	DefaultStrayCheckInterval = 30 * time.Second
	// DefaultStrayAfter is twice the longest a claim's answer can take to
	// reach the pool (brokerCallTimeout): a claim still unknown to the
	// pool that long after it was first seen running never will be.
	DefaultStrayAfter = 2 * brokerCallTimeout
)

// strayError is the last error a requeued stray is given; ranLostError
// that of a message whose task ran here but whose outcome could not be
// written.
const (
	strayError   = "claimed for this worker but never delivered to it (the claim committed and its answer was lost); requeued"
	ranLostError = "its task ran on this worker but the outcome could not be written; requeued"
)

// A stray is a message running in the broker under this pool's worker id
// that the pool does not hold: its claim committed, but the answer never
// reached the pool (the connection broke after the commit, or the call
// timed out while the commit went through). Nothing else would ever end
// it: the worker is alive and heartbeating, so the reaper leaves its
// claims alone, and the pool does not know the message exists. On a
// limited topic a few strays hold every slot and wedge the topic for as
// long as the process lives.
//
// The strayCheck compares, every StrayCheckInterval, the claims the broker
// lists as running under the worker id with those the pool holds (claimed,
// outcome not yet written). A claim the pool does not hold, seen again at
// least StrayAfter after it was first seen and still not held, is a
// stray: any answer of its claim would have reached the pool by then. It
// is requeued under its token (broker.Nack), so a claim that ended in the
// meantime is left as it is. The attempt the lost claim counted is given
// back (broker.NackRequest.NotRun): the task never ran. (A message whose
// task did run here, but whose outcome could not be written, is requeued
// the same way once the pool has given up on it, keeping its attempt.)
type strayCheck struct {
	b        broker.Broker
	log      hclog.Logger
	workerID string
	interval time.Duration // Options.StrayCheckInterval; <= 0: no check
	after    time.Duration // Options.StrayAfter
	claims   *holdings
	out      *completer  // requeues the strays
	strays   func(n int) // Options.Strays; may be nil
	ctx      context.Context
	cancel   context.CancelFunc
	done     chan struct{}
	started  bool // start ran (the pool calls start, then stop)
}

func newStrayCheck(p *Pool) *strayCheck {
	s := &strayCheck{
		b: p.b, log: p.log, workerID: p.opts.WorkerID, interval: p.opts.StrayCheckInterval, after: p.opts.StrayAfter,
		claims: &p.claims, out: p.out, strays: p.opts.Strays, done: make(chan struct{}),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// start starts the check.
func (s *strayCheck) start() {
	s.started = true
	go s.run()
}

// stop stops the check and waits for it. It may be called more than once,
// and before start.
func (s *strayCheck) stop() {
	s.cancel()
	if s.started {
		<-s.done
	}
}

// run compares the claims every interval, until stop.
func (s *strayCheck) run() {
	defer close(s.done)
	if s.interval <= 0 {
		return
	}
	t := time.NewTicker(s.interval)
	defer t.Stop()
	var seen map[broker.Claim]time.Time
	for {
		select {
		case <-t.C:
		case <-s.ctx.Done():
			return
		}
		seen = s.pass(seen)
	}
}

// pass is one comparison. seen holds when each claim not held was first
// seen; it returns the same for the next pass.
func (s *strayCheck) pass(seen map[broker.Claim]time.Time) map[broker.Claim]time.Time {
	ctx, cancel := context.WithTimeout(s.ctx, brokerCallTimeout)
	claims, err := s.b.RunningClaims(ctx, s.workerID)
	cancel()
	if err != nil {
		if s.ctx.Err() == nil {
			s.log.Warn("could not list this worker's running messages to look for strays", "error", err)
		}
		return seen
	}
	// Compared after the listing: a claim listed as running that the pool
	// holds by now is no stray, whenever its answer came.
	now := time.Now()
	next := make(map[broker.Claim]time.Time)
	requeued := 0
	s.claims.forgetRanLost(claims)
scan:
	for _, c := range claims {
		held, ran := s.claims.holds(c)
		if held {
			continue
		}
		first, ok := seen[c]
		if !ok {
			next[c] = now
			continue
		}
		if now.Sub(first) < s.after {
			next[c] = first
			continue
		}
		nctx, ncancel := context.WithTimeout(s.ctx, brokerCallTimeout)
		msg := strayError
		if ran {
			msg = ranLostError
		}
		err := s.out.requeueUnheld(nctx, c, !ran, msg)
		ncancel()
		switch {
		case err == nil:
			requeued++
			s.log.Warn("requeued a message claimed for this worker that never reached it (the claim's answer was lost)",
				"message_id", c.ID, "not_held_for", now.Sub(first).Round(time.Millisecond).String())
		case errors.Is(err, broker.ErrClaimLost) || errors.Is(err, broker.ErrNotFound):
			// It ended meanwhile (reclaimed, purged): nothing to do.
		case s.ctx.Err() != nil:
			break scan // stopping
		default:
			s.log.Warn("could not requeue a stray message; trying again at the next check", "message_id", c.ID, "error", err)
			next[c] = first
		}
	}
	if requeued > 0 && s.strays != nil {
		s.strays(requeued)
	}
	return next
}

// holdings are the claims the pool holds: claimed, outcome not yet
// written. The dispatcher holds what it claims, the completer releases
// what it has written (or given up on), and the stray check looks at them.
type holdings struct {
	mu   sync.Mutex
	held map[broker.Claim]struct{}
	// ranLost: claims whose task ran but whose outcome could not be
	// written; the stray check requeues them keeping the attempt.
	ranLost map[broker.Claim]struct{}
}

// init makes the maps, for about n claims held at once.
func (h *holdings) init(n int) {
	h.held = make(map[broker.Claim]struct{}, n)
	h.ranLost = make(map[broker.Claim]struct{})
}

// hold records the claims of msgs as the pool's until the completer
// releases them (finish).
func (h *holdings) hold(msgs []broker.Message) {
	if len(msgs) == 0 {
		return
	}
	h.mu.Lock()
	for i := range msgs {
		h.held[msgs[i].ClaimOf()] = struct{}{}
	}
	h.mu.Unlock()
}

// release forgets the claims of batch, whose outcomes were written (or
// given up on).
func (h *holdings) release(batch []*completion) {
	h.mu.Lock()
	for _, c := range batch {
		delete(h.held, c.claim)
	}
	h.mu.Unlock()
}

// holdsID reports whether the pool holds a claim of message id.
func (h *holdings) holdsID(id int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for c := range h.held {
		if c.ID == id {
			return true
		}
	}
	return false
}

// ranAndLost records that c's task ran but its outcome could not be
// written (see lose).
func (h *holdings) ranAndLost(c broker.Claim) {
	h.mu.Lock()
	h.ranLost[c] = struct{}{}
	h.mu.Unlock()
}

// holds reports whether the pool holds c, and whether c's task ran and
// its outcome could not be written (lose).
func (h *holdings) holds(c broker.Claim) (held, ranLost bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, held = h.held[c]
	_, ranLost = h.ranLost[c]
	return held, ranLost
}

// forgetRanLost drops the ran-and-lost claims no longer running (claims is
// every claim running under the worker id).
func (h *holdings) forgetRanLost(claims []broker.Claim) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for c := range h.ranLost {
		if !slices.Contains(claims, c) {
			delete(h.ranLost, c)
		}
	}
}
