package brokertest

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

func testSubmitThenClaim(t *testing.T, b broker.Broker) {
	id := submit(t, b, broker.SubmitRequest{
		Topic: "email", Task: "send", Payload: json.RawMessage(`{"to": "a@example.com"}`),
		Headers: map[string]string{"trace": "abc"}, MaxAttempts: 3,
	})
	m := wantState(t, b, id, broker.StateQueued)
	if m.Attempts != 0 || m.ClaimedBy != "" || m.ClaimedAt != nil || m.Token != "" {
		t.Fatalf("queued message has claim fields: %+v", m)
	}

	c := claimOne(t, b, "w1", "email")
	if c.ID != id || c.State != broker.StateRunning || c.Attempts != 1 || c.Token == "" ||
		c.ClaimedBy != "w1" || c.ClaimedAt == nil {
		t.Fatalf("claimed message = %+v, want id %d running, attempts 1, token, claimed by w1", c, id)
	}
	if c.Topic != "email" || c.Task != "send" || c.MaxAttempts != 3 || c.Headers["trace"] != "abc" ||
		!jsonEqual(c.Payload, []byte(`{"to":"a@example.com"}`)) {
		t.Fatalf("claimed message lost its content: %+v", c)
	}

	g := wantState(t, b, id, broker.StateRunning)
	if g.Attempts != 1 || g.ClaimedBy != "w1" || g.ClaimedAt == nil || !g.ClaimedAt.Equal(*c.ClaimedAt) {
		t.Fatalf("GetMessage = %+v, disagrees with the claim %+v", g, c)
	}
	if g.Token != "" {
		t.Fatalf("GetMessage exposes the token")
	}
	claimNone(t, b, "email")

	ack(t, b, c.ClaimOf(), `{"sent": true}`)
	d := wantState(t, b, id, broker.StateDone)
	if d.FinishedAt == nil || !jsonEqual(d.Result, []byte(`{"sent":true}`)) || d.Attempts != 1 {
		t.Fatalf("done message = %+v, want finished_at and the result", d)
	}
	// A done message keeps who claimed it and when: a worker whose ack's
	// answer was lost tells from them that its ack went through.
	if d.ClaimedBy != "w1" || d.ClaimedAt == nil || !d.ClaimedAt.Equal(*c.ClaimedAt) {
		t.Fatalf("done message claimed by %q at %v, want the claim's %q at %v", d.ClaimedBy, d.ClaimedAt, "w1", c.ClaimedAt)
	}
	if _, err := b.GetMessage(ctxOf(t), id+1000); !errors.Is(err, broker.ErrNotFound) {
		t.Fatalf("GetMessage(unknown): %v, want ErrNotFound", err)
	}
}

func testSubmitDefaults(t *testing.T, b broker.Broker) {
	id1 := submit(t, b, broker.SubmitRequest{Topic: "t", Task: "x"})
	id2 := submit(t, b, broker.SubmitRequest{Topic: "t", Task: "x"})
	if id2 <= id1 {
		t.Fatalf("ids not increasing: %d then %d", id1, id2)
	}
	m := wantState(t, b, id1, broker.StateQueued)
	if !jsonEqual(m.Payload, []byte(`{}`)) {
		t.Fatalf("empty payload stored as %q, want {}", m.Payload)
	}
	if m.CreatedAt.IsZero() || m.AvailableAt.Before(m.CreatedAt) || m.FinishedAt != nil {
		t.Fatalf("times wrong: %+v", m)
	}
	topics, err := b.Topics(ctxOf(t))
	if err != nil {
		t.Fatal(err)
	}
	want := []broker.TopicConfig{{Name: "t", ConcurrencyLimit: 0, DeadLetterEnabled: true, Paused: false}}
	if !reflect.DeepEqual(topics, want) {
		t.Fatalf("Topics = %+v, want %+v", topics, want)
	}
}

// testSubmitMany: every broker queues a batch at once, ids in request
// order; one invalid request refuses the batch and stores nothing.
func testSubmitMany(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	bad := []broker.SubmitRequest{{Topic: "many", Task: "x"}, {Topic: "many", Task: "x", Payload: json.RawMessage(`{nope`)}}
	if ids, err := b.SubmitMany(ctx, bad); !errors.Is(err, broker.ErrInvalid) || !strings.Contains(err.Error(), "request 1") {
		t.Fatalf("SubmitMany with an invalid request = %v, %v; want ErrInvalid naming request 1", ids, err)
	}
	if msgs := list(t, b, broker.MessageFilter{}); len(msgs) != 0 {
		t.Fatalf("a refused SubmitMany stored %d messages", len(msgs))
	}
	var reqs []broker.SubmitRequest
	for i := range 25 {
		reqs = append(reqs, broker.SubmitRequest{Topic: "many", Task: "x", Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
	}
	ids, err := b.SubmitMany(ctx, reqs)
	if err != nil || len(ids) != len(reqs) {
		t.Fatalf("SubmitMany = %v, %v", ids, err)
	}
	for i, id := range ids {
		m := get(t, b, id)
		if m.State != broker.StateQueued || m.Topic != "many" || string(m.Payload) != fmt.Sprintf(`{"i": %d}`, i) && string(m.Payload) != fmt.Sprintf(`{"i":%d}`, i) {
			t.Fatalf("message %d (request %d): %+v", id, i, m)
		}
		if i > 0 && id <= ids[i-1] {
			t.Fatalf("ids not increasing in request order: %v", ids)
		}
	}
	if ids, err := b.SubmitMany(ctx, nil); err != nil || len(ids) != 0 {
		t.Fatalf("SubmitMany(nil) = %v, %v", ids, err)
	}
	tooMany := make([]broker.SubmitRequest, broker.MaxSubmitBatch+1)
	for i := range tooMany {
		tooMany[i] = broker.SubmitRequest{Topic: "many", Task: "x"}
	}
	if ids, err := b.SubmitMany(ctx, tooMany); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("SubmitMany of %d = %d ids, %v; want ErrInvalid", len(tooMany), len(ids), err)
	}
	if msgs := list(t, b, broker.MessageFilter{Topic: "many", Limit: 100}); len(msgs) != len(reqs) {
		t.Fatalf("after a refused batch the topic holds %d messages, want %d", len(msgs), len(reqs))
	}
}

func testInvalidSubmit(t *testing.T, b broker.Broker) {
	big := `{"s":"` + strings.Repeat("x", broker.MaxPayloadSize) + `"}`
	cases := []struct {
		name string
		req  broker.SubmitRequest
	}{
		{"empty topic", broker.SubmitRequest{Topic: "", Task: "x"}},
		{"201-byte topic", broker.SubmitRequest{Topic: strings.Repeat("t", 201), Task: "x"}},
		{"empty task", broker.SubmitRequest{Topic: "t1", Task: ""}},
		{"task too long", broker.SubmitRequest{Topic: "t2", Task: strings.Repeat("k", 201)}},
		{"payload not JSON", broker.SubmitRequest{Topic: "t3", Task: "x", Payload: json.RawMessage(`{nope`)}},
		{"payload over 1 MiB", broker.SubmitRequest{Topic: "t4", Task: "x", Payload: json.RawMessage(big)}},
		{"negative delay", broker.SubmitRequest{Topic: "t5", Task: "x", Delay: -time.Second}},
		{"delay over 10 years", broker.SubmitRequest{Topic: "t5", Task: "x", Delay: broker.MaxDelay + time.Second}},
		{"negative max attempts", broker.SubmitRequest{Topic: "t6", Task: "x", MaxAttempts: -1}},
		{"payload with a NUL character", broker.SubmitRequest{Topic: "t7", Task: "x", Payload: json.RawMessage(`{"s":"a\u0000b"}`)}},
		{"payload with a lone surrogate", broker.SubmitRequest{Topic: "t8", Task: "x", Payload: json.RawMessage(`["\ud800"]`)}},
		{"payload not UTF-8", broker.SubmitRequest{Topic: "t9", Task: "x", Payload: json.RawMessage("\"\xff\"")}},
	}
	for _, c := range cases {
		id, err := b.Submit(ctxOf(t), c.req)
		if !errors.Is(err, broker.ErrInvalid) {
			t.Errorf("%s: Submit = (%d, %v), want ErrInvalid", c.name, id, err)
		}
	}
	if msgs := list(t, b, broker.MessageFilter{}); len(msgs) != 0 {
		t.Fatalf("invalid submits stored %d messages", len(msgs))
	}
	topics, err := b.Topics(ctxOf(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(topics) != 0 {
		t.Fatalf("invalid submits created topics %+v", topics)
	}
}
