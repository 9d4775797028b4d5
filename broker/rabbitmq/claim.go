package rabbitmq

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/sqlstore"
)

// This file owns claims: which topics a claim asks, how much of each its
// limit admits, and the take of the deliveries fetch.go brings.

// Claim takes up to req.Max messages of req.Topics, round-robin as the
// broker contract says: it takes deliveries (fetchTopic) one topic after
// the other, each topic at most what its limit admits, then makes their
// rows running in the state store in one transaction (sqlstore.Take
// decides each); the deliveries stay unacked until their outcomes are
// stored. Deliveries that were stale are dropped and the claim goes on.
// Paused topics and topics at their limit are not asked for deliveries.
func (b *Broker) Claim(ctx context.Context, req broker.ClaimRequest) ([]broker.Message, error) {
	return b.claim(ctx, req, nil, nil)
}

// AckAndClaim writes the outcomes as Ack does while the claim takes its
// deliveries from RabbitMQ, and takes their rows once the outcomes are
// written, so that the claim sees the slots they free (broker.AckClaimer).
// When writing the outcomes fails, nothing is claimed. When the claim
// fails after the outcomes were written, it returns their errors and no
// message (the claim is logged, and the next one tries again).
func (b *Broker) AckAndClaim(ctx context.Context, outcomes []broker.Outcome, req broker.ClaimRequest) ([]error, []broker.Message, error) {
	if req.WorkerID == "" {
		return nil, nil, broker.Invalid("worker id is empty")
	}
	if len(outcomes) == 0 {
		msgs, err := b.Claim(ctx, req)
		if err != nil {
			return nil, nil, err
		}
		return []error{}, msgs, nil
	}
	freed := b.held.topics(outcomes)
	var (
		errs   []error
		ackErr error
		done   = make(chan struct{})
	)
	go func() {
		defer close(done)
		errs, ackErr = b.Ack(ctx, outcomes)
	}()
	acked := func() error {
		<-done
		return ackErr
	}
	msgs, err := b.claim(ctx, req, freed, acked)
	if err := acked(); err != nil {
		return nil, nil, err
	}
	if err != nil {
		b.log.Warn("claim after writing outcomes failed; the next claim tries again", "error", err)
		return errs, nil, nil
	}
	return errs, msgs, nil
}

// claim is Claim. With acks being written, freed counts the running
// slots of each topic they free, and acked waits for them: it is called
// before anything is taken, and its error ends the claim.
func (b *Broker) claim(ctx context.Context, req broker.ClaimRequest, freed map[string]int, acked func() error) ([]broker.Message, error) {
	if req.WorkerID == "" {
		return nil, broker.Invalid("worker id is empty")
	}
	if err := b.enter(ctx); err != nil {
		return nil, err
	}
	want := max(req.Max, 1)
	topics := broker.ClaimOrder(req.Topics, b.rr.Add(1)-1)
	if len(topics) == 0 {
		return nil, nil
	}
	// One claim of this process at a time takes from a limited topic: the
	// others would only lose the race for its last slots and put their
	// deliveries back. A topic known to be limited whose takes another
	// claim is doing is left out before anything is read.
	locked := make(map[string]bool)
	defer func() {
		for t := range locked {
			b.limitedMutex(t).Unlock()
		}
	}()
	var asked []string
	for _, t := range topics {
		if b.isLimited(t) {
			if !b.limitedMutex(t).TryLock() {
				continue
			}
			locked[t] = true
		}
		asked = append(asked, t)
	}
	if len(asked) == 0 {
		return nil, nil
	}
	left, err := b.state.Admits(ctx, asked)
	if err != nil {
		return nil, err
	}
	s, err := b.current()
	if err != nil {
		return nil, err
	}
	for _, t := range topics {
		n, known := left[t]
		if !slices.Contains(asked, t) {
			known = false
		}
		if known && n >= 0 && freed[t] > 0 {
			n += freed[t]
			left[t] = n
		}
		if known && n != sqlstore.Paused {
			b.setLimited(t, n != sqlstore.Unlimited)
		}
		switch {
		case !known || n == sqlstore.Paused:
			left[t] = 0
			continue
		case n == 0 && b.probeDue(t):
			left[t] = probeOne
		case n == 0:
			continue
		}
		if n != sqlstore.Unlimited && !locked[t] {
			if !b.limitedMutex(t).TryLock() {
				left[t] = 0
				continue
			}
			locked[t] = true
		}
	}
	var out []broker.Message
	for round := 0; round < maxClaimRounds && len(out) < want; round++ {
		got, err := b.fetch(ctx, s, topics, left, want-len(out))
		if err == nil && len(got) == 0 {
			break
		}
		if err == nil && acked != nil {
			if err = acked(); err != nil {
				releaseAll(got)
				return nil, err
			}
			acked = nil
		}
		if err == nil {
			var taken []broker.Message
			taken, err = b.take(ctx, s, req.WorkerID, got, left)
			out = append(out, taken...)
		}
		if err != nil {
			if len(out) > 0 {
				b.log.Warn("claim: stopped early", "error", err)
				return out, nil
			}
			return nil, err
		}
	}
	return out, nil
}

// maxClaimRounds bounds the rounds of fetching and taking of one claim
// (a round after the first only follows stale deliveries).
const maxClaimRounds = 8

// take makes the rows of deliveries got running for worker in one
// transaction, holds the deliveries of those taken, and settles the
// others: stale ones (their row ended, a live claim holds it, or it is
// gone) are acked; ones not available yet get their outbox
// entry back and are acked; ones whose topic is full or paused go to the
// end of their queue as new messages (so waiting costs no delivery) and
// their topic is asked no more in this claim.
func (b *Broker) take(ctx context.Context, s *session, worker string, got []fetched, left map[string]int) ([]broker.Message, error) {
	ds := make([]sqlstore.Delivery, len(got))
	for i, f := range got {
		ds[i] = sqlstore.Delivery{ID: f.id, Redelivered: f.d.Redelivered}
	}
	res, err := b.state.TakeMessages(ctx, worker, ds)
	if err != nil {
		releaseAll(got)
		return nil, err
	}
	var (
		out   []broker.Message
		wait  []int64
		later = make(map[string][]int64)
	)
	for i, r := range res {
		f := got[i]
		switch r.Verdict {
		case sqlstore.TakeOK:
			b.held.put(r.Message.Token, delivery{ch: f.ch, tag: f.d.DeliveryTag, topic: f.topic})
			out = append(out, r.Message)
		case sqlstore.TakeWait:
			wait = append(wait, f.id)
		case sqlstore.TakeLater:
			later[f.topic] = append(later[f.topic], f.id)
			left[f.topic] = 0
		default:
			// Stale: its place in the topic's share goes to the next.
			b.logDrop(f, r.Verdict)
			_ = f.d.Ack(false)
			if left[f.topic] != sqlstore.Unlimited {
				left[f.topic]++
			}
		}
	}
	var failed error
	if len(wait) > 0 {
		failed = b.state.OutboxAdd(ctx, wait, 0, 0)
	}
	for topic, ids := range later {
		if err := s.publish(ctx, topic, ids); err != nil && failed == nil {
			failed = err
		}
	}
	for i, r := range res {
		if r.Verdict == sqlstore.TakeWait || r.Verdict == sqlstore.TakeLater {
			if failed != nil {
				_ = got[i].d.Reject(true)
			} else {
				_ = got[i].d.Ack(false)
			}
		}
	}
	if failed != nil {
		b.log.Warn("claim: could not put untaken deliveries back as new messages; RabbitMQ requeued them", "error", failed)
	}
	return out, nil
}

// limitedMutex returns the mutex of limited topic t: see Claim.
func (b *Broker) limitedMutex(t string) *sync.Mutex {
	b.probeMu.Lock()
	defer b.probeMu.Unlock()
	mu := b.limited[t]
	if mu == nil {
		mu = new(sync.Mutex)
		b.limited[t] = mu
	}
	return mu
}

// isLimited reports whether topic had a concurrency limit at the last
// claim of this process that read it.
func (b *Broker) isLimited(topic string) bool {
	b.probeMu.Lock()
	defer b.probeMu.Unlock()
	return b.isLim[topic]
}

func (b *Broker) setLimited(topic string, limited bool) {
	b.probeMu.Lock()
	b.isLim[topic] = limited
	b.probeMu.Unlock()
}

// probeOne marks a topic at its limit whose queue a claim looks at once:
// see probeDue.
const probeOne = -3

// probeEvery is how often a broker looks at the queue of a topic at its
// limit.
const probeEvery = time.Second

// probeDue reports whether a claim should look at the queue of topic,
// which is at its limit, once: a slot may be held by a claim whose worker
// died, and its delivery, back in the queue (RabbitMQ serves returned
// deliveries first), passes the slot on only when it is taken. A fresh
// delivery met that way goes back to the end of the queue, so a topic
// at its limit pays that reordering at most once per probeEvery per
// process.
func (b *Broker) probeDue(topic string) bool {
	b.probeMu.Lock()
	defer b.probeMu.Unlock()
	if last, ok := b.probed[topic]; ok && time.Since(last) < probeEvery {
		return false
	}
	b.probed[topic] = time.Now()
	return true
}

// logDrop says why a delivery is dropped. A drop of a task that ended, or
// that a live claim holds, is routine (a duplicate pointer). So is one
// whose row is gone when the delivery carries this store's stamp: the
// row was cleared after its task ended, or purged. A delivery without a
// stamp (published by a version that did not stamp) whose row is gone may
// have been another store's task, which then waits in that store: that
// is said at WARN.
func (b *Broker) logDrop(f fetched, v sqlstore.Verdict) {
	switch {
	case v != sqlstore.TakeGone:
		b.log.Debug("dropped a delivery of a task that ended, or that a live claim holds (a duplicate)", "id", f.id, "topic", f.topic)
	case f.stamped:
		b.log.Debug("dropped a delivery of a task whose row is gone (cleared after it ended, or purged)", "id", f.id, "topic", f.topic)
	default:
		b.log.Warn("dropped a delivery without a state store stamp (published by an older version) whose task this state store does not have: "+
			"cleared after it ended, or purged; or another state store's task, published on this amqp_prefix, which then waits in that store",
			"id", f.id, "topic", f.topic, "this_store", b.storeID)
	}
}
