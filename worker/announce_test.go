package worker

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/memory"
)

// fakeSubscription is a subscription whose notices the test sends.
type fakeSubscription struct {
	c         chan broker.Notice
	listening atomic.Bool
}

func (s *fakeSubscription) Notices() <-chan broker.Notice { return s.c }
func (s *fakeSubscription) Listening() bool               { return s.listening.Load() }
func (s *fakeSubscription) Close()                        {}

// announcingBroker is a memory broker with announcements
// (broker.Notifier) the test sends.
type announcingBroker struct {
	*memory.Broker
	sub *fakeSubscription
}

func (a *announcingBroker) Subscribe() broker.Subscription { return a.sub }

func newAnnouncingBroker(listening bool) *announcingBroker {
	a := &announcingBroker{Broker: memory.New(), sub: &fakeSubscription{c: make(chan broker.Notice, 16)}}
	a.sub.listening.Store(listening)
	return a
}

func TestAnnouncementsWakeTheDispatcher(t *testing.T) {
	ab := newAnnouncingBroker(true)
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "x", Handler: func(context.Context, *TaskContext) (any, error) { return nil, nil }})
	// Both waits an hour: only the announcements make the pool claim.
	startPool(t, ab, reg, Options{ClaimIdleInterval: time.Hour, ClaimIdleFallback: time.Hour})
	ctx := context.Background()

	id, err := ab.Submit(ctx, broker.SubmitRequest{Topic: broker.DefaultTopic, Task: "x", Payload: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	ab.sub.c <- broker.Notice{Topic: "some other topic"}
	ab.sub.c <- broker.Notice{Topic: broker.DefaultTopic}
	waitState(t, ab, id, broker.StateDone)

	// Delayed messages: the pool claims each when it is due.
	var ids []int64
	for _, d := range []time.Duration{300 * time.Millisecond, 100 * time.Millisecond} {
		id, err := ab.Submit(ctx, broker.SubmitRequest{Topic: broker.DefaultTopic, Task: "x", Payload: json.RawMessage(`{}`), Delay: d})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		ab.sub.c <- broker.Notice{Topic: broker.DefaultTopic, Delay: d}
	}
	for _, id := range ids {
		waitState(t, ab, id, broker.StateDone)
	}
}

func TestPoolPollsWhileAnnouncementsAreDown(t *testing.T) {
	ab := newAnnouncingBroker(false)
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "x", Handler: func(context.Context, *TaskContext) (any, error) { return nil, nil }})
	startPool(t, ab, reg, Options{ClaimIdleInterval: 10 * time.Millisecond, ClaimIdleFallback: time.Hour})
	// No announcement comes, and the fallback is an hour: the pool finds
	// the message by polling at its idle interval.
	id := submit(t, ab, "x", `{}`)
	waitState(t, ab, id, broker.StateDone)
}

// heldClaimBroker is an announcing broker whose claims, while hold is
// set, wait for release and then return nothing: a claim whose snapshot
// was taken before what the test does meanwhile.
type heldClaimBroker struct {
	*announcingBroker
	hold    atomic.Bool
	held    chan struct{} // a held claim is waiting
	release chan struct{}
}

func (h *heldClaimBroker) Claim(ctx context.Context, req broker.ClaimRequest) ([]broker.Message, error) {
	if h.hold.Load() {
		h.held <- struct{}{}
		<-h.release
		return nil, nil
	}
	return h.announcingBroker.Claim(ctx, req)
}

// TestAnnouncementDuringAClaimIsNotLost: an announcement that comes while
// a claim is out, which did not see its message, makes the pool claim
// again once that claim comes back short, rather than wait for its idle
// interval.
func TestAnnouncementDuringAClaimIsNotLost(t *testing.T) {
	hb := &heldClaimBroker{announcingBroker: newAnnouncingBroker(true), held: make(chan struct{}), release: make(chan struct{})}
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "x", Handler: func(context.Context, *TaskContext) (any, error) { return nil, nil }})
	hb.hold.Store(true)
	// Both waits an hour: only the announcements make the pool claim.
	startPool(t, hb, reg, Options{ClaimIdleInterval: time.Hour, ClaimIdleFallback: time.Hour})
	select {
	case <-hb.held: // the pool's first claim is out
	case <-time.After(waitDeadline):
		t.Fatal("the pool did not claim")
	}
	id := submit(t, hb, "x", `{}`)
	hb.sub.c <- broker.Notice{Topic: broker.DefaultTopic}
	// Only the dispatcher reads the notices: once the channel is empty,
	// it has read them while its claim was out.
	hb.sub.c <- broker.Notice{Topic: "some other topic"}
	deadline := time.Now().Add(waitDeadline)
	for len(hb.sub.c) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the dispatcher did not read the notices while its claim was out")
		}
		time.Sleep(time.Millisecond)
	}
	hb.hold.Store(false)
	close(hb.release)
	waitState(t, hb, id, broker.StateDone)
}
