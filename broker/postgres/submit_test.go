package postgres

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// TestSubmitMany: ids come back in request order, every message is stored
// as Submit would store it, missing topics are created, and a call longer
// than one statement holds is still one transaction.
func TestSubmitMany(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := t.Context()

	n := maxSubmitMany + 7
	reqs := make([]broker.SubmitRequest, n)
	for i := range reqs {
		reqs[i] = broker.SubmitRequest{
			Topic:   fmt.Sprintf("many-%d", i%3),
			Task:    "x",
			Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)),
		}
	}
	reqs[1].Headers = map[string]string{"k": "v"}
	reqs[2].Delay = time.Hour
	reqs[3].MaxAttempts = 4
	reqs[4].Payload = nil

	ids, err := b.SubmitMany(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != n {
		t.Fatalf("%d ids for %d requests", len(ids), n)
	}
	seen := map[int64]bool{}
	for i, id := range ids {
		if id <= 0 || seen[id] {
			t.Fatalf("id %d of request %d is not new", id, i)
		}
		seen[id] = true
	}
	for _, i := range []int{0, 1, 2, 3, 4, n - 1} {
		m, err := b.GetMessage(ctx, ids[i])
		if err != nil {
			t.Fatal(err)
		}
		want := string(reqs[i].Payload)
		if want == "" {
			want = "{}"
		}
		if m.Topic != reqs[i].Topic || m.Task != "x" || m.State != broker.StateQueued || !jsonEqual(t, m.Payload, want) {
			t.Errorf("request %d stored as %+v", i, m)
		}
		switch i {
		case 1:
			if m.Headers["k"] != "v" {
				t.Errorf("headers = %v", m.Headers)
			}
		case 2:
			if time.Until(m.AvailableAt) < 50*time.Minute {
				t.Errorf("delayed message available at %v", m.AvailableAt)
			}
		case 3:
			if m.MaxAttempts != 4 {
				t.Errorf("max attempts = %d", m.MaxAttempts)
			}
		}
	}
	topics, err := b.Topics(ctx)
	if err != nil || len(topics) != 3 {
		t.Fatalf("topics = %v, %v", topics, err)
	}
	// FIFO across the call: the first claim gets the first request.
	msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"many-0"}, Max: 2})
	if err != nil || len(msgs) != 2 || msgs[0].ID != ids[0] || msgs[1].ID != ids[3] {
		t.Fatalf("claim after SubmitMany = %v, %v; want ids %d, %d", msgs, err, ids[0], ids[3])
	}

	// One bad request: nothing is stored.
	bad := []broker.SubmitRequest{{Topic: "many-bad", Task: "x"}, {Topic: "many-bad", Task: ""}}
	if _, err := b.SubmitMany(ctx, bad); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("SubmitMany with an invalid request: %v", err)
	}
	if list, err := b.ListMessages(ctx, broker.MessageFilter{Topic: "many-bad"}); err != nil || len(list) != 0 {
		t.Fatalf("after a refused SubmitMany: %v, %v", list, err)
	}
	if ids, err := b.SubmitMany(ctx, nil); err != nil || len(ids) != 0 {
		t.Fatalf("empty SubmitMany = %v, %v", ids, err)
	}
	_ = b.Close()
	if _, err := b.SubmitMany(ctx, reqs[:1]); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("SubmitMany after Close: %v", err)
	}
}

func jsonEqual(t *testing.T, got json.RawMessage, want string) bool {
	t.Helper()
	var a, b any
	if err := json.Unmarshal(got, &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(want), &b); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(a) == fmt.Sprint(b)
}

// TestClaimedMessagesShareNothing: the messages of one claim, read with one
// scanner, each keep their own headers, payload and token: none carries
// over from the row read before it.
func TestClaimedMessagesShareNothing(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	headers := []map[string]string{{"a": "1", "b": "2"}, nil, {"c": "3"}, {}, {"a": "4"}}
	var reqs []broker.SubmitRequest
	for i, h := range headers {
		reqs = append(reqs, broker.SubmitRequest{Topic: "share", Task: "x", Headers: h, Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
	}
	ids, err := b.SubmitMany(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"share"}, Max: len(reqs)})
	if err != nil || len(msgs) != len(reqs) {
		t.Fatalf("claimed %d messages of %d (%v)", len(msgs), len(reqs), err)
	}
	tokens := map[string]bool{}
	for _, m := range msgs {
		i := slices.Index(ids, m.ID)
		want := headers[i]
		if len(want) == 0 {
			want = nil
		}
		if !maps.Equal(m.Headers, want) || (m.Headers == nil) != (want == nil) {
			t.Errorf("message %d: headers %v, want %v", i, m.Headers, want)
		}
		if !jsonEqual(t, m.Payload, fmt.Sprintf(`{"i":%d}`, i)) {
			t.Errorf("message %d: payload %s", i, m.Payload)
		}
		if m.Token == "" || tokens[m.Token] {
			t.Errorf("message %d: token %q is empty or another message's", i, m.Token)
		}
		tokens[m.Token] = true
	}
	// The headers are the message's own: changing one message's map
	// changes no other's.
	for _, m := range msgs {
		if m.Headers != nil {
			m.Headers["changed"] = "yes"
		}
	}
	for _, m := range msgs {
		if i := slices.Index(ids, m.ID); len(m.Headers) != 0 && len(m.Headers) != len(headers[i])+1 {
			t.Errorf("message %d: headers %v after changing each message's map once", i, m.Headers)
		}
	}
}
