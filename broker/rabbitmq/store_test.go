package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/local"
	"github.com/taskhost/taskhost/broker/postgres"
	"github.com/taskhost/taskhost/internal/testdb"
	"github.com/taskhost/taskhost/internal/testrabbit"
)

// TestTwoStateStoresOnOnePrefixAreRefused: a broker opened on a prefix
// that a broker of another state store uses (two hosts with the default
// state_store: local on one RabbitMQ) refuses to start, naming both
// stores, the prefix and the fix. Before the check, the second broker
// started, took the first one's deliveries, found no row of theirs in its
// own store and dropped them: the tasks stayed queued in the first store
// for ever, with nothing logged.
func TestTwoStateStoresOnOnePrefixAreRefused(t *testing.T) {
	a := openTest(t, onLocal, Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	other := openState(t, onLocal)
	b, err := Open(ctx, Options{URL: a.opts.URL, Prefix: a.opts.Prefix, State: other})
	if err == nil {
		t.Cleanup(func() {
			_ = b.Close()
			testrabbit.Delete(t, b.opts.URL, b.Queues(), nil)
		})
		t.Fatalf("a second state store opened on prefix %s beside another: %s", a.opts.Prefix, lossOf(t, a, b))
	}
	theirs, ierr := other.StoreID(ctx)
	_ = other.Close()
	if ierr != nil {
		t.Fatal(ierr)
	}
	var pe *PrefixTakenError
	if !errors.Is(err, ErrPrefixTaken) || !errors.As(err, &pe) || pe.Theirs != a.storeID || pe.Ours != theirs {
		t.Fatalf("the second Open: %v; want a PrefixTakenError naming store %s as the prefix's and %s as this one", err, a.storeID, theirs)
	}
	msg := err.Error()
	t.Logf("the refusal: %s", msg)
	for _, want := range []string{a.storeID, theirs, other.(*local.Broker).Path(), strconv.Quote(a.opts.Prefix), `virtual host "/"`, "own amqp_prefix",
		"state_store: postgres", "rabbitmqctl delete_queue --vhost \"/\" " + a.opts.Prefix + ".store"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the refusal does not name %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "guest:guest") || strings.Contains(msg, "\n") {
		t.Errorf("the refusal holds the password or a line break:\n%s", msg)
	}
	// The first store's broker goes on.
	id := mustSubmit(t, a, "shared")
	if m := claimWithin(t, a, "wa", "shared"); m.ID != id {
		t.Fatalf("claimed %d on the first store, want %d", m.ID, id)
	}
}

// lossOf submits tasks through a, lets b claim from their topic, and
// says what became of them: what the failure of a second store on one
// prefix looks like.
func lossOf(t *testing.T, a, b *Broker) string {
	t.Helper()
	const n = 20
	// The second host serves the topic too (its config names it).
	if _, err := b.SetTopic(t.Context(), "shared", broker.TopicPatch{}); err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for range n {
		ids = append(ids, mustSubmit(t, a, "shared"))
	}
	for range 10 {
		if _, err := b.Claim(t.Context(), broker.ClaimRequest{WorkerID: "wb", Topics: []string{"shared"}, Max: n}); err != nil {
			t.Fatalf("claim on the second store: %v", err)
		}
	}
	queued := 0
	for _, id := range ids {
		if m, err := a.GetMessage(t.Context(), id); err == nil && m.State == broker.StateQueued {
			queued++
		}
	}
	s, err := a.current()
	if err != nil {
		t.Fatal(err)
	}
	ch, err := s.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ch.Close() }()
	q, err := ch.QueueDeclarePassive(a.names.topic("shared"), true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d tasks submitted through the first; after the second's claims %d are still queued in the first store while the topic queue holds %d messages",
		n, queued, q.Messages)
}

// rejections counts the deliveries a broker moved aside, by reason.
type rejections struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *rejections) add(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = make(map[string]int)
	}
	r.n[reason]++
}

func (r *rejections) of(reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[reason]
}

// channel opens a channel on the test RabbitMQ, closed at cleanup.
func channel(t *testing.T) *amqp.Channel {
	t.Helper()
	ch, err := testrabbit.Connect(t).Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// TestAnotherStoresTasksAreMovedAsideNotDropped: when two state stores
// run on one prefix all the same (the marker queue was deleted while the
// first ran), a broker takes none of the other store's deliveries and
// drops none: each goes to its topic's rejected queue, stamped with its
// store and a reason naming both stores, and is counted. The tasks stay
// queued in their own store, and run there once their messages are put
// back.
func TestAnotherStoresTasksAreMovedAsideNotDropped(t *testing.T) {
	a := openTest(t, onLocal, Options{})
	ch := channel(t)
	if _, err := ch.QueueDelete(a.names.store(), false, false, false); err != nil {
		t.Fatal(err)
	}
	var rej rejections
	b := openOn(t, Options{URL: a.opts.URL, Prefix: a.opts.Prefix, State: openState(t, onLocal), Rejected: rej.add})
	if a.storeID == b.storeID {
		t.Fatalf("two stores with one id %s", a.storeID)
	}
	if _, err := b.SetTopic(t.Context(), "shared", broker.TopicPatch{}); err != nil {
		t.Fatal(err)
	}
	const n = 5
	ids := make(map[int64]bool)
	for range n {
		ids[mustSubmit(t, a, "shared")] = true
	}
	eventually(t, 30*time.Second, "the second store's claims move the first one's deliveries aside", func() bool {
		ms, err := b.Claim(t.Context(), broker.ClaimRequest{WorkerID: "wb", Topics: []string{"shared"}, Max: n})
		if err != nil || len(ms) > 0 {
			t.Fatalf("claim on the second store = %v, %v; want nothing taken", ms, err)
		}
		return rej.of(RejectedOtherStore) == n
	})
	if got := rej.of(RejectedNotATask); got != 0 {
		t.Errorf("%d deliveries rejected as not tasks, want 0", got)
	}
	for id := range ids {
		if m, err := a.GetMessage(t.Context(), id); err != nil || m.State != broker.StateQueued || m.Attempts != 0 {
			t.Fatalf("task %d in its store: %+v, %v; want queued, never attempted", id, m, err)
		}
	}
	var back []amqp.Delivery
	for range n {
		d, ok, err := ch.Get(a.names.rejected("shared"), false)
		if err != nil || !ok {
			t.Fatalf("the rejected queue: %v, %v; want the %d tasks of the first store", ok, err, n)
		}
		id, err := idOf(d)
		reason, _ := d.Headers[RejectReasonHeader].(string)
		if err != nil || !ids[id] || d.Headers[StoreHeader] != a.storeID ||
			!strings.Contains(reason, a.storeID) || !strings.Contains(reason, b.storeID) {
			t.Fatalf("rejected delivery %q (%v) with headers %v; want a task of store %s, a reason naming it and %s", d.MessageId, err, d.Headers, a.storeID, b.storeID)
		}
		back = append(back, d)
	}
	// Put back, once the second store is gone, they run in their own.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for _, d := range back {
		if err := ch.PublishWithContext(t.Context(), "", a.names.topic("shared"), false, false, amqp.Publishing{
			Headers: d.Headers, DeliveryMode: amqp.Persistent, Type: d.Type, MessageId: d.MessageId, Body: d.Body,
		}); err != nil {
			t.Fatal(err)
		}
		_ = d.Ack(false)
	}
	for len(ids) > 0 {
		m := claimWithin(t, a, "wa", "shared")
		if !ids[m.ID] {
			t.Fatalf("claimed %d, not one of the tasks left %v", m.ID, ids)
		}
		delete(ids, m.ID)
	}
}

// TestAnotherStoresDeadLetterEndsNoRow: a message of another store in a
// topic's dead queue (RabbitMQ dead-lettered it there at that store's
// delivery limit) does not end the row of this store that has its id: it
// is moved aside, counted.
func TestAnotherStoresDeadLetterEndsNoRow(t *testing.T) {
	var rej rejections
	b := openTest(t, onLocal, Options{Rejected: rej.add})
	id := mustSubmit(t, b, "dl") // declares the topic's queues; its dead queue is read from now on
	ch := channel(t)
	sid := strconv.FormatInt(id, 10)
	if err := ch.PublishWithContext(t.Context(), "", b.names.dead("dl"), false, false, amqp.Publishing{
		Headers: amqp.Table{StoreHeader: "0123456789abcdef", "x-first-death-reason": "delivery_limit"},
		Type:    envelopeType, MessageId: sid, Body: []byte(`{"id":` + sid + `}`),
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the other store's dead letter moved aside", func() bool { return rej.of(RejectedOtherStore) == 1 })
	if m, err := b.GetMessage(t.Context(), id); err != nil || m.State != broker.StateQueued {
		t.Fatalf("this store's task %d: %+v, %v; want it queued still", id, m, err)
	}
	d, ok, err := ch.Get(b.names.rejected("dl"), true)
	if err != nil || !ok || d.MessageId != sid {
		t.Fatalf("the rejected queue: %v, %v, %q; want the other store's dead letter", ok, err, d.MessageId)
	}
}

// TestUnstampedDeliveriesAreTaken: a delivery without a store stamp, as
// a version before the stamp published, is taken as this store's.
func TestUnstampedDeliveriesAreTaken(t *testing.T) {
	b := openTest(t, onLocal, Options{})
	id, err := b.state.SubmitOutbox(t.Context(), []broker.SubmitRequest{{Topic: "old", Task: "task"}}, time.Hour, 1)
	if err != nil {
		t.Fatal(err)
	}
	mustSubmit(t, b, "old") // declares the queue
	sid := strconv.FormatInt(id[0].ID, 10)
	if err := channel(t).PublishWithContext(t.Context(), "", b.names.topic("old"), false, false, amqp.Publishing{
		DeliveryMode: amqp.Persistent, Type: envelopeType, MessageId: sid, Body: []byte(`{"id":` + sid + `}`),
	}); err != nil {
		t.Fatal(err)
	}
	seen := map[int64]bool{}
	for !seen[id[0].ID] {
		m := claimWithin(t, b, "w", "old")
		seen[m.ID] = true
	}
}

// TestBrokersSharingAStoreShareAPrefix: brokers on one state store (one
// local file, one postgres schema: processes of one deployment) open on
// one prefix and take each other's tasks.
func TestBrokersSharingAStoreShareAPrefix(t *testing.T) {
	for _, kind := range []stateKind{onLocal, onPostgres} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			var rej rejections
			url, prefix := testrabbit.URL(t), testrabbit.Prefix()
			var open func() StateStore
			switch kind {
			case onLocal:
				path := filepath.Join(t.TempDir(), "taskhost.db")
				open = func() StateStore {
					s, err := local.Open(t.Context(), local.Options{Path: path})
					if err != nil {
						t.Fatal(err)
					}
					return s
				}
			case onPostgres:
				schema := testdb.FreshSchema(t, "rabbit")
				open = func() StateStore {
					s, err := postgres.New(t.Context(), postgres.Options{DSN: testdb.DSN(), Schema: schema})
					if err != nil {
						t.Fatal(err)
					}
					return s
				}
			}
			a := openOn(t, Options{URL: url, Prefix: prefix, State: open(), Rejected: rej.add})
			b := openOn(t, Options{URL: url, Prefix: prefix, State: open(), Rejected: rej.add})
			if a.storeID != b.storeID {
				t.Fatalf("one store, two ids: %s and %s", a.storeID, b.storeID)
			}
			for _, p := range [][2]*Broker{{a, b}, {b, a}} {
				id := mustSubmit(t, p[0], "both")
				m := claimWithin(t, p[1], "w", "both")
				if m.ID != id {
					t.Fatalf("claimed %d, want %d", m.ID, id)
				}
				if errs, err := p[1].Ack(t.Context(), []broker.Outcome{{Claim: m.ClaimOf()}}); err != nil || errs[0] != nil {
					t.Fatalf("Ack: %v %v", errs, err)
				}
			}
			if n := rej.of(RejectedOtherStore) + rej.of(RejectedNotATask); n != 0 {
				t.Fatalf("%d deliveries moved aside between brokers of one store", n)
			}
		})
	}
}

// TestAReplacingStoreTakesThePrefixOnceItsMarkerIsDeleted: a store that
// replaces a lost one is refused the prefix until an operator deletes
// the marker queue, as the refusal says; then it starts, runs its own
// tasks, and moves the tasks the lost store left in the queues aside
// instead of taking them.
func TestAReplacingStoreTakesThePrefixOnceItsMarkerIsDeleted(t *testing.T) {
	lost := openTest(t, onLocal, Options{})
	for range 3 {
		mustSubmit(t, lost, "left")
	}
	if err := lost.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	o := Options{URL: lost.opts.URL, Prefix: lost.opts.Prefix, State: openState(t, onLocal)}
	_, err := Open(ctx, o)
	_ = o.State.Close()
	if !errors.Is(err, ErrPrefixTaken) {
		t.Fatalf("Open of the replacing store: %v, want ErrPrefixTaken", err)
	}
	if _, err := channel(t).QueueDelete(lost.names.store(), false, false, false); err != nil {
		t.Fatal(err)
	}
	var rej rejections
	o.State, o.Rejected = openState(t, onLocal), rej.add
	b := openOn(t, o)
	id := mustSubmit(t, b, "left")
	if m := claimWithin(t, b, "w", "left"); m.ID != id {
		t.Fatalf("claimed %d, want this store's task %d", m.ID, id)
	}
	if n := rej.of(RejectedOtherStore); n != 3 {
		t.Fatalf("%d deliveries of the lost store moved aside, want its 3", n)
	}
}

// TestAReconnectToAPrefixTakenMeanwhileIsRefused: a broker whose prefix
// another store took while it was disconnected (its marker queue was
// deleted) stays disconnected, saying why, and takes and publishes
// nothing until the prefix is its store's again.
func TestAReconnectToAPrefixTakenMeanwhileIsRefused(t *testing.T) {
	b := openTest(t, onLocal, Options{})
	ch := channel(t)
	if _, err := ch.QueueDelete(b.names.store(), false, false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(b.names.store(), true, false, false, false, markerArgs("0123456789abcdef")); err != nil {
		t.Fatal(err)
	}
	dropConnection(t, b)
	eventually(t, 30*time.Second, "Health says the prefix is another store's", func() bool {
		err := b.Health()
		return err != nil && strings.Contains(err.Error(), "belongs to state store 0123456789abcdef")
	})
	if _, err := b.Claim(t.Context(), broker.ClaimRequest{WorkerID: "w", Topics: []string{"r"}}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Claim on a prefix taken meanwhile: %v, want ErrUnavailable", err)
	}
	id := mustSubmit(t, b, "r") // stored, published once the prefix is back
	if _, err := ch.QueueDelete(b.names.store(), false, false, false); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "Health after the prefix is free again", func() bool { return b.Health() == nil })
	if m := claimWithin(t, b, "w", "r"); m.ID != id {
		t.Fatalf("claimed %d, want %d", m.ID, id)
	}
}

// TestStoresRacingForANewPrefixOneWins: brokers of two stores opened at
// once on a new prefix (two of each, as two hosts of each would): the
// brokers of one store open, and both of the other's are refused.
func TestStoresRacingForANewPrefixOneWins(t *testing.T) {
	url, prefix := testrabbit.URL(t), testrabbit.Prefix()
	paths := []string{filepath.Join(t.TempDir(), "a.db"), filepath.Join(t.TempDir(), "b.db")}
	type result struct {
		store int
		b     *Broker
		err   error
	}
	results := make(chan result, 4)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			s, err := local.Open(t.Context(), local.Options{Path: paths[i%2]})
			if err != nil {
				results <- result{store: i % 2, err: err}
				return
			}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			b, err := Open(ctx, Options{URL: url, Prefix: prefix, State: s})
			if err != nil {
				_ = s.Close()
			}
			results <- result{store: i % 2, b: b, err: err}
		})
	}
	wg.Wait()
	close(results)
	opened := map[int]int{}
	refused := map[int]int{}
	queues, exchanges := map[string]bool{}, map[string]bool{}
	for r := range results {
		switch {
		case r.err == nil:
			opened[r.store]++
			for _, q := range r.b.Queues() {
				queues[q] = true
			}
			for _, e := range r.b.Exchanges() {
				exchanges[e] = true
			}
			_ = r.b.Close()
		case errors.Is(r.err, ErrPrefixTaken):
			refused[r.store]++
		default:
			t.Errorf("store %d: %v", r.store, r.err)
		}
	}
	testrabbit.Delete(t, url, slices.Collect(maps.Keys(queues)), slices.Collect(maps.Keys(exchanges)))
	if len(opened) != 1 || len(refused) != 1 || opened[0]+opened[1] != 2 || refused[0]+refused[1] != 2 {
		t.Fatalf("brokers opened by store %v, refused by store %v; want both of one store opened and both of the other refused", opened, refused)
	}
}
