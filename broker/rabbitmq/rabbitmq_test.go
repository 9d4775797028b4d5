package rabbitmq

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/brokertest"
	"github.com/taskhost/taskhost/broker/local"
	"github.com/taskhost/taskhost/broker/postgres"
	"github.com/taskhost/taskhost/internal/testdb"
	"github.com/taskhost/taskhost/internal/testrabbit"
)

// notApplicable are the conformance cases that cannot apply to this
// broker, with the reason.
var notApplicable = map[string]string{
	"PriorityOrder": "quorum queues (RabbitMQ 3.10) have no priorities: a topic's messages are delivered in the order they were published; the priority is stored and listed, not used for order",
}

// stateKind names a state store.
type stateKind string

const (
	onLocal    stateKind = "local"
	onPostgres stateKind = "postgres"
)

// openState opens a fresh, empty state store of kind, dropped at cleanup.
func openState(t testing.TB, kind stateKind) StateStore {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	switch kind {
	case onLocal:
		s, err := local.Open(ctx, local.Options{Path: filepath.Join(t.TempDir(), "taskhost.db")})
		if err != nil {
			t.Fatalf("open the local state store: %v", err)
		}
		return s
	case onPostgres:
		s, err := postgres.New(ctx, postgres.Options{DSN: testdb.DSN(), Schema: testdb.FreshSchema(t, "rabbit")})
		if err != nil {
			t.Fatalf("open the postgres state store: %v", err)
		}
		return s
	}
	t.Fatalf("unknown state store %q", kind)
	return nil
}

// openTest opens a broker on a fresh prefix and a fresh state store of
// kind; at cleanup it is closed and the queues and exchange it declared
// are deleted.
func openTest(t testing.TB, kind stateKind, o Options) *Broker {
	t.Helper()
	if o.URL == "" {
		o.URL = testrabbit.URL(t)
	}
	if o.Prefix == "" {
		o.Prefix = testrabbit.Prefix()
	}
	o.State = openState(t, kind)
	return openOn(t, o)
}

// openOn opens a broker with o (its state store included), closed at
// cleanup, its queues deleted.
func openOn(t testing.TB, o Options) *Broker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := Open(ctx, o)
	if err != nil {
		_ = o.State.Close()
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		_ = b.Close()
		testrabbit.Delete(t, o.URL, b.Queues(), b.Exchanges())
	})
	return b
}

func TestConformanceOnLocal(t *testing.T) {
	brokertest.Run(t, func(t *testing.T) broker.Broker { return openTest(t, onLocal, Options{}) },
		brokertest.Options{NotApplicable: notApplicable})
}

func TestConformanceOnPostgres(t *testing.T) {
	brokertest.Run(t, func(t *testing.T) broker.Broker { return openTest(t, onPostgres, Options{}) },
		brokertest.Options{NotApplicable: notApplicable})
}

func TestSchedulesOnLocal(t *testing.T) {
	brokertest.RunSchedules(t, func(t *testing.T) broker.Broker { return openTest(t, onLocal, Options{}) })
}

func TestDurableOnPostgres(t *testing.T) {
	brokertest.RunDurable(t, func(t *testing.T) brokertest.Store {
		url, prefix := testrabbit.URL(t), testrabbit.Prefix()
		schema := testdb.FreshSchema(t, "rabbit")
		open := func(t *testing.T) *Broker {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s, err := postgres.New(ctx, postgres.Options{DSN: testdb.DSN(), Schema: schema})
			if err != nil {
				t.Fatalf("open the postgres state store: %v", err)
			}
			return openOn(t, Options{URL: url, Prefix: prefix, State: s})
		}
		b := open(t)
		c := testdb.Connect(t, schema)
		exec := func(t *testing.T, sql string, args ...any) {
			t.Helper()
			if _, err := c.Exec(t.Context(), sql, args...); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
		}
		return brokertest.Store{
			Broker:  b,
			Another: func(t *testing.T) brokertest.Durable { return open(t) },
			AgeClaim: func(t *testing.T, id int64, d time.Duration) {
				exec(t, `UPDATE tw_messages SET claimed_at = claimed_at - $1::bigint * interval '1 microsecond' WHERE id = $2`, d.Microseconds(), id)
			},
			AgeLock: func(t *testing.T, name string, d time.Duration) {
				exec(t, `UPDATE tw_locks SET acquired_at = acquired_at - $1::bigint * interval '1 microsecond' WHERE name = $2`, d.Microseconds(), name)
			},
			AgeHeartbeat: func(t *testing.T, id string, d time.Duration) {
				exec(t, `UPDATE tw_workers SET heartbeat_at = heartbeat_at - $1::bigint * interval '1 microsecond' WHERE id = $2`, d.Microseconds(), id)
			},
			ExpireLeases: func(t *testing.T) {
				exec(t, `UPDATE tw_leases SET expires_at = now() - interval '1 second'`)
			},
		}
	}, brokertest.Options{NotApplicable: map[string]string{
		"ReclaimDead": "RabbitMQ delivers again the messages of a process whose connection closed, and the next take ends the dead claim; a reclaim by worker would publish them a second time",
	}})
}
