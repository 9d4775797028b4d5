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

// maxExchanges is how many exchanges (acks and a claim in one broker call)
// the dispatcher keeps in flight at once.
const maxExchanges = 2

// dispatch claims messages while there are free slots and hands them to
// the workers, and has the completer write the acks the collectors leave
// it with its claims (exchange). It closes jobs when it returns.
//
// A claim asks for as many messages as there are idle handlers not
// already asked for by an exchange in flight, but the pool holds at most
// 2*Concurrency messages claimed and not yet written back (running in the
// broker), so slow outcome writes slow claiming down.
//
// A topic's concurrency limit counts a message as running until its
// outcome is written. The acks therefore go with the next claim, written
// before it (in one transaction when the broker is a broker.AckClaimer),
// so the claim sees the slots they free; a finishing handler frees a slot
// and so starts that claim at once. When a claim comes back short while
// this pool's outcomes are still being written, the next one goes out as
// soon as one of those writes returns rather than after the idle interval.
//
// Up to maxExchanges exchanges are in flight: while one is being written,
// the acks of the messages it does not carry go out in a second one, with
// a claim of the slots left, once the batch is whole (every handler idle
// and every outcome handed over with the collectors' batch written out)
// or at least half the pool. So a finished message waits for one write,
// not for the write in flight and then its own, and the batches stay as
// large as with one exchange at a time. The broker orders the two: a
// limited topic's claims take its lock, and the second one's gate counts
// the first one's claims once they commit.
//
// The second exchange leaves out the acks of a claim whose acks the first
// one carries (broker.Message.ClaimGroup), for the one after it: with the
// PostgreSQL broker, the first one's acks lock that claim's row until
// they commit, after the first exchange's claim and its WAL flush, and
// the second one's acks would wait for all of it before its own claim.
//
// After a short claim the dispatcher waits ClaimIdleInterval, or, while
// the broker announces submitted messages (announcements), until one for
// a topic of this pool comes or ClaimIdleFallback passes, before it
// claims with no acks to write.
func (p *Pool) dispatch() {
	defer close(p.dispatcherDone)
	defer close(p.jobs)
	defer p.out.closeAcks()
	n := p.opts.Concurrency
	// A suspect (see suspect) waits until it can run alone.
	iso := newIsolation(p)
	defer iso.stop()
	ann := newAnnouncements(p)
	x := &exchanges{results: make(chan exchanged, maxExchanges), busy: map[int64]int{}}
	// The exchanges in flight end first: what they claimed goes to the
	// workers, and the acks they give back go to closeAcks.
	defer func() {
		for x.flying > 0 {
			x.land(p, iso, <-x.results)
		}
	}()
	bo := retryBackoff()
	idle := time.NewTimer(0)
	<-idle.C
	var (
		idling   bool      // after a short claim: claim with no acks only once it ends
		deadline time.Time // when the idle wait ends
		// woken: something that may make messages claimable (an
		// announcement, an outcome written, a Wake) came while an
		// exchange was out, which may not have seen it; a short exchange
		// then does not make the dispatcher idle.
		woken   bool
		backoff = time.NewTimer(0)
		failed  bool // a call failed: nothing goes out until backoff fires
	)
	<-backoff.C
	defer idle.Stop()
	defer backoff.Stop()
	stopIdling := func() {
		if idling {
			idling = false
			idle.Stop()
		}
	}
	wakeUp := func() {
		stopIdling()
		if x.flying > 0 {
			woken = true
		}
	}
	for p.claimCtx.Err() == nil {
		inflight := iso.settle(int(p.inflight.Load()), x.reserved)
		if x.flying < maxExchanges && !failed {
			nAcks := p.out.ackCountExcept(x.busy)
			s := slots{
				n: n, inflight: inflight, offloaded: int(p.offloaded.Load()), reserved: x.reserved,
				pending: int(p.out.pending.Load()), acks: nAcks, carried: x.acks, blocked: iso.blocks(),
			}
			if s.launches(x.flying, idling) {
				free := s.free()
				acks := p.out.takeAcksExcept(x.busy)
				if free > 0 {
					// A write that returns from here on may free a slot this
					// claim does not see: it signals afresh.
					select {
					case <-p.out.written:
					default:
					}
				}
				stopIdling()
				if free > 0 {
					// This claim sees what woke the dispatcher so far.
					woken = false
				}
				ann.claiming()
				x.launch(p, acks, broker.ClaimRequest{WorkerID: p.opts.WorkerID, Topics: p.claimTopics(), Max: free})
				continue
			}
		}
		var written <-chan struct{}
		if !idling || p.inflight.Load()+p.out.pending.Load() > 0 {
			written = p.out.written
		}
		var idleC <-chan time.Time
		if idling {
			idleC = idle.C
		}
		var backoffC <-chan time.Time
		if failed {
			backoffC = backoff.C
		}
		// A freed slot can launch nothing while every exchange is out: the
		// next one to land brings the dispatcher back to the top, where it
		// reads the slots afresh. Not waking for each finished message
		// then saves a wake-up of the dispatcher per message.
		var slotFreed <-chan struct{}
		if x.flying < maxExchanges && !failed {
			slotFreed = p.slotFreed
		}
		select {
		case r := <-x.results:
			x.land(p, iso, r)
			if r.err != nil {
				if p.claimCtx.Err() != nil {
					return
				}
				d := bo.next()
				p.log.Warn("claim failed; retrying", "error", r.err, "retry_in", d.String())
				if !failed {
					failed = true
					backoff.Reset(d)
				}
				continue
			}
			bo.reset()
			if iso.holding() || r.max == 0 {
				continue
			}
			if len(r.msgs) == r.max || woken {
				woken = false
				stopIdling()
				continue
			}
			// Short: the queues ran dry, or a concurrency limit binds. Our
			// own messages free the limit's slots as their outcomes are
			// written.
			idling = true
			deadline = time.Now().Add(ann.interval())
			idle.Reset(time.Until(deadline))
		case <-backoffC:
			failed = false
		case <-slotFreed:
		case <-written:
			wakeUp()
		case <-p.out.acksReady:
			stopIdling()
		case <-iso.holdOver():
		case <-idleC:
			idling = false
		case nt := <-ann.notices():
			if ann.wakes(nt) {
				wakeUp()
			} else if next, ok := ann.next(); idling && ok && next.Before(deadline) {
				deadline = next
				idle.Reset(time.Until(deadline))
			}
		case <-p.wake:
			wakeUp()
		case <-p.claimCtx.Done():
		}
	}
}

// slots is what the dispatcher counts before it sends an exchange out:
// whether one goes, and how many messages its claim asks for.
type slots struct {
	n         int  // Options.Concurrency
	inflight  int  // claimed and not yet handed to the completer
	offloaded int  // of inflight, run on goroutines of their own (offload)
	reserved  int  // what the exchanges in flight may claim
	pending   int  // outcomes handed to the completer, not yet written
	acks      int  // acks the next exchange may carry (none held back for a busy claim)
	carried   int  // acks the exchanges in flight carry
	blocked   bool // a suspect is held or runs alone (isolation.blocks)
}

// local is how many messages hold a worker: offloaded attempts hold none,
// so the slots are the workers' (see offload).
func (s slots) local() int { return s.inflight - s.offloaded }

// idle is how many handlers are idle and not already asked for by an
// exchange in flight.
func (s slots) idle() int { return s.n - s.local() - s.reserved }

// room is how many more messages the pool may hold: at most
// 2*Concurrency claimed and not yet written back, the acks about to go
// out counted as written.
func (s slots) room() int { return 2*s.n - s.local() - s.reserved - (s.pending - s.acks) }

// free is how many messages the next claim asks for: none while a suspect
// blocks claiming.
func (s slots) free() int {
	if s.blocked {
		return 0
	}
	return max(min(s.idle(), s.room()), 0)
}

// whole reports whether the acks are a whole batch: no handler busy, and
// every outcome handed over is in flight or may go in the next exchange.
// Acks held back for a busy claim count as not yet here, so while some
// are held back only half the pool's worth sends a second exchange
// (secondLaunches), which keeps its batch large.
func (s slots) whole() bool { return s.inflight == 0 && s.pending-s.carried-s.acks <= 0 }

// launches reports whether an exchange goes out now, with flying in
// flight already and the dispatcher idling or not (see dispatch).
func (s slots) launches(flying int, idling bool) bool {
	if flying == 0 {
		return s.acks > 0 || (s.free() > 0 && !idling)
	}
	return s.secondLaunches()
}

// secondLaunches reports whether a second exchange goes out beside the
// one in flight: it carries a whole batch of acks, or at least half the
// pool's worth.
func (s slots) secondLaunches() bool {
	return s.acks > 0 && !s.blocked && (s.whole() || 2*s.acks >= s.n)
}

// exchanges is the dispatcher's view of its exchanges in flight.
type exchanges struct {
	results  chan exchanged
	flying   int // exchanges in flight
	reserved int // messages they may claim
	acks     int // acks they carry
	// busy counts, per claim (claimGroup), the exchanges in flight that
	// carry acks of its messages.
	busy map[int64]int
}

// exchanged is what an exchange returned.
type exchanged struct {
	msgs   []broker.Message
	err    error
	max    int     // messages it asked for
	acks   int     // acks it carried
	groups []int64 // the claims they were of (exchanges.busy)
}

// launch sends acks and req out in an exchange of their own.
func (x *exchanges) launch(p *Pool, acks []*completion, req broker.ClaimRequest) {
	x.flying++
	x.reserved += req.Max
	x.acks += len(acks)
	var groups []int64
	for _, c := range acks {
		if g := claimGroup(c); g != 0 && !slices.Contains(groups, g) {
			groups = append(groups, g)
			x.busy[g]++
		}
	}
	go func() {
		msgs, err := p.out.exchange(p.claimCtx, acks, req)
		x.results <- exchanged{msgs: msgs, err: err, max: req.Max, acks: len(acks), groups: groups}
	}()
}

// land takes an exchange's answer: whatever it claimed is ours to finish,
// even if we are stopping (the workers requeue it).
func (x *exchanges) land(p *Pool, iso *isolation, r exchanged) {
	x.flying--
	x.reserved -= r.max
	x.acks -= r.acks
	for _, g := range r.groups {
		if x.busy[g]--; x.busy[g] <= 0 {
			delete(x.busy, g)
		}
	}
	p.claims.hold(r.msgs)
	// The messages go to the workers by pointer: each is then one of the
	// claim's slice, which lives until its last attempt is done.
	for i := range r.msgs {
		if m := &r.msgs[i]; iso.admit(m) {
			p.toWorkers(m)
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
func (p *Pool) toWorkers(m *broker.Message) {
	p.inflight.Add(1)
	p.jobs <- m
}
