package postgres

import (
	"context"
	"testing"

	"github.com/taskhost/taskhost/broker"
)

// TestIdleTopicsAreLookedAtNotClaimed: a topic whose last claim took
// nothing is looked at in a read before it is claimed again; while it
// stays empty it takes no lock (no write, no commit to flush), and the
// topics beside it get the whole claim in one transaction. Once it holds
// a message again, the next claim takes it; a paused one is passed by.
func TestIdleTopicsAreLookedAtNotClaimed(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := context.Background()
	c := schemaConn(t, b)
	submitN := func(topic string, n int) {
		t.Helper()
		reqs := make([]broker.SubmitRequest, n)
		for i := range reqs {
			reqs[i] = broker.SubmitRequest{Topic: topic, Task: "x"}
		}
		if _, err := b.SubmitMany(ctx, reqs); err != nil {
			t.Fatal(err)
		}
	}
	claim := func(max int) []broker.Message {
		t.Helper()
		msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"busy", "quiet"}, Max: max})
		if err != nil {
			t.Fatal(err)
		}
		return msgs
	}
	xmax := func() string {
		t.Helper()
		var x string
		if err := c.QueryRow(ctx, `SELECT xmax::text FROM tw_topics WHERE name = 'quiet'`).Scan(&x); err != nil {
			t.Fatal(err)
		}
		return x
	}
	claimRows := func() int {
		t.Helper()
		var n int
		if err := c.QueryRow(ctx, `SELECT count(*) FROM tw_claims WHERE topic = 'busy'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if _, err := b.SetTopic(ctx, "quiet", broker.TopicPatch{}); err != nil {
		t.Fatal(err)
	}
	submitN("busy", 30)
	if got := claim(2); len(got) != 2 {
		t.Fatalf("first claim took %d, want 2", len(got))
	}
	locked := xmax()
	rows := claimRows()
	if got := claim(10); len(got) != 10 {
		t.Fatalf("claim with quiet idle took %d, want 10", len(got))
	}
	if x := xmax(); x != locked {
		t.Fatalf("the claim locked the idle topic's row (xmax %s, was %s)", x, locked)
	}
	if n := claimRows(); n != rows+1 {
		t.Fatalf("the claim with quiet idle wrote %d claim rows of busy, want 1 (the whole claim in one transaction)", n-rows)
	}

	submitN("quiet", 1)
	var quiet int
	for _, m := range claim(20) {
		if m.Topic == "quiet" {
			quiet++
		}
	}
	if quiet != 1 {
		t.Fatalf("the claim after a submit to the idle topic took %d of its messages, want 1", quiet)
	}

	paused := true
	if _, err := b.SetTopic(ctx, "quiet", broker.TopicPatch{Paused: &paused}); err != nil {
		t.Fatal(err)
	}
	submitN("quiet", 1)
	claim(20) // each topic gets a share: quiet's claim takes nothing, and it is idle
	locked = xmax()
	for range 3 {
		for _, m := range claim(20) {
			if m.Topic == "quiet" {
				t.Fatalf("claimed message %d of the paused topic", m.ID)
			}
		}
	}
	if x := xmax(); x != locked {
		t.Fatalf("claims locked the paused idle topic's row (xmax %s, was %s)", x, locked)
	}
}
