package pgtx_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/postgres"
	"github.com/taskhost/taskhost/client/pgtx"
	"github.com/taskhost/taskhost/internal/testdb"
	"github.com/taskhost/taskhost/worker"
)

// waitDeadline bounds the waits on a condition: generous, for a loaded
// 2-core machine.
const waitDeadline = 60 * time.Second

// setup returns a migrated broker schema with an application table
// (orders) in it, the broker, and the application's own connection
// (search_path left at its default, as an application's would be).
func setup(t *testing.T) (string, *postgres.Broker, *pgx.Conn) {
	t.Helper()
	schema := testdb.FreshSchema(t, "tw_pgtx_")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := postgres.New(ctx, postgres.Options{DSN: testdb.DSN(), Schema: schema})
	if err != nil {
		t.Fatalf("postgres.New: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	app := testdb.Connect(t, "")
	if _, err := app.Exec(ctx, `CREATE TABLE `+pgx.Identifier{schema, "orders"}.Sanitize()+` (id serial PRIMARY KEY, item text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return schema, b, app
}

// count returns the number of rows in schema.table.
func count(t *testing.T, c *pgx.Conn, schema, table string) int {
	t.Helper()
	var n int
	if err := c.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{schema, table}.Sanitize()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// startPool runs task "mail.receipt" on topic "mail" from b until the
// test ends, and returns the payloads it ran.
func startPool(t *testing.T, b *postgres.Broker) <-chan string {
	t.Helper()
	ran := make(chan string, 100)
	reg := worker.NewRegistry()
	reg.MustRegister(worker.Task{Name: "mail.receipt", Topic: "mail", Handler: func(_ context.Context, tc *worker.TaskContext) (any, error) {
		ran <- string(tc.Payload)
		return "sent", nil
	}})
	// Both waits an hour: the pool claims when a task is announced (or
	// when its listener starts).
	p := worker.NewPool(b, reg, worker.Options{Logger: hclog.NewNullLogger(),
		ClaimIdleInterval: time.Hour, ClaimIdleFallback: time.Hour})
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(context.Background()) })
	s := b.Subscribe()
	defer s.Close()
	deadline := time.Now().Add(waitDeadline)
	for !s.Listening() {
		if time.Now().After(deadline) {
			t.Fatal("the broker does not listen for announcements")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return ran
}

func waitDone(t *testing.T, b broker.Broker, id int64) broker.Message {
	t.Helper()
	deadline := time.Now().Add(waitDeadline)
	for {
		m, err := b.GetMessage(context.Background(), id)
		if err != nil {
			t.Fatalf("get message %d: %v", id, err)
		}
		if m.State == broker.StateDone {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("message %d is %s (error %q), want done", id, m.State, m.LastError)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestCommittedTaskExistsAndRuns(t *testing.T) {
	schema, b, app := setup(t)
	ran := startPool(t, b)
	ctx := context.Background()

	tx, err := app.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "orders"}.Sanitize()+` (item) VALUES ('book')`); err != nil {
		t.Fatal(err)
	}
	id, err := pgtx.Submit(ctx, tx, pgtx.Task{Topic: "mail", Name: "mail.receipt", Payload: json.RawMessage(`{"order":1}`),
		Headers: map[string]string{"trace": "t1"}}, pgtx.WithSchema(schema))
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	// Not visible to anyone before the commit.
	if _, err := b.GetMessage(ctx, id); !errors.Is(err, broker.ErrNotFound) {
		t.Fatalf("before commit, GetMessage = %v, want ErrNotFound", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	m := waitDone(t, b, id)
	if m.Task != "mail.receipt" || m.Topic != "mail" || m.Headers["trace"] != "t1" {
		t.Errorf("stored %+v", m)
	}
	if got := <-ran; got != `{"order": 1}` && got != `{"order":1}` {
		t.Errorf("handler got payload %s", got)
	}
	if n := count(t, app, schema, "orders"); n != 1 {
		t.Errorf("%d orders, want 1", n)
	}
}

func TestRolledBackTaskAndRowAreBothGone(t *testing.T) {
	schema, b, app := setup(t)
	ctx := context.Background()
	tx, err := app.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "orders"}.Sanitize()+` (item) VALUES ('book')`); err != nil {
		t.Fatal(err)
	}
	ids, err := pgtx.SubmitMany(ctx, tx, []pgtx.Task{
		{Topic: "mail", Name: "mail.receipt"},
		{Topic: "audit", Name: "audit.log", Delay: time.Minute},
	}, pgtx.WithSchema(schema))
	if err != nil || len(ids) != 2 {
		t.Fatalf("SubmitMany = %v, %v", ids, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if _, err := b.GetMessage(ctx, id); !errors.Is(err, broker.ErrNotFound) {
			t.Errorf("after rollback, message %d: %v, want ErrNotFound", id, err)
		}
	}
	if n := count(t, app, schema, "tw_messages"); n != 0 {
		t.Errorf("%d messages after rollback", n)
	}
	if n := count(t, app, schema, "orders"); n != 0 {
		t.Errorf("%d orders after rollback", n)
	}
}

func TestSubmitManyCommitsWithTheAppRows(t *testing.T) {
	schema, b, app := setup(t)
	ran := startPool(t, b)
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "orders"}.Sanitize()+` (item) VALUES ('a'), ('b')`); err != nil {
			return err
		}
		ids, err := pgtx.SubmitMany(ctx, tx, []pgtx.Task{
			{Topic: "mail", Name: "mail.receipt", Payload: json.RawMessage(`1`)},
			{Topic: "mail", Name: "mail.receipt", Payload: json.RawMessage(`2`)},
		}, pgtx.WithSchema(schema))
		if err != nil {
			return err
		}
		if len(ids) != 2 || ids[0] == ids[1] {
			t.Errorf("ids %v", ids)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for range 2 {
		select {
		case p := <-ran:
			got[p] = true
		case <-time.After(waitDeadline):
			t.Fatalf("ran %v of 2 tasks", got)
		}
	}
	if !got["1"] || !got["2"] {
		t.Errorf("ran %v", got)
	}
	if n := count(t, app, schema, "orders"); n != 2 {
		t.Errorf("%d orders, want 2", n)
	}
}

func TestInvalidTasksAreRefusedAndNothingIsStored(t *testing.T) {
	schema, _, app := setup(t)
	ctx := context.Background()
	cases := []struct {
		name string
		task pgtx.Task
		want string
	}{
		{"no topic", pgtx.Task{Name: "mail.receipt"}, "topic is empty: name the topic"},
		{"no name", pgtx.Task{Topic: "mail"}, "task is empty"},
		{"payload not JSON", pgtx.Task{Topic: "mail", Name: "mail.receipt", Payload: json.RawMessage(`{nope`)}, "payload"},
		{"negative max attempts", pgtx.Task{Topic: "mail", Name: "mail.receipt", MaxAttempts: -1}, "max_attempts is negative"},
		{"negative delay", pgtx.Task{Topic: "mail", Name: "mail.receipt", Delay: -time.Second}, "delay"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tx, err := app.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = pgtx.Submit(ctx, tx, c.task, pgtx.WithSchema(schema))
			if !errors.Is(err, broker.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Submit = %v, want ErrInvalid saying %q", err, c.want)
			}
			// The transaction is untouched: it still works and commits.
			if _, err := tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "orders"}.Sanitize()+` (item) VALUES ('x')`); err != nil {
				t.Fatalf("transaction after a refused task: %v", err)
			}
			_, err = pgtx.SubmitMany(ctx, tx, []pgtx.Task{{Topic: "mail", Name: "ok"}, c.task}, pgtx.WithSchema(schema))
			if !errors.Is(err, broker.ErrInvalid) || !strings.Contains(err.Error(), "task 1:") {
				t.Fatalf("SubmitMany = %v, want ErrInvalid naming task 1", err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
	if n := count(t, app, schema, "tw_messages"); n != 0 {
		t.Errorf("%d messages stored from refused tasks", n)
	}
}

func TestUnknownMigrationVersionIsRefused(t *testing.T) {
	schema, _, app := setup(t)
	ctx := context.Background()
	newer := pgtx.MaxVersion + 1
	if _, err := app.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "tw_schema_migrations"}.Sanitize()+` (version) VALUES ($1)`, newer); err != nil {
		t.Fatal(err)
	}
	tx, err := app.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = pgtx.Submit(ctx, tx, pgtx.Task{Topic: "mail", Name: "mail.receipt"}, pgtx.WithSchema(schema))
	var ve *pgtx.VersionError
	if !errors.As(err, &ve) || ve.Found != newer || ve.Known != pgtx.MaxVersion {
		t.Fatalf("Submit = %v, want a VersionError for %d", err, newer)
	}
	for _, want := range []string{"at migration " + strconv.Itoa(newer), "knows up to " + strconv.Itoa(pgtx.MaxVersion), "upgrade the package"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	// The transaction still works: the version was read without failing it.
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit after a refused version: %v", err)
	}
	if n := count(t, app, schema, "tw_messages"); n != 0 {
		t.Errorf("%d messages stored", n)
	}
}

func TestSchemaWithoutTablesSaysRunMigrate(t *testing.T) {
	schema := testdb.FreshSchema(t, "tw_pgtx_")
	app := testdb.Connect(t, "")
	ctx := context.Background()
	tx, err := app.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = pgtx.Submit(ctx, tx, pgtx.Task{Topic: "mail", Name: "mail.receipt"}, pgtx.WithSchema(schema))
	var ve *pgtx.VersionError
	if !errors.As(err, &ve) || ve.Found != 0 || !strings.Contains(err.Error(), "run `host migrate`") {
		t.Fatalf("Submit = %v, want a VersionError saying run `host migrate`", err)
	}
}

func TestWithoutNotifySendsNoAnnouncement(t *testing.T) {
	schema, _, app := setup(t)
	ctx := context.Background()
	listener := testdb.Connect(t, "")
	if _, err := listener.Exec(ctx, `LISTEN `+pgx.Identifier{postgres.NotifyChannel(schema)}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		topic string
		opts  []pgtx.Option
	}{
		{"quiet", []pgtx.Option{pgtx.WithSchema(schema), pgtx.WithoutNotify()}},
		{"loud", []pgtx.Option{pgtx.WithSchema(schema)}},
	} {
		err := pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
			_, err := pgtx.Submit(ctx, tx, pgtx.Task{Topic: c.topic, Name: "t"}, c.opts...)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Notifications arrive in commit order: the first is the loud one's.
	wctx, cancel := context.WithTimeout(ctx, waitDeadline)
	defer cancel()
	n, err := listener.WaitForNotification(wctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(n.Payload, `"topic":"loud"`) {
		t.Errorf("first notification %q, want the loud task's", n.Payload)
	}
}
