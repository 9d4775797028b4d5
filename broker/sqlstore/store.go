package sqlstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/taskhost/taskhost/broker"
)

// Store is the shared part of a SQL store. A store embeds it, and so
// answers the calls it implements with the rules written here and the
// statements of its Dialect.
type Store struct {
	d          Dialect
	q          *Queries
	maxPayload int
}

// New returns the Store of dialect d; maxPayload bounds a schedule's
// payload as it bounds a submit's.
func New(d Dialect, maxPayload int) *Store {
	return &Store{d: d, q: d.SQL(), maxPayload: maxPayload}
}

// notFound reports err as broker.ErrNotFound naming what when it is
// ErrNoRows.
func notFound(err error, format string, args ...any) error {
	if errors.Is(err, ErrNoRows) {
		return fmt.Errorf(format+": %w", append(args, broker.ErrNotFound)...)
	}
	return err
}

// exactlyOne runs q and reports broker.ErrNotFound naming what when it
// changed no row.
func exactlyOne(c Conn, what string, q string, args ...any) error {
	n, err := c.Exec(q, args...)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%s: %w", what, broker.ErrNotFound)
	}
	return nil
}

// list runs q in a read and scans its rows with scan.
func list[T any](ctx context.Context, s *Store, op string, scan func(Row) (T, error), q string, args ...any) ([]T, error) {
	var out []T
	err := s.d.Read(ctx, op, func(c Conn) error {
		rows, err := c.Query(q, args...)
		out, err = Collect(rows, err, scan)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// one runs q in a read and scans its one row with scan; no row is
// broker.ErrNotFound naming what.
func one[T any](ctx context.Context, s *Store, op, what string, scan func(Row) (T, error), q string, args ...any) (T, error) {
	var out T
	err := s.d.Read(ctx, op, func(c Conn) error {
		var err error
		out, err = scan(c.QueryRow(q, args...))
		return notFound(err, "%s", what)
	})
	if err != nil {
		var zero T
		return zero, err
	}
	return out, nil
}
