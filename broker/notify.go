package broker

import "time"

// Notifier is implemented by brokers that announce submitted messages to
// the worker pools of every process sharing the store (postgres: LISTEN
// and NOTIFY). A pool whose broker has one claims when an announcement
// comes instead of polling, and polls only slowly (in case one is lost)
// while the announcements work. The memory and local brokers have none:
// their pools poll.
type Notifier interface {
	// Subscribe returns a new subscription to the announcements. Close it
	// when done.
	Subscribe() Subscription
}

// Subscription receives a Notifier's announcements.
type Subscription interface {
	// Notices delivers the announcements. It is buffered and never blocks
	// the broker: when the reader falls behind, notices are dropped (the
	// reader is busy claiming anyway). It is never closed.
	Notices() <-chan Notice
	// Listening reports whether announcements arrive now. While it is
	// false (the listening connection is down) the reader must poll.
	Listening() bool
	// Close ends the subscription. Closing twice is harmless.
	Close()
}

// Notice announces messages submitted to Topic, available Delay after the
// notice arrives (0: now). A Notice with an empty Topic says that notices
// may have been missed (listening started, stopped or came back): claim
// every topic and look at Listening again.
type Notice struct {
	Topic string
	Delay time.Duration
}
