package rabbitmq

import (
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/internal/testrabbit"
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

// TestAnnouncementsComeBackAfterTheExchangeIsDeleted: an operator
// deletes the announce exchange; the process whose announcement fails
// opens its channel again and declares the exchange, and the listening
// process binds its queue again, so announcements flow again.
func TestAnnouncementsComeBackAfterTheExchangeIsDeleted(t *testing.T) {
	a, b := twoOnOneStore(t, Options{rebindEvery: 200 * time.Millisecond})
	sub := b.Subscribe()
	defer sub.Close()
	ch, err := testrabbit.Connect(t).Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDelete(a.names.announceExchange(), false, false); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !noticeOf(sub, "again", 200*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no announcement reached the other process within 30s of the exchange's deletion")
		}
		mustSubmit(t, a, "again")
	}
}
