package rabbitmq

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// This file owns how a topic's deliveries reach claims: by basic.get, one
// at a time, or through a consumer while the topic has a backlog.
//
// A basic.get on a quorum queue is a Raft command of its own (about a
// millisecond or more each), while a consumer's deliveries stream. So a
// claim whose get finds a backlog (feedAfter messages or more behind the
// one it took) starts a consumer on the topic's channel, and the claims that follow
// take its deliveries from the feed's buffer. A claim that finds the
// buffer short cancels the consumer and reads every delivery it was sent
// (after basic.cancel-ok there are no more), then goes on with gets: so a
// claim always sees every message the queue holds for it, as with gets
// alone, and a consumer runs only while claims keep it busy.
//
// Deliveries a consumer sent stay with this process until taken. Those no
// claim took for feedLinger (the pool is busy, or the topic is at its
// limit) are given back: published again as new messages and acked, so
// that other processes can take them and the wait costs no delivery (a
// RabbitMQ 3.10 quorum queue counts returns toward its delivery limit).
// Close gives back the same way. A process killed with deliveries in its
// buffer returns them through its closed connection, which counts.
//
// A consumer's prefetch counts its deliveries not yet acked, those running
// too. When its running ones use up its prefetch, the buffer runs short,
// the consumer stops, and the next gets that meet a backlog start a fresh
// one (a cancelled consumer keeps its deliveries until they are acked, so
// its running messages stay held).

// Tuning of the feeds.
const (
	// feedAfter is how many messages a basic.get must find behind the one
	// it took to start the topic's consumer.
	feedAfter = 2
	// feedPrefetch is a consumer's prefetch.
	feedPrefetch = 1000
	// feedFirst is how long the claim that starts a consumer waits for
	// its first delivery.
	feedFirst = 50 * time.Millisecond
	// feedLinger is how long deliveries wait in a buffer for a claim
	// before they are given back.
	feedLinger = time.Second
)

// consumer is one consumer of a topic queue.
type consumer struct {
	tag string
	in  <-chan amqp.Delivery
}

// feed is how one topic's deliveries reach the claims of a session.
type feed struct {
	mu   sync.Mutex
	ch   *amqp.Channel
	cur  *consumer // nil while not consuming
	buf  []amqp.Delivery
	used time.Time // when a claim last took from buf or wanted more
}

var consumerSeq atomic.Uint64

// feedOf returns the feed of topic on channel ch, a new one when the
// channel is new.
func (s *session) feedOf(topic string, ch *amqp.Channel) *feed {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.feeds[topic]
	if f == nil || f.ch != ch {
		f = &feed{ch: ch}
		s.feeds[topic] = f
	}
	return f
}

// next returns the next buffered delivery of f, reading what the consumer
// sent meanwhile; ok is false when there is none. A short buffer stops the
// consumer and reads all it sent (see the file's comment).
func (f *feed) next() (amqp.Delivery, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.used = time.Now()
	f.drain()
	if len(f.buf) == 0 && f.cur != nil {
		f.stop()
	}
	if len(f.buf) == 0 {
		return amqp.Delivery{}, false
	}
	d := f.buf[0]
	f.buf[0] = amqp.Delivery{}
	f.buf = f.buf[1:]
	return d, true
}

// drain moves what the consumer sent into buf, without waiting. f.mu is
// held.
func (f *feed) drain() {
	if f.cur == nil {
		return
	}
	for {
		select {
		case d, ok := <-f.cur.in:
			if !ok {
				// The channel closed: its deliveries went back.
				f.cur = nil
				return
			}
			f.buf = append(f.buf, d)
		default:
			return
		}
	}
}

// stop cancels the consumer and reads every delivery it sent (after
// basic.cancel-ok the client closes its delivery channel). f.mu is held.
func (f *feed) stop() {
	c := f.cur
	f.cur = nil
	if err := f.ch.Cancel(c.tag, false); err != nil {
		// The channel is closing: its deliveries go back with it.
		return
	}
	for d := range c.in {
		f.buf = append(f.buf, d)
	}
}

// start starts a consumer on queue when none runs, and waits up to
// feedFirst for its first delivery (the claim that starts it saw a
// backlog).
func (f *feed) start(queue string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.used = time.Now()
	if f.cur != nil {
		return nil
	}
	tag := fmt.Sprintf("taskhost-%d", consumerSeq.Add(1))
	in, err := f.ch.Consume(queue, tag, false, false, false, false, nil)
	if err != nil {
		return err
	}
	f.cur = &consumer{tag: tag, in: in}
	t := time.NewTimer(feedFirst)
	defer t.Stop()
	select {
	case d, ok := <-in:
		if ok {
			f.buf = append(f.buf, d)
		} else {
			f.cur = nil
		}
	case <-t.C:
	}
	return nil
}

// idle stops f's consumer and returns its buffered deliveries when no
// claim has used it for feedLinger.
func (f *feed) idle(now time.Time) []amqp.Delivery {
	f.mu.Lock()
	defer f.mu.Unlock()
	if now.Sub(f.used) < feedLinger || (f.cur == nil && len(f.buf) == 0) {
		return nil
	}
	return f.takeAll()
}

// takeAll stops f's consumer and returns every delivery it buffered.
// f.mu is held.
func (f *feed) takeAll() []amqp.Delivery {
	f.drain()
	if f.cur != nil {
		f.stop()
	}
	out := f.buf
	f.buf = nil
	return out
}

// feeds returns the session's feeds.
func (s *session) allFeeds() map[string]*feed {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]*feed, len(s.feeds))
	for t, f := range s.feeds {
		out[t] = f
	}
	return out
}

// giveBack gives deliveries of topic that no claim took back to the
// queue: published again as new messages, then acked; when that cannot
// be done, rejected (RabbitMQ requeues them, which counts toward their
// delivery limit).
func (b *Broker) giveBack(ctx context.Context, s *session, topic string, ds []amqp.Delivery) {
	if len(ds) == 0 {
		return
	}
	ids := make([]int64, 0, len(ds))
	for _, d := range ds {
		if id, err := idOf(d); err == nil {
			ids = append(ids, id)
		}
	}
	err := s.publish(ctx, topic, ids)
	for _, d := range ds {
		if err == nil {
			_ = d.Ack(false)
		} else {
			_ = d.Reject(true)
		}
	}
	if err != nil {
		b.log.Warn("could not give back deliveries no claim took; RabbitMQ requeued them", "topic", topic, "count", len(ds), "error", err)
	}
}

// feedLoop gives back, every feedLinger/4, the deliveries that waited in
// a buffer for feedLinger.
func (b *Broker) feedLoop() {
	defer b.wg.Done()
	t := time.NewTicker(feedLinger / 4)
	defer t.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case now := <-t.C:
			s, err := b.current()
			if err != nil {
				continue
			}
			for topic, f := range s.allFeeds() {
				b.giveBack(b.ctx, s, topic, f.idle(now))
			}
		}
	}
}

// closeFeeds gives back every buffered delivery of s, before its
// connection closes.
func (b *Broker) closeFeeds(ctx context.Context, s *session) {
	for topic, f := range s.allFeeds() {
		f.mu.Lock()
		ds := f.takeAll()
		f.mu.Unlock()
		b.giveBack(ctx, s, topic, ds)
	}
}
