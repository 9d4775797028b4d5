package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// A claim starts from where the previous one did (claimFloors), but a
// message that becomes available behind that point is still claimed: the
// claim that comes back short walks the queue from its start.
func TestClaimFindsMessagesBehindTheFloor(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := context.Background()
	submitN(t, b, "t", 6)
	req := broker.ClaimRequest{WorkerID: "w", Topics: []string{"t"}, Max: 2}
	first, err := b.Claim(ctx, req)
	if err != nil || len(first) != 2 {
		t.Fatalf("first claim: %d messages, %v", len(first), err)
	}
	if _, ok := b.floors.get("t", time.Now()); !ok {
		t.Fatal("no floor after a claim that got all it asked for: the test would not test the floor")
	}

	// A message committed now with a key older than every queued one, as a
	// transaction that took its now() long ago and committed late leaves.
	c := schemaConn(t, b)
	var straggler int64
	if err := c.QueryRow(ctx, `INSERT INTO tw_messages (topic, task, available_at)
		VALUES ('t', 'x', now() - interval '1 hour') RETURNING id`).Scan(&straggler); err != nil {
		t.Fatal(err)
	}

	got := map[int64]bool{}
	for range 10 {
		msgs, err := b.Claim(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if got[m.ID] {
				t.Fatalf("message %d claimed twice", m.ID)
			}
			got[m.ID] = true
		}
		if len(msgs) < req.Max {
			break
		}
	}
	if !got[straggler] {
		t.Fatalf("the message behind the floor (%d) was not claimed; claimed %v", straggler, got)
	}
	if len(got) != 5 {
		t.Fatalf("claimed %d messages after the first claim, want the 4 left and the straggler", len(got))
	}
}

// A claim the topic's limit cuts short has not run out of queue: the floor
// stays, and the next claim starts there.
func TestClaimKeepsTheFloorWhenTheLimitBinds(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := context.Background()
	limit := 2
	if _, err := b.SetTopic(ctx, "t", broker.TopicPatch{ConcurrencyLimit: &limit}); err != nil {
		t.Fatal(err)
	}
	submitN(t, b, "t", 6)
	req := broker.ClaimRequest{WorkerID: "w", Topics: []string{"t"}, Max: 5}
	first, err := b.Claim(ctx, req)
	if err != nil || len(first) != 2 {
		t.Fatalf("first claim: %d messages, %v; want the limit's 2", len(first), err)
	}
	fl, ok := b.floors.get("t", time.Now())
	at, id := fl.at, fl.id
	if !ok || id != first[1].ID || !at.Equal(first[1].AvailableAt) {
		t.Fatalf("floor after a claim the limit cut short: %v %d %v, want the last message claimed (%d)", at, id, ok, first[1].ID)
	}
	if !b.floors.isLimited("t") {
		t.Fatal("a claim of a limited topic did not note it limited: its acks would not announce the slots they free")
	}
	none, err := b.Claim(ctx, req)
	if err != nil || len(none) != 0 {
		t.Fatalf("claim at the limit: %d messages, %v", len(none), err)
	}
	if _, ok := b.floors.get("t", time.Now()); !ok {
		t.Fatal("a claim the limit allowed nothing cleared the floor")
	}
	outcomes := []broker.Outcome{{Claim: first[0].ClaimOf()}, {Claim: first[1].ClaimOf()}}
	if errs, err := b.Ack(ctx, outcomes); err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatalf("ack: %v %v", errs, err)
	}
	next, err := b.Claim(ctx, req)
	if err != nil || len(next) != 2 || next[0].ID <= first[1].ID {
		t.Fatalf("claim after the acks: %d messages, %v; want the next 2 in line", len(next), err)
	}
}

// submitN submits n messages of task x to topic.
func submitN(t *testing.T, b *Broker, topic string, n int) {
	t.Helper()
	for i := range n {
		if _, err := b.Submit(context.Background(), broker.SubmitRequest{Topic: topic, Task: "x", Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))}); err != nil {
			t.Fatal(err)
		}
	}
}

// A message submitted with a higher priority than the floor's is behind
// the floor; its announcement drops the floor, so the next claim takes it
// first without waiting for a walk from the start.
func TestHigherPriorityDropsTheFloor(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := context.Background()
	s := b.Subscribe()
	defer s.Close()
	waitFor(t, "listening", s.Listening)
	submitN(t, b, "t", 6)
	req := broker.ClaimRequest{WorkerID: "w", Topics: []string{"t"}, Max: 2}
	if first, err := b.Claim(ctx, req); err != nil || len(first) != 2 {
		t.Fatalf("first claim: %d messages, %v", len(first), err)
	}
	if _, ok := b.floors.get("t", time.Now()); !ok {
		t.Fatal("no floor after a claim that got all it asked for: the test would not test the floor")
	}
	urgent, err := b.Submit(ctx, broker.SubmitRequest{Topic: "t", Task: "x", Priority: 50})
	if err != nil {
		t.Fatal(err)
	}
	// (get also says no floor once a walk from the start is due: read the
	// floor itself.)
	waitFor(t, "the announcement to drop the floor", func() bool {
		b.floors.mu.Lock()
		defer b.floors.mu.Unlock()
		return b.floors.m["t"].id == 0
	})
	msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"t"}, Max: 1})
	if err != nil || len(msgs) != 1 || msgs[0].ID != urgent {
		t.Fatalf("claim after the urgent submit = %v, %v; want message %d", ids(msgs), err, urgent)
	}
}

func ids(msgs []broker.Message) []int64 {
	out := make([]int64, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

// The tokens of one claim are made from its claim row's id and key and
// each message's id (claimToken): they differ between the messages of a
// claim, and a message claimed again gets a token unrelated to its
// earlier ones. A token shared by a claim's messages would let a stale
// claim's ack of one pass the fence of another.
func TestClaimTokensDifferPerRowAndPerClaim(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := context.Background()
	submitN(t, b, "tok", 5)
	seen := map[string]int64{}
	req := broker.ClaimRequest{WorkerID: "w", Topics: []string{"tok"}, Max: 5}
	for round := range 3 {
		msgs, err := b.Claim(ctx, req)
		if err != nil || len(msgs) != 5 {
			t.Fatalf("round %d: claimed %d, %v; want 5", round, len(msgs), err)
		}
		for _, m := range msgs {
			if len(m.Token) != 36 {
				t.Fatalf("token %q is not a uuid", m.Token)
			}
			if id, dup := seen[m.Token]; dup {
				t.Fatalf("round %d: message %d got token %s, already given to message %d", round, m.ID, m.Token, id)
			}
			seen[m.Token] = m.ID
			if err := b.Nack(ctx, broker.NackRequest{Claim: m.ClaimOf(), Requeue: true, NotRun: true}); err != nil {
				t.Fatal(err)
			}
		}
	}
}
