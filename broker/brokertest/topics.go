package brokertest

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

func testTopics(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	if _, err := b.SetTopic(ctx, "x", broker.TopicPatch{ConcurrencyLimit: ptr(-1)}); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("SetTopic(limit -1): %v, want ErrInvalid", err)
	}
	// Over the limit (a 32-bit column in the SQL stores): refused as
	// invalid by every broker, never a store's failure.
	over := broker.MaxConcurrencyLimit
	over++
	if _, err := b.SetTopic(ctx, "x", broker.TopicPatch{ConcurrencyLimit: &over}); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("SetTopic(limit %d): %v, want ErrInvalid", over, err)
	}
	if _, err := b.SetTopic(ctx, "", broker.TopicPatch{}); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("SetTopic(empty name): %v, want ErrInvalid", err)
	}
	if _, err := b.SetTopic(ctx, strings.Repeat("t", 201), broker.TopicPatch{}); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("SetTopic(201-byte name): %v, want ErrInvalid", err)
	}
	if ts, _ := b.Topics(ctx); len(ts) != 0 {
		t.Fatalf("invalid SetTopic created %+v", ts)
	}

	cfg := setTopic(t, b, "zeta", broker.TopicPatch{ConcurrencyLimit: ptr(3)})
	if cfg != (broker.TopicConfig{Name: "zeta", ConcurrencyLimit: 3, DeadLetterEnabled: true}) {
		t.Fatalf("SetTopic(new) = %+v", cfg)
	}
	cfg = setTopic(t, b, "zeta", broker.TopicPatch{DeadLetterEnabled: ptr(false)})
	if cfg != (broker.TopicConfig{Name: "zeta", ConcurrencyLimit: 3}) {
		t.Fatalf("partial patch = %+v, want the limit kept", cfg)
	}
	cfg = setTopic(t, b, "zeta", broker.TopicPatch{})
	if cfg != (broker.TopicConfig{Name: "zeta", ConcurrencyLimit: 3}) {
		t.Fatalf("empty patch = %+v", cfg)
	}
	submitN(t, b, "alpha", 1)
	if err := b.Drain(ctx, "mid"); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	ts, err := b.Topics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []broker.TopicConfig{
		{Name: "alpha", DeadLetterEnabled: true},
		{Name: "mid", DeadLetterEnabled: true, Paused: true},
		{Name: "zeta", ConcurrencyLimit: 3},
	}
	if !reflect.DeepEqual(ts, want) {
		t.Fatalf("Topics = %+v, want %+v", ts, want)
	}
	// Submitting to a configured topic keeps its config.
	submitN(t, b, "zeta", 1)
	if ts, _ := b.Topics(ctx); ts[2] != want[2] {
		t.Fatalf("submit changed the config: %+v", ts[2])
	}
	// Limit 1 admits one running message; lifting it to 0 means unlimited.
	submitN(t, b, "one", 3)
	setTopic(t, b, "one", broker.TopicPatch{ConcurrencyLimit: ptr(1)})
	if got := claim(t, b, "w", 3, "one"); len(got) != 1 {
		t.Fatalf("limit 1: claimed %d, want 1", len(got))
	}
	claimNone(t, b, "one")
	setTopic(t, b, "one", broker.TopicPatch{ConcurrencyLimit: ptr(0)})
	if got := claim(t, b, "w", 3, "one"); len(got) != 2 {
		t.Fatalf("unlimited: claimed %d, want 2", len(got))
	}
}

func testDrain(t *testing.T, b broker.Broker) {
	ids := submitN(t, b, "d", 2)
	running := claimOne(t, b, "w", "d")
	if err := b.Drain(ctxOf(t), "d"); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	claimNone(t, b, "d")
	ack(t, b, running.ClaimOf(), "")
	claimNone(t, b, "d")
	if ts := topicStats(t, stats(t, b), "d"); !ts.Paused || ts.Queued != 1 || ts.Running != 0 {
		t.Fatalf("drained topic stats = %+v, want paused with 1 queued", ts)
	}
	cfg := setTopic(t, b, "d", broker.TopicPatch{Paused: ptr(false)})
	if cfg.Paused {
		t.Fatalf("SetTopic(paused=false) = %+v", cfg)
	}
	if c := claimOne(t, b, "w", "d"); c.ID != ids[1] {
		t.Fatalf("after resume claimed %d, want %d", c.ID, ids[1])
	}
}

func testPurge(t *testing.T, b broker.Broker) {
	ids := submitN(t, b, "p", 4)
	delayed := submit(t, b, broker.SubmitRequest{Topic: "p", Task: "x", Delay: time.Hour})
	other := submitN(t, b, "other", 1)[0]
	got := claim(t, b, "w", 2, "p")
	if len(got) != 2 {
		t.Fatalf("claimed %d, want 2", len(got))
	}
	run, dead := got[0], got[1]
	if err := b.Nack(ctxOf(t), broker.NackRequest{Claim: dead.ClaimOf()}); err != nil {
		t.Fatal(err)
	}
	// Now p has 3 queued (one delayed), 1 running, 1 dead.

	res, err := b.Purge(ctxOf(t), "p", false)
	if err != nil {
		t.Fatalf("Purge: %v", err)
	}
	if res != (broker.PurgeResult{Queued: 3}) {
		t.Fatalf("Purge(p, false) = %+v, want 3 queued", res)
	}
	for _, id := range []int64{ids[2], ids[3], delayed} {
		if _, err := b.GetMessage(ctxOf(t), id); !errors.Is(err, broker.ErrNotFound) {
			t.Fatalf("purged message %d: %v, want ErrNotFound", id, err)
		}
	}
	wantState(t, b, run.ID, broker.StateRunning)
	wantState(t, b, dead.ID, broker.StateDead)
	wantState(t, b, other, broker.StateQueued)
	if ts := topicStats(t, stats(t, b), "p"); ts.Queued != 0 || ts.Running != 1 || ts.DeadLetter != 1 {
		t.Fatalf("after purge: %+v, want 0 queued, 1 running, 1 dead", ts)
	}

	res, err = b.Purge(ctxOf(t), "p", true)
	if err != nil {
		t.Fatal(err)
	}
	if res != (broker.PurgeResult{DeadLetter: 1}) {
		t.Fatalf("Purge(p, true) = %+v, want 1 dead letter", res)
	}
	if _, err := b.GetMessage(ctxOf(t), dead.ID); !errors.Is(err, broker.ErrNotFound) {
		t.Fatalf("purged dead letter: %v, want ErrNotFound", err)
	}
	ack(t, b, run.ClaimOf(), "")
	wantState(t, b, other, broker.StateQueued)
	if res, err := b.Purge(ctxOf(t), "never-seen", true); err != nil || res != (broker.PurgeResult{}) {
		t.Fatalf("Purge(unknown) = %+v, %v, want nothing purged", res, err)
	}
}
