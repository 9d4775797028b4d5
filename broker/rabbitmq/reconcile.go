package rabbitmq

import (
	"context"
	"errors"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// This file owns the reconcile of the state store's queued messages with
// what the topic queues hold.
//
// A message in RabbitMQ is a pointer to a queued row. A queue purged by an
// operator (rabbitmqctl purge_queue), or messages RabbitMQ lost, leave
// their rows queued with nothing to deliver them, and unlike a deleted
// queue, which the next publish or claim meets, nothing else notices. So
// each process looks at the topics it uses: every reconcileEvery, and
// soon after a topic's claims, having taken deliveries, find its queue
// empty (at most once per reconcileIdle). A look reads the queue's ready
// count (a passive queue.declare, a few times early in reconcileSettle,
// keeping the highest), waits out the settle, then reads up to that many
// rows of the topic and reconcileBatch more, and keeps those RabbitMQ
// should hold (sqlstore.External.QueuedOutside: queued, available since
// the settle before the count, and without an outbox entry, so their
// publish was confirmed). More such rows than ready messages is a
// shortfall, which Missing shows once a second look finds it.
//
// The count sees only ready messages, so what it cannot see is told apart
// by time and by the rows themselves:
//
//   - a delivery on its way to a take (unacked, its row still queued) is
//     taken, or put back, within the settle: the rows read after it are
//     running, or ready again;
//   - a message whose publish was confirmed just before the count may not
//     be in it: its row is not read until it has been available for the
//     settle before the count. A delayed message, or one whose publish is
//     pending or failed, has no place in the count: its row is not
//     available yet, or has an outbox entry (the outbox publishes it);
//   - a running message's delivery is unacked and its row running: neither
//     side counts it;
//   - a duplicate pointer counts in the queue: it can hide a shortfall for
//     a while, never make one up, and once the queue has drained the
//     missing rows show;
//   - a take that puts a delivery back at the end of the queue (its topic
//     at its limit) leaves it unready for an instant, which one count may
//     catch and several hardly all do. And nothing is republished before
//     the topic has been short at every look for reconcileHold (a publish
//     lease).
//
// A look that reads fewer ready messages than rows it passed over (too
// young to judge, delayed, being published) looks again after
// reconcileIdle rather than reconcileEvery: a purge just after a submit
// is seen once its rows can be judged.
//
// The count does not say which rows are missing. RabbitMQ delivers a
// topic's messages in the order they were published, so after a purge the
// queue holds what was published since, and the rows missing are the
// oldest: a look republishes the oldest ones, as many as the queue is
// short and at most reconcileBatch, and the next looks the rest. A row
// republished that was there after all is a duplicate, dropped by its
// take ("a delivery runs only once its row is taken"); the queue then
// counts it, and the rows really missing show once the queue drains. The
// rows a process republished are not republished by it again within the
// hold, and a look that follows them (their messages may have been
// counted, then taken before the rows were read) neither confirms nor
// clears the shortfall.
//
// Several processes look at the same topics. The one that republishes a
// topic's rows holds the state store's lease "rabbitmq reconcile <topic>"
// (broker.Leaser) for reconcileHold, renewed at each republish, so one
// process at a time republishes a topic. The rows go through the outbox,
// due at once: the publisher loop of any process publishes each once,
// and a row that ended meanwhile is not published.

// Timing and bounds of the reconcile.
const (
	// reconcileEvery is how often a process looks at each topic it uses.
	reconcileEvery = 30 * time.Second
	// reconcileIdle is the least time between two looks at a topic
	// prompted by its claims, and between the looks at a topic found
	// short.
	reconcileIdle = 5 * time.Second
	// reconcileSettle is the wait between reading a queue's count and its
	// rows: the deliveries then on their way to a take have been taken or
	// put back. The count is read reconcileSamples times over its first
	// quarter, and the highest taken.
	reconcileSettle  = 3 * time.Second
	reconcileSamples = 4
	// reconcileBatch is the most rows one look republishes per topic, and
	// how many rows it reads beyond the queue's count.
	reconcileBatch = 5000
	// reconcileMaxReady: a queue with this many ready messages or more is
	// not compared with its rows (they are not read), so that a look reads
	// at most this many rows and reconcileBatch more. A shortfall behind a
	// deeper queue shows once it has drained below.
	reconcileMaxReady = 20000
)

// Why messages were published again: the values of Options.Republished.
const (
	// RepublishedMissing: queued messages that their topic queue had
	// lost (purged, or lost by RabbitMQ).
	RepublishedMissing = "missing"
)

// reconciler finds the queued messages the topic queues lost, and
// publishes them again (see the file's comment). Its loop is started and
// stopped by the broker; fetched and soon are called by claims and
// declarations.
type reconciler struct {
	b                         *Broker
	every, idle, hold, settle time.Duration
	batch                     int
	kick                      chan struct{}

	mu     sync.Mutex
	topics map[string]*watch
	looks  int // for tests
}

// watch is what the reconciler knows of one topic.
type watch struct {
	next    time.Time // when the topic is looked at next
	last    time.Time // the last look (its count)
	busy    bool      // a claim took deliveries of it since the last look
	missing int       // the shortfall at the last look, once two in a row found one
	// since is the first look of the shortfall the topic has had at every
	// look since (zero: none), and sent when this process republished
	// each row during it.
	since time.Time
	sent  map[int64]time.Time
}

func newReconciler(b *Broker) *reconciler {
	r := &reconciler{
		b: b, every: reconcileEvery, idle: reconcileIdle, hold: publishLease, settle: reconcileSettle,
		batch: reconcileBatch, kick: make(chan struct{}, 1), topics: make(map[string]*watch),
	}
	if o := b.opts; o.reconcileBatch > 0 {
		r.batch = o.reconcileBatch
	}
	if o := b.opts; o.reconcileEvery > 0 {
		r.every = o.reconcileEvery
	}
	if o := b.opts; o.reconcileIdle > 0 {
		r.idle = o.reconcileIdle
	}
	if o := b.opts; o.reconcileHold > 0 {
		r.hold = o.reconcileHold
	}
	return r
}

// watchOf returns topic's watch; r.mu is held.
func (r *reconciler) watchOf(topic string) *watch {
	w := r.topics[topic]
	if w == nil {
		w = &watch{}
		r.topics[topic] = w
	}
	return w
}

// fetched records what a fetch of topic found: deliveries (got), or an
// empty queue, which after deliveries makes the topic due for a look.
func (r *reconciler) fetched(topic string, got bool) {
	r.mu.Lock()
	w := r.watchOf(topic)
	due := false
	switch {
	case got:
		w.busy = true
	case w.busy:
		w.busy = false
		if at := w.last.Add(r.idle); at.Before(w.next) {
			w.next = at
			due = !at.After(time.Now())
		}
	}
	r.mu.Unlock()
	if due {
		r.wake()
	}
}

// soon makes topic due for a look now (its queue was empty when this
// session declared it: it may have lost its messages while no broker ran).
func (r *reconciler) soon(topic string) {
	r.mu.Lock()
	w := r.watchOf(topic)
	if at := w.last.Add(r.idle); at.Before(w.next) {
		w.next = at
	}
	r.mu.Unlock()
	r.wake()
}

func (r *reconciler) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// missing sums the shortfalls of the last looks.
func (r *reconciler) missing() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, w := range r.topics {
		n += w.missing
	}
	return n
}

// loop looks at the topics as they become due, until ctx ends.
func (r *reconciler) loop(ctx context.Context) {
	t := time.NewTicker(min(r.idle, time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.kick:
		}
		if err := r.pass(ctx); err != nil && ctx.Err() == nil {
			r.b.log.Warn("reconcile: looking at the topic queues failed; trying again", "error", err)
		}
	}
}

// due returns the topics this broker uses whose look is due at now.
func (r *reconciler) due(now time.Time) []string {
	known := r.b.knownTopics()
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, t := range known {
		if !r.watchOf(t).next.After(now) {
			out = append(out, t)
		}
	}
	return out
}

// pass looks at the topics that are due: their counts first, then, after
// the settle, their rows.
func (r *reconciler) pass(ctx context.Context) error {
	s, err := r.b.current()
	if err != nil {
		return nil // nothing to compare with; the reconnect comes first
	}
	topics := r.due(time.Now())
	if len(topics) == 0 {
		return nil
	}
	// The highest of several counts early in the settle: a delivery put back
	// at the end of its queue (its topic at its limit) is out of the
	// count while it is in flight, an instant that one count may catch
	// and several hardly all do. A later count is never higher for
	// messages taken meanwhile, and a queue that lost messages counts
	// low at every one.
	counted := time.Now()
	var ready map[string]int
	for i := range reconcileSamples {
		n, err := r.counts(s, topics)
		if err != nil {
			return err
		}
		if ready == nil {
			ready = n
		}
		for t, c := range n {
			ready[t] = max(ready[t], c)
		}
		wait := r.settle / (4 * reconcileSamples)
		if i == reconcileSamples-1 {
			wait = time.Until(counted.Add(r.settle))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
	for _, t := range topics {
		n, ok := ready[t]
		if !ok {
			r.done(t, counted, 0, nil, 0)
			continue
		}
		if n >= reconcileMaxReady {
			r.done(t, counted, 0, nil, 0)
			continue
		}
		// Rows available since the settle before the count: one whose
		// publish was confirmed just before it may not be counted yet.
		age := time.Since(counted) + r.settle
		ids, read, err := r.b.state.QueuedOutside(ctx, t, age, n+r.batch)
		if err != nil {
			return err
		}
		if pick, shortFor := r.done(t, counted, n, ids, read); len(pick) > 0 {
			r.republish(ctx, t, n, len(ids), pick, shortFor)
		}
	}
	return nil
}

// counts reads the ready count of each topic's queue. A queue that is
// missing is left out: the next claim or publish of its topic declares it
// again and publishes its queued messages (see readReturns).
func (r *reconciler) counts(s *session, topics []string) (map[string]int, error) {
	ch, err := s.conn.Channel()
	if err != nil {
		return nil, err
	}
	defer func() { _ = ch.Close() }()
	out := make(map[string]int, len(topics))
	for _, t := range topics {
		q, err := ch.QueueDeclarePassive(r.b.names.topic(t), true, false, false, false, nil)
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			// The failure closed the channel.
			if ch, err = s.conn.Channel(); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		out[t] = q.Messages
	}
	return out, nil
}

// done records a look at topic: its queue held ready messages at counted;
// of the read rows of the topic the look read, ids (oldest first) should
// have been in it. It returns the rows to republish once the topic has
// been short at every look for the hold: as many as it is short (at most
// reconcileBatch), the oldest first, less those this process republished
// within the hold; and how long the topic has been short.
func (r *reconciler) done(topic string, counted time.Time, ready int, ids []int64, read int) (pick []int64, shortFor time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.looks++
	w := r.watchOf(topic)
	w.last = counted
	short := len(ids) - ready
	for id, at := range w.sent {
		if counted.Sub(at) >= r.hold {
			delete(w.sent, id)
		}
	}
	if short <= 0 && !w.since.IsZero() && len(w.sent) > 0 {
		// This process republished rows of the topic within the hold:
		// the queue may have been counted with them and the rows read
		// once they were taken. The look tells nothing either way, and
		// the shortfall is kept.
		w.missing = 0
		w.next = counted.Add(r.idle)
		return nil, 0
	}
	if short <= 0 {
		w.missing, w.since, w.sent = 0, time.Time{}, nil
		w.next = counted.Add(r.every)
		if read > ready {
			// The queue holds fewer messages than the topic's rows, which
			// are too young to judge, delayed or being published: look
			// again once the young ones can be.
			w.next = counted.Add(r.idle)
		}
		return nil, 0
	}
	w.next = counted.Add(r.idle)
	if w.since.IsZero() {
		w.since = counted
	}
	if w.since.Before(counted) {
		// Shown once a second look finds it: one look may catch what
		// the count cannot see.
		w.missing = short
	}
	shortFor = counted.Sub(w.since)
	r.b.log.Debug("reconcile: a topic queue holds fewer messages than the rows it should", "topic", topic,
		"ready_in_queue", ready, "queued_in_store", len(ids), "short_for", shortFor.Round(time.Second).String())
	if shortFor < r.hold {
		if end := w.since.Add(r.hold); end.Before(w.next) {
			w.next = end
		}
		return nil, shortFor
	}
	for _, id := range ids {
		if len(pick) == min(short, r.batch) {
			break
		}
		if _, sent := w.sent[id]; !sent {
			pick = append(pick, id)
		}
	}
	return pick, shortFor
}

// republish puts rows ids of topic in the outbox, due at once, when this
// process holds the topic's reconcile lease: its queue held ready
// messages while outside rows should have been there.
func (r *reconciler) republish(ctx context.Context, topic string, ready, outside int, ids []int64, shortFor time.Duration) {
	b := r.b
	if _, held, err := b.state.TryLease(ctx, "rabbitmq reconcile "+topic, b.id, r.hold); err != nil || !held {
		if err != nil {
			b.log.Debug("reconcile: could not take the topic's lease; the next look tries again", "topic", topic, "error", err)
		}
		return // another process republishes this topic's rows
	}
	if err := b.state.OutboxAdd(ctx, ids, 0, 0); err != nil {
		b.log.Warn("reconcile: could not mark missing messages for publishing; the next look tries again", "topic", topic, "error", err)
		return
	}
	b.kickPublisher()
	now := time.Now()
	r.mu.Lock()
	w := r.watchOf(topic)
	if w.sent == nil {
		w.sent = make(map[int64]time.Time)
	}
	for _, id := range ids {
		w.sent[id] = now
	}
	short := w.missing
	r.mu.Unlock()
	b.opts.Republished(RepublishedMissing, len(ids))
	b.log.Warn("a topic queue lacks queued tasks (purged, or lost by RabbitMQ); publishing them again",
		"topic", topic, "queue", b.names.topic(topic), "ready_in_queue", ready, "queued_in_store", outside,
		"missing", short, "republished", len(ids), "short_for", shortFor.Round(time.Second).String())
}
