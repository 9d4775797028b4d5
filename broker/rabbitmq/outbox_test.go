package rabbitmq

import (
	"database/sql"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/local"
	"github.com/taskhost/taskhost/broker/postgres"
	"github.com/taskhost/taskhost/broker/sqlstore"
	"github.com/taskhost/taskhost/internal/testdb"
)

// outboxEntries counts the outbox entries of message id in b's state
// store, read from its tables.
func outboxEntries(t *testing.T, b *Broker, id int64) int {
	t.Helper()
	var n int
	switch s := b.state.(type) {
	case *postgres.Broker:
		c := testdb.Connect(t, "")
		if err := c.QueryRow(t.Context(), `SELECT count(*) FROM `+s.Schema()+`.tw_amqp_outbox WHERE message_id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
	case *local.Broker:
		db, err := sql.Open("sqlite", "file:"+s.Path()+"?mode=ro")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if err := db.QueryRowContext(t.Context(), `SELECT count(*) FROM tw_amqp_outbox WHERE message_id = ?`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("state store %T", s)
	}
	return n
}

// TestRequeuedInTheStoreIsPublished: a message put back to queued in the
// state store by a transaction that wrote no outbox entry of its own (as
// when a process dies between a requeue's commit and its publish) is
// published all the same, on both state stores: the store's trigger gave
// it an entry in that transaction.
func TestRequeuedInTheStoreIsPublished(t *testing.T) {
	for _, kind := range []stateKind{onLocal, onPostgres} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			b := openTest(t, kind, Options{})
			id := mustSubmit(t, b, "app")
			m := claimWithin(t, b, "w", "app")
			if m.ID != id {
				t.Fatalf("claimed %d, want %d", m.ID, id)
			}
			// Once the submit's publish is confirmed and its entry gone,
			// the state store alone: no outbox entry written by the
			// broker, no publish.
			eventually(t, 2*time.Minute, "the submit's outbox entry deleted", func() bool {
				return outboxEntries(t, b, id) == 0
			})
			if err := b.state.Nack(t.Context(), broker.NackRequest{Claim: m.ClaimOf(), Requeue: true, Error: "requeued in the store"}); err != nil {
				t.Fatalf("state store Nack: %v", err)
			}
			var again broker.Message
			eventually(t, 2*time.Minute, "the requeued message claimed again", func() bool {
				ms, err := b.Claim(t.Context(), broker.ClaimRequest{WorkerID: "w2", Topics: []string{"app"}, Max: 1})
				if err != nil || len(ms) == 0 {
					return false
				}
				again = ms[0]
				return true
			})
			if again.ID != id || again.Token == m.Token {
				t.Fatalf("claimed %d (token %s), want %d under a new claim", again.ID, again.Token, id)
			}
		})
	}
}

// TestOutboxEntryArmedAgainOutlivesAnEarlierPublish: an outbox entry
// armed again after a publish (its queue was deleted, its message
// requeued) is not deleted by that publish's late OutboxDone, on both
// state stores; the publish of the entry as it is now deletes it.
func TestOutboxEntryArmedAgainOutlivesAnEarlierPublish(t *testing.T) {
	for _, kind := range []stateKind{onLocal, onPostgres} {
		t.Run(string(kind), func(t *testing.T) {
			st := openState(t, kind)
			defer st.Close()
			ctx := t.Context()
			subs, err := st.SubmitOutbox(ctx, []broker.SubmitRequest{{Topic: "armed", Task: "task"}}, time.Minute, 11)
			if err != nil {
				t.Fatalf("SubmitOutbox: %v", err)
			}
			id := subs[0].ID
			due := func(arm int64) []sqlstore.OutboxEntry {
				t.Helper()
				es, err := st.OutboxDue(ctx, time.Minute, 10, arm)
				if err != nil {
					t.Fatalf("OutboxDue: %v", err)
				}
				return es
			}
			done := func(es ...sqlstore.OutboxEntry) {
				t.Helper()
				if err := st.OutboxDone(ctx, es); err != nil {
					t.Fatalf("OutboxDone: %v", err)
				}
			}
			// The queue is lost after the submit's publish, and its
			// messages armed again before the submit's entry is deleted.
			if n, err := st.OutboxAddQueued(ctx, "armed", 0); err != nil || n != 1 {
				t.Fatalf("OutboxAddQueued = %d, %v; want 1", n, err)
			}
			done(sqlstore.OutboxEntry{ID: id, Arm: 11})
			es := due(22)
			if len(es) != 1 || es[0].ID != id || es[0].Arm != 22 {
				t.Fatalf("due after a late delete = %+v, want message %d leased with arm 22", es, id)
			}
			// A requeue arms it again while the publisher loop publishes.
			if err := st.OutboxAdd(ctx, []int64{id}, 0, 33); err != nil {
				t.Fatalf("OutboxAdd: %v", err)
			}
			done(es...)
			if es := due(44); len(es) != 1 || es[0].ID != id {
				t.Fatalf("due after the publisher loop's late delete = %+v, want message %d", es, id)
			} else {
				done(es...)
			}
			if es := due(55); len(es) != 0 {
				t.Fatalf("due after the delete of the last publish = %+v, want none", es)
			}
		})
	}
}
