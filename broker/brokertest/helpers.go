package brokertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

func ctxOf(t *testing.T) context.Context { return t.Context() }

func submit(t *testing.T, b broker.Broker, req broker.SubmitRequest) int64 {
	t.Helper()
	id, err := b.Submit(ctxOf(t), req)
	if err != nil {
		t.Fatalf("Submit(%s/%s): %v", req.Topic, req.Task, err)
	}
	if id <= 0 {
		t.Fatalf("Submit returned id %d, want > 0", id)
	}
	return id
}

func submitN(t *testing.T, b broker.Broker, topic string, n int) []int64 {
	t.Helper()
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = submit(t, b, broker.SubmitRequest{Topic: topic, Task: "task", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))})
	}
	return ids
}

func claim(t *testing.T, b broker.Broker, worker string, max int, topics ...string) []broker.Message {
	t.Helper()
	msgs, err := b.Claim(ctxOf(t), broker.ClaimRequest{WorkerID: worker, Topics: topics, Max: max})
	if err != nil {
		t.Fatalf("Claim(%v): %v", topics, err)
	}
	return msgs
}

func claimOne(t *testing.T, b broker.Broker, worker string, topics ...string) broker.Message {
	t.Helper()
	msgs := claim(t, b, worker, 1, topics...)
	if len(msgs) != 1 {
		t.Fatalf("Claim(%v) returned %d messages, want 1", topics, len(msgs))
	}
	return msgs[0]
}

func claimNone(t *testing.T, b broker.Broker, topics ...string) {
	t.Helper()
	if msgs := claim(t, b, "w-none", 10, topics...); len(msgs) != 0 {
		t.Fatalf("Claim(%v) returned %d messages (first id %d), want none", topics, len(msgs), msgs[0].ID)
	}
}

func ack(t *testing.T, b broker.Broker, c broker.Claim, result string) {
	t.Helper()
	var res json.RawMessage
	if result != "" {
		res = json.RawMessage(result)
	}
	errs, err := b.Ack(ctxOf(t), []broker.Outcome{{Claim: c, Result: res}})
	if err != nil {
		t.Fatalf("Ack(%d): %v", c.ID, err)
	}
	if len(errs) != 1 || errs[0] != nil {
		t.Fatalf("Ack(%d) = %v, want [nil]", c.ID, errs)
	}
}

// ackErr acks one outcome and returns its per-outcome error.
func ackErr(t *testing.T, b broker.Broker, c broker.Claim) error {
	t.Helper()
	errs, err := b.Ack(ctxOf(t), []broker.Outcome{{Claim: c}})
	if err != nil {
		t.Fatalf("Ack(%d): %v", c.ID, err)
	}
	if len(errs) != 1 {
		t.Fatalf("Ack(%d) returned %d errors, want 1", c.ID, len(errs))
	}
	return errs[0]
}

func get(t *testing.T, b broker.Broker, id int64) broker.Message {
	t.Helper()
	m, err := b.GetMessage(ctxOf(t), id)
	if err != nil {
		t.Fatalf("GetMessage(%d): %v", id, err)
	}
	return m
}

func wantState(t *testing.T, b broker.Broker, id int64, state string) broker.Message {
	t.Helper()
	m := get(t, b, id)
	if m.State != state {
		t.Fatalf("message %d is %q, want %q", id, m.State, state)
	}
	return m
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: error %v, want %v", what, err, want)
	}
}

func stats(t *testing.T, b broker.Broker) broker.Stats {
	t.Helper()
	st, err := b.Stats(ctxOf(t))
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	return st
}

func topicStats(t *testing.T, st broker.Stats, topic string) broker.TopicStats {
	t.Helper()
	for _, ts := range st.Topics {
		if ts.Name == topic {
			return ts
		}
	}
	t.Fatalf("Stats has no topic %q (has %v)", topic, st.Topics)
	return broker.TopicStats{}
}

func list(t *testing.T, b broker.Broker, f broker.MessageFilter) []broker.Message {
	t.Helper()
	msgs, err := b.ListMessages(ctxOf(t), f)
	if err != nil {
		t.Fatalf("ListMessages(%+v): %v", f, err)
	}
	return msgs
}

func ids(msgs []broker.Message) []int64 {
	out := make([]int64, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

func locks(t *testing.T, b broker.Broker) []broker.Lock {
	t.Helper()
	ls, err := b.Locks(ctxOf(t))
	if err != nil {
		t.Fatalf("Locks: %v", err)
	}
	return ls
}

func setTopic(t *testing.T, b broker.Broker, name string, p broker.TopicPatch) broker.TopicConfig {
	t.Helper()
	cfg, err := b.SetTopic(ctxOf(t), name, p)
	if err != nil {
		t.Fatalf("SetTopic(%s): %v", name, err)
	}
	return cfg
}

func ptr[T any](v T) *T { return &v }

// jsonEqual compares JSON documents by value (databases may reformat them).
func jsonEqual(a, b []byte) bool {
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
