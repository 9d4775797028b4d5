package worker

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/memory"
	"github.com/taskhost/taskhost/broker/postgres"
	"github.com/taskhost/taskhost/internal/testdb"
)

// lostAnswers passes calls to the broker it wraps, but while lose is above
// zero a Claim that took messages returns an error instead of them, as
// when the connection breaks after the claim committed: the messages run
// under the worker in the broker, and the pool never sees them.
type lostAnswers struct {
	broker.Broker
	lose atomic.Int32
	lost atomic.Int32 // messages whose claim's answer was dropped
}

func (l *lostAnswers) Claim(ctx context.Context, req broker.ClaimRequest) ([]broker.Message, error) {
	return l.drop(l.Broker.Claim(ctx, req))
}

func (l *lostAnswers) drop(msgs []broker.Message, err error) ([]broker.Message, error) {
	if err == nil && len(msgs) > 0 && l.lose.Add(-1) >= 0 {
		l.lost.Add(int32(len(msgs)))
		return nil, errors.New("read tcp 127.0.0.1:5432: connection reset by peer")
	}
	return msgs, err
}

// lostAnswersAC is lostAnswers over a broker.AckClaimer, so that the pool
// claims through AckAndClaim as it does in production; its answers are
// lost the same way (the acks are then written again, and refused as
// stale: the pool records those attempts as lost).
type lostAnswersAC struct {
	*lostAnswers
	ac broker.AckClaimer
}

func (l lostAnswersAC) AckAndClaim(ctx context.Context, outcomes []broker.Outcome, req broker.ClaimRequest) ([]error, []broker.Message, error) {
	errs, msgs, err := l.ac.AckAndClaim(ctx, outcomes, req)
	msgs, err = l.drop(msgs, err)
	if err != nil {
		return nil, nil, err
	}
	return errs, msgs, nil
}

// testBrokers are the brokers the pool tests on real brokers run on: memory, and the
// PostgreSQL test database (TEST_DATABASE_URL, default the local one) in
// a schema of its own.
func testBrokers(t *testing.T) map[string]func(t *testing.T) broker.Broker {
	return map[string]func(t *testing.T) broker.Broker{
		"memory":   func(*testing.T) broker.Broker { return memory.New() },
		"postgres": pgBroker,
	}
}

func pgBroker(t *testing.T) broker.Broker {
	b, _ := pgBrokerNamed(t)
	return b
}

// pgBrokerNamed returns a PostgreSQL broker in a schema of its own whose
// connections carry an application_name of their own, returned too.
func pgBrokerNamed(t *testing.T) (*postgres.Broker, string) {
	t.Helper()
	schema := testdb.FreshSchema(t, "tw_worker_")
	u, err := url.Parse(testdb.DSN())
	if err != nil {
		t.Fatalf("%s: %v", testdb.Env, err)
	}
	q := u.Query()
	q.Set("application_name", schema)
	u.RawQuery = q.Encode()
	b, err := postgres.New(context.Background(), postgres.Options{DSN: u.String(), Schema: schema, MaxConns: 8})
	if err != nil {
		t.Fatalf("PostgreSQL broker: %v\n%s", err, testdb.HowToStart)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b, schema
}

// wedgeSetup queues two messages on a topic limited to 2, and wraps inner
// so that the answer of the first claim that takes any is lost; it returns
// the wrapped broker (an AckClaimer when inner is one), the count of
// messages whose claim's answer was lost, the registry (one no-op task)
// and the ids of the two.
func wedgeSetup(t *testing.T, inner broker.Broker) (broker.Broker, *atomic.Int32, *Registry, []int64) {
	t.Helper()
	ctx := context.Background()
	limit := 2
	if _, err := inner.SetTopic(ctx, broker.DefaultTopic, broker.TopicPatch{ConcurrencyLimit: &limit}); err != nil {
		t.Fatal(err)
	}
	la := &lostAnswers{Broker: inner}
	la.lose.Store(1)
	var b broker.Broker = la
	if ac, ok := inner.(broker.AckClaimer); ok {
		b = lostAnswersAC{lostAnswers: la, ac: ac}
	}
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "x", Handler: func(context.Context, *TaskContext) (any, error) { return "ok", nil }})
	var ids []int64
	for range 2 {
		ids = append(ids, submit(t, b, "x", `{}`))
	}
	return b, &la.lost, reg, ids
}

// TestStraysAreRequeued: two messages claimed for the pool whose claim's
// answer was lost hold both slots of their topic; the pool finds them
// running under its id without holding them, requeues them, and then runs
// them and everything queued behind them.
func TestStraysAreRequeued(t *testing.T) {
	for name, newBroker := range testBrokers(t) {
		t.Run(name, func(t *testing.T) {
			b, lost, reg, ids := wedgeSetup(t, newBroker(t))
			if _, ok := b.(broker.AckClaimer); !ok && name == "postgres" {
				t.Fatal("the PostgreSQL broker is no longer an AckClaimer: the test no longer claims as production does")
			}
			var strays atomic.Int32
			startPool(t, b, reg, Options{StrayCheckInterval: 20 * time.Millisecond, StrayAfter: 200 * time.Millisecond,
				Strays: func(n int) { strays.Add(int32(n)) }})
			eventually(t, "the claim whose answer is lost", func() bool { return lost.Load() == 2 })
			for range 3 {
				ids = append(ids, submit(t, b, "x", `{}`))
			}
			// The lost claims' attempts were given back: each ran once.
			for _, id := range ids {
				if m := waitState(t, b, id, broker.StateDone); m.Attempts != 1 {
					t.Errorf("message %d: %d attempts, want 1", id, m.Attempts)
				}
			}
			// Strays is told after the check's pass, which may end after
			// the messages it requeued ran.
			eventually(t, "Strays to be told of the 2 requeued", func() bool { return strays.Load() == 2 })
			time.Sleep(100 * time.Millisecond)
			if n := strays.Load(); n != 2 {
				t.Errorf("Strays told of %d requeued, want 2", n)
			}
		})
	}
}

// TestStraysWedgeWithoutTheCheck is the control of TestStraysAreRequeued:
// with the check off, the two strays hold the topic and nothing else runs.
func TestStraysWedgeWithoutTheCheck(t *testing.T) {
	b, lost, reg, _ := wedgeSetup(t, memory.New())
	startPool(t, b, reg, Options{StrayCheckInterval: -1})
	eventually(t, "the claim whose answer is lost", func() bool { return lost.Load() == 2 })
	later := submit(t, b, "x", `{}`)
	time.Sleep(500 * time.Millisecond)
	if m, err := b.GetMessage(context.Background(), later); err != nil || m.State != broker.StateQueued {
		t.Fatalf("message behind the strays: %+v, %v; want it still queued", m, err)
	}
}

// TestHeldClaimsAreNotStrays: messages the pool holds (running, and
// written back while the check runs) are never requeued, however long
// they run past StrayAfter.
func TestHeldClaimsAreNotStrays(t *testing.T) {
	for name, newBroker := range testBrokers(t) {
		t.Run(name, func(t *testing.T) {
			b := newBroker(t)
			reg := NewRegistry()
			reg.MustRegister(Task{Name: "slow", Handler: func(ctx context.Context, _ *TaskContext) (any, error) {
				time.Sleep(time.Second)
				return nil, nil
			}})
			reg.MustRegister(Task{Name: "fast", Handler: func(context.Context, *TaskContext) (any, error) { return nil, nil }})
			var strays atomic.Int32
			// StrayAfter well below the slow tasks' run time, and well above
			// the time a claim's answer takes even on a loaded machine.
			startPool(t, b, reg, Options{Concurrency: 4, StrayCheckInterval: 10 * time.Millisecond, StrayAfter: 300 * time.Millisecond,
				Strays: func(n int) { strays.Add(int32(n)) }})
			var ids []int64
			for i := range 200 {
				task := "fast"
				if i%50 == 0 {
					task = "slow"
				}
				ids = append(ids, submit(t, b, task, `{}`))
			}
			for _, id := range ids {
				if m := waitState(t, b, id, broker.StateDone); m.Attempts != 1 {
					t.Errorf("message %d (%s): %d attempts, want 1", id, m.Task, m.Attempts)
				}
			}
			if n := strays.Load(); n != 0 {
				t.Errorf("%d held messages requeued as strays", n)
			}
		})
	}
}

// TestUnknownTaskWaitsForItsRegistration: a message of a task registered
// only after the pool started (as tasks of other plugins are, by polling)
// is requeued while UnknownTaskGrace lasts instead of failed, without
// using up its attempts, and runs once the task is known.
func TestUnknownTaskWaitsForItsRegistration(t *testing.T) {
	for name, newBroker := range testBrokers(t) {
		t.Run(name, func(t *testing.T) {
			b := newBroker(t)
			reg := NewRegistry()
			reg.MustRegister(Task{Name: "now", Handler: func(context.Context, *TaskContext) (any, error) { return nil, nil }})
			id := submit(t, b, "later", `{}`)
			startPool(t, b, reg, Options{UnknownTaskGrace: 30 * time.Second})
			eventually(t, "the message to be requeued", func() bool {
				m, err := b.GetMessage(context.Background(), id)
				return err == nil && strings.Contains(m.LastError, "not registered")
			})
			reg.MustRegister(Task{Name: "later", Handler: func(context.Context, *TaskContext) (any, error) { return "ran", nil }})
			m := waitState(t, b, id, broker.StateDone)
			if string(m.Result) != `"ran"` || m.Attempts != 1 {
				t.Errorf("message: result %s after %d attempts, want \"ran\" after 1", m.Result, m.Attempts)
			}
		})
	}
}
