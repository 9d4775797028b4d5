package worker

import (
	"context"
	"slices"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
)

// This file owns the claim loop: the dispatcher, whose goroutine claims
// messages for free slots, with the pending acks (exchange), and hands
// them to the workers. The pool starts it in Start and stops it, and waits
// for it, in Stop.

// maxExchanges is how many exchanges (acks and a claim in one broker call)
// the dispatcher keeps in flight at once.
const maxExchanges = 2

// dispatcher claims messages while there are free slots and hands them to
// the workers, and has the completer write the acks the collectors leave
// it with its claims (exchange). It closes jobs when it returns.
//
// A claim asks for as many messages as there are idle handlers not
// already asked for by an exchange in flight, but the pool holds at most
// 2*Concurrency messages claimed and not yet written back (running in the
// broker), so slow outcome writes slow claiming down (slots).
//
// Offloaded attempts (Task.Offload) hold no worker, so a claim also asks
// for the offload slots that are free (slots.extra), as far as the last
// claim's mix of tasks says they would go to offloaded attempts: a claim
// whose messages were all of offloaded tasks sizes the next for every
// free offload slot, one of in-process tasks alone for the idle workers.
// What a claim brings past the idle workers waits in the executor's
// backlog (executor.give), counted as held by a worker, so the next claims
// shrink until it has run.
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
type dispatcher struct {
	n        int // Options.Concurrency
	workerID string
	log      hclog.Logger
	b        broker.Broker
	topics   *topicSet
	out      *completer
	claims   *holdings
	exec     *executor // the workers

	idleInterval, idleFallback time.Duration // Options.ClaimIdleInterval, ClaimIdleFallback

	wake    chan struct{}       // Wake: claim now
	notices broker.Subscription // the broker's announcements (broker.Notifier), or nil
	ctx     context.Context     // cancelled: stop claiming
	cancel  context.CancelFunc
	done    chan struct{} // closed when the claim loop has returned
	started bool          // start ran (the pool calls start, then stop)

	// The claim loop's state, its goroutine's alone.
	iso *isolation
	ann *announcements
	x   *exchanges
	bo  *backoff
	mix claimMix // what the last claim that brought messages held
	// idling: after a short claim, claim with no acks only once the idle
	// wait ends (deadline, the idle timer).
	idling   bool
	deadline time.Time
	idle     *time.Timer
	// woken: something that may make messages claimable (an
	// announcement, an outcome written, a Wake) came while an exchange
	// was out, which may not have seen it; a short exchange then does not
	// make the dispatcher idle.
	woken   bool
	failed  bool        // a call failed: nothing goes out until the backoff timer fires
	backoff *time.Timer // fires when the failed call may be retried
}

func newDispatcher(p *Pool, back *giveBacks) *dispatcher {
	d := &dispatcher{
		n: p.opts.Concurrency, workerID: p.opts.WorkerID, log: p.log, b: p.b,
		topics: &p.topics, out: p.out, claims: &p.claims, exec: p.exec,
		idleInterval: p.opts.ClaimIdleInterval, idleFallback: p.opts.ClaimIdleFallback,
		wake: make(chan struct{}, 1),
		done: make(chan struct{}),
	}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	// A suspect (see suspect) waits until it can run alone.
	d.iso = newIsolation(d, p.reg, back)
	return d
}

// start subscribes to the broker's announcements and starts the claim
// loop.
func (d *dispatcher) start() {
	if n, ok := d.b.(broker.Notifier); ok {
		d.notices = n.Subscribe()
	}
	d.started = true
	go d.run()
}

// stop stops claiming and waits for the claim loop, which closed jobs as
// it returned: the workers end once it is empty. It may be called more
// than once, and before start.
func (d *dispatcher) stop() {
	d.cancel()
	if !d.started {
		return
	}
	<-d.done
	if d.notices != nil {
		d.notices.Close()
	}
}

// wakeUp makes the dispatcher claim at once (Pool.Wake); it never blocks.
func (d *dispatcher) wakeUp() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// run is the claim loop: it sends an exchange out whenever one is due
// (launch), and otherwise waits for what may make one due (wait).
func (d *dispatcher) run() {
	defer close(d.done)
	defer d.exec.closeJobs()
	defer d.out.closeAcks()
	defer d.exec.requeueBacklog()
	defer d.iso.stop()
	d.ann = newAnnouncements(d)
	d.x = &exchanges{results: make(chan exchanged, maxExchanges), busy: map[int64]int{}}
	// The exchanges in flight end first: what they claimed goes to the
	// workers, and the acks they give back go to closeAcks.
	defer func() {
		for d.x.flying > 0 {
			d.x.land(d, <-d.x.results)
		}
	}()
	d.bo = retryBackoff()
	d.idle = time.NewTimer(0)
	<-d.idle.C
	d.backoff = time.NewTimer(0)
	<-d.backoff.C
	defer d.idle.Stop()
	defer d.backoff.Stop()
	for d.ctx.Err() == nil {
		if d.launch() {
			continue
		}
		if !d.wait() {
			return
		}
	}
}

// launch sends an exchange out when one is due (slots.launches): the acks
// it may carry and a claim of the free slots. False when none is.
func (d *dispatcher) launch() bool {
	x := d.x
	d.exec.feed()
	inflight := d.iso.settle(int(d.exec.inflight.Load()), x.reserved)
	if x.flying >= maxExchanges || d.failed {
		return false
	}
	nAcks := d.out.acks.countExcept(x.busy)
	s := slots{
		n: d.n, inflight: inflight, offloaded: int(d.exec.offloaded.Load()), reserved: x.reserved,
		pending: int(d.out.pending.Load()), acks: nAcks, carried: x.acks, blocked: d.iso.blocks(),
		offSlots: d.exec.offloadSlots(), offReserved: x.reservedOff, mix: d.mix,
	}
	if !s.launches(x.flying, d.idling) {
		return false
	}
	local := s.free()
	extra := s.extra(local)
	free := local + extra
	acks := d.out.acks.takeExcept(x.busy)
	if free > 0 {
		// A write that returns from here on may free a slot this
		// claim does not see: it signals afresh.
		select {
		case <-d.out.written:
		default:
		}
	}
	d.stopIdling()
	if free > 0 {
		// This claim sees what woke the dispatcher so far.
		d.woken = false
	}
	d.ann.claiming()
	x.launch(d, acks, broker.ClaimRequest{WorkerID: d.workerID, Topics: d.topics.claim(), Max: free}, extra)
	return true
}

// wait waits for one thing that may make an exchange due, and takes it
// in; false when the dispatcher stops (a claim failed as it stopped).
func (d *dispatcher) wait() bool {
	var written <-chan struct{}
	if !d.idling || d.exec.inflight.Load()+d.out.pending.Load() > 0 {
		written = d.out.written
	}
	var idleC <-chan time.Time
	if d.idling {
		idleC = d.idle.C
	}
	var backoffC <-chan time.Time
	if d.failed {
		backoffC = d.backoff.C
	}
	// A freed slot can launch nothing while every exchange is out: the
	// next one to land brings the dispatcher back to the top, where it
	// reads the slots afresh. Not waking for each finished message
	// then saves a wake-up of the dispatcher per message.
	var slotFreed <-chan struct{}
	if d.x.flying < maxExchanges && !d.failed || d.exec.backlogged() {
		slotFreed = d.exec.slotFreed
	}
	select {
	case r := <-d.x.results:
		return d.landed(r)
	case <-backoffC:
		d.failed = false
	case <-slotFreed:
	case <-written:
		d.woke()
	case <-d.out.acks.ready:
		d.stopIdling()
	case <-d.iso.holdOver():
	case <-idleC:
		d.idling = false
	case nt := <-d.ann.notices():
		d.announced(nt)
	case <-d.wake:
		d.woke()
	case <-d.ctx.Done():
	}
	return true
}

// landed takes an exchange's answer: after a failed call the dispatcher
// backs off, after a short claim it idles. False when it stops.
func (d *dispatcher) landed(r exchanged) bool {
	d.x.land(d, r)
	if r.err != nil {
		if d.ctx.Err() != nil {
			return false
		}
		wait := d.bo.next()
		d.log.Warn("claim failed; retrying", "error", r.err, "retry_in", wait.String())
		if !d.failed {
			d.failed = true
			d.backoff.Reset(wait)
		}
		return true
	}
	d.bo.reset()
	if d.iso.holding() || r.max == 0 {
		return true
	}
	if len(r.msgs) == r.max || d.woken {
		d.woken = false
		d.stopIdling()
		return true
	}
	// Short: the queues ran dry, or a concurrency limit binds. Our
	// own messages free the limit's slots as their outcomes are
	// written.
	d.idling = true
	d.deadline = time.Now().Add(d.ann.interval())
	d.idle.Reset(time.Until(d.deadline))
	return true
}

// announced takes a notice of submitted messages: one that calls for a
// claim wakes the dispatcher, one of delayed messages may end its idle
// wait sooner.
func (d *dispatcher) announced(nt broker.Notice) {
	if d.ann.wakes(nt) {
		d.woke()
	} else if next, ok := d.ann.next(); d.idling && ok && next.Before(d.deadline) {
		d.deadline = next
		d.idle.Reset(time.Until(d.deadline))
	}
}

// stopIdling ends the idle wait.
func (d *dispatcher) stopIdling() {
	if d.idling {
		d.idling = false
		d.idle.Stop()
	}
}

// woke takes in something that may make messages claimable: the idle
// wait ends, and an exchange in flight may not have seen it.
func (d *dispatcher) woke() {
	d.stopIdling()
	if d.x.flying > 0 {
		d.woken = true
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

	offSlots    int      // Options.OffloadSlots now
	offReserved int      // what the exchanges in flight may claim past the idle workers
	mix         claimMix // what the last claim that brought messages held
}

// claimMix is what a claim brought: how many messages, and how many of
// them were of offloaded tasks.
type claimMix struct{ claimed, offloadable int }

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

// offRoom is how many offloaded attempts the pool may claim for now: the
// offload slots not out nor asked for, and, as for the workers (room), at
// most twice the slots claimed and not yet written back.
func (s slots) offRoom() int {
	return min(s.offSlots-s.offloaded-s.offReserved, 2*s.offSlots-s.offloaded-s.offReserved-max(s.pending-s.acks, 0))
}

// extra is how many messages a claim of local for the idle workers asks
// for besides, for the free offload slots (offRoom): all of them when the
// last claim's messages were all of offloaded tasks, none when none were,
// and otherwise as many as keep the in-process part expected of the
// claim, by the last one's mix, within the idle workers.
func (s slots) extra(local int) int {
	room := s.offRoom()
	if s.blocked || room <= 0 || s.mix.offloadable == 0 {
		return 0
	}
	if s.mix.offloadable >= s.mix.claimed {
		return room
	}
	return min(local*s.mix.offloadable/(s.mix.claimed-s.mix.offloadable), room)
}

// whole reports whether the acks are a whole batch: no handler busy, and
// every outcome handed over is in flight or may go in the next exchange.
// Acks held back for a busy claim count as not yet here, so while some
// are held back only half the pool's worth sends a second exchange
// (secondLaunches), which keeps its batch large.
func (s slots) whole() bool { return s.inflight == 0 && s.pending-s.carried-s.acks <= 0 }

// launches reports whether an exchange goes out now, with flying in
// flight already and the dispatcher idling or not (see dispatcher).
func (s slots) launches(flying int, idling bool) bool {
	if flying == 0 {
		return s.acks > 0 || (s.free()+s.extra(s.free()) > 0 && !idling)
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
	results     chan exchanged
	flying      int // exchanges in flight
	reserved    int // messages they may claim for the idle workers
	reservedOff int // messages they may claim past those, for offloaded attempts (slots.extra)
	acks        int // acks they carry
	// busy counts, per claim (claimGroup), the exchanges in flight that
	// carry acks of its messages.
	busy map[int64]int
}

// exchanged is what an exchange returned.
type exchanged struct {
	msgs   []broker.Message
	err    error
	max    int     // messages it asked for
	extra  int     // of max, those past the idle workers (slots.extra)
	acks   int     // acks it carried
	groups []int64 // the claims they were of (exchanges.busy)
}

// launch sends acks and req out in an exchange of their own; extra of
// req.Max are asked for past the idle workers.
func (x *exchanges) launch(d *dispatcher, acks []*completion, req broker.ClaimRequest, extra int) {
	x.flying++
	x.reserved += req.Max - extra
	x.reservedOff += extra
	x.acks += len(acks)
	var groups []int64
	for _, c := range acks {
		if g := claimGroup(c); g != 0 && !slices.Contains(groups, g) {
			groups = append(groups, g)
			x.busy[g]++
		}
	}
	go func() {
		msgs, err := d.out.exchange(d.ctx, acks, req)
		x.results <- exchanged{msgs: msgs, err: err, max: req.Max, extra: extra, acks: len(acks), groups: groups}
	}()
}

// land takes an exchange's answer: whatever it claimed is ours to finish,
// even if we are stopping (the workers requeue it).
func (x *exchanges) land(d *dispatcher, r exchanged) {
	x.flying--
	x.reserved -= r.max - r.extra
	x.reservedOff -= r.extra
	x.acks -= r.acks
	for _, g := range r.groups {
		if x.busy[g]--; x.busy[g] <= 0 {
			delete(x.busy, g)
		}
	}
	d.claims.hold(r.msgs)
	if len(r.msgs) > 0 {
		d.mix = claimMix{claimed: len(r.msgs)}
	}
	// The messages go to the workers by pointer: each is then one of the
	// claim's slice, which lives until its last attempt is done.
	for i := range r.msgs {
		m := &r.msgs[i]
		if d.exec.offloadable(m) {
			d.mix.offloadable++
		}
		if d.iso.admit(m) {
			d.exec.give(m)
		}
	}
}

// announcements is the dispatcher's view of the broker's announcements of
// submitted messages (broker.Notifier): which wake it, and how long it may
// wait idle.
type announcements struct {
	d   *dispatcher
	sub broker.Subscription // nil: the broker has none
	// due holds, in order, when the messages announced with a delay become
	// available (at most maxDue, the earliest kept): the idle wait ends at
	// the first.
	due []time.Time
}

// maxDue bounds announcements.due; later ones are left to the fallback
// poll.
const maxDue = 256

func newAnnouncements(d *dispatcher) *announcements {
	return &announcements{d: d, sub: d.notices}
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
	d := a.d.idleInterval
	if a.sub != nil && a.sub.Listening() {
		d = a.d.idleFallback
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
	if !a.d.topics.ours(n.Topic) {
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
