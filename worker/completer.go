package worker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
)

// This file owns the completer's lifecycle and how outcomes flow through
// it: the intake from the workers, the collectors that batch it, the queue
// of acks left to the dispatcher, and the reporting of written outcomes.
// The writes themselves are in outcomes.go.

// Timings of outcome writes.
const (
	// flushTimeout bounds how long Stop keeps retrying outcome writes
	// against a failing broker once the handlers are done.
	flushTimeout = 10 * time.Second
	// lastTryTimeout bounds a write once the pool has given up retrying.
	lastTryTimeout = 2 * time.Second
	// maxAckBatch bounds one broker.Ack call.
	maxAckBatch = 256
	// collectors is how many goroutines write outcomes the dispatcher does
	// not take (nacks, and acks once it has stopped), so one slow write
	// does not hold up the rest.
	collectors = 2
)

// completer owns every write of an attempt's outcome: acks, nacks (a
// retry, a requeue, a dead letter), their batching, their retries and
// their flushing at stop. Every path hands outcomes to it: the workers
// through add, the dispatcher through exchange, which writes the pending
// acks with its claim, and the stray check through requeueUnheld. It alone
// calls broker.Ack and broker.Nack. Once an attempt's outcome is written,
// or given up on, it releases the claim and reports the attempt (finish).
//
// Its collectors goroutines are started by start, and stopped and waited
// for by stop, which may be called more than once.
type completer struct {
	b        broker.Broker
	log      hclog.Logger
	workerID string
	obs      Observer
	mobs     MessageObserver // obs, when it implements MessageObserver
	reporter Reporter        // may be nil
	// carry: reports ride on their outcomes (storesInto); reporter gets
	// those of lost attempts only.
	carry  bool
	claims *holdings // released once written; ran-and-lost marked

	in      chan *completion // outcomes handed over by the workers
	acks    ackQueue         // the acks left to the dispatcher
	written chan struct{}    // an outcome write returned: the broker may have a free slot
	pending atomic.Int64     // handed over, outcome not yet written

	giveUpCtx context.Context // cancelled: stop retrying broker writes
	giveUp    context.CancelFunc

	collecting sync.WaitGroup
	closeIn    sync.Once
}

// newCompleter returns a completer for a pool of n handlers; nothing runs
// until start.
func newCompleter(b broker.Broker, log hclog.Logger, workerID string, obs Observer, reporter Reporter, claims *holdings, n int) *completer {
	mobs, _ := obs.(MessageObserver)
	o := &completer{
		b: b, log: log, workerID: workerID, obs: obs, mobs: mobs, reporter: reporter, claims: claims,
		carry:   storesInto(reporter, b),
		in:      make(chan *completion, 2*n),
		acks:    ackQueue{open: true, ready: make(chan struct{}, 1)},
		written: make(chan struct{}, 1),
	}
	o.giveUpCtx, o.giveUp = context.WithCancel(context.Background())
	return o
}

// start starts the collectors.
func (o *completer) start() {
	for range collectors {
		o.collecting.Go(o.collect)
	}
}

// add hands an attempt's outcome over for writing; it blocks while the
// collectors are behind. Not after stop.
func (o *completer) add(c *completion) {
	o.pending.Add(1)
	o.in <- c
}

// stop writes every outcome handed over and waits for the collectors; call
// it once nothing calls add any more (the workers have returned) and the
// dispatcher has stopped. Writes against a failing broker are retried for
// flushTimeout at most, or until giveUp, and no longer once stop returns.
// A second call waits as the first does.
func (o *completer) stop() {
	o.closeAcks()
	o.closeIn.Do(func() { close(o.in) })
	t := time.AfterFunc(flushTimeout, o.giveUp)
	defer t.Stop()
	o.collecting.Wait()
	o.giveUp()
}

// collect writes outcomes: every ack that is pending when it looks goes in
// one broker.Ack call; it never waits for more to come. Several collectors
// run, so one batch gathers while another is written.
func (o *completer) collect() {
	for c := range o.in {
		o.flush(gather(o.in, []*completion{c}, maxAckBatch))
	}
}

// flush writes a batch of outcomes: nacks one by one, acks in one call,
// or, while the dispatcher runs, by handing them to it for its next claim.
func (o *completer) flush(batch []*completion) {
	var acks, rest []*completion
	for _, c := range batch {
		switch {
		case c.lost:
		case c.ack:
			acks = append(acks, c)
			continue
		default:
			o.nack(c)
		}
		rest = append(rest, c)
	}
	if len(acks) > 0 && !o.acks.leave(acks) {
		o.ackAll(acks)
		rest = append(rest, acks...)
	}
	if len(rest) > 0 {
		o.finish(rest, true)
	}
}

// finish reports attempts whose outcomes were written (or given up on):
// to the observers, and to the reporter the reports that did not ride on
// their outcomes.
// signal tells the dispatcher: a write it did not see returned.
func (o *completer) finish(batch []*completion, signal bool) {
	o.claims.release(batch)
	o.pending.Add(-int64(len(batch)))
	if signal {
		select {
		case o.written <- struct{}{}:
		default:
		}
	}
	for _, c := range batch {
		o.obs.TaskFinished(c.topic, c.task, c.status, c.dur)
		if o.mobs != nil {
			o.mobs.MessageFinished(c.claim.ID, c.topic, c.task, c.status)
		}
		// A report that rode on its outcome is stored with it: only a
		// lost attempt's is left to the reporter then.
		if o.reporter != nil && (!o.carry || c.status == StatusLost) {
			if r, ok := c.report(o.workerID); ok {
				o.reporter.Report(r)
			}
		}
	}
}

// ackQueue holds the acks the collectors leave to the dispatcher, which
// takes them for its exchanges; it is the completer's side that faces the
// dispatcher.
type ackQueue struct {
	mu    sync.Mutex
	items []*completion
	open  bool          // the dispatcher runs and takes acks
	ready chan struct{} // acks were left: the dispatcher may send them
}

// leave gives acks to the dispatcher; false when it has stopped (the
// caller writes them).
func (q *ackQueue) leave(acks []*completion) bool {
	q.mu.Lock()
	if !q.open {
		q.mu.Unlock()
		return false
	}
	q.items = append(q.items, acks...)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
	return true
}

// take returns the acks left to the dispatcher, for its next exchange.
func (q *ackQueue) take() []*completion {
	q.mu.Lock()
	defer q.mu.Unlock()
	acks := q.items
	q.items = nil
	return acks
}

// requeue puts back acks an exchange could not write, ahead of the
// others, for the next one.
func (q *ackQueue) requeue(acks []*completion) {
	q.mu.Lock()
	q.items = append(acks, q.items...)
	q.mu.Unlock()
}

// close stops the queue, as the dispatcher ends, and returns what is left
// in it: from then on the collectors write their acks themselves.
func (q *ackQueue) close() []*completion {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.open = false
	acks := q.items
	q.items = nil
	return acks
}

// closeAcks closes the queue, as the dispatcher ends, and writes what is
// left in it.
func (o *completer) closeAcks() {
	acks := o.acks.close()
	if len(acks) > 0 {
		// Stop waits for this before its own bounds start: bound it here,
		// or a broker that does not answer would hold Stop for ever.
		stop, cancel := context.WithTimeout(o.giveUpCtx, flushTimeout)
		defer cancel()
		o.ackAllUntil(stop, acks)
		o.finish(acks, true)
	}
}

// claimGroup is the claim c's message came in (broker.Message.ClaimGroup);
// 0 when the broker names none.
func claimGroup(c *completion) int64 {
	if c.msg == nil {
		return 0
	}
	return c.msg.ClaimGroup
}

// heldBack reports whether the ack c waits for the exchanges in flight
// that carry acks of its claim (busy, exchanges.busy).
func heldBack(c *completion, busy map[int64]int) bool {
	g := claimGroup(c)
	return g != 0 && busy[g] > 0
}

// countExcept is how many acks left to the dispatcher are of no claim
// in busy.
func (q *ackQueue) countExcept(busy map[int64]int) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(busy) == 0 {
		return len(q.items)
	}
	n := 0
	for _, c := range q.items {
		if !heldBack(c, busy) {
			n++
		}
	}
	return n
}

// takeExcept is take, leaving in the queue the acks of the claims in busy.
func (q *ackQueue) takeExcept(busy map[int64]int) []*completion {
	if len(busy) == 0 {
		return q.take()
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	var take, keep []*completion
	for _, c := range q.items {
		if heldBack(c, busy) {
			keep = append(keep, c)
		} else {
			take = append(take, c)
		}
	}
	q.items = keep
	return take
}
