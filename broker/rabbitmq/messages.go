package rabbitmq

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/taskhost/taskhost/broker"
)

// publishLease is how long a message's outbox entry waits for the process
// that publishes it itself (a submit, a requeue) before the publisher
// loop of any process publishes it: only a process that died in between
// leaves one that long.
const publishLease = 15 * time.Second

// newArm returns a mark for the outbox entries one write arms (see
// sqlstore.External): random, never 0 (no one's).
func newArm() int64 { return rand.Int64N(math.MaxInt64) + 1 }

// delivery is a delivery held unacked while its message runs.
type delivery struct {
	ch    *amqp.Channel
	tag   uint64
	topic string
}

// heldDeliveries are the deliveries of this process's running claims, by
// claim token.
type heldDeliveries struct {
	mu sync.Mutex
	m  map[string]delivery
}

func (h *heldDeliveries) put(token string, d delivery) {
	h.mu.Lock()
	h.m[token] = d
	h.mu.Unlock()
}

// take removes the delivery of token and returns it.
func (h *heldDeliveries) take(token string) (delivery, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	d, ok := h.m[token]
	delete(h.m, token)
	return d, ok
}

// topics counts, by topic, the outcomes whose deliveries this process
// holds: the running slots they free.
func (h *heldDeliveries) topics(outcomes []broker.Outcome) map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]int)
	for _, o := range outcomes {
		if d, ok := h.m[o.Claim.Token]; ok {
			out[d.topic]++
		}
	}
	return out
}

// ack acks the delivery of the claim token once its outcome is stored,
// and returns its topic ("" when this process does not hold it). A
// delivery whose channel has closed meanwhile came back to RabbitMQ: its
// next take finds its message ended and drops it.
func (h *heldDeliveries) ack(token string) string {
	d, ok := h.take(token)
	if !ok {
		return ""
	}
	_ = d.ch.Ack(d.tag, false)
	return d.topic
}

// Submit validates req, stores its row in the state store (with its
// outbox entry, in one transaction) and, when it is available at once,
// publishes it and waits for RabbitMQ's confirm. A duplicate returns the
// holder's id and a *broker.DuplicateError. When RabbitMQ cannot take it
// now, the message is stored all the same: the publisher loop publishes
// it once RabbitMQ is back.
func (b *Broker) Submit(ctx context.Context, req broker.SubmitRequest) (int64, error) {
	if err := broker.ValidateSubmit(req, b.opts.MaxPayload); err != nil {
		return 0, err
	}
	out, err := b.SubmitBatch(ctx, []broker.SubmitRequest{req})
	if err != nil {
		return 0, err
	}
	if out[0].Duplicate {
		return out[0].ID, &broker.DuplicateError{ID: out[0].ID, Key: req.UniqueKey}
	}
	return out[0].ID, nil
}

// SubmitMany stores reqs as SubmitBatch does and returns their ids.
func (b *Broker) SubmitMany(ctx context.Context, reqs []broker.SubmitRequest) ([]int64, error) {
	out, err := b.SubmitBatch(ctx, reqs)
	return broker.IDs(out), err
}

// SubmitBatch stores reqs in one transaction of the state store, with
// their outbox entries, then publishes those available at once, topic by
// topic, and waits for the confirms (see Submit).
func (b *Broker) SubmitBatch(ctx context.Context, reqs []broker.SubmitRequest) ([]broker.Submitted, error) {
	if err := b.enter(ctx); err != nil {
		return nil, err
	}
	arm := newArm()
	out, err := b.state.SubmitOutbox(ctx, reqs, publishLease, arm)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	byTopic := make(map[string][]int64)
	var topics []string
	for i, s := range out {
		if s.Duplicate || reqs[i].AvailableAt(now).After(now) {
			continue
		}
		t := reqs[i].Topic
		if _, ok := byTopic[t]; !ok {
			topics = append(topics, t)
		}
		byTopic[t] = append(byTopic[t], s.ID)
	}
	for _, t := range topics {
		b.publishNow(ctx, t, byTopic[t], arm)
	}
	return out, nil
}

// publishNow publishes messages ids of topic, whose outbox entries were
// armed with arm, and deletes the entries that still carry it; when it
// cannot, it makes the entries due now, for the publisher loop.
func (b *Broker) publishNow(ctx context.Context, topic string, ids []int64, arm int64) {
	err := b.publish(ctx, topic, ids)
	if err == nil {
		b.done.add(arm, ids)
		return
	}
	b.log.Warn("publish failed; the publisher loop will retry", "topic", topic, "count", len(ids), "error", err)
	if err := b.state.OutboxAdd(context.WithoutCancel(ctx), ids, 0, 0); err != nil {
		b.log.Warn("outbox: could not mark entries due; they are published when their lease ends", "error", err)
	}
	b.kickPublisher()
}

// publish publishes ids of topic on the current session.
func (b *Broker) publish(ctx context.Context, topic string, ids []int64) error {
	s, err := b.current()
	if err != nil {
		return err
	}
	return s.publish(ctx, topic, ids)
}

// Ack stores the outcomes in the state store (token-checked: a lost claim
// is broker.ErrClaimLost there and changes nothing), then acks their
// deliveries.
func (b *Broker) Ack(ctx context.Context, outcomes []broker.Outcome) ([]error, error) {
	if err := b.enter(ctx); err != nil {
		return nil, err
	}
	errs, err := b.state.Ack(ctx, outcomes)
	if err != nil {
		return errs, err
	}
	for _, o := range outcomes {
		b.held.ack(o.Claim.Token)
	}
	return errs, nil
}

// Nack stores the attempt's end in the state store, then acks its
// delivery. A requeued message is published again as a new message: at
// once without a delay, else by the publisher loop when it is due (its
// outbox entry is written before the nack, so a crash in between loses
// nothing).
func (b *Broker) Nack(ctx context.Context, req broker.NackRequest) error {
	if err := b.enter(ctx); err != nil {
		return err
	}
	requeue := req.Requeue && !req.Cancel && req.Delay >= 0 && req.Delay <= broker.MaxDelay
	var arm int64
	if requeue {
		due := req.Delay
		if due == 0 {
			due = publishLease
		}
		arm = newArm()
		if err := b.state.OutboxAdd(ctx, []int64{req.Claim.ID}, due, arm); err != nil {
			return err
		}
	}
	if err := b.state.Nack(ctx, req); err != nil {
		return err
	}
	topic := b.held.ack(req.Claim.Token)
	if requeue && req.Delay == 0 {
		b.publishMessage(ctx, req.Claim.ID, topic, arm)
	}
	return nil
}

// publishMessage publishes message id (of topic, looked up when empty)
// at once.
func (b *Broker) publishMessage(ctx context.Context, id int64, topic string, arm int64) {
	if topic == "" {
		m, err := b.state.GetMessage(ctx, id)
		if err != nil {
			b.kickPublisher()
			return
		}
		topic = m.Topic
	}
	b.publishNow(ctx, topic, []int64{id}, arm)
}

// DeadLetter ends the attempt dead in the state store (with its report,
// when given), then acks its delivery.
func (b *Broker) DeadLetter(ctx context.Context, c broker.Claim, reason string, report *broker.Report) error {
	if err := b.enter(ctx); err != nil {
		return err
	}
	if err := b.state.DeadLetter(ctx, c, reason, report); err != nil {
		return err
	}
	b.held.ack(c.Token)
	return nil
}

// Requeue puts a dead or failed message back in the queue and publishes
// it (its outbox entry is written first).
func (b *Broker) Requeue(ctx context.Context, id int64) error {
	if err := b.enter(ctx); err != nil {
		return err
	}
	arm := newArm()
	if err := b.state.OutboxAdd(ctx, []int64{id}, publishLease, arm); err != nil {
		return err
	}
	if err := b.state.Requeue(ctx, id); err != nil {
		return err
	}
	b.publishMessage(ctx, id, "", arm)
	return nil
}

// FireSchedule fires through the state store and publishes the message
// it submitted.
func (b *Broker) FireSchedule(ctx context.Context, req broker.FireRequest) (broker.FireResult, error) {
	res, err := b.state.FireSchedule(ctx, req)
	if err != nil {
		return res, err
	}
	b.publishFired(ctx, []broker.FireRequest{req}, []broker.FireResult{res})
	return res, nil
}

// FireSchedules fires through the state store and publishes the messages
// they submitted.
func (b *Broker) FireSchedules(ctx context.Context, reqs []broker.FireRequest) ([]broker.FireResult, error) {
	res, err := b.state.FireSchedules(ctx, reqs)
	if err != nil {
		return res, err
	}
	b.publishFired(ctx, reqs, res)
	return res, nil
}

// publishFired publishes the messages fires submitted. Their rows are in
// the state store already; the outbox entry comes first, so that the
// publisher loop publishes them if this fails.
func (b *Broker) publishFired(ctx context.Context, reqs []broker.FireRequest, res []broker.FireResult) {
	for i, r := range res {
		if !r.Fired || r.Duplicate || r.MessageID == 0 || i >= len(reqs) || reqs[i].Submit == nil {
			continue
		}
		arm := newArm()
		if err := b.state.OutboxAdd(ctx, []int64{r.MessageID}, publishLease, arm); err != nil {
			b.log.Warn("outbox: could not add a fired message", "id", r.MessageID, "error", err)
			continue
		}
		b.publishNow(ctx, reqs[i].Submit.Topic, []int64{r.MessageID}, arm)
	}
}

// republishTopic puts every queued message of topic in the outbox, due at
// once: its queue was lost.
func (b *Broker) republishTopic(topic string) {
	n, err := b.state.OutboxAddQueued(b.ctx, topic, 0)
	if err != nil {
		b.log.Error("could not mark a lost queue's messages for publishing again", "topic", topic, "error", err)
		return
	}
	b.log.Info("publishing a lost queue's messages again", "topic", topic, "count", n)
	b.kickPublisher()
}

// remember records queues this broker declared (see Queues).
func (b *Broker) remember(queues ...string) {
	b.queueMu.Lock()
	for _, q := range queues {
		b.queues[q] = true
	}
	b.queueMu.Unlock()
}

// rememberTopic records a topic whose queues this broker declared: its
// dead queue is read from then on (see deadLoop).
func (b *Broker) rememberTopic(topic string) {
	b.queueMu.Lock()
	b.topics[topic] = true
	b.queueMu.Unlock()
}

// knownTopics returns the topics whose queues this broker declared.
func (b *Broker) knownTopics() []string {
	b.queueMu.Lock()
	defer b.queueMu.Unlock()
	out := make([]string, 0, len(b.topics))
	for t := range b.topics {
		out = append(out, t)
	}
	return out
}
