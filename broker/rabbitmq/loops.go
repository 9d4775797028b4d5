package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/sqlstore"
)

// Intervals of the loops.
const (
	publishEvery = 100 * time.Millisecond
	doneEvery    = 20 * time.Millisecond
	deadEvery    = time.Second
	outboxBatch  = 500
)

// kickPublisher wakes the publisher loop.
func (b *Broker) kickPublisher() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// publishLoop publishes the outbox entries that are due: delayed
// messages once available, messages whose publisher died or failed, lost
// queues' messages.
func (b *Broker) publishLoop() {
	defer b.wg.Done()
	t := time.NewTicker(publishEvery)
	defer t.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-t.C:
		case <-b.kick:
		}
		if err := b.publishDue(b.ctx); err != nil && b.ctx.Err() == nil {
			b.log.Debug("outbox: publishing due messages failed; retrying", "error", err)
		}
	}
}

// publishDue publishes the due outbox entries, in batches.
func (b *Broker) publishDue(ctx context.Context) error {
	s, err := b.current()
	if err != nil {
		return err
	}
	for {
		es, err := b.state.OutboxDue(ctx, publishLease, outboxBatch, newArm())
		if err != nil {
			return err
		}
		byTopic := make(map[string][]sqlstore.OutboxEntry)
		var topics []string
		for _, e := range es {
			if _, ok := byTopic[e.Topic]; !ok {
				topics = append(topics, e.Topic)
			}
			byTopic[e.Topic] = append(byTopic[e.Topic], e)
		}
		for _, t := range topics {
			ids := make([]int64, len(byTopic[t]))
			for i, e := range byTopic[t] {
				ids[i] = e.ID
			}
			if err := s.publish(ctx, t, ids); err != nil {
				return fmt.Errorf("publish to topic %s: %w", t, err)
			}
			if err := b.state.OutboxDone(ctx, byTopic[t]); err != nil {
				return err
			}
		}
		if len(es) < outboxBatch {
			return nil
		}
	}
}

// publishedEntries are the outbox entries of published messages, deleted
// in batches by doneLoop: a submit then waits for one write to the state
// store, not two. An entry whose delete is lost (the process died first)
// publishes its message again once its lease has passed: a duplicate,
// which its take drops. An entry armed again before its delete (see
// sqlstore.External) stays.
type publishedEntries struct {
	mu   sync.Mutex
	ids  []sqlstore.OutboxEntry
	kick chan struct{}
}

// add records messages ids, published after their entries were armed
// with arm.
func (p *publishedEntries) add(arm int64, ids []int64) {
	p.mu.Lock()
	for _, id := range ids {
		p.ids = append(p.ids, sqlstore.OutboxEntry{ID: id, Arm: arm})
	}
	full := len(p.ids) >= outboxBatch
	p.mu.Unlock()
	if full {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
}

func (p *publishedEntries) takeAll() []sqlstore.OutboxEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := p.ids
	p.ids = nil
	return ids
}

// doneLoop deletes the outbox entries of published messages, every
// doneEvery or when a batch is full, and once more when the broker
// closes.
func (b *Broker) doneLoop() {
	defer b.wg.Done()
	t := time.NewTicker(doneEvery)
	defer t.Stop()
	for {
		stopping := false
		select {
		case <-b.ctx.Done():
			stopping = true
		case <-t.C:
		case <-b.done.kick:
		}
		for ids := b.done.takeAll(); len(ids) > 0; ids = b.done.takeAll() {
			for len(ids) > 0 {
				n := min(len(ids), outboxBatch)
				if err := b.state.OutboxDone(context.Background(), ids[:n]); err != nil {
					b.log.Warn("outbox: could not delete published entries; their messages are published again when their lease ends (duplicates are dropped)", "error", err)
				}
				ids = ids[n:]
			}
		}
		if stopping {
			return
		}
	}
}

// deadLoop reads the dead queues of the topics this process uses: a
// message RabbitMQ dead-lettered (it reached the delivery limit: a worker
// died holding it each time) ends dead in the state store, where it is
// listed and can be requeued; the state store's row is the dead letter.
func (b *Broker) deadLoop() {
	defer b.wg.Done()
	t := time.NewTicker(deadEvery)
	defer t.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-t.C:
		}
		s, err := b.current()
		if err != nil {
			continue
		}
		if err := b.readDead(b.ctx, s); err != nil && b.ctx.Err() == nil {
			b.log.Warn("reading dead letters failed; retrying", "error", err)
		}
	}
}

// readDead moves every message of the known topics' dead queues into the
// state store.
func (b *Broker) readDead(ctx context.Context, s *session) error {
	topics := b.knownTopics()
	if len(topics) == 0 {
		return nil
	}
	ch, err := s.conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	for _, topic := range topics {
		for {
			d, ok, err := ch.Get(b.names.dead(topic), false)
			if err != nil {
				s.forget(topic)
				return err
			}
			if !ok {
				break
			}
			// Another store's message must not end the row of this
			// store that has its id.
			id, _, err := b.ours(d)
			if err != nil {
				b.reject(ctx, s, topic, d, err)
				continue
			}
			reason := deathReason(d, b.opts.DeliveryLimit)
			ended, err := b.state.EndUndeliverable(ctx, id, reason)
			if err != nil {
				_ = d.Nack(false, true)
				return err
			}
			if ended {
				b.log.Warn("RabbitMQ dead-lettered a message", "id", id, "topic", topic, "reason", reason)
			} else {
				b.log.Debug("RabbitMQ dead-lettered a message that had ended already (or whose row is gone); dropped", "id", id, "topic", topic)
			}
			_ = d.Ack(false)
		}
	}
	return nil
}

// deathReason is the last error of a message RabbitMQ dead-lettered.
func deathReason(d amqp.Delivery, limit int) string {
	why, _ := d.Headers["x-first-death-reason"].(string)
	if why == "delivery_limit" {
		return fmt.Sprintf(broker.OrphanedErrorPrefix+" RabbitMQ dead-lettered it after %d deliveries (delivery limit, orphan_max_attempts): a worker died holding it each time", limit)
	}
	if why == "" {
		why = "unknown"
	}
	return fmt.Sprintf("RabbitMQ dead-lettered it (reason %s)", why)
}

// RejectReasonHeader is the header that says why a delivery was moved to
// its topic's rejected queue (<prefix>.t.<topic>.rejected).
const RejectReasonHeader = "x-taskhost-reason"

// reject moves a delivery that is not one of the broker's messages (why:
// no message id of ours, or another state store's stamp) to its topic's
// rejected queue, with why in RejectReasonHeader, for an operator to look
// at; it never runs, and is never acked before its copy is confirmed. It
// is counted (Options.Rejected) and logged: another store's task as an
// error, since that store's task waits for it.
func (b *Broker) reject(ctx context.Context, s *session, topic string, d amqp.Delivery, why error) {
	reason := why.Error()
	queue := b.names.rejected(topic)
	err := func() error {
		ch, err := s.conn.Channel()
		if err != nil {
			return err
		}
		defer func() { _ = ch.Close() }()
		if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
			return err
		}
		b.remember(queue)
		headers := amqp.Table{}
		for k, v := range d.Headers {
			headers[k] = v
		}
		headers[RejectReasonHeader] = reason
		if err := ch.Confirm(false); err != nil {
			return err
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
			Headers: headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
			DeliveryMode: amqp.Persistent, MessageId: d.MessageId, Type: d.Type, Timestamp: d.Timestamp,
			AppId: d.AppId, Body: d.Body,
		})
		if err != nil {
			return err
		}
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return fmt.Errorf("publish to %s not confirmed: %v", queue, err)
		}
		return nil
	}()
	if err != nil {
		b.log.Error("could not move a foreign message to the rejected queue; it goes back to its queue", "queue", queue, "reason", reason, "error", err)
		_ = d.Reject(true)
		return
	}
	_ = d.Ack(false)
	var other *otherStoreError
	if errors.As(why, &other) {
		b.opts.Rejected(RejectedOtherStore)
		b.log.Error("moved a task of another state store to the rejected queue: it is that store's, and waits there for it",
			"topic", topic, "queue", queue, "message_id", other.id, "its_store", other.theirs, "this_store", b.storeID, "reason", reason)
		return
	}
	b.opts.Rejected(RejectedNotATask)
	b.log.Warn("moved a message that is not a task to the rejected queue", "topic", topic, "queue", queue, "reason", reason)
}

// RedeliveryWindow is how long RabbitMQ may take to bring back the
// deliveries of a process that died or froze: it closes a connection
// after about two missed heartbeats; the rest is margin.
func (b *Broker) RedeliveryWindow() time.Duration {
	return 3*b.opts.Heartbeat + 5*time.Second
}

// ReclaimOrphans is the reaper's pass on this broker. A dead or frozen
// worker's messages come back by RabbitMQ's own means: its connection
// closes (or misses its heartbeats), RabbitMQ redelivers its deliveries,
// and the next take makes each row running under a new claim (its old
// claim ends, its locks are released, and its late outcome is
// broker.ErrClaimLost); after DeliveryLimit deliveries RabbitMQ
// dead-letters the message instead and its row ends dead.
//
// The pass does not reclaim those again: it leaves every claim younger
// than RedeliveryWindow (its grace is raised to at least that). It runs
// the state store's pass with the same guards (empty live set, fence,
// grace, orphan budget), which reclaims only the running messages
// RabbitMQ did not bring back in that time (their queue was deleted or
// purged, or RabbitMQ lost them) and publishes them again, and releases
// the locks of non-live holders past the grace: a dead holder's lock is
// freed even when its message is not taken again. Then it reports what
// RabbitMQ did since the last pass as its own: the redeliveries taken
// from dead holders count as Reclaimed, the messages dead-lettered at the
// delivery limit as DeadLettered, all in IDs; so the reaper's counters
// keep their meaning. A pass the guards refuse reports nothing of it
// (the next one does).
func (b *Broker) ReclaimOrphans(ctx context.Context, req broker.ReclaimRequest) (broker.ReclaimResult, error) {
	if err := b.enter(ctx); err != nil {
		return broker.ReclaimResult{}, err
	}
	if w := b.RedeliveryWindow(); req.Grace >= 0 && req.Grace < w {
		req.Grace = w
	}
	res, err := b.state.ReclaimOrphans(ctx, req)
	if err != nil {
		return res, err
	}
	requeued := res.IDs
	// What RabbitMQ did since the last pass, counted as the pass's own.
	reclaimed, dead, err := b.state.TakeOrphanLog(ctx)
	if err != nil {
		b.log.Warn("reaper pass: could not read what RabbitMQ redelivered and dead-lettered", "error", err)
	}
	res.Reclaimed += len(reclaimed)
	res.DeadLettered += len(dead)
	res.IDs = append(append(res.IDs, reclaimed...), dead...)
	if len(requeued) == 0 {
		return res, nil
	}
	arm := newArm()
	if err := b.state.OutboxAdd(ctx, requeued, publishLease, arm); err != nil {
		return res, fmt.Errorf("reclaimed %d messages, but could not mark them for publishing: %w", len(requeued), err)
	}
	for _, id := range requeued {
		if m, err := b.state.GetMessage(ctx, id); err == nil && m.State == broker.StateQueued {
			b.publishNow(ctx, m.Topic, []int64{id}, arm)
		}
	}
	return res, nil
}
