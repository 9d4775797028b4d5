package worker

import (
	"slices"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// This file owns the claim loop: the dispatcher goroutine, which claims
// messages for free slots, with the pending acks (exchange), and hands
// them to the workers. The pool starts it in Start and stops it (claimCtx)
// and waits for it (dispatcherDone) in Stop.

// dispatch claims messages while there are free slots and hands them to
// the workers, and has the completer write the acks the collectors leave
// it with its claims (exchange). It closes jobs when it returns.
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
//
// After a short claim the dispatcher waits ClaimIdleInterval, or, while
// the broker announces submitted messages (announcements), until one for
// a topic of this pool comes or ClaimIdleFallback passes.
func (p *Pool) dispatch() {
	defer close(p.dispatcherDone)
	defer close(p.jobs)
	defer p.out.closeAcks()
	bo := retryBackoff()
	idle := time.NewTimer(0)
	<-idle.C
	n := p.opts.Concurrency
	// A suspect (see suspect) waits until it can run alone.
	iso := newIsolation(p)
	defer iso.stop()
	ann := newAnnouncements(p)
	for p.claimCtx.Err() == nil {
		acks := p.out.takeAcks()
		inflight := iso.settle(int(p.inflight.Load()))
		free := min(n-inflight, 2*n-inflight-(int(p.out.pending.Load())-len(acks)))
		if iso.blocks() {
			free = 0
		}
		if free <= 0 && len(acks) == 0 {
			select {
			case <-p.slotFreed:
			case <-p.out.written:
			case <-p.out.acksReady:
			case <-iso.holdOver():
			case <-p.claimCtx.Done():
			}
			continue
		}
		free = max(free, 0)
		if free > 0 {
			// A write that returns from here on may free a slot this claim
			// does not see: it signals afresh.
			select {
			case <-p.out.written:
			default:
			}
		}
		ann.claiming()
		msgs, err := p.out.exchange(p.claimCtx, acks, broker.ClaimRequest{WorkerID: p.opts.WorkerID, Topics: p.claimTopics(), Max: free})
		// Whatever was claimed is ours to finish, even if we are stopping:
		// the workers requeue it.
		p.claims.hold(msgs)
		for _, m := range msgs {
			if iso.admit(m) {
				p.toWorkers(m)
			}
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
		if iso.holding() || free == 0 || len(msgs) == free {
			continue
		}
		// Short: the queues ran dry, or a concurrency limit binds. Our own
		// messages free the limit's slots as their outcomes are written.
		var written <-chan struct{}
		if p.inflight.Load()+p.out.pending.Load() > 0 {
			written = p.out.written
		}
		deadline := time.Now().Add(ann.interval())
		idle.Reset(time.Until(deadline))
	wait:
		for {
			select {
			case <-idle.C:
				break wait
			case n := <-ann.notices():
				if ann.wakes(n) {
					idle.Stop()
					break wait
				}
				if next, ok := ann.next(); ok && next.Before(deadline) {
					deadline = next
					idle.Reset(time.Until(deadline))
				}
			case <-written:
				idle.Stop()
				break wait
			case <-p.out.acksReady:
				idle.Stop()
				break wait
			case <-p.wake:
				idle.Stop()
				break wait
			case <-p.claimCtx.Done():
				idle.Stop()
				break wait
			}
		}
	}
}

// announcements is the dispatcher's view of the broker's announcements of
// submitted messages (broker.Notifier): which wake it, and how long it may
// wait idle.
type announcements struct {
	p   *Pool
	sub broker.Subscription // nil: the broker has none
	// due holds, in order, when the messages announced with a delay become
	// available (at most maxDue, the earliest kept): the idle wait ends at
	// the first.
	due []time.Time
}

// maxDue bounds announcements.due; later ones are left to the fallback
// poll.
const maxDue = 256

func newAnnouncements(p *Pool) *announcements {
	return &announcements{p: p, sub: p.notices}
}

// notices is the subscription's channel; nil (never ready) without one.
func (a *announcements) notices() <-chan broker.Notice {
	if a.sub == nil {
		return nil
	}
	return a.sub.Notices()
}

// interval is how long the dispatcher may wait idle: the fallback while
// announcements arrive, the idle interval otherwise, and never past the
// first due time.
func (a *announcements) interval() time.Duration {
	d := a.p.opts.ClaimIdleInterval
	if a.sub != nil && a.sub.Listening() {
		d = a.p.opts.ClaimIdleFallback
	}
	if next, ok := a.next(); ok {
		d = min(d, max(time.Until(next), 0))
	}
	return d
}

// next is the first due time, if any.
func (a *announcements) next() (time.Time, bool) {
	if len(a.due) == 0 {
		return time.Time{}, false
	}
	return a.due[0], true
}

// wakes reports whether n calls for a claim now; a notice of delayed
// messages on one of the pool's topics adds a due time instead.
func (a *announcements) wakes(n broker.Notice) bool {
	if n.Topic == "" {
		return true
	}
	if _, ours := slices.BinarySearch(a.p.claimTopics(), n.Topic); !ours {
		return false
	}
	if n.Delay <= 0 {
		return true
	}
	at := time.Now().Add(n.Delay)
	i, _ := slices.BinarySearchFunc(a.due, at, time.Time.Compare)
	if i < maxDue {
		a.due = slices.Insert(a.due, i, at)
		if len(a.due) > maxDue {
			a.due = a.due[:maxDue]
		}
	}
	return false
}

// claiming notes that a claim goes out now: it finds the messages that
// were due by now.
func (a *announcements) claiming() {
	now := time.Now()
	i := 0
	for i < len(a.due) && !a.due[i].After(now) {
		i++
	}
	a.due = a.due[i:]
}

// toWorkers hands a claimed message to the workers.
func (p *Pool) toWorkers(m broker.Message) {
	p.inflight.Add(1)
	p.jobs <- m
}
