package postgres

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/taskhost/taskhost/internal/testdb"
)

// connect opens a connection for the test's own bookkeeping (schemas,
// direct reads and writes), closed at cleanup. PostgreSQL being
// unreachable fails the test: these tests are the broker's only proof.
func connect(t testing.TB) *pgx.Conn {
	t.Helper()
	return testdb.Connect(t, "")
}

// freshSchema returns the name of a schema nobody uses yet, dropped (with
// everything in it) when the test ends.
func freshSchema(t testing.TB) string {
	t.Helper()
	return testdb.FreshSchema(t, "tw_test_")
}

// newTestBroker returns a broker on a fresh schema, closed and dropped at
// cleanup.
func newTestBroker(t testing.TB, opts Options) *Broker {
	t.Helper()
	opts.DSN = testdb.DSN()
	opts.Schema = freshSchema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := New(ctx, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// schemaConn is a connection whose search_path is b's schema.
func schemaConn(t testing.TB, b *Broker) *pgx.Conn {
	t.Helper()
	c := connect(t)
	if _, err := c.Exec(context.Background(), `SET search_path TO `+pgx.Identifier{b.schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	return c
}

// execAll runs each statement on c, failing the test at the first error.
func execAll(t testing.TB, c *pgx.Conn, sqls ...string) {
	t.Helper()
	for _, sql := range sqls {
		if _, err := c.Exec(context.Background(), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
}

// benchSchemas are the schemas benchmarks keep for the whole run (seeded
// once), dropped by TestMain.
var benchSchemas struct {
	sync.Mutex
	names []string
}

func TestMain(m *testing.M) {
	code := m.Run()
	queues.Lock()
	for _, br := range queues.byDepth {
		_ = br.Close()
	}
	queues.Unlock()
	benchSchemas.Lock()
	names := benchSchemas.names
	benchSchemas.Unlock()
	if len(names) > 0 {
		for _, n := range names {
			_ = testdb.DropSchema(n)
		}
	}
	os.Exit(code)
}
