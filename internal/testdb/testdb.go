// Package testdb gives tests the PostgreSQL database they run against:
// its address (TEST_DATABASE_URL, by default the local test database),
// connections to it and fresh schemas in it.
//
// PostgreSQL being unreachable fails the test, never skips it: the tests
// on PostgreSQL are the only proof the distributed mode works. The failure
// says how to start it.
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Env names the variable that points the tests at another database.
const Env = "TEST_DATABASE_URL"

// DefaultDSN is the database the tests use unless Env names another.
const DefaultDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// DSN returns the test database's address: Env when set, else DefaultDSN.
func DSN() string {
	if v := os.Getenv(Env); v != "" {
		return v
	}
	return DefaultDSN
}

// HowToStart is what a test says when PostgreSQL does not answer.
const HowToStart = "start it with: pg_ctlcluster 15 main start, or set " + Env +
	" to a database the tests may create schemas in (default " + DefaultDSN + ")"

// Connect opens a connection to the test database, closed at cleanup; when
// schema is not empty, its search_path is that schema. PostgreSQL being
// unreachable fails the test with HowToStart.
func Connect(tb testing.TB, schema string) *pgx.Conn {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, DSN())
	if err != nil {
		tb.Fatalf("cannot reach the test PostgreSQL (%s): %v\n%s", Redact(DSN()), err, HowToStart)
	}
	tb.Cleanup(func() { closeConn(c) })
	if schema != "" {
		if _, err := c.Exec(ctx, `SET search_path TO `+pgx.Identifier{schema}.Sanitize()); err != nil {
			tb.Fatalf("search_path %s: %v", schema, err)
		}
	}
	return c
}

// Redact describes dsn without its password.
func Redact(dsn string) string {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "an unparsable " + Env
	}
	return fmt.Sprintf("host %s port %d database %s user %s", cfg.Host, cfg.Port, cfg.Database, cfg.User)
}

// SchemaName returns a schema name nobody uses yet: prefix and random
// hex digits.
func SchemaName(prefix string) string {
	var buf [6]byte
	_, _ = rand.Read(buf[:])
	return prefix + hex.EncodeToString(buf[:])
}

// FreshSchema checks that the test database answers (failing the test
// when it does not) and returns a new schema name (SchemaName(prefix)); the
// schema, with everything in it, is dropped when the test ends.
func FreshSchema(tb testing.TB, prefix string) string {
	tb.Helper()
	Connect(tb, "") // fail early and clearly when PostgreSQL is down
	name := SchemaName(prefix)
	tb.Cleanup(func() {
		if err := DropSchema(name); err != nil {
			tb.Errorf("dropping schema %s: %v", name, err)
		}
	})
	return name
}

// DropSchema drops schema name and everything in it, if it exists.
func DropSchema(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, DSN())
	if err != nil {
		return err
	}
	defer closeConn(c)
	_, err = c.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{name}.Sanitize()+` CASCADE`)
	return err
}

func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}
