package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// defaultTestDSN is the database the tests use unless TEST_DATABASE_URL
// names another.
const defaultTestDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

func testDSN() string {
	if v := os.Getenv("TEST_DATABASE_URL"); v != "" {
		return v
	}
	return defaultTestDSN
}

// connect opens a connection for the test's own bookkeeping (schemas,
// direct reads and writes), closed at cleanup. PostgreSQL being
// unreachable fails the test: these tests are the broker's only proof.
func connect(t testing.TB) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, testDSN())
	if err != nil {
		t.Fatalf("cannot reach the test PostgreSQL (%s): %v\n"+
			"start it with: pg_ctlcluster 15 main start, or set TEST_DATABASE_URL to a database the tests may create schemas in",
			redactDSN(testDSN()), err)
	}
	t.Cleanup(func() { closeConn(c) })
	return c
}

func redactDSN(dsn string) string {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "an unparsable TEST_DATABASE_URL"
	}
	return fmt.Sprintf("host %s port %d database %s user %s", cfg.Host, cfg.Port, cfg.Database, cfg.User)
}

func randomSchema() string {
	var buf [6]byte
	_, _ = rand.Read(buf[:])
	return "tw_test_" + hex.EncodeToString(buf[:])
}

// freshSchema returns the name of a schema nobody uses yet, dropped (with
// everything in it) when the test ends.
func freshSchema(t testing.TB) string {
	t.Helper()
	connect(t) // fail early and clearly when PostgreSQL is down
	name := randomSchema()
	t.Cleanup(func() { dropSchema(t, name) })
	return name
}

func dropSchema(t testing.TB, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, testDSN())
	if err != nil {
		t.Errorf("dropping schema %s: %v", name, err)
		return
	}
	defer closeConn(c)
	if _, err := c.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{name}.Sanitize()+` CASCADE`); err != nil {
		t.Errorf("dropping schema %s: %v", name, err)
	}
}

// newTestBroker returns a broker on a fresh schema, closed and dropped at
// cleanup.
func newTestBroker(t testing.TB, opts Options) *Broker {
	t.Helper()
	opts.DSN = testDSN()
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
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if c, err := pgx.Connect(ctx, testDSN()); err == nil {
			for _, n := range names {
				_, _ = c.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{n}.Sanitize()+` CASCADE`)
			}
			closeConn(c)
		}
		cancel()
	}
	os.Exit(code)
}
