package brokertest

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// The counts of Stats are what the operators' reads (the broker gauges,
// GET topics, the dashboard) show. The SQL stores keep the queued and
// dead ones with the writes rather than counting the queue at each read,
// so every kind of write must keep them: each case below writes, then
// compares every topic's counts with its messages listed by state.

// counts are a topic's counts, as Stats gives them or as the messages
// listed by state make them.
type counts struct{ Queued, Running, Dead int }

// wantCounts checks that Stats counts, for each of topics, what its
// messages listed by state hold, and that these are want[topic] when
// want names the topic. what says which write came before.
func wantCounts(t *testing.T, b broker.Broker, what string, want map[string]counts, topics ...string) {
	t.Helper()
	st := stats(t, b)
	for _, topic := range topics {
		ts := topicStats(t, st, topic)
		got := counts{ts.Queued, ts.Running, ts.DeadLetter}
		listed := counts{
			len(list(t, b, broker.MessageFilter{Topic: topic, State: broker.StateQueued, Limit: 1000})),
			len(list(t, b, broker.MessageFilter{Topic: topic, State: broker.StateRunning, Limit: 1000})),
			len(list(t, b, broker.MessageFilter{Topic: topic, State: broker.StateDead, Limit: 1000})),
		}
		if got != listed {
			t.Fatalf("after %s, Stats of topic %s counts %+v, its messages listed by state %+v", what, topic, got, listed)
		}
		if w, ok := want[topic]; ok && got != w {
			t.Fatalf("after %s, Stats of topic %s counts %+v, want %+v", what, topic, got, w)
		}
	}
}

// testStatsCountEveryWrite: the queued, running and dead counts follow
// every write that moves a message between states, in both directions.
func testStatsCountEveryWrite(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	const a, c = "sa", "sc"
	setTopic(t, b, a, broker.TopicPatch{})
	setTopic(t, b, c, broker.TopicPatch{DeadLetterEnabled: ptr(false)})
	check := func(what string, want map[string]counts) {
		t.Helper()
		wantCounts(t, b, what, want, a, c)
	}
	check("nothing", map[string]counts{a: {}, c: {}})

	submitN(t, b, a, 4)
	submit(t, b, broker.SubmitRequest{Topic: a, Task: "task", Delay: time.Hour})
	reqs := make([]broker.SubmitRequest, 3)
	for i := range reqs {
		reqs[i] = broker.SubmitRequest{Topic: c, Task: "task", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
	}
	if _, err := b.SubmitMany(ctx, reqs); err != nil {
		t.Fatalf("SubmitMany: %v", err)
	}
	key := broker.SubmitRequest{Topic: c, Task: "task", UniqueKey: "k"}
	submit(t, b, key)
	if _, err := b.Submit(ctx, key); !errors.Is(err, broker.ErrDuplicate) {
		t.Fatalf("Submit of a duplicate: %v, want ErrDuplicate", err)
	}
	check("submits, a delayed one and a duplicate", map[string]counts{a: {Queued: 5}, c: {Queued: 4}})

	ms := claim(t, b, "w", 3, a)
	if len(ms) != 3 {
		t.Fatalf("claimed %d of topic %s, want 3", len(ms), a)
	}
	check("a claim", map[string]counts{a: {Queued: 2, Running: 3}})

	ack(t, b, ms[0].ClaimOf(), `{"ok":true}`)
	check("an ack", map[string]counts{a: {Queued: 2, Running: 2}})

	wantErr(t, "Ack under a spent token", ackErr(t, b, ms[0].ClaimOf()), broker.ErrClaimLost)
	check("a refused ack", map[string]counts{a: {Queued: 2, Running: 2}})

	if err := b.Nack(ctx, broker.NackRequest{Claim: ms[1].ClaimOf(), Requeue: true, Error: "again"}); err != nil {
		t.Fatalf("Nack(requeue): %v", err)
	}
	check("a requeueing nack", map[string]counts{a: {Queued: 3, Running: 1}})

	if err := b.Nack(ctx, broker.NackRequest{Claim: ms[2].ClaimOf(), Error: "boom"}); err != nil {
		t.Fatalf("Nack: %v", err)
	}
	check("a nack that dead-letters", map[string]counts{a: {Queued: 3, Dead: 1}})

	mc := claim(t, b, "w", 3, c)
	if len(mc) != 3 {
		t.Fatalf("claimed %d of topic %s, want 3", len(mc), c)
	}
	if err := b.Nack(ctx, broker.NackRequest{Claim: mc[0].ClaimOf(), Error: "boom"}); err != nil {
		t.Fatalf("Nack: %v", err)
	}
	check("a nack that fails (no dead letters)", map[string]counts{c: {Queued: 1, Running: 2}})

	if err := b.DeadLetter(ctx, mc[1].ClaimOf(), "poison", nil); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	check("a dead letter", map[string]counts{c: {Queued: 1, Running: 1, Dead: 1}})

	if _, err := b.Cancel(ctx, mc[2].ID); err != nil {
		t.Fatalf("Cancel(running): %v", err)
	}
	check("a cancel requested of a running message", map[string]counts{c: {Queued: 1, Running: 1, Dead: 1}})
	if err := b.Nack(ctx, broker.NackRequest{Claim: mc[2].ClaimOf(), Cancel: true}); err != nil {
		t.Fatalf("Nack(cancel): %v", err)
	}
	check("a cancelled attempt", map[string]counts{c: {Queued: 1, Dead: 1}})

	queuedA := list(t, b, broker.MessageFilter{Topic: a, State: broker.StateQueued, Limit: 10})
	if _, err := b.Cancel(ctx, queuedA[0].ID); err != nil {
		t.Fatalf("Cancel(queued): %v", err)
	}
	check("a cancel of a queued message", map[string]counts{a: {Queued: 2, Dead: 1}})

	failed := list(t, b, broker.MessageFilter{Topic: c, State: broker.StateFailed, Limit: 10})
	dead := list(t, b, broker.MessageFilter{Topic: c, State: broker.StateDead, Limit: 10})
	if len(failed) != 1 || len(dead) != 1 {
		t.Fatalf("topic %s has %d failed and %d dead messages, want 1 and 1", c, len(failed), len(dead))
	}
	for _, m := range []broker.Message{failed[0], dead[0]} {
		if err := b.Requeue(ctx, m.ID); err != nil {
			t.Fatalf("Requeue(%d): %v", m.ID, err)
		}
	}
	check("requeues of a failed and a dead message", map[string]counts{c: {Queued: 3}})

	if n, err := b.CancelQueued(ctx, broker.CancelFilter{Topic: c}); err != nil || n != 3 {
		t.Fatalf("CancelQueued(%s) = %d, %v; want 3", c, n, err)
	}
	check("a cancel of a topic's queued messages", map[string]counts{c: {}})

	submitN(t, b, a, 2)
	dl := claimOne(t, b, "w", a)
	if err := b.DeadLetter(ctx, dl.ClaimOf(), "poison", nil); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	check("more submits and a dead letter", map[string]counts{a: {Queued: 3, Dead: 2}})

	res, err := b.Purge(ctx, a, false)
	if err != nil || res.Queued != 3 || res.DeadLetter != 0 {
		t.Fatalf("Purge(%s, queued) = %+v, %v; want 3 queued purged", a, res, err)
	}
	check("a purge of the queue", map[string]counts{a: {Dead: 2}})
	submitN(t, b, a, 1)
	res, err = b.Purge(ctx, a, true)
	if err != nil || res.Queued != 1 || res.DeadLetter != 2 {
		t.Fatalf("Purge(%s, dead letters too) = %+v, %v; want 1 queued and 2 dead purged", a, res, err)
	}
	check("a purge of the queue and the dead letters", map[string]counts{a: {}, c: {}})
}

// testStatsCountReclaims: a reaper pass that requeues an orphan and
// dead-letters a poisoned one, and a reclaim of a worker known dead,
// keep the counts.
func testStatsCountReclaims(t *testing.T, s Store) {
	b := s.Broker
	ctx := ctxOf(t)
	const topic, grace = "sr", time.Minute
	register(t, b, "alive", "dead")
	submitN(t, b, topic, 3)
	wantCounts(t, b, "submits", map[string]counts{topic: {Queued: 3}}, topic)

	poisoned := claimOne(t, b, "dead", topic)
	s.AgeClaim(t, poisoned.ID, 2*grace)
	res, err := b.ReclaimOrphans(ctx, broker.ReclaimRequest{Live: []string{"alive"}, Grace: grace, MaxAttempts: 2})
	if err != nil || res.Reclaimed != 1 {
		t.Fatalf("ReclaimOrphans = %+v, %v; want one requeued", res, err)
	}
	wantCounts(t, b, "an orphan requeued", map[string]counts{topic: {Queued: 3}}, topic)

	var again broker.Message
	for _, m := range claim(t, b, "dead", 3, topic) {
		if m.ID == poisoned.ID {
			again = m
		} else {
			s.AgeClaim(t, m.ID, 2*grace)
		}
	}
	if again.ID == 0 {
		t.Fatalf("the requeued orphan %d was not claimed again", poisoned.ID)
	}
	s.AgeClaim(t, again.ID, 2*grace)
	wantCounts(t, b, "claims by a worker that dies", map[string]counts{topic: {Running: 3}}, topic)
	res, err = b.ReclaimOrphans(ctx, broker.ReclaimRequest{Live: []string{"alive"}, Grace: grace, MaxAttempts: 2})
	if err != nil || res.Reclaimed != 2 || res.DeadLettered != 1 {
		t.Fatalf("ReclaimOrphans = %+v, %v; want two requeued and one dead-lettered", res, err)
	}
	wantCounts(t, b, "a pass that requeues two orphans and dead-letters one", map[string]counts{topic: {Queued: 2, Dead: 1}}, topic)

	dr, ok := b.(broker.DeadReclaimer)
	if !ok {
		return
	}
	claim(t, b, "gone", 2, topic)
	wantCounts(t, b, "claims by a worker whose process ends", map[string]counts{topic: {Running: 2, Dead: 1}}, topic)
	if res, err := dr.ReclaimDead(ctx, broker.ReclaimRequest{Dead: []string{"gone"}, MaxAttempts: 5}); err != nil || res.Reclaimed != 2 {
		t.Fatalf("ReclaimDead = %+v, %v; want two requeued", res, err)
	}
	wantCounts(t, b, "a reclaim of a dead worker's claims", map[string]counts{topic: {Queued: 2, Dead: 1}}, topic)
}
