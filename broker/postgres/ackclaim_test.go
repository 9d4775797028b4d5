package postgres

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// TestAckAndClaim: the acks are written before the claim in the same
// transaction, so on a topic at its limit the claim gets the slots they
// free; a stale claim is ErrClaimLost; a refused call writes nothing.
func TestAckAndClaim(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	if _, err := b.SetTopic(ctx, "ac", broker.TopicPatch{ConcurrencyLimit: ptr(2)}); err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for range 5 {
		id, err := b.Submit(ctx, broker.SubmitRequest{Topic: "ac", Task: "x"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	first, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"ac"}, Max: 5})
	if err != nil || len(first) != 2 {
		t.Fatalf("first claim = %d messages, %v", len(first), err)
	}
	// At the limit: a plain claim gets nothing.
	if msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"ac"}, Max: 5}); err != nil || len(msgs) != 0 {
		t.Fatalf("claim at the limit = %d messages, %v", len(msgs), err)
	}

	// A result that is not JSON: refused, nothing written.
	bad := []broker.Outcome{{Claim: first[0].ClaimOf()}, {Claim: first[1].ClaimOf(), Result: json.RawMessage(`{`)}}
	if _, _, err := b.AckAndClaim(ctx, bad, broker.ClaimRequest{WorkerID: "w", Topics: []string{"ac"}, Max: 5}); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("AckAndClaim with a bad result: %v", err)
	}
	if m, _ := b.GetMessage(ctx, first[0].ID); m.State != broker.StateRunning {
		t.Fatalf("after a refused AckAndClaim the message is %s", m.State)
	}

	stale := first[1].ClaimOf()
	stale.Token = "00000000-0000-0000-0000-000000000000"
	outcomes := []broker.Outcome{
		{Claim: first[0].ClaimOf(), Result: json.RawMessage(`{"ok":1}`)},
		{Claim: stale},
		{Claim: first[1].ClaimOf()},
	}
	errs, msgs, err := b.AckAndClaim(ctx, outcomes, broker.ClaimRequest{WorkerID: "w", Topics: []string{"ac"}, Max: 5})
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) != 3 || errs[0] != nil || !errors.Is(errs[1], broker.ErrClaimLost) || errs[2] != nil {
		t.Fatalf("ack errors = %v", errs)
	}
	if len(msgs) != 2 || msgs[0].ID != ids[2] || msgs[1].ID != ids[3] {
		t.Fatalf("AckAndClaim claimed %v, want ids %d and %d (the acks free both slots)", msgs, ids[2], ids[3])
	}
	if m, _ := b.GetMessage(ctx, first[0].ID); m.State != broker.StateDone || string(m.Result) != `{"ok": 1}` {
		t.Fatalf("acked message: %s %s", m.State, m.Result)
	}

	// No topic: the acks alone.
	errs, msgs, err = b.AckAndClaim(ctx, []broker.Outcome{{Claim: msgs[0].ClaimOf()}}, broker.ClaimRequest{WorkerID: "w"})
	if err != nil || len(errs) != 1 || errs[0] != nil || len(msgs) != 0 {
		t.Fatalf("AckAndClaim without topics = %v, %v, %v", errs, msgs, err)
	}
	if m, _ := b.GetMessage(ctx, ids[2]); m.State != broker.StateDone {
		t.Fatalf("acked without topics: %s", m.State)
	}
	// No outcomes: a claim.
	if errs, msgs, err = b.AckAndClaim(ctx, nil, broker.ClaimRequest{WorkerID: "w", Topics: []string{"ac"}, Max: 5}); err != nil || len(errs) != 0 || len(msgs) != 1 {
		t.Fatalf("AckAndClaim without outcomes = %v, %d messages, %v", errs, len(msgs), err)
	}
	if _, _, err := b.AckAndClaim(ctx, nil, broker.ClaimRequest{Topics: []string{"ac"}}); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("AckAndClaim without a worker id: %v", err)
	}
}

// TestClaimedAtIsWhenTheClaimRan: an AckAndClaim that waits for the topic
// lock stamps its claims with the time the claim statement ran, not the
// time its transaction began (before the wait): the reaper's grace and the
// oldest-claim gauge read claimed_at.
func TestClaimedAtIsWhenTheClaimRan(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	if _, err := b.SetTopic(ctx, "wait", broker.TopicPatch{ConcurrencyLimit: ptr(5)}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := b.Submit(ctx, broker.SubmitRequest{Topic: "wait", Task: "x"}); err != nil {
			t.Fatal(err)
		}
	}
	first, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"wait"}, Max: 1})
	if err != nil || len(first) != 1 {
		t.Fatalf("claim = %d messages, %v", len(first), err)
	}

	holder := schemaConn(t, b)
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM tw_topics WHERE name = 'wait' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		msgs []broker.Message
		err  error
	}
	done := make(chan result, 1)
	go func() {
		_, msgs, err := b.AckAndClaim(ctx, []broker.Outcome{{Claim: first[0].ClaimOf()}},
			broker.ClaimRequest{WorkerID: "w", Topics: []string{"wait"}, Max: 1})
		done <- result{msgs, err}
	}()
	time.Sleep(time.Second) // the AckAndClaim waits for the topic lock
	var released time.Time
	if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&released); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || len(r.msgs) != 1 {
		t.Fatalf("AckAndClaim = %d messages, %v", len(r.msgs), r.err)
	}
	at := r.msgs[0].ClaimedAt
	if at == nil {
		t.Fatal("claimed message without claimed_at")
	}
	if at.Before(released) {
		t.Fatalf("claimed_at %s is %s before the topic lock was released (%s): it is the transaction's start",
			at.Format(time.RFC3339Nano), released.Sub(*at), released.Format(time.RFC3339Nano))
	}
}

// TestClaimRoomAndStillFree: the claim's gate reports a limited topic's
// room (its limit less its running messages before the claim), and an
// AckAndClaim whose claim left the topic full announces no freed slot of
// it, while the other topics its acks freed are still announced.
func TestClaimRoomAndStillFree(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	if _, err := b.SetTopic(ctx, "room", broker.TopicPatch{ConcurrencyLimit: ptr(3)}); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := b.Submit(ctx, broker.SubmitRequest{Topic: "room", Task: "t"}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Submit(ctx, broker.SubmitRequest{Topic: "open", Task: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	freed := map[string]bool{"room": true, "other": true}

	got, err := b.claimFrom(ctx, "room", 1, "w", nil, nil, false, claimFloor{})
	if err != nil {
		t.Fatal(err)
	}
	if !got.limited || got.room != 3 || len(got.msgs) != 1 || got.full() {
		t.Fatalf("first claim: limited %v room %d got %d full %v, want limited, room 3, 1, not full",
			got.limited, got.room, len(got.msgs), got.full())
	}
	if s := stillFree(freed, "room", got); !s["room"] || !s["other"] {
		t.Fatalf("a claim that left room announces %v, want room and other", s)
	}

	got, err = b.claimFrom(ctx, "room", 5, "w", nil, nil, false, claimFloor{})
	if err != nil {
		t.Fatal(err)
	}
	if got.room != 2 || len(got.msgs) != 2 || !got.full() {
		t.Fatalf("second claim: room %d got %d full %v, want room 2, 2, full", got.room, len(got.msgs), got.full())
	}
	if s := stillFree(freed, "room", got); s["room"] || !s["other"] || !freed["room"] {
		t.Fatalf("a claim that left the topic full announces %v (freed now %v), want other alone and freed unchanged", s, freed)
	}

	got, err = b.claimFrom(ctx, "open", 2, "w", nil, nil, false, claimFloor{})
	if err != nil {
		t.Fatal(err)
	}
	if got.limited || len(got.msgs) != 2 || got.full() {
		t.Fatalf("unlimited topic: limited %v got %d full %v, want unlimited, 2, not full", got.limited, len(got.msgs), got.full())
	}
}
