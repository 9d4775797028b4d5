package rabbitmq

import (
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// TestPublishesAreAnnouncedToOtherProcesses: a message one process
// publishes is announced to the subscriptions of another process on the
// same prefix (and to its own), so their pools claim it without waiting
// for their next poll.
func TestPublishesAreAnnouncedToOtherProcesses(t *testing.T) {
	a, b := twoOnOneStore(t, Options{})
	other := b.Subscribe()
	defer other.Close()
	own := a.Subscribe()
	defer own.Close()
	mustSubmit(t, a, "heard")
	for name, sub := range map[string]broker.Subscription{"the other process": other, "the publishing process": own} {
		if !noticeOf(sub, "heard", 30*time.Second) {
			t.Fatalf("%s got no notice of topic heard within 30s", name)
		}
	}
}

// noticeOf waits up to d for a notice of topic on sub.
func noticeOf(sub broker.Subscription, topic string, d time.Duration) bool {
	deadline := time.After(d)
	for {
		select {
		case n := <-sub.Notices():
			if n.Topic == topic {
				return true
			}
		case <-deadline:
			return false
		}
	}
}
