package rabbitmq

import (
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/taskhost/taskhost/broker"
)

// This file owns the broker's announcements (broker.Notifier): a message
// published, once RabbitMQ confirmed it, is announced to the pools of
// every process on the same prefix, so that one of them claims it at
// once.
//
//   - In the publishing process, at once.
//   - To the other processes through the fanout exchange <prefix>.announce:
//     each session binds an exclusive, auto-deleted queue of its own to
//     it. What a process publishes within announceGap is announced as one
//     message (the topics, as a JSON array), so that a burst of submits
//     costs a few announcements, not one each; a process ignores its own.
//
// Announcements are a shortcut, never the only way: one sent while a
// process was reconnecting is lost, and the messages RabbitMQ itself
// gives back (a dead holder's redeliveries) are not announced. So
// Listening is always false, and the pools poll at their claim idle
// interval as well.

var _ broker.Notifier = (*Broker)(nil)

// noticeBuffer is how many notices a subscription holds for a reader that
// is busy (it is claiming anyway).
const noticeBuffer = 256

// rebindEvery is how often a session declares the announce exchange and
// binds its queue again, in case an operator deleted the exchange (its
// queue then hears nothing, and nothing says so).
const rebindEvery = 30 * time.Second

// announceGap is the least time between two announcements a session
// sends to the other processes; topics published meanwhile wait for the
// next one.
const announceGap = 2 * time.Millisecond

// notices fans the announcements out to the subscriptions.
type notices struct {
	mu   sync.Mutex
	subs map[*subscription]struct{}
}

type subscription struct {
	n    *notices
	c    chan broker.Notice
	once sync.Once
}

func (s *subscription) Notices() <-chan broker.Notice { return s.c }

// Listening is false: announcements can be missed (see the file's
// comment), so the pools poll as well.
func (s *subscription) Listening() bool { return false }

func (s *subscription) Close() {
	s.once.Do(func() {
		s.n.mu.Lock()
		delete(s.n.subs, s)
		s.n.mu.Unlock()
	})
}

// Subscribe returns a subscription to the announcements of published
// messages (see the file's comment).
func (b *Broker) Subscribe() broker.Subscription {
	s := &subscription{n: &b.notices, c: make(chan broker.Notice, noticeBuffer)}
	b.notices.mu.Lock()
	if b.notices.subs == nil {
		b.notices.subs = make(map[*subscription]struct{})
	}
	b.notices.subs[s] = struct{}{}
	b.notices.mu.Unlock()
	return s
}

// announce tells the subscriptions that topic has messages available now;
// a subscription whose reader is behind misses it.
func (n *notices) announce(topic string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for s := range n.subs {
		select {
		case s.c <- broker.Notice{Topic: topic}:
		default:
		}
	}
}

// announceExchange is the fanout exchange of the announcements between
// processes.
func (n names) announceExchange() string { return n.prefix + ".announce" }

// announcer sends a session's announcements to the other processes and
// passes theirs to this process's subscriptions.
type announcer struct {
	b     *Broker
	from  string // this broker's id: its own announcements come back to it
	queue string // this session's queue, on the channel run holds

	mu      sync.Mutex
	pending map[string]bool
	wake    chan struct{}
}

// startAnnouncer declares the announce exchange and this session's queue
// on it, and starts the goroutine that sends and receives announcements
// until the connection closes; a channel that closes meanwhile (the
// exchange was deleted) is opened again.
func startAnnouncer(b *Broker, c *amqp.Connection) (*announcer, error) {
	a := &announcer{b: b, from: b.id, pending: make(map[string]bool), wake: make(chan struct{}, 1)}
	ch, in, err := a.open(c)
	if err != nil {
		return nil, err
	}
	go a.run(c, ch, in)
	return a, nil
}

// open opens a channel, declares the exchange and this session's queue,
// and consumes it.
func (a *announcer) open(c *amqp.Connection) (*amqp.Channel, <-chan amqp.Delivery, error) {
	ch, err := c.Channel()
	if err != nil {
		return nil, nil, err
	}
	fail := func(what string, err error) (*amqp.Channel, <-chan amqp.Delivery, error) {
		_ = ch.Close()
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return fail("declare this process's announcement queue", err)
	}
	a.queue = q.Name
	if err := a.bind(ch); err != nil {
		_ = ch.Close()
		return nil, nil, err
	}
	in, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		return fail("consume this process's announcements", err)
	}
	return ch, in, nil
}

// bind declares the exchange and binds this session's queue to it.
func (a *announcer) bind(ch *amqp.Channel) error {
	x := a.b.names.announceExchange()
	if err := ch.ExchangeDeclare(x, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", x, err)
	}
	if err := ch.QueueBind(a.queue, "", x, false, nil); err != nil {
		return fmt.Errorf("bind this process's announcement queue to %s: %w", x, err)
	}
	return nil
}

// run sends and receives announcements on ch until the connection
// closes, opening the channel again (each second) when it closes alone.
func (a *announcer) run(c *amqp.Connection, ch *amqp.Channel, in <-chan amqp.Delivery) {
	connClosed := c.NotifyClose(make(chan *amqp.Error, 1))
	for {
		if ch != nil {
			go a.receive(in)
			a.send(ch, connClosed, ch.NotifyClose(make(chan *amqp.Error, 1)))
		}
		select {
		case <-connClosed:
			return
		case <-time.After(time.Second):
		}
		var err error
		if ch, in, err = a.open(c); err != nil {
			a.b.log.Warn("announcements to the other processes stopped; their pools poll", "error", err)
		}
	}
}

// add queues topic for the next announcement to the other processes.
func (a *announcer) add(topic string) {
	a.mu.Lock()
	a.pending[topic] = true
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// send publishes the pending topics on ch as one announcement, at most
// one each announceGap, until the connection or ch closes, and binds
// again every rebindEvery. An announcement that cannot be sent is
// dropped: the pools poll.
func (a *announcer) send(ch *amqp.Channel, connClosed, chClosed <-chan *amqp.Error) {
	rebind := time.NewTicker(a.b.opts.rebindEvery)
	defer rebind.Stop()
	for {
		select {
		case <-connClosed:
			return
		case <-chClosed:
			return
		case <-rebind.C:
			if err := a.bind(ch); err != nil {
				a.b.log.Debug("could not bind the announcement queue again", "error", err)
			}
			continue
		case <-a.wake:
		}
		a.mu.Lock()
		topics := make([]string, 0, len(a.pending))
		for t := range a.pending {
			topics = append(topics, t)
		}
		clear(a.pending)
		a.mu.Unlock()
		body, err := json.Marshal(topics)
		if err == nil {
			err = ch.Publish(a.b.names.announceExchange(), "", false, false, amqp.Publishing{
				ContentType: "application/json",
				AppId:       a.from,
				Body:        body,
			})
		}
		if err != nil {
			a.b.log.Debug("could not announce published messages to the other processes; they poll", "error", err)
		}
		select {
		case <-connClosed:
			return
		case <-chClosed:
			return
		case <-time.After(announceGap):
		}
	}
}

// receive passes the other processes' announcements to this process's
// subscriptions, until the channel closes.
func (a *announcer) receive(in <-chan amqp.Delivery) {
	for d := range in {
		if d.AppId == a.from {
			continue
		}
		var topics []string
		if err := json.Unmarshal(d.Body, &topics); err != nil {
			continue // not an announcement of ours
		}
		for _, t := range topics {
			a.b.notices.announce(t)
		}
	}
}

// brokerID names a broker among the processes on one prefix.
func brokerID() string { return strconv.FormatInt(newArm(), 36) }
