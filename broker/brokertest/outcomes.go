package brokertest

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// testUnstorableOutcomes: a result no broker can store (a NUL character)
// refuses the whole Ack with ErrInvalid, naming it, and changes nothing;
// error texts with a NUL character or bytes that are not UTF-8 are stored
// with those replaced, never refused.
func testUnstorableOutcomes(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	submitN(t, b, "u", 3)
	ms := claim(t, b, "w", 3, "u")
	if len(ms) != 3 {
		t.Fatalf("claimed %d, want 3", len(ms))
	}
	_, err := b.Ack(ctx, []broker.Outcome{{Claim: ms[0].ClaimOf(), Result: json.RawMessage(`{"ok":1}`)},
		{Claim: ms[1].ClaimOf(), Result: json.RawMessage(`{"s":"a\u0000"}`)}})
	if !errors.Is(err, broker.ErrInvalid) || !strings.Contains(err.Error(), fmt.Sprint("message ", ms[1].ID)) {
		t.Fatalf("Ack with a NUL in a result: %v, want ErrInvalid naming message %d", err, ms[1].ID)
	}
	for _, m := range ms[:2] {
		if got := get(t, b, m.ID); got.State != broker.StateRunning {
			t.Fatalf("message %d is %s after a refused Ack, want running", m.ID, got.State)
		}
	}
	for _, d := range []time.Duration{-time.Second, broker.MaxDelay + time.Second, math.MaxInt64} {
		err := b.Nack(ctx, broker.NackRequest{Claim: ms[0].ClaimOf(), Requeue: true, Delay: d})
		if !errors.Is(err, broker.ErrInvalid) {
			t.Fatalf("Nack with a delay of %s: %v, want ErrInvalid", d, err)
		}
	}
	if got := get(t, b, ms[0].ID); got.State != broker.StateRunning {
		t.Fatalf("message %d is %s after a refused Nack, want running", ms[0].ID, got.State)
	}
	if err := b.Nack(ctx, broker.NackRequest{Claim: ms[0].ClaimOf(), Requeue: true, Error: "bad \x00 byte \xff"}); err != nil {
		t.Fatalf("Nack with a NUL and a stray byte in its error: %v", err)
	}
	if got := get(t, b, ms[0].ID); got.LastError != "bad \uFFFD byte \uFFFD" {
		t.Fatalf("last error %q, want the NUL and the stray byte replaced", got.LastError)
	}
	if err := b.DeadLetter(ctx, ms[1].ClaimOf(), "dead \x00", nil); err != nil {
		t.Fatalf("DeadLetter with a NUL in its reason: %v", err)
	}
	if got := get(t, b, ms[1].ID); got.State != broker.StateDead || got.LastError != "dead \uFFFD" {
		t.Fatalf("dead-lettered message: %s %q", got.State, got.LastError)
	}
}

// testNackNotRun: a requeue that says the attempt never ran takes the
// claim's count back from the message's attempts; a plain requeue keeps it.
func testNackNotRun(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	id := submitN(t, b, "nr", 1)[0]
	attempts := func(wantAttempts int, notRun bool) {
		t.Helper()
		m := claimOne(t, b, "w", "nr")
		if m.ID != id || m.Attempts != wantAttempts {
			t.Fatalf("claimed %d with %d attempts, want %d with %d", m.ID, m.Attempts, id, wantAttempts)
		}
		if err := b.Nack(ctx, broker.NackRequest{Claim: m.ClaimOf(), Requeue: true, NotRun: notRun, Error: "x"}); err != nil {
			t.Fatalf("Nack: %v", err)
		}
	}
	attempts(1, true)  // not run: back to 0
	attempts(1, true)  // and again
	attempts(1, false) // ran: stays 1
	attempts(2, true)  // back to 1
	if m := get(t, b, id); m.Attempts != 1 || m.State != broker.StateQueued {
		t.Fatalf("message after the nacks: %s with %d attempts, want queued with 1", m.State, m.Attempts)
	}
}

// testNackKeepsStateInFields: the suspect mark and the start of a wait
// for a worker ride on a requeue in fields of their own, reach the next
// claim and every read, and a Nack without them clears them; the last
// error plays no part.
func testNackKeepsStateInFields(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	id := submitN(t, b, "fields", 1)[0]
	since := time.Now().Add(-time.Minute).Truncate(time.Second)
	m := claimOne(t, b, "w", "fields")
	if m.Suspect || m.WaitingSince != nil {
		t.Fatalf("a new message claimed as suspect %t, waiting since %v; want neither", m.Suspect, m.WaitingSince)
	}
	if err := b.Nack(ctx, broker.NackRequest{Claim: m.ClaimOf(), Requeue: true, NotRun: true, Suspect: true, WaitingSince: &since,
		Error: "any text at all"}); err != nil {
		t.Fatalf("Nack: %v", err)
	}
	read := get(t, b, id)
	m = claimOne(t, b, "w", "fields")
	for what, got := range map[string]broker.Message{"read": read, "claimed": m} {
		if !got.Suspect || got.WaitingSince == nil || !got.WaitingSince.Equal(since) {
			t.Fatalf("%s after a requeue with both: suspect %t, waiting since %v; want true, %v", what, got.Suspect, got.WaitingSince, since)
		}
	}
	if err := b.Nack(ctx, broker.NackRequest{Claim: m.ClaimOf(), Requeue: true, Error: "orphaned: reads like a mark, is not one"}); err != nil {
		t.Fatalf("Nack: %v", err)
	}
	if got := claimOne(t, b, "w", "fields"); got.Suspect || got.WaitingSince != nil {
		t.Fatalf("after a requeue with neither: suspect %t, waiting since %v; want both cleared", got.Suspect, got.WaitingSince)
	}
}

func testStaleToken(t *testing.T, b broker.Broker) {
	id := submitN(t, b, "s", 1)[0]
	m := claimOne(t, b, "w", "s")
	bad := broker.Claim{ID: id, Token: m.Token + "x"}
	empty := broker.Claim{ID: id}

	wantErr(t, "Ack with a wrong token", ackErr(t, b, bad), broker.ErrClaimLost)
	wantErr(t, "Ack with an empty token", ackErr(t, b, empty), broker.ErrClaimLost)
	wantErr(t, "Ack of an unknown id", ackErr(t, b, broker.Claim{ID: id + 1000, Token: m.Token}), broker.ErrClaimLost)
	wantErr(t, "Nack with a wrong token", b.Nack(ctxOf(t), broker.NackRequest{Claim: bad, Requeue: true}), broker.ErrClaimLost)
	wantErr(t, "Nack with a wrong token", b.Nack(ctxOf(t), broker.NackRequest{Claim: bad}), broker.ErrClaimLost)
	wantErr(t, "DeadLetter with a wrong token", b.DeadLetter(ctxOf(t), bad, "no", nil), broker.ErrClaimLost)
	if _, err := b.AcquireLock(ctxOf(t), "L", "w", bad); !errors.Is(err, broker.ErrClaimLost) {
		t.Fatalf("AcquireLock with a wrong token: %v, want ErrClaimLost", err)
	}
	if ok, err := b.AcquireLock(ctxOf(t), "L", "w", m.ClaimOf()); err != nil || !ok {
		t.Fatalf("AcquireLock = %v, %v, want true", ok, err)
	}
	wantErr(t, "ReleaseLock with a wrong token", b.ReleaseLock(ctxOf(t), "L", bad), broker.ErrClaimLost)
	if ls := locks(t, b); len(ls) != 1 || ls[0].Name != "L" || ls[0].MessageID != id {
		t.Fatalf("after a refused release, Locks = %+v, want L held for %d", ls, id)
	}

	// Mixed batch: each outcome gets its own answer.
	errs, err := b.Ack(ctxOf(t), []broker.Outcome{{Claim: bad}, {Claim: m.ClaimOf()}, {Claim: m.ClaimOf()}})
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) != 3 || !errors.Is(errs[0], broker.ErrClaimLost) || errs[1] != nil || !errors.Is(errs[2], broker.ErrClaimLost) {
		t.Fatalf("Ack(bad, good, good again) = %v, want [ErrClaimLost nil ErrClaimLost]", errs)
	}
	d := wantState(t, b, id, broker.StateDone)
	if d.Attempts != 1 || d.LastError != "" {
		t.Fatalf("refused writes changed the message: %+v", d)
	}
	wantErr(t, "second Ack", ackErr(t, b, m.ClaimOf()), broker.ErrClaimLost)
	wantErr(t, "Nack after Ack", b.Nack(ctxOf(t), broker.NackRequest{Claim: m.ClaimOf(), Requeue: true}), broker.ErrClaimLost)
	wantErr(t, "DeadLetter after Ack", b.DeadLetter(ctxOf(t), m.ClaimOf(), "late", nil), broker.ErrClaimLost)
	wantState(t, b, id, broker.StateDone)
}

func testNackRequeue(t *testing.T, b broker.Broker) {
	id := submitN(t, b, "n", 1)[0]
	first := claimOne(t, b, "w1", "n")
	if err := b.Nack(ctxOf(t), broker.NackRequest{Claim: first.ClaimOf(), Requeue: true, Error: "boom"}); err != nil {
		t.Fatalf("Nack: %v", err)
	}
	q := wantState(t, b, id, broker.StateQueued)
	if q.LastError != "boom" || q.ClaimedBy != "" || q.ClaimedAt != nil || q.Attempts != 1 || q.FinishedAt != nil {
		t.Fatalf("requeued message = %+v, want last_error boom, claim cleared, attempts 1", q)
	}

	second := claimOne(t, b, "w2", "n")
	if second.ID != id || second.Attempts != 2 || second.Token == first.Token || second.ClaimedBy != "w2" {
		t.Fatalf("second claim = %+v, want attempt 2 with a new token by w2", second)
	}
	wantErr(t, "Ack with the first attempt's token", ackErr(t, b, first.ClaimOf()), broker.ErrClaimLost)
	wantErr(t, "Nack with the first attempt's token", b.Nack(ctxOf(t), broker.NackRequest{Claim: first.ClaimOf()}), broker.ErrClaimLost)
	wantState(t, b, id, broker.StateRunning)
	ack(t, b, second.ClaimOf(), "")
	wantState(t, b, id, broker.StateDone)

	// A requeue with a delay is not claimable at once.
	id2 := submitN(t, b, "n2", 1)[0]
	m := claimOne(t, b, "w1", "n2")
	if err := b.Nack(ctxOf(t), broker.NackRequest{Claim: m.ClaimOf(), Requeue: true, Delay: time.Hour}); err != nil {
		t.Fatalf("Nack: %v", err)
	}
	if q := wantState(t, b, id2, broker.StateQueued); q.AvailableAt.Before(q.CreatedAt.Add(59 * time.Minute)) {
		t.Fatalf("nack delay ignored: available_at %v", q.AvailableAt)
	}
	claimNone(t, b, "n2")
}

func testNackNoRequeue(t *testing.T, b broker.Broker) {
	id := submitN(t, b, "dl", 1)[0]
	m := claimOne(t, b, "w", "dl")
	if err := b.Nack(ctxOf(t), broker.NackRequest{Claim: m.ClaimOf(), Error: "bad input"}); err != nil {
		t.Fatal(err)
	}
	d := wantState(t, b, id, broker.StateDead)
	if d.FinishedAt == nil || d.LastError != "bad input" {
		t.Fatalf("dead message = %+v, want finished_at and last_error", d)
	}

	setTopic(t, b, "nodl", broker.TopicPatch{DeadLetterEnabled: ptr(false)})
	id2 := submitN(t, b, "nodl", 1)[0]
	m2 := claimOne(t, b, "w", "nodl")
	if err := b.Nack(ctxOf(t), broker.NackRequest{Claim: m2.ClaimOf(), Error: "bad"}); err != nil {
		t.Fatal(err)
	}
	f := wantState(t, b, id2, broker.StateFailed)
	if f.FinishedAt == nil || f.LastError != "bad" {
		t.Fatalf("failed message = %+v", f)
	}
	st := stats(t, b)
	if n := topicStats(t, st, "dl").DeadLetter; n != 1 {
		t.Fatalf("dl: DeadLetter = %d, want 1", n)
	}
	if n := topicStats(t, st, "nodl").DeadLetter; n != 0 {
		t.Fatalf("nodl: DeadLetter = %d, want 0 (failed is not dead)", n)
	}
	claimNone(t, b, "dl", "nodl")
}

func testDeadLetterRequeue(t *testing.T, b broker.Broker) {
	id := submitN(t, b, "r", 1)[0]
	m := claimOne(t, b, "w", "r")
	wantErr(t, "Requeue of a running message", b.Requeue(ctxOf(t), id), broker.ErrInvalid)
	if err := b.DeadLetter(ctxOf(t), m.ClaimOf(), "poison", nil); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	d := wantState(t, b, id, broker.StateDead)
	if d.LastError != "poison" || d.FinishedAt == nil {
		t.Fatalf("dead-lettered message = %+v", d)
	}
	if n := topicStats(t, stats(t, b), "r").DeadLetter; n != 1 {
		t.Fatalf("DeadLetter count %d, want 1", n)
	}
	claimNone(t, b, "r")

	if err := b.Requeue(ctxOf(t), id); err != nil {
		t.Fatalf("Requeue: %v", err)
	}
	q := wantState(t, b, id, broker.StateQueued)
	if q.Attempts != 1 || q.FinishedAt != nil || q.LastError != "poison" {
		t.Fatalf("requeued message = %+v, want attempts 1, no finished_at, last_error kept", q)
	}
	wantErr(t, "Requeue of a queued message", b.Requeue(ctxOf(t), id), broker.ErrInvalid)
	again := claimOne(t, b, "w", "r")
	if again.ID != id || again.Attempts != 2 {
		t.Fatalf("claim after requeue = %+v, want attempt 2", again)
	}
	ack(t, b, again.ClaimOf(), "")
	wantErr(t, "Requeue of a done message", b.Requeue(ctxOf(t), id), broker.ErrInvalid)
	wantErr(t, "Requeue of an unknown message", b.Requeue(ctxOf(t), id+1000), broker.ErrNotFound)

	// A failed message can be requeued too.
	setTopic(t, b, "rf", broker.TopicPatch{DeadLetterEnabled: ptr(false)})
	id2 := submitN(t, b, "rf", 1)[0]
	m2 := claimOne(t, b, "w", "rf")
	if err := b.Nack(ctxOf(t), broker.NackRequest{Claim: m2.ClaimOf(), Error: "e"}); err != nil {
		t.Fatal(err)
	}
	wantState(t, b, id2, broker.StateFailed)
	if err := b.Requeue(ctxOf(t), id2); err != nil {
		t.Fatalf("Requeue(failed): %v", err)
	}
	wantState(t, b, id2, broker.StateQueued)
	if c := claimOne(t, b, "w", "rf"); c.ID != id2 {
		t.Fatalf("claimed %d, want %d", c.ID, id2)
	}
}
