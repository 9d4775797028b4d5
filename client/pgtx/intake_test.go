package pgtx_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/client/pgtx"
)

// submitIn runs fn in a transaction of app and commits it.
func submitIn(t *testing.T, app *pgx.Conn, fn func(tx pgx.Tx)) {
	t.Helper()
	ctx := context.Background()
	tx, err := app.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	fn(tx)
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
}

// A unique key holds across transactions: a second submit of it is a
// duplicate naming the first task, stores nothing and leaves the
// application's transaction usable; a rolled-back submit holds nothing.
func TestUniqueKeyInTransactions(t *testing.T) {
	schema, b, app := setup(t)
	ctx := context.Background()
	task := pgtx.Task{Topic: "mail", Name: "mail.receipt", UniqueKey: "order-1"}
	var first int64
	submitIn(t, app, func(tx pgx.Tx) {
		var err error
		if first, err = pgtx.Submit(ctx, tx, task, pgtx.WithSchema(schema)); err != nil {
			t.Fatalf("first submit: %v", err)
		}
	})
	submitIn(t, app, func(tx pgx.Tx) {
		id, err := pgtx.Submit(ctx, tx, task, pgtx.WithSchema(schema))
		if !errors.Is(err, broker.ErrDuplicate) || id != first {
			t.Fatalf("second submit = %d, %v; want %d and ErrDuplicate", id, err, first)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "orders"}.Sanitize()+` (item) VALUES ('x')`); err != nil {
			t.Fatalf("the transaction is not usable after a duplicate: %v", err)
		}
	})
	if n := count(t, app, schema, "tw_messages"); n != 1 {
		t.Fatalf("%d messages, want 1", n)
	}
	if n := count(t, app, schema, "orders"); n != 1 {
		t.Fatalf("%d orders, want 1", n)
	}

	// Rolled back: the key stays free.
	tx, err := app.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	other := pgtx.Task{Topic: "mail", Name: "mail.receipt", UniqueKey: "order-2", Priority: 7}
	if _, err := pgtx.Submit(ctx, tx, other, pgtx.WithSchema(schema)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(time.Hour).Truncate(time.Second)
	other.RunAt = at
	var id int64
	submitIn(t, app, func(tx pgx.Tx) {
		if id, err = pgtx.Submit(ctx, tx, other, pgtx.WithSchema(schema)); err != nil {
			t.Fatalf("submit after a rolled-back one: %v", err)
		}
	})
	m, err := b.GetMessage(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if m.Priority != 7 || m.UniqueKey != "order-2" || !m.AvailableAt.Equal(at) {
		t.Fatalf("stored priority %d, key %q, available at %v; want 7, order-2, %v", m.Priority, m.UniqueKey, m.AvailableAt, at)
	}
}

// SubmitBatch collapses one key within the call and names the holder of a
// key already held.
func TestSubmitBatchCollapsesKeys(t *testing.T) {
	schema, _, app := setup(t)
	ctx := context.Background()
	var held int64
	submitIn(t, app, func(tx pgx.Tx) {
		var err error
		if held, err = pgtx.Submit(ctx, tx, pgtx.Task{Topic: "mail", Name: "m", UniqueKey: "held"}, pgtx.WithSchema(schema)); err != nil {
			t.Fatal(err)
		}
	})
	submitIn(t, app, func(tx pgx.Tx) {
		out, err := pgtx.SubmitBatch(ctx, tx, []pgtx.Task{
			{Topic: "mail", Name: "m", UniqueKey: "a"},
			{Topic: "mail", Name: "m"},
			{Topic: "mail", Name: "m", UniqueKey: "a"},
			{Topic: "mail", Name: "m", UniqueKey: "held"},
		}, pgtx.WithSchema(schema))
		if err != nil {
			t.Fatal(err)
		}
		if out[0].Duplicate || out[1].Duplicate || !out[2].Duplicate || !out[3].Duplicate ||
			out[2].ID != out[0].ID || out[3].ID != held {
			t.Fatalf("SubmitBatch = %+v", out)
		}
	})
	if n := count(t, app, schema, "tw_messages"); n != 3 {
		t.Fatalf("%d messages, want 3", n)
	}
}

// Tables migrated before priorities and unique keys (migration 12) still
// take plain tasks; a priority or a key is refused, saying to migrate.
func TestTablesBeforeMigration12(t *testing.T) {
	schema, _, app := setup(t)
	ctx := context.Background()
	s := pgx.Identifier{schema}.Sanitize()
	for _, q := range []string{
		`DROP INDEX ` + s + `.tw_messages_unique`,
		`DROP INDEX ` + s + `.tw_messages_queued`,
		`CREATE INDEX tw_messages_queued ON ` + s + `.tw_messages (topic, available_at, id) WHERE state = 'queued'`,
		`DROP FUNCTION ` + s + `.tw_message(bigint), ` + s + `.tw_report(bigint)`,
		`DROP VIEW ` + s + `.tw_reports, ` + s + `.tw_messages_all`,
		`ALTER TABLE ` + s + `.tw_messages DROP COLUMN priority, DROP COLUMN unique_key, DROP COLUMN unique_states`,
		`DROP TABLE ` + s + `.tw_unique_keys`,
		`DELETE FROM ` + s + `.tw_schema_migrations WHERE version >= 12`,
	} {
		if _, err := app.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	submitIn(t, app, func(tx pgx.Tx) {
		if _, err := pgtx.Submit(ctx, tx, pgtx.Task{Topic: "mail", Name: "m", RunAt: time.Now().Add(time.Minute)}, pgtx.WithSchema(schema)); err != nil {
			t.Fatalf("plain submit to tables at 11: %v", err)
		}
		if _, err := pgtx.SubmitMany(ctx, tx, []pgtx.Task{{Topic: "mail", Name: "m"}, {Topic: "mail", Name: "m"}}, pgtx.WithSchema(schema)); err != nil {
			t.Fatalf("plain SubmitMany to tables at 11: %v", err)
		}
		for _, task := range []pgtx.Task{{Topic: "mail", Name: "m", Priority: 1}, {Topic: "mail", Name: "m", UniqueKey: "k"}} {
			_, err := pgtx.Submit(ctx, tx, task, pgtx.WithSchema(schema))
			if !errors.Is(err, broker.ErrInvalid) || !strings.Contains(err.Error(), "migration 12") {
				t.Fatalf("Submit(%+v) to tables at 11 = %v, want ErrInvalid saying migration 12", task, err)
			}
		}
	})
	if n := count(t, app, schema, "tw_messages"); n != 3 {
		t.Fatalf("%d messages, want 3", n)
	}
}
