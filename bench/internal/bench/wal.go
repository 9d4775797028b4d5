package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// statsPublished is how long the bench waits, untimed, before it reads
// PostgreSQL's cumulative statistics at the end of a window: a backend
// publishes its counts when it goes idle, at most once a second.
const statsPublished = 1500 * time.Millisecond

// walMeter measures the WAL written during a phase, from pg_stat_wal's
// wal_bytes before and after. pg_stat_wal covers the whole cluster, so
// other databases' writes meanwhile count too: give the bench a quiet
// server. A walMeter without a connection (memory and local) measures
// nothing.
type walMeter struct {
	c      *pgx.Conn
	before int64
}

// walBytes reads pg_stat_wal's wal_bytes (PostgreSQL 14 and later).
func walBytes(ctx context.Context, c *pgx.Conn) (int64, error) {
	_, _ = c.Exec(ctx, `SELECT pg_stat_clear_snapshot()`)
	var v int64
	if err := c.QueryRow(ctx, `SELECT wal_bytes::bigint FROM pg_stat_wal`).Scan(&v); err != nil {
		return 0, fmt.Errorf("reading pg_stat_wal (PostgreSQL 14 or later has it): %w", err)
	}
	return v, nil
}

// start reads wal_bytes at the start of the phase, through c (nil: no
// measure).
func (w *walMeter) start(ctx context.Context, c *pgx.Conn) error {
	w.c = c
	if c == nil {
		return nil
	}
	var err error
	w.before, err = walBytes(ctx, c)
	return err
}

// perMessage waits until the phase's backends have published their
// counts, reads wal_bytes again and returns the bytes written since start
// per message of n (0 without a connection).
func (w *walMeter) perMessage(ctx context.Context, n int) (float64, error) {
	if w.c == nil {
		return 0, nil
	}
	select {
	case <-time.After(statsPublished):
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	after, err := walBytes(ctx, w.c)
	if err != nil {
		return 0, err
	}
	return float64(after-w.before) / float64(n), nil
}

// note is the figure perMessage returned, for a phase's line.
func (w *walMeter) note(perMsg float64) string {
	if w.c == nil {
		return ""
	}
	return fmt.Sprintf("  WAL %s B/message", fmtNum(perMsg))
}
