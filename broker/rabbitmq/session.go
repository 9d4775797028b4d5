package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// names builds the names of the broker's queues and exchanges.
type names struct{ prefix string }

// topic is the quorum queue of a topic's messages.
func (n names) topic(t string) string { return n.prefix + ".t." + t }

// dead is the queue RabbitMQ dead-letters a topic's messages into.
func (n names) dead(t string) string { return n.topic(t) + ".dead" }

// rejected is where deliveries that are not the broker's messages go.
func (n names) rejected(t string) string { return n.topic(t) + ".rejected" }

// deadExchange routes dead letters by their queue's name into its dead
// queue.
func (n names) deadExchange() string { return n.prefix + ".dead" }

// session is one connection to RabbitMQ with its channels: one in
// confirm mode for publishing, one per topic for taking deliveries (a
// channel error, such as a queue deleted by an operator, closes only that
// topic's channel and takes back only its deliveries).
type session struct {
	b    *Broker
	conn *amqp.Connection

	pubMu sync.Mutex
	pub   *amqp.Channel
	ann   *announcer

	mu       sync.Mutex
	topics   map[string]*amqp.Channel
	declared map[string]bool
	fetching topicLocks // see fetchTopic
}

func newSession(b *Broker, c *amqp.Connection) (*session, error) {
	s := &session{b: b, conn: c, topics: make(map[string]*amqp.Channel), declared: make(map[string]bool)}
	pub, err := c.Channel()
	if err != nil {
		return nil, err
	}
	if err := pub.Confirm(false); err != nil {
		return nil, fmt.Errorf("confirm mode: %w", err)
	}
	s.pub = pub
	returns := pub.NotifyReturn(make(chan amqp.Return, 64))
	go s.readReturns(returns)
	ch, err := c.Channel()
	if err != nil {
		return nil, err
	}
	defer func() { _ = ch.Close() }()
	if err := b.claimPrefix(ch); err != nil {
		return nil, err
	}
	if err := ch.ExchangeDeclare(b.names.deadExchange(), amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		return nil, fmt.Errorf("declare exchange %s: %w", b.names.deadExchange(), err)
	}
	s.ann = startAnnouncer(b, c)
	return s, nil
}

func (s *session) close() { _ = s.conn.Close() }

// declare declares topic's queues when this session has not yet: the
// topic's quorum queue (delivery limit, dead-lettering into its dead
// queue) and its dead queue.
func (s *session) declare(topic string) error {
	s.mu.Lock()
	done := s.declared[topic]
	s.mu.Unlock()
	if done {
		return nil
	}
	ch, err := s.conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	n := s.b.names
	args := amqp.Table{
		"x-queue-type":              "quorum",
		"x-dead-letter-exchange":    n.deadExchange(),
		"x-dead-letter-routing-key": n.topic(topic),
	}
	if s.b.opts.DeliveryLimit > 0 {
		// RabbitMQ counts returns: a limit of L dead-letters at the
		// (L+1)th return, after L+1 deliveries.
		args["x-delivery-limit"] = int64(s.b.opts.DeliveryLimit - 1)
	}
	q, err := ch.QueueDeclare(n.topic(topic), true, false, false, false, args)
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
		// The queue exists with other arguments (its delivery limit was
		// declared with another orphan_max_attempts): it is used as it
		// is. The failed declare closed the channel.
		s.b.log.Warn("a topic queue exists with other arguments; using it as it is (to change its delivery limit, delete the queue while no worker runs, or set a policy)",
			"queue", n.topic(topic), "error", ae.Reason)
		if ch, err = s.conn.Channel(); err != nil {
			return err
		}
		defer func() { _ = ch.Close() }()
		q, err = ch.QueueDeclarePassive(n.topic(topic), true, false, false, false, nil)
	}
	if err != nil {
		return fmt.Errorf("declare queue %s: %w", n.topic(topic), err)
	}
	if _, err := ch.QueueDeclare(n.dead(topic), true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		return fmt.Errorf("declare queue %s: %w", n.dead(topic), err)
	}
	if err := ch.QueueBind(n.dead(topic), n.topic(topic), n.deadExchange(), false, nil); err != nil {
		return fmt.Errorf("bind queue %s: %w", n.dead(topic), err)
	}
	s.b.remember(n.topic(topic), n.dead(topic))
	s.b.rememberTopic(topic)
	s.mu.Lock()
	s.declared[topic] = true
	s.mu.Unlock()
	if q.Messages == 0 {
		// An empty queue may have lost its messages (purged, or lost by
		// RabbitMQ while no broker ran): the reconcile looks at it now.
		s.b.recon.soon(topic)
	}
	return nil
}

// forget makes the next use of topic declare its queues again.
func (s *session) forget(topic string) {
	s.mu.Lock()
	delete(s.declared, topic)
	s.mu.Unlock()
}

// topicChannel returns the channel that takes topic's deliveries, opened
// (and the topic declared) on first use or after it closed, with the
// mutex its fetches hold.
func (s *session) topicChannel(topic string) (*amqp.Channel, *sync.Mutex, error) {
	s.mu.Lock()
	ch := s.topics[topic]
	s.mu.Unlock()
	if ch != nil && !ch.IsClosed() {
		return ch, s.fetching.of(topic), nil
	}
	if ch != nil {
		// It closed on an error: the queue may be gone.
		s.forget(topic)
	}
	if err := s.declare(topic); err != nil {
		return nil, nil, err
	}
	ch, err := s.conn.Channel()
	if err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	if old := s.topics[topic]; old != nil && !old.IsClosed() {
		s.mu.Unlock()
		_ = ch.Close()
		return old, s.fetching.of(topic), nil
	}
	s.topics[topic] = ch
	s.mu.Unlock()
	return ch, s.fetching.of(topic), nil
}

// envelopeType marks the broker's messages (AMQP type property); the
// message id property is the message's id in the state store.
const envelopeType = "taskhost.message"

// idOf returns the message id a delivery carries, or why it is not one
// of the broker's messages.
func idOf(d amqp.Delivery) (int64, error) {
	if d.Type != envelopeType {
		return 0, fmt.Errorf("not a taskhost message: type %q, want %q", d.Type, envelopeType)
	}
	id, err := strconv.ParseInt(d.MessageId, 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("not a taskhost message: message id %q is not a message id", d.MessageId)
	}
	return id, nil
}

// errNacked: RabbitMQ refused a publish (it could not store it).
var errNacked = errors.New("rabbitmq refused the message (publisher confirm was a nack)")

// publish publishes messages ids of topic, persistent and mandatory, and
// waits for RabbitMQ's confirms, then announces them (notify.go). A message RabbitMQ cannot route (its
// queue was deleted) comes back as a return: see readReturns.
func (s *session) publish(ctx context.Context, topic string, ids []int64) error {
	if err := s.declare(topic); err != nil {
		return err
	}
	key := s.b.names.topic(topic)
	confirms := make([]*amqp.DeferredConfirmation, 0, len(ids))
	s.pubMu.Lock()
	for _, id := range ids {
		sid := strconv.FormatInt(id, 10)
		dc, err := s.pub.PublishWithDeferredConfirmWithContext(ctx, "", key, true, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent,
			ContentType:  "application/json",
			Headers:      s.b.stamp,
			Type:         envelopeType,
			MessageId:    sid,
			Body:         []byte(`{"id":` + sid + `}`),
		})
		if err != nil {
			s.pubMu.Unlock()
			return fmt.Errorf("publish to %s: %w", key, err)
		}
		confirms = append(confirms, dc)
	}
	s.pubMu.Unlock()
	for _, dc := range confirms {
		ok, err := dc.WaitContext(ctx)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("publish to %s: %w", key, errNacked)
		}
	}
	if len(ids) > 0 {
		s.b.notices.announce(topic)
		s.ann.add(topic)
	}
	return nil
}

// readReturns handles the messages RabbitMQ could not route: their topic
// queue is gone (deleted by an operator). The topic is declared again at
// the next use, and its queued messages are published again.
func (s *session) readReturns(returns <-chan amqp.Return) {
	for r := range returns {
		topic, ok := s.b.names.topicOf(r.RoutingKey)
		if !ok {
			continue
		}
		s.forget(topic)
		s.b.log.Warn("a topic queue is missing (deleted?); declaring it again and publishing its queued messages again",
			"queue", r.RoutingKey, "reply", r.ReplyText)
		s.b.republishTopic(topic)
	}
}

// topicOf returns the topic of a topic queue's name.
func (n names) topicOf(queue string) (string, bool) {
	p := n.prefix + ".t."
	if len(queue) <= len(p) || queue[:len(p)] != p {
		return "", false
	}
	return queue[len(p):], true
}

// Redact describes an AMQP URL without its password.
func Redact(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "an unparsable URL"
	}
	return p.Redacted()
}
