package rabbitmq

import (
	"sync"

	"github.com/taskhost/taskhost/broker"
)

// This file owns the broker's announcements (broker.Notifier): a message
// this process published, once RabbitMQ confirmed it, is announced to the
// pools of this process, so that one of them claims it at once. Messages
// other processes publish are not announced: Listening is always false,
// and the pools poll at their claim idle interval as well.

var _ broker.Notifier = (*Broker)(nil)

// noticeBuffer is how many notices a subscription holds for a reader that
// is busy (it is claiming anyway).
const noticeBuffer = 256

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

// Listening is false: only this process's publishes are announced.
func (s *subscription) Listening() bool { return false }

func (s *subscription) Close() {
	s.once.Do(func() {
		s.n.mu.Lock()
		delete(s.n.subs, s)
		s.n.mu.Unlock()
	})
}

// Subscribe returns a subscription to the announcements of the messages
// this process publishes (see the file's comment).
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
