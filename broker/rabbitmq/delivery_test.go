package rabbitmq

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/local"
	"github.com/taskhost/taskhost/broker/postgres"
	"github.com/taskhost/taskhost/client/pgtx"
	"github.com/taskhost/taskhost/internal/testdb"
	"github.com/taskhost/taskhost/internal/testrabbit"
)

// eventually polls cond until it holds, failing t after within.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dropConnection closes b's connection to RabbitMQ as a network failure
// would: RabbitMQ takes back its deliveries, and b reconnects.
func dropConnection(t *testing.T, b *Broker) {
	t.Helper()
	s, err := b.current()
	if err != nil {
		t.Fatalf("drop the connection: %v", err)
	}
	_ = s.conn.Close()
}

// claimWithin claims one message of topic for worker, retrying (through a
// reconnect) until one comes.
func claimWithin(t *testing.T, b *Broker, worker, topic string) broker.Message {
	t.Helper()
	var got broker.Message
	eventually(t, 30*time.Second, "a claim of "+topic, func() bool {
		ms, err := b.Claim(t.Context(), broker.ClaimRequest{WorkerID: worker, Topics: []string{topic}, Max: 1})
		if err != nil || len(ms) == 0 {
			return false
		}
		got = ms[0]
		return true
	})
	return got
}

func mustSubmit(t *testing.T, b broker.Broker, topic string) int64 {
	t.Helper()
	id, err := b.Submit(t.Context(), broker.SubmitRequest{Topic: topic, Task: "task"})
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	return id
}

// twoOnOneStore opens two brokers on one local state store file and one
// prefix, as two processes would.
func twoOnOneStore(t testing.TB, o Options) (*Broker, *Broker) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "taskhost.db")
	o.URL, o.Prefix = testrabbit.URL(t), testrabbit.Prefix()
	open := func() *Broker {
		s, err := local.Open(t.Context(), local.Options{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		o.State = s
		return openOn(t, o)
	}
	return open(), open()
}

// TestRedeliveryFencesTheOldClaim: a worker whose connection is lost
// while it holds a message has that delivery taken back by RabbitMQ; the
// next take runs it under a new claim (a suspect, one attempt more), and
// the first worker's late ack is refused with ErrClaimLost.
func TestRedeliveryFencesTheOldClaim(t *testing.T) {
	a, b := twoOnOneStore(t, Options{})
	id := mustSubmit(t, a, "fence")
	first := claimWithin(t, a, "wa", "fence")
	if first.ID != id || first.Attempts != 1 {
		t.Fatalf("first claim = %+v, want message %d attempt 1", first, id)
	}
	dropConnection(t, a)

	second := claimWithin(t, b, "wb", "fence")
	if second.ID != id || second.Attempts != 2 || second.ClaimedBy != "wb" || second.Token == first.Token {
		t.Fatalf("claim after the redelivery = %+v, want message %d attempt 2 by wb with a new token", second, id)
	}
	if !second.Suspect || !strings.HasPrefix(second.LastError, broker.OrphanedErrorPrefix) {
		t.Fatalf("taken-again message: suspect %v, last error %q; want a suspect whose last error starts with %q",
			second.Suspect, second.LastError, broker.OrphanedErrorPrefix)
	}
	errs, err := a.Ack(t.Context(), []broker.Outcome{{Claim: first.ClaimOf()}})
	if err != nil || len(errs) != 1 || !errors.Is(errs[0], broker.ErrClaimLost) {
		t.Fatalf("late ack of the first claim = %v, %v; want ErrClaimLost", errs, err)
	}
	errs, err = b.Ack(t.Context(), []broker.Outcome{{Claim: second.ClaimOf()}})
	if err != nil || len(errs) != 1 || errs[0] != nil {
		t.Fatalf("ack of the second claim = %v, %v", errs, err)
	}
	if m, err := b.GetMessage(t.Context(), id); err != nil || m.State != broker.StateDone || m.Attempts != 2 {
		t.Fatalf("message after the acks = %+v, %v; want done after 2 attempts", m, err)
	}
}

// TestDeliveryLimitDeadLetters: a message delivered DeliveryLimit times,
// each time to a worker that loses its connection, is dead-lettered by
// RabbitMQ, and its row ends dead.
func TestDeliveryLimitDeadLetters(t *testing.T) {
	b := openTest(t, onLocal, Options{DeliveryLimit: 2})
	id := mustSubmit(t, b, "poison")
	for attempt := 1; attempt <= 2; attempt++ {
		m := claimWithin(t, b, "w", "poison")
		if m.ID != id || m.Attempts != attempt {
			t.Fatalf("claim %d = %+v, want message %d attempt %d", attempt, m, id, attempt)
		}
		dropConnection(t, b)
	}
	eventually(t, 30*time.Second, "the row ends dead", func() bool {
		m, err := b.GetMessage(t.Context(), id)
		return err == nil && m.State == broker.StateDead
	})
	m, _ := b.GetMessage(t.Context(), id)
	if !strings.Contains(m.LastError, "delivery limit") || !strings.HasPrefix(m.LastError, broker.OrphanedErrorPrefix) {
		t.Fatalf("dead message's last error %q, want it to name the delivery limit", m.LastError)
	}
}

// TestForeignMessageIsRejected: a message on a topic queue that is not
// one of the broker's goes to the topic's rejected queue with a reason,
// and the claim goes on with the next delivery.
func TestForeignMessageIsRejected(t *testing.T) {
	b := openTest(t, onLocal, Options{})
	mustSubmit(t, b, "mixed") // declares the queue
	conn := testrabbit.Connect(t)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	// A foreign message between two of ours, confirmed before the second.
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(t.Context(), "", b.names.topic("mixed"), false, false,
		amqp.Publishing{Body: []byte("hello"), MessageId: "x"})
	if err != nil || !dc.Wait() {
		t.Fatalf("publish the foreign message: %v", err)
	}
	id2 := mustSubmit(t, b, "mixed")
	claimWithin(t, b, "w", "mixed")
	if m := claimWithin(t, b, "w", "mixed"); m.ID != id2 {
		t.Fatalf("second claim = %d, want %d (past the foreign message)", m.ID, id2)
	}
	var d amqp.Delivery
	eventually(t, 10*time.Second, "the foreign message in the rejected queue", func() bool {
		var ok bool
		d, ok, err = ch.Get(b.names.rejected("mixed"), true)
		return err == nil && ok
	})
	if string(d.Body) != "hello" || !strings.Contains(d.Headers[RejectReasonHeader].(string), "not a taskhost message") {
		t.Fatalf("rejected message %q with headers %v, want the foreign body and a reason", d.Body, d.Headers)
	}
}

// TestDeletedQueueIsDeclaredAgain: an operator deletes a topic queue with
// messages in it; the broker declares it again and publishes the topic's
// queued messages again, and a submit after the deletion is not lost.
func TestDeletedQueueIsDeclaredAgain(t *testing.T) {
	b := openTest(t, onLocal, Options{})
	ids := map[int64]bool{mustSubmit(t, b, "gone"): true, mustSubmit(t, b, "gone"): true}
	conn := testrabbit.Connect(t)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDelete(b.names.topic("gone"), false, false, false); err != nil {
		t.Fatal(err)
	}
	ids[mustSubmit(t, b, "gone")] = true
	for len(ids) > 0 {
		m := claimWithin(t, b, "w", "gone")
		if !ids[m.ID] {
			t.Fatalf("claimed %d, which is not one of the messages left %v", m.ID, ids)
		}
		delete(ids, m.ID)
		if errs, err := b.Ack(t.Context(), []broker.Outcome{{Claim: m.ClaimOf()}}); err != nil || errs[0] != nil {
			t.Fatalf("Ack: %v %v", errs, err)
		}
	}
}

// TestReconnect: while RabbitMQ cannot be reached, Health says so, claims
// fail with ErrUnavailable and submits are stored; once it can, the
// broker reconnects, Health is nil and the stored submit is published.
func TestReconnect(t *testing.T) {
	b := openTest(t, onLocal, Options{})
	if err := b.Health(); err != nil {
		t.Fatalf("Health while connected: %v", err)
	}
	url := b.opts.URL
	b.mu.Lock()
	b.opts.URL = "amqp://guest:guest@127.0.0.1:1/"
	b.mu.Unlock()
	dropConnection(t, b)
	eventually(t, 10*time.Second, "Health reports the outage", func() bool { return b.Health() != nil })
	if err := b.Health(); !strings.Contains(err.Error(), "RabbitMQ") {
		t.Fatalf("Health during the outage: %v, want it to name RabbitMQ", err)
	}
	if _, err := b.Claim(t.Context(), broker.ClaimRequest{WorkerID: "w", Topics: []string{"r"}}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Claim during the outage: %v, want ErrUnavailable", err)
	}
	id := mustSubmit(t, b, "r")

	b.mu.Lock()
	b.opts.URL = url
	b.mu.Unlock()
	eventually(t, 30*time.Second, "Health after the reconnect", func() bool { return b.Health() == nil })
	if m := claimWithin(t, b, "w", "r"); m.ID != id {
		t.Fatalf("claimed %d, want the message submitted during the outage (%d)", m.ID, id)
	}
}

// TestLimitChange: a lower limit admits no new claim until the running
// count is below it; a higher one admits more at once. No tokens: the
// limit is the count of running rows, checked at each take.
func TestLimitChange(t *testing.T) {
	b := openTest(t, onLocal, Options{})
	ctx := t.Context()
	limit := func(n int) {
		t.Helper()
		if _, err := b.SetTopic(ctx, "lim", broker.TopicPatch{ConcurrencyLimit: &n}); err != nil {
			t.Fatal(err)
		}
	}
	claimN := func(want int) []broker.Message {
		t.Helper()
		ms, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"lim"}, Max: 10})
		if err != nil || len(ms) != want {
			t.Fatalf("Claim = %d messages, %v; want %d", len(ms), err, want)
		}
		return ms
	}
	limit(2)
	for range 6 {
		mustSubmit(t, b, "lim")
	}
	held := claimN(2)
	limit(3)
	held = append(held, claimN(1)...)
	limit(1)
	claimN(0)
	if errs, err := b.Ack(ctx, []broker.Outcome{{Claim: held[0].ClaimOf()}, {Claim: held[1].ClaimOf()}}); err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatalf("Ack: %v %v", errs, err)
	}
	claimN(0) // one still runs: the limit of 1 is used
	if errs, err := b.Ack(ctx, []broker.Outcome{{Claim: held[2].ClaimOf()}}); err != nil || errs[0] != nil {
		t.Fatalf("Ack: %v %v", errs, err)
	}
	claimN(1)
}

// TestClosedLoopsStop: Close with deliveries held returns, and the state
// store is closed with it.
func TestClosedLoopsStop(t *testing.T) {
	b := openTest(t, onLocal, Options{})
	mustSubmit(t, b, "c")
	claimWithin(t, b, "w", "c")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- b.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Close did not return")
	}
	if _, err := b.state.GetMessage(context.Background(), 1); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("state store after Close: %v, want ErrClosed", err)
	}
	if err := b.Health(); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("Health after Close: %v, want ErrClosed", err)
	}
}

// TestDeadHoldersSlotPassesOn: on a topic limited to 1, the one running
// message's worker loses its connection; its slot is not lost: the
// redelivered message is taken again though the topic is at its limit,
// and then the rest run.
func TestDeadHoldersSlotPassesOn(t *testing.T) {
	a, b := twoOnOneStore(t, Options{})
	one := 1
	if _, err := a.SetTopic(t.Context(), "one", broker.TopicPatch{ConcurrencyLimit: &one}); err != nil {
		t.Fatal(err)
	}
	first := mustSubmit(t, a, "one")
	second := mustSubmit(t, a, "one")
	if m := claimWithin(t, a, "wa", "one"); m.ID != first {
		t.Fatalf("claimed %d, want %d", m.ID, first)
	}
	dropConnection(t, a)
	m := claimWithin(t, b, "wb", "one")
	if m.ID != first || m.Attempts != 2 {
		t.Fatalf("claim after the holder's connection closed = %+v, want message %d attempt 2", m, first)
	}
	if errs, err := b.Ack(t.Context(), []broker.Outcome{{Claim: m.ClaimOf()}}); err != nil || errs[0] != nil {
		t.Fatalf("Ack: %v %v", errs, err)
	}
	if m := claimWithin(t, b, "wb", "one"); m.ID != second {
		t.Fatalf("claimed %d, want %d", m.ID, second)
	}
}

// TestOtherDeliveryLimitKeepsTheQueue: a broker opened with another
// delivery limit than the one its topic queue was declared with uses the
// queue as it is: its submits and claims work.
func TestOtherDeliveryLimitKeepsTheQueue(t *testing.T) {
	a, b := twoOnOneStore(t, Options{DeliveryLimit: 5})
	mustSubmit(t, a, "dl")
	b.opts.DeliveryLimit = 3
	id := mustSubmit(t, b, "dl")
	claimWithin(t, b, "w", "dl")
	if m := claimWithin(t, b, "w", "dl"); m.ID != id {
		t.Fatalf("claimed %d, want %d", m.ID, id)
	}
}

// TestTransactionalEnqueueIsPublished: a task queued by client/pgtx in an
// application's transaction, straight into the tables of a postgres state
// store, is published and claimed like a submitted one.
func TestTransactionalEnqueueIsPublished(t *testing.T) {
	b := openTest(t, onPostgres, Options{})
	schema := b.state.(*postgres.Broker).Schema()
	c := testdb.Connect(t, "")
	tx, err := c.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	id, err := pgtx.Submit(t.Context(), tx, pgtx.Task{Topic: "app", Name: "mail"}, pgtx.WithSchema(schema))
	if err != nil {
		t.Fatalf("pgtx.Submit: %v", err)
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	if m := claimWithin(t, b, "w", "app"); m.ID != id {
		t.Fatalf("claimed %d, want the task queued in the transaction (%d)", m.ID, id)
	}
}

// TestReaperPassReportsRedeliveries: a reaper pass on this broker reclaims
// nothing RabbitMQ brought back, but reports the redeliveries taken from
// dead holders and the messages dead-lettered at the delivery limit
// since the last pass, once.
func TestReaperPassReportsRedeliveries(t *testing.T) {
	b := openTest(t, onLocal, Options{DeliveryLimit: 2})
	redelivered := mustSubmit(t, b, "r")
	claimWithin(t, b, "w", "r")
	dropConnection(t, b)
	m := claimWithin(t, b, "w2", "r")
	if m.ID != redelivered {
		t.Fatalf("claimed %d, want %d", m.ID, redelivered)
	}
	dropConnection(t, b) // its second delivery: dead-lettered
	eventually(t, 30*time.Second, "the row ends dead", func() bool {
		m, err := b.GetMessage(t.Context(), redelivered)
		return err == nil && m.State == broker.StateDead
	})
	req := broker.ReclaimRequest{Live: []string{"w3"}, Grace: time.Second, MaxAttempts: 5}
	res, err := b.ReclaimOrphans(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if res.Reclaimed != 1 || res.DeadLettered != 1 || len(res.IDs) != 2 {
		t.Fatalf("pass = %+v, want 1 reclaimed (the redelivery taken again) and 1 dead-lettered", res)
	}
	if res, err := b.ReclaimOrphans(t.Context(), req); err != nil || res.Reclaimed+res.DeadLettered != 0 {
		t.Fatalf("second pass = %+v, %v; want nothing", res, err)
	}
}
