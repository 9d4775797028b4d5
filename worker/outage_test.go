package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/internal/testdb"
)

// TestDatabaseConnectionsKilled: while a pool works through 3,000 messages
// on PostgreSQL, every connection of its broker is killed again and again
// (pg_terminate_backend) for a second and a half, whatever it is doing:
// claiming, acking, committing. The pool backs off and reconnects; in the
// end every message is done, every handler ran at least once, nothing is
// left running, and the pool goes on working. (A kill that lands between a
// claim's commit and its answer leaves strays, which the stray check takes
// back; how often that happens is logged, not asserted: it is up to
// timing. TestStraysAreRequeued makes it happen.)
func TestDatabaseConnectionsKilled(t *testing.T) {
	b, app := pgBrokerNamed(t)
	ctx := context.Background()
	const n = 3000
	var runs [n]atomic.Int32
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "x", Handler: func(_ context.Context, tc *TaskContext) (any, error) {
		var p struct {
			N int `json:"n"`
		}
		if err := json.Unmarshal(tc.Payload, &p); err != nil {
			return nil, err
		}
		runs[p.N].Add(1)
		time.Sleep(2 * time.Millisecond)
		return nil, nil
	}})
	reqs := make([]broker.SubmitRequest, n)
	for i := range reqs {
		reqs[i] = broker.SubmitRequest{Topic: broker.DefaultTopic, Task: "x", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
	}
	if _, err := b.SubmitMany(ctx, reqs); err != nil {
		t.Fatal(err)
	}

	dsn := testdb.DSN()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("PostgreSQL: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `SET search_path TO `+pgx.Identifier{app}.Sanitize()); err != nil {
		t.Fatal(err)
	}

	var strays atomic.Int32
	// A short StrayAfter, so that claims whose answer a kill lost come
	// back within the test.
	startPool(t, b, reg, Options{Concurrency: 8, StrayCheckInterval: 50 * time.Millisecond, StrayAfter: 500 * time.Millisecond,
		Strays: func(k int) { strays.Add(int32(k)) }})
	killed := 0
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); {
		var k int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE application_name = $1) k`, app).Scan(&k); err != nil {
			t.Fatal(err)
		}
		killed += k
		time.Sleep(time.Duration(10+killed%20) * time.Millisecond)
	}
	if killed == 0 {
		t.Fatal("no connection of the broker was killed: the test tested nothing")
	}

	var done, running int
	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'done'), count(*) FILTER (WHERE state = 'running')
			FROM tw_messages_all`).Scan(&done, &running); err != nil {
			t.Fatal(err)
		}
		if done == n || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if done != n || running != 0 {
		t.Fatalf("after the kills: %d of %d done, %d running", done, n, running)
	}
	again := 0
	for i := range runs {
		switch r := runs[i].Load(); {
		case r == 0:
			t.Errorf("message %d is done but its handler never ran", i)
		case r > 1:
			again += int(r) - 1
		}
	}
	t.Logf("%d connections killed; %d handler runs beyond one per message; %d strays requeued", killed, again, strays.Load())

	id, err := b.Submit(ctx, broker.SubmitRequest{Topic: broker.DefaultTopic, Task: "x", Payload: json.RawMessage(`{"n":0}`)})
	if err != nil {
		t.Fatalf("submit after the kills: %v", err)
	}
	waitState(t, b, id, broker.StateDone)
}
