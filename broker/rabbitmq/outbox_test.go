package rabbitmq

import (
	"database/sql"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/local"
	"github.com/taskhost/taskhost/broker/postgres"
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
