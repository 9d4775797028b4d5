// Package brokertest is the conformance suite every broker implementation
// passes (memory, local, postgres): the shared semantics of broker.Broker
// stated as tests.
//
// The rules it checks are written once, in package broker's
// documentation. Run holds every broker to them; RunDurable adds the cases
// of the stores whose running messages outlive their workers (orphan
// reclaim, fenced passes, leader election across brokers on one store).
//
// Worker liveness thresholds are implementation settings and are not
// tested here (they would need the suite to wait for a heartbeat to go
// stale).
package brokertest

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// Run runs the suite. newBroker returns a fresh, empty broker for one
// subtest and should register its cleanup (Close, dropping the database)
// with t.Cleanup; it is called from parallel subtests. A broker the suite
// closed itself may be closed again by that cleanup.
func Run(t *testing.T, newBroker func(t *testing.T) broker.Broker) {
	tests := []struct {
		name string
		fn   func(t *testing.T, b broker.Broker)
	}{
		{"SubmitThenClaim", testSubmitThenClaim},
		{"SubmitDefaults", testSubmitDefaults},
		{"InvalidSubmitStoresNothing", testInvalidSubmit},
		{"SubmitMany", testSubmitMany},
		{"CancelledContext", testCancelledContext},
		{"DelayedMessageWaits", testDelayed},
		{"FIFOWithinTopic", testFIFO},
		{"FairAcrossTopics", testFairness},
		{"ClaimEdgeCases", testClaimEdgeCases},
		{"ConcurrencyLimitUnderContention", testConcurrencyLimit},
		{"StaleTokenChangesNothing", testStaleToken},
		{"UnstorableOutcomes", testUnstorableOutcomes},
		{"NackRequeueRedelivers", testNackRequeue},
		{"NackNotRunGivesTheAttemptBack", testNackNotRun},
		{"NackWithoutRequeue", testNackNoRequeue},
		{"DrainAndResume", testDrain},
		{"Purge", testPurge},
		{"DeadLetterAndRequeue", testDeadLetterRequeue},
		{"LocksUnderContention", testLocks},
		{"LocksReleasedWhenClaimEnds", testLocksAutoRelease},
		{"WorkersAndStats", testWorkersStats},
		{"RunningClaims", testRunningClaims},
		{"Topics", testTopics},
		{"ListMessages", testListMessages},
		{"Leases", testLeases},
		{"Closed", testClosed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newBroker(t))
		})
	}
}

// ---- helpers ----

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

// ---- tests ----

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
	bs, ok := b.(broker.BatchSubmitter)
	if !ok {
		t.Fatalf("%T does not implement broker.BatchSubmitter", b)
	}
	ctx := ctxOf(t)
	bad := []broker.SubmitRequest{{Topic: "many", Task: "x"}, {Topic: "many", Task: "x", Payload: json.RawMessage(`{nope`)}}
	if ids, err := bs.SubmitMany(ctx, bad); !errors.Is(err, broker.ErrInvalid) || !strings.Contains(err.Error(), "request 1") {
		t.Fatalf("SubmitMany with an invalid request = %v, %v; want ErrInvalid naming request 1", ids, err)
	}
	if msgs := list(t, b, broker.MessageFilter{}); len(msgs) != 0 {
		t.Fatalf("a refused SubmitMany stored %d messages", len(msgs))
	}
	var reqs []broker.SubmitRequest
	for i := range 25 {
		reqs = append(reqs, broker.SubmitRequest{Topic: "many", Task: "x", Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
	}
	ids, err := bs.SubmitMany(ctx, reqs)
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
	if ids, err := bs.SubmitMany(ctx, nil); err != nil || len(ids) != 0 {
		t.Fatalf("SubmitMany(nil) = %v, %v", ids, err)
	}
	tooMany := make([]broker.SubmitRequest, broker.MaxSubmitBatch+1)
	for i := range tooMany {
		tooMany[i] = broker.SubmitRequest{Topic: "many", Task: "x"}
	}
	if ids, err := bs.SubmitMany(ctx, tooMany); !errors.Is(err, broker.ErrInvalid) {
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
	if err := b.DeadLetter(ctx, ms[1].ClaimOf(), "dead \x00"); err != nil {
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

func testCancelledContext(t *testing.T, b broker.Broker) {
	ctx, cancel := context.WithCancel(ctxOf(t))
	cancel()
	if _, err := b.Submit(ctx, broker.SubmitRequest{Topic: "t", Task: "x"}); err == nil {
		t.Fatalf("Submit with a cancelled context succeeded")
	}
	if msgs := list(t, b, broker.MessageFilter{}); len(msgs) != 0 {
		t.Fatalf("Submit with a cancelled context stored %d messages", len(msgs))
	}
	submitN(t, b, "t", 1)
	if _, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"t"}, Max: 1}); err == nil {
		t.Fatalf("Claim with a cancelled context succeeded")
	}
	claimOne(t, b, "w", "t")
}

func testDelayed(t *testing.T, b broker.Broker) {
	const delay = 300 * time.Millisecond
	start := time.Now()
	id := submit(t, b, broker.SubmitRequest{Topic: "later", Task: "x", Delay: delay})
	m := wantState(t, b, id, broker.StateQueued)
	if d := m.AvailableAt.Sub(m.CreatedAt); d < delay-10*time.Millisecond {
		t.Fatalf("available_at - created_at = %v, want about %v", d, delay)
	}
	if n := topicStats(t, stats(t, b), "later").Queued; n != 1 {
		t.Fatalf("a delayed message counts as queued: Queued = %d, want 1", n)
	}

	var got broker.Message
	eventually(t, 5*time.Second, "delayed message becomes claimable", func() bool {
		msgs := claim(t, b, "w", 1, "later")
		if len(msgs) == 0 {
			return false
		}
		got = msgs[0]
		return true
	})
	// The broker's clock said available_at had passed; the process clock
	// agrees give or take clock rounding.
	if elapsed := time.Since(start); elapsed < delay-50*time.Millisecond {
		t.Fatalf("delayed message claimed after %v, before its %v delay", elapsed, delay)
	}
	if got.ID != id || got.Attempts != 1 {
		t.Fatalf("claimed %+v, want message %d attempt 1", got, id)
	}
}

func testFIFO(t *testing.T, b broker.Broker) {
	want := submitN(t, b, "fifo", 5)
	var got []int64
	for range want {
		got = append(got, claimOne(t, b, "w", "fifo").ID)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("claim order %v, want submit order %v", got, want)
	}
	// A Max-3 claim also returns the oldest first.
	more := submitN(t, b, "fifo", 4)
	if got := ids(claim(t, b, "w", 3, "fifo")); !slices.Equal(got, more[:3]) {
		t.Fatalf("Claim(Max 3) = %v, want %v", got, more[:3])
	}
	// A delayed message does not block older-but-later-available ones, and
	// a message requeued with a delay goes behind available ones.
	late := submit(t, b, broker.SubmitRequest{Topic: "fifo2", Task: "x", Delay: time.Hour})
	now := submit(t, b, broker.SubmitRequest{Topic: "fifo2", Task: "x"})
	if c := claimOne(t, b, "w", "fifo2"); c.ID != now {
		t.Fatalf("claimed %d, want the available %d (not the delayed %d)", c.ID, now, late)
	}
}

func testFairness(t *testing.T, b broker.Broker) {
	a := submitN(t, b, "a", 4) // all older than b's
	bb := submitN(t, b, "b", 4)

	// One Claim of Max 2 over two topics with work serves both.
	got := claim(t, b, "w", 2, "a", "b")
	if len(got) != 2 || got[0].Topic == got[1].Topic {
		t.Fatalf("Claim(Max 2, [a b]) = %v, want one message of each topic", got)
	}
	if !slices.Contains(ids(got), a[0]) || !slices.Contains(ids(got), bb[0]) {
		t.Fatalf("Claim(Max 2, [a b]) = %v, want the oldest of each (%d, %d)", ids(got), a[0], bb[0])
	}
	// Two Max-1 claims serve both topics: the first topic rotates.
	t1 := claimOne(t, b, "w", "a", "b").Topic
	t2 := claimOne(t, b, "w", "a", "b").Topic
	if t1 == t2 {
		t.Fatalf("two Max-1 claims over [a b] both served %q, want both topics", t1)
	}
	// With one topic empty the other gets the whole Max.
	rest := claim(t, b, "w", 10, "a", "b")
	if len(rest) != 4 {
		t.Fatalf("Claim(Max 10) returned %d, want the 4 left", len(rest))
	}
}

func testClaimEdgeCases(t *testing.T, b broker.Broker) {
	submitN(t, b, "e", 3)
	if _, err := b.Claim(ctxOf(t), broker.ClaimRequest{Topics: []string{"e"}, Max: 1}); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("Claim with an empty worker id: %v, want ErrInvalid", err)
	}
	claimNone(t, b, "unknown-topic")
	if msgs := claim(t, b, "w", 0, "e"); len(msgs) != 1 {
		t.Fatalf("Claim(Max 0) returned %d, want 1", len(msgs))
	}
	if msgs := claim(t, b, "w", -5, "e", "unknown-topic"); len(msgs) != 1 {
		t.Fatalf("Claim(Max -5) returned %d, want 1", len(msgs))
	}
	if msgs := claim(t, b, "w", 5, "e", "e"); len(msgs) != 1 {
		t.Fatalf("Claim over a repeated topic returned %d, want the 1 left", len(msgs))
	}
}

func testConcurrencyLimit(t *testing.T, b broker.Broker) {
	const (
		topic   = "limited"
		limit   = 2
		total   = 200
		workers = 16
	)
	setTopic(t, b, topic, broker.TopicPatch{ConcurrencyLimit: ptr(limit)})
	submitN(t, b, topic, total)
	ctx := ctxOf(t)

	var (
		mu       sync.Mutex
		running  int                      // claims held by the test, counted late and dropped early
		maxSeen  int                      // so running never over-reports the broker's count
		held     = make(map[int64]string) // id -> token currently held
		doneN    = make(map[int64]int)    // successful acks per id
		finished atomic.Int64
		stop     = make(chan struct{})
	)
	deadline := time.Now().Add(30 * time.Second)

	// The broker's own view, sampled while the workers run.
	var pollWG sync.WaitGroup
	pollWG.Add(1)
	go func() {
		defer pollWG.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			st, err := b.Stats(ctx)
			if err != nil {
				t.Errorf("Stats: %v", err)
				return
			}
			for _, ts := range st.Topics {
				if ts.Name == topic && ts.Running > limit {
					t.Errorf("Stats reports %d running, limit %d", ts.Running, limit)
					return
				}
			}
			time.Sleep(time.Millisecond)
		}
	}()

	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			worker := fmt.Sprintf("w%d", w)
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			for finished.Load() < total {
				if time.Now().After(deadline) {
					t.Errorf("%s: gave up with %d of %d done", worker, finished.Load(), total)
					return
				}
				msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: worker, Topics: []string{topic}, Max: 1 + rng.IntN(3)})
				if err != nil {
					t.Errorf("Claim: %v", err)
					return
				}
				if len(msgs) == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				mu.Lock()
				running += len(msgs)
				maxSeen = max(maxSeen, running)
				for _, m := range msgs {
					if old, ok := held[m.ID]; ok {
						t.Errorf("message %d claimed with token %s while still held with %s", m.ID, m.Token, old)
					}
					held[m.ID] = m.Token
				}
				mu.Unlock()

				for _, m := range msgs {
					mu.Lock()
					running--
					delete(held, m.ID)
					mu.Unlock()
					if rng.IntN(5) == 0 && m.Attempts < 3 {
						if err := b.Nack(ctx, broker.NackRequest{Claim: m.ClaimOf(), Requeue: true, Error: "retry"}); err != nil {
							t.Errorf("Nack(%d): %v", m.ID, err)
						}
						continue
					}
					errs, err := b.Ack(ctx, []broker.Outcome{{Claim: m.ClaimOf()}})
					if err != nil || len(errs) != 1 || errs[0] != nil {
						t.Errorf("Ack(%d) = %v, %v", m.ID, errs, err)
						continue
					}
					mu.Lock()
					doneN[m.ID]++
					mu.Unlock()
					finished.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	pollWG.Wait()
	if t.Failed() {
		return
	}
	if maxSeen > limit {
		t.Fatalf("saw %d messages running at once, limit %d", maxSeen, limit)
	}
	if len(doneN) != total {
		t.Fatalf("%d distinct messages acked, want %d", len(doneN), total)
	}
	for id, n := range doneN {
		if n != 1 {
			t.Errorf("message %d acked %d times, want once", id, n)
		}
	}
	done := list(t, b, broker.MessageFilter{Topic: topic, State: broker.StateDone, Limit: 1000})
	if len(done) != total {
		t.Fatalf("%d messages done, want %d", len(done), total)
	}
	ts := topicStats(t, stats(t, b), topic)
	if ts.Queued != 0 || ts.Running != 0 {
		t.Fatalf("after the run: %d queued, %d running, want none", ts.Queued, ts.Running)
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
	wantErr(t, "DeadLetter with a wrong token", b.DeadLetter(ctxOf(t), bad, "no"), broker.ErrClaimLost)
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
	wantErr(t, "DeadLetter after Ack", b.DeadLetter(ctxOf(t), m.ClaimOf(), "late"), broker.ErrClaimLost)
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

func testDeadLetterRequeue(t *testing.T, b broker.Broker) {
	id := submitN(t, b, "r", 1)[0]
	m := claimOne(t, b, "w", "r")
	wantErr(t, "Requeue of a running message", b.Requeue(ctxOf(t), id), broker.ErrInvalid)
	if err := b.DeadLetter(ctxOf(t), m.ClaimOf(), "poison"); err != nil {
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

func testLocks(t *testing.T, b broker.Broker) {
	const n = 8
	submitN(t, b, "lk", n)
	msgs := claim(t, b, "w", n, "lk")
	if len(msgs) != n {
		t.Fatalf("claimed %d, want %d", len(msgs), n)
	}

	won := make([]bool, n)
	var wg sync.WaitGroup
	startGate := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-startGate
			ok, err := b.AcquireLock(ctxOf(t), "L", fmt.Sprintf("holder-%d", i), msgs[i].ClaimOf())
			if err != nil {
				t.Errorf("AcquireLock(%d): %v", i, err)
			}
			won[i] = ok
		}()
	}
	close(startGate)
	wg.Wait()
	if t.Failed() {
		return
	}
	winner := -1
	for i, ok := range won {
		if ok {
			if winner >= 0 {
				t.Fatalf("both %d and %d acquired the lock", winner, i)
			}
			winner = i
		}
	}
	if winner < 0 {
		t.Fatalf("nobody acquired the lock")
	}
	ls := locks(t, b)
	if len(ls) != 1 || ls[0].Name != "L" || ls[0].Holder != fmt.Sprintf("holder-%d", winner) ||
		ls[0].MessageID != msgs[winner].ID || ls[0].AcquiredAt.IsZero() {
		t.Fatalf("Locks = %+v, want L held by holder-%d for message %d", ls, winner, msgs[winner].ID)
	}
	if ok, err := b.AcquireLock(ctxOf(t), "L", "again", msgs[winner].ClaimOf()); err != nil || !ok {
		t.Fatalf("re-acquire by the holder = %v, %v, want true (idempotent)", ok, err)
	}
	loser := (winner + 1) % n
	wantErr(t, "ReleaseLock by a loser", b.ReleaseLock(ctxOf(t), "L", msgs[loser].ClaimOf()), broker.ErrClaimLost)

	if err := b.ReleaseLock(ctxOf(t), "L", msgs[winner].ClaimOf()); err != nil {
		t.Fatalf("ReleaseLock by the winner: %v", err)
	}
	wantErr(t, "second ReleaseLock", b.ReleaseLock(ctxOf(t), "L", msgs[winner].ClaimOf()), broker.ErrClaimLost)
	if ls := locks(t, b); len(ls) != 0 {
		t.Fatalf("after release Locks = %+v", ls)
	}

	if ok, err := b.AcquireLock(ctxOf(t), "L", "loser", msgs[loser].ClaimOf()); err != nil || !ok {
		t.Fatalf("acquire after release = %v, %v, want true", ok, err)
	}
	if ok, err := b.AcquireLock(ctxOf(t), "L", "winner", msgs[winner].ClaimOf()); err != nil || ok {
		t.Fatalf("acquire of a held lock = %v, %v, want false", ok, err)
	}
	if ok, err := b.ForceReleaseLock(ctxOf(t), "L"); err != nil || !ok {
		t.Fatalf("ForceReleaseLock = %v, %v, want true", ok, err)
	}
	if ok, err := b.ForceReleaseLock(ctxOf(t), "L"); err != nil || ok {
		t.Fatalf("second ForceReleaseLock = %v, %v, want false", ok, err)
	}
	wantErr(t, "ReleaseLock after a force release", b.ReleaseLock(ctxOf(t), "L", msgs[loser].ClaimOf()), broker.ErrClaimLost)

	// Several locks are sorted by name.
	third := (winner + 2) % n
	for _, name := range []string{"b", "a", "c"} {
		if ok, err := b.AcquireLock(ctxOf(t), name, "h", msgs[third].ClaimOf()); err != nil || !ok {
			t.Fatalf("AcquireLock(%s) = %v, %v", name, ok, err)
		}
	}
	var names []string
	for _, l := range locks(t, b) {
		names = append(names, l.Name)
	}
	if !slices.Equal(names, []string{"a", "b", "c"}) {
		t.Fatalf("Locks names = %v, want [a b c]", names)
	}
	if n := stats(t, b).Locks; n != 3 {
		t.Fatalf("Stats.Locks = %d, want 3", n)
	}

	if _, err := b.AcquireLock(ctxOf(t), "", "h", msgs[0].ClaimOf()); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("AcquireLock(empty name): %v, want ErrInvalid", err)
	}
	wantErr(t, "ReleaseLock(empty name)", b.ReleaseLock(ctxOf(t), "", msgs[0].ClaimOf()), broker.ErrInvalid)
}

func testLocksAutoRelease(t *testing.T, b broker.Broker) {
	submitN(t, b, "la", 3)
	msgs := claim(t, b, "w", 3, "la")
	if len(msgs) != 3 {
		t.Fatalf("claimed %d, want 3", len(msgs))
	}
	for i, m := range msgs {
		if ok, err := b.AcquireLock(ctxOf(t), fmt.Sprintf("lock-%d", i), "w", m.ClaimOf()); err != nil || !ok {
			t.Fatalf("AcquireLock(%d) = %v, %v", i, ok, err)
		}
	}
	if ok, err := b.AcquireLock(ctxOf(t), "lock-0-extra", "w", msgs[0].ClaimOf()); err != nil || !ok {
		t.Fatalf("second lock under one claim = %v, %v", ok, err)
	}

	lockNames := func() []string {
		var names []string
		for _, l := range locks(t, b) {
			names = append(names, l.Name)
		}
		return names
	}
	ack(t, b, msgs[0].ClaimOf(), "")
	if got := lockNames(); !slices.Equal(got, []string{"lock-1", "lock-2"}) {
		t.Fatalf("after ack, locks %v, want [lock-1 lock-2]", got)
	}
	if err := b.Nack(ctxOf(t), broker.NackRequest{Claim: msgs[1].ClaimOf(), Requeue: true}); err != nil {
		t.Fatal(err)
	}
	if got := lockNames(); !slices.Equal(got, []string{"lock-2"}) {
		t.Fatalf("after nack, locks %v, want [lock-2]", got)
	}
	if err := b.DeadLetter(ctxOf(t), msgs[2].ClaimOf(), "x"); err != nil {
		t.Fatal(err)
	}
	if got := lockNames(); len(got) != 0 {
		t.Fatalf("after dead letter, locks %v, want none", got)
	}
	if _, err := b.AcquireLock(ctxOf(t), "late", "w", msgs[0].ClaimOf()); !errors.Is(err, broker.ErrClaimLost) {
		t.Fatalf("AcquireLock under an acked claim: %v, want ErrClaimLost", err)
	}
}

// testRunningClaims: RunningClaims lists exactly the claims (id and token)
// a worker's running messages are held under, by id; ended attempts leave
// the list, and an unknown worker has none.
func testRunningClaims(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	running := func(worker string) []broker.Claim {
		t.Helper()
		cs, err := b.RunningClaims(ctx, worker)
		if err != nil {
			t.Fatalf("RunningClaims(%s): %v", worker, err)
		}
		return cs
	}
	submitN(t, b, "rc", 4)
	a := claim(t, b, "w1", 3, "rc")
	if len(a) != 3 {
		t.Fatalf("claimed %d, want 3", len(a))
	}
	other := claimOne(t, b, "w2", "rc")
	want := []broker.Claim{a[0].ClaimOf(), a[1].ClaimOf(), a[2].ClaimOf()}
	slices.SortFunc(want, func(x, y broker.Claim) int { return cmp.Compare(x.ID, y.ID) })
	if got := running("w1"); !slices.Equal(got, want) {
		t.Fatalf("RunningClaims(w1) = %v, want %v", got, want)
	}
	if got := running("w2"); !slices.Equal(got, []broker.Claim{other.ClaimOf()}) {
		t.Fatalf("RunningClaims(w2) = %v, want %v", got, []broker.Claim{other.ClaimOf()})
	}
	if got := running("nobody"); len(got) != 0 {
		t.Fatalf("RunningClaims(nobody) = %v, want none", got)
	}
	if errs, err := b.Ack(ctx, []broker.Outcome{{Claim: want[0]}}); err != nil || errs[0] != nil {
		t.Fatalf("Ack: %v %v", errs, err)
	}
	if err := b.Nack(ctx, broker.NackRequest{Claim: want[1], Requeue: true}); err != nil {
		t.Fatalf("Nack: %v", err)
	}
	if got := running("w1"); !slices.Equal(got, want[2:]) {
		t.Fatalf("RunningClaims(w1) after an ack and a nack = %v, want %v", got, want[2:])
	}
	// The requeued message, claimed again by w1, comes back under its new
	// token only.
	again := claimOne(t, b, "w1", "rc")
	if again.ID != want[1].ID || again.Token == want[1].Token {
		t.Fatalf("claimed again %d (token %q), want %d under a new token", again.ID, again.Token, want[1].ID)
	}
	if got := running("w1"); !slices.Equal(got, []broker.Claim{again.ClaimOf(), want[2]}) {
		t.Fatalf("RunningClaims(w1) after the claim again = %v, want %v", got, []broker.Claim{again.ClaimOf(), want[2]})
	}
}

func testWorkersStats(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	w1 := broker.WorkerInfo{ID: "w1", Host: "h1", PID: 11, Roles: []string{broker.RoleWorker}, Topics: []string{"a"}, Capacity: 4,
		Tasks: []string{"a.x", "a.y"}}
	w2 := broker.WorkerInfo{ID: "w2", Host: "h2", PID: 22, Roles: []string{broker.RoleWorker, broker.RoleBeat}, Topics: []string{"*"}, Capacity: 2}
	for _, w := range []broker.WorkerInfo{w2, w1} {
		if err := b.RegisterWorker(ctx, w); err != nil {
			t.Fatalf("RegisterWorker(%s): %v", w.ID, err)
		}
	}
	if err := b.RegisterWorker(ctx, broker.WorkerInfo{}); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("RegisterWorker(no id): %v, want ErrInvalid", err)
	}
	ws, err := b.Workers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 2 || ws[0].ID != "w1" || ws[1].ID != "w2" {
		t.Fatalf("Workers = %+v, want w1, w2", ws)
	}
	if w := ws[0]; w.Host != "h1" || w.PID != 11 || w.Capacity != 4 || !slices.Equal(w.Topics, []string{"a"}) ||
		!slices.Equal(w.Roles, []string{broker.RoleWorker}) || w.StartedAt.IsZero() || w.HeartbeatAt.IsZero() ||
		!slices.Equal(w.Tasks, []string{"a.x", "a.y"}) {
		t.Fatalf("w1 = %+v", w)
	}
	if len(ws[1].Tasks) != 0 {
		t.Fatalf("w2 registered no task, has %v", ws[1].Tasks)
	}
	// The same process registers again with one more task: the tasks
	// change, its start does not.
	w1.Tasks = append(w1.Tasks, "a.z")
	if err := b.RegisterWorker(ctx, w1); err != nil {
		t.Fatal(err)
	}
	if again, err := b.Workers(ctx); err != nil || !slices.Equal(again[0].Tasks, w1.Tasks) || !again[0].StartedAt.Equal(ws[0].StartedAt) {
		t.Fatalf("w1 registered again = %+v, %v; want tasks %v and the start %v kept", again[0], err, w1.Tasks, ws[0].StartedAt)
	}
	before := ws[0].HeartbeatAt
	if err := b.Heartbeat(ctx, "w1"); err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}
	wantErr(t, "Heartbeat(unknown)", b.Heartbeat(ctx, "nobody"), broker.ErrNotFound)
	ws, _ = b.Workers(ctx)
	if ws[0].HeartbeatAt.Before(before) {
		t.Fatalf("heartbeat went back in time: %v -> %v", before, ws[0].HeartbeatAt)
	}

	submitN(t, b, "a", 3)
	submitN(t, b, "b", 2)
	c1 := claimOne(t, b, "w1", "a")
	claimOne(t, b, "w2", "b")
	dl := claimOne(t, b, "w2", "b")
	if err := b.DeadLetter(ctx, dl.ClaimOf(), "x"); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.AcquireLock(ctx, "lk", "w1", c1.ClaimOf()); err != nil || !ok {
		t.Fatalf("AcquireLock = %v, %v", ok, err)
	}

	ws, _ = b.Workers(ctx)
	if ws[0].Running != 1 || ws[1].Running != 1 {
		t.Fatalf("Workers running = %d, %d, want 1, 1", ws[0].Running, ws[1].Running)
	}

	var st broker.Stats
	eventually(t, 5*time.Second, "OldestClaimAge > 0", func() bool {
		st = stats(t, b)
		return topicStats(t, st, "a").OldestClaimAge > 0
	})
	if st.Workers != 2 || st.Beats != 1 || st.Locks != 1 {
		t.Fatalf("Stats workers %d, beats %d, locks %d, want 2, 1, 1", st.Workers, st.Beats, st.Locks)
	}
	if names := func() []string {
		var n []string
		for _, ts := range st.Topics {
			n = append(n, ts.Name)
		}
		return n
	}(); !slices.Equal(names, []string{"a", "b"}) {
		t.Fatalf("Stats topics %v, want [a b]", names)
	}
	a, bs := topicStats(t, st, "a"), topicStats(t, st, "b")
	if a.Queued != 2 || a.Running != 1 || a.DeadLetter != 0 || a.Subscribers != 2 {
		t.Fatalf("topic a = %+v, want 2 queued, 1 running, 0 dead, 2 subscribers", a)
	}
	if bs.Queued != 0 || bs.Running != 1 || bs.DeadLetter != 1 || bs.Subscribers != 1 || bs.OldestClaimAge <= 0 {
		t.Fatalf("topic b = %+v, want 0 queued, 1 running, 1 dead, 1 subscriber, a claim age", bs)
	}
	if !a.DeadLetterEnabled || a.Paused || a.ConcurrencyLimit != 0 {
		t.Fatalf("topic a config in stats = %+v", a.TopicConfig)
	}

	ack(t, b, c1.ClaimOf(), "")
	if a := topicStats(t, stats(t, b), "a"); a.OldestClaimAge != 0 || a.Running != 0 {
		t.Fatalf("topic a with nothing running: %+v, want claim age 0", a)
	}

	if err := b.UnregisterWorker(ctx, "w1"); err != nil {
		t.Fatalf("UnregisterWorker: %v", err)
	}
	ws, _ = b.Workers(ctx)
	if len(ws) != 1 || ws[0].ID != "w2" {
		t.Fatalf("after unregister Workers = %+v, want w2", ws)
	}
	st = stats(t, b)
	if st.Workers != 1 || st.Beats != 1 || topicStats(t, st, "a").Subscribers != 1 {
		t.Fatalf("after unregister Stats = %+v", st)
	}
	// Re-registering is an upsert.
	w2.Topics = []string{"b"}
	w2.Roles = []string{broker.RoleWorker}
	if err := b.RegisterWorker(ctx, w2); err != nil {
		t.Fatal(err)
	}
	st = stats(t, b)
	if st.Workers != 1 || st.Beats != 0 || topicStats(t, st, "a").Subscribers != 0 || topicStats(t, st, "b").Subscribers != 1 {
		t.Fatalf("after re-register Stats = %+v", st)
	}
}

func testTopics(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	if _, err := b.SetTopic(ctx, "x", broker.TopicPatch{ConcurrencyLimit: ptr(-1)}); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("SetTopic(limit -1): %v, want ErrInvalid", err)
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

func testListMessages(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	var a, bb []int64
	for i := range 6 {
		a = append(a, submit(t, b, broker.SubmitRequest{Topic: "la", Task: []string{"x", "y"}[i%2]}))
		bb = append(bb, submit(t, b, broker.SubmitRequest{Topic: "lb", Task: "x"}))
	}
	m := claimOne(t, b, "w", "la") // a[0] running
	second := claimOne(t, b, "w", "la")
	ack(t, b, second.ClaimOf(), "")

	all := list(t, b, broker.MessageFilter{})
	if len(all) != 12 {
		t.Fatalf("ListMessages() returned %d, want 12", len(all))
	}
	for i := 1; i < len(all); i++ {
		if all[i].ID >= all[i-1].ID {
			t.Fatalf("ListMessages not newest first: %v", ids(all))
		}
	}
	for _, msg := range all {
		if msg.Token != "" {
			t.Fatalf("ListMessages exposes the token of %d", msg.ID)
		}
	}

	cases := []struct {
		name string
		f    broker.MessageFilter
		want []int64
	}{
		{"topic", broker.MessageFilter{Topic: "lb"}, reversed(bb)},
		{"topic and task", broker.MessageFilter{Topic: "la", Task: "y"}, []int64{a[5], a[3], a[1]}},
		{"task across topics", broker.MessageFilter{Task: "y"}, []int64{a[5], a[3], a[1]}},
		{"running", broker.MessageFilter{State: broker.StateRunning}, []int64{m.ID}},
		{"done", broker.MessageFilter{State: broker.StateDone}, []int64{a[1]}},
		{"queued in la", broker.MessageFilter{State: broker.StateQueued, Topic: "la"}, []int64{a[5], a[4], a[3], a[2]}},
		{"limit", broker.MessageFilter{Topic: "lb", Limit: 2}, []int64{bb[5], bb[4]}},
		{"page", broker.MessageFilter{Topic: "lb", Limit: 2, Before: bb[4]}, []int64{bb[3], bb[2]}},
		{"last page", broker.MessageFilter{Topic: "lb", Limit: 5, Before: bb[1]}, []int64{bb[0]}},
		{"past the end", broker.MessageFilter{Topic: "lb", Before: bb[0]}, nil},
		{"no match", broker.MessageFilter{Topic: "nope"}, nil},
		{"state dead none", broker.MessageFilter{State: broker.StateDead}, nil},
	}
	if m.ID != a[0] {
		t.Fatalf("claimed %d, want %d", m.ID, a[0])
	}
	for _, c := range cases {
		got := ids(list(t, b, c.f))
		if !slices.Equal(got, c.want) && !(len(got) == 0 && len(c.want) == 0) {
			t.Errorf("%s: ListMessages(%+v) = %v, want %v", c.name, c.f, got, c.want)
		}
	}
	if _, err := b.ListMessages(ctx, broker.MessageFilter{State: "bogus"}); !errors.Is(err, broker.ErrInvalid) {
		t.Errorf("ListMessages(state bogus): %v, want ErrInvalid", err)
	}

	// Default limit 50; paging walks everything exactly once.
	for range 50 {
		submit(t, b, broker.SubmitRequest{Topic: "many", Task: "x"})
	}
	page := list(t, b, broker.MessageFilter{})
	if len(page) != 50 {
		t.Fatalf("default limit: %d, want 50", len(page))
	}
	seen := 0
	var before int64
	for {
		page := list(t, b, broker.MessageFilter{Limit: 7, Before: before})
		if len(page) == 0 {
			break
		}
		seen += len(page)
		before = page[len(page)-1].ID
	}
	if seen != 62 {
		t.Fatalf("paging saw %d messages, want 62", seen)
	}
}

func reversed(s []int64) []int64 {
	c := slices.Clone(s)
	slices.Reverse(c)
	return c
}

func testClosed(t *testing.T, b broker.Broker) {
	submitN(t, b, "c", 1)
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := b.Submit(ctxOf(t), broker.SubmitRequest{Topic: "c", Task: "x"}); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("Submit after Close: %v, want ErrClosed", err)
	}
	if _, err := b.Claim(ctxOf(t), broker.ClaimRequest{WorkerID: "w", Topics: []string{"c"}, Max: 1}); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("Claim after Close: %v, want ErrClosed", err)
	}
}
