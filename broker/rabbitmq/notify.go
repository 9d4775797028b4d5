package rabbitmq

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
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

// announceQueue is the name of one connection's queue on the announce
// exchange: exclusive to it and deleted with it, and under the prefix, so
// that the rights a broker needs are those on its prefix.
func (n names) announceQueue(broker string) string {
	return n.announceExchange() + "." + broker + "-" + strconv.FormatInt(newArm(), 36)
}

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

// startAnnouncer starts the announcements of session connection c: it
// opens their channel (declares the announce exchange and the
// connection's queue on it) and starts the goroutine that sends and
// receives them until the connection closes. Announcements are a
// shortcut: when the channel cannot be opened, or closes alone (the
// exchange was deleted), a warning says so, the pools poll, and it is
// opened again later.
func startAnnouncer(b *Broker, c *amqp.Connection) *announcer {
	a := &announcer{b: b, from: b.id, pending: make(map[string]bool), wake: make(chan struct{}, 1)}
	ch, in, err := a.open(c)
	go a.run(c, ch, in, err)
	return a
}

// open opens a channel, declares the exchange and this connection's
// queue, and consumes it. On an error, a queue it declared is deleted.
func (a *announcer) open(c *amqp.Connection) (_ *amqp.Channel, _ <-chan amqp.Delivery, err error) {
	ch, err := c.Channel()
	if err != nil {
		return nil, nil, err
	}
	a.queue = ""
	defer func() {
		if err == nil {
			return
		}
		_ = ch.Close()
		if a.queue == "" {
			return
		}
		// The failure may have closed ch: delete the queue on a channel
		// of its own.
		if del, derr := c.Channel(); derr == nil {
			_, _ = del.QueueDelete(a.queue, false, false, false)
			_ = del.Close()
		}
	}()
	x := a.b.names.announceExchange()
	if err := ch.ExchangeDeclare(x, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return nil, nil, fmt.Errorf("declare exchange %s: %w", x, err)
	}
	name := a.b.names.announceQueue(a.from)
	if _, err := ch.QueueDeclare(name, false, true, true, false, nil); err != nil {
		return nil, nil, fmt.Errorf("declare queue %s: %w", name, err)
	}
	a.queue = name
	if err := a.bind(ch); err != nil {
		return nil, nil, err
	}
	in, err := ch.Consume(name, "", true, true, false, false, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("consume queue %s: %w", name, err)
	}
	return ch, in, nil
}

// bind declares the exchange and binds this connection's queue to it.
func (a *announcer) bind(ch *amqp.Channel) error {
	x := a.b.names.announceExchange()
	if err := ch.ExchangeDeclare(x, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", x, err)
	}
	if err := ch.QueueBind(a.queue, "", x, false, nil); err != nil {
		return fmt.Errorf("bind queue %s to %s: %w", a.queue, x, err)
	}
	return nil
}

// run sends and receives announcements on ch (opened with err) until the
// connection closes, opening the channel again when it closes alone or
// could not be opened: after a second, and up to 30 s apart while that
// fails. A failure is logged once until the channel is open again.
func (a *announcer) run(c *amqp.Connection, ch *amqp.Channel, in <-chan amqp.Delivery, err error) {
	connClosed := c.NotifyClose(make(chan *amqp.Error, 1))
	wait, warned := time.Second, false
	for {
		if err == nil {
			wait, warned = time.Second, false
			go a.receive(in)
			a.send(ch, connClosed, ch.NotifyClose(make(chan *amqp.Error, 1)))
		} else {
			if !warned {
				warned = true
				a.b.log.Warn("announcements to the other processes are off; their pools poll until they are back", "error", err)
			}
			wait = min(wait*2, 30*time.Second)
		}
		select {
		case <-connClosed:
			return
		case <-time.After(wait):
		}
		ch, in, err = a.open(c)
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
		topics := slices.Collect(maps.Keys(a.pending))
		clear(a.pending)
		a.mu.Unlock()
		body, err := json.Marshal(topics)
		if err == nil {
			err = ch.Publish(a.b.names.announceExchange(), "", false, false, amqp.Publishing{
				ContentType: "application/json",
				AppId:       a.from,
				Headers:     a.b.stamp,
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
		if st, ok := d.Headers[StoreHeader]; ok && st != a.b.storeID {
			continue // another store's topics
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
