package local

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/sqlstore"
)

// shared is the part of the broker common to the SQL stores; embedded
// under this name, it stays out of the exported fields.
type shared = sqlstore.Store

// dialect is the local store's sqlstore.Dialect: SQLite's statements, run
// in the broker's transactions, times as unix nanoseconds.
type dialect struct{ b *Broker }

var _ sqlstore.Dialect = dialect{}

func (d dialect) Read(ctx context.Context, op string, fn func(c sqlstore.Conn) error) error {
	return d.b.read(ctx, op, func(tx *txn, now time.Time) error { return fn(&conn{tx: tx, now: now}) })
}

func (d dialect) Write(ctx context.Context, op string, fn func(c sqlstore.Conn) error) error {
	return d.b.write(ctx, op, func(tx *txn, now time.Time) error { return fn(&conn{tx: tx, now: now}) })
}

// Tx is Write: every write is one transaction here.
func (d dialect) Tx(ctx context.Context, op string, fn func(c sqlstore.Conn) error) error {
	return d.Write(ctx, op, fn)
}

func (dialect) Time(t *time.Time) any { return nsTime{t} }

func (dialect) NullTime(t **time.Time) any { return nullNSTime{t} }

func (dialect) ScanMessage(r sqlstore.Row) (broker.Message, error) { return scanMessage(r, false) }

func (dialect) SQL() *sqlstore.Queries { return &queries }

// nsTime scans a time stored as unix nanoseconds.
type nsTime struct{ t *time.Time }

func (s nsTime) Scan(src any) error {
	v, ok := src.(int64)
	if !ok {
		return fmt.Errorf("time column holds %T, want unix nanoseconds", src)
	}
	*s.t = fromNS(v)
	return nil
}

// nullNSTime scans a nullable time stored as unix nanoseconds.
type nullNSTime struct{ t **time.Time }

func (s nullNSTime) Scan(src any) error {
	if src == nil {
		*s.t = nil
		return nil
	}
	var t time.Time
	if err := (nsTime{&t}).Scan(src); err != nil {
		return err
	}
	*s.t = &t
	return nil
}

// conn is a sqlstore.Conn over one of the broker's transactions, whose
// now (read once the transaction began) the markers bind to.
type conn struct {
	tx  *txn
	now time.Time
}

// bind turns sqlstore's markers and pointer arguments into values SQLite
// stores.
func (c *conn) bind(args []any) []any {
	out := make([]any, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case sqlstore.AgoArg:
			out[i] = addNS(c.now, -v.D)
		case sqlstore.AtArg:
			out[i] = ns(v.T)
			if v.Null && v.T.IsZero() {
				out[i] = nil
			}
		case *int:
			out[i] = deref(v)
		case *int32:
			out[i] = deref(v)
		case *bool:
			out[i] = deref(v)
		case *string:
			out[i] = deref(v)
		default:
			if sqlstore.IsNow(a) {
				out[i] = ns(c.now)
			} else {
				out[i] = a
			}
		}
	}
	return out
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

func (c *conn) Exec(q string, args ...any) (int64, error) {
	r, err := c.tx.Exec(q, c.bind(args)...)
	if err != nil {
		return 0, err
	}
	return r.RowsAffected()
}

func (c *conn) Query(q string, args ...any) (sqlstore.Rows, error) {
	rows, err := c.tx.Query(q, c.bind(args)...)
	if err != nil {
		return nil, err
	}
	return sqlRows{rows}, nil
}

func (c *conn) QueryRow(q string, args ...any) sqlstore.Row {
	return sqlRow{c.tx.QueryRow(q, c.bind(args)...)}
}

type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }

type sqlRow struct{ *sql.Row }

func (r sqlRow) Scan(dest ...any) error {
	err := r.Row.Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return sqlstore.ErrNoRows
	}
	return err
}

// queries are the local store's statements of the shared operations; see
// sqlstore.Queries for their arguments. Times are unix nanoseconds.
var queries = sqlstore.Queries{
	Heartbeat:        `UPDATE tw_workers SET heartbeat_at = ?2 WHERE id = ?1`,
	ExpireWorker:     `UPDATE tw_workers SET heartbeat_at = 0 WHERE id = ?`,
	UnregisterWorker: `DELETE FROM tw_workers WHERE id = ?`,
	RunningClaims: `SELECT id, token FROM tw_messages
			WHERE state = 'running' AND claimed_by = ? ORDER BY id`,
	LiveWorkers: `SELECT id FROM tw_workers WHERE heartbeat_at > ? ORDER BY id`,

	SetTopic: `INSERT INTO tw_topics (name, concurrency_limit, dead_letter_enabled, paused)
			VALUES (?1, coalesce(?2, 0), coalesce(?3, 1), coalesce(?4, 0))
			ON CONFLICT (name) DO UPDATE SET
				concurrency_limit = coalesce(?2, concurrency_limit),
				dead_letter_enabled = coalesce(?3, dead_letter_enabled),
				paused = coalesce(?4, paused)
			RETURNING name, concurrency_limit, dead_letter_enabled, paused`,
	Topics: `SELECT name, concurrency_limit, dead_letter_enabled, paused FROM tw_topics ORDER BY name`,

	ReleaseLock:      `DELETE FROM tw_locks WHERE name = ? AND message_id = ? AND token = ?`,
	ForceReleaseLock: `DELETE FROM tw_locks WHERE name = ?`,
	Locks:            `SELECT name, holder, message_id, acquired_at FROM tw_locks ORDER BY name`,

	MessageCols: msgCols,
	GetMessage:  `SELECT ` + msgCols + ` FROM tw_messages WHERE id = ?`,

	CancelLock: `SELECT state FROM tw_messages WHERE id = ?`,
	CancelQueuedOne: `UPDATE tw_messages
			SET state = 'cancelled', finished_at = ?3, last_error = ?2, waiting_since = NULL
			WHERE id = ?1`,
	RequestCancel: `UPDATE tw_messages SET cancel_requested_at = coalesce(cancel_requested_at, ?2) WHERE id = ?1`,
	// The filter's arguments come first in the text, so its plain
	// placeholders number before the SET's.
	CancelQueued: func(where string, n int) string {
		return `WITH c AS (SELECT id FROM tw_messages WHERE state = 'queued' AND ` + where + `)
			UPDATE tw_messages
			SET state = 'cancelled', last_error = ?` + strconv.Itoa(n) + `, finished_at = ?` + strconv.Itoa(n+1) + `, waiting_since = NULL
			WHERE id IN (SELECT id FROM c)`
	},
	CancelRequests: `SELECT id, token FROM tw_messages
			WHERE state = 'running' AND claimed_by = ? AND cancel_requested_at IS NOT NULL ORDER BY id`,

	ScheduleCols: schedCols,
	PutSchedule: `INSERT INTO tw_schedules
			(name, task, topic, payload, interval_seconds, cron, enabled, missed_policy, source, unique_key, created_at, updated_at, next_fire_at)
			VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?11, ?11 / 1000000000 * 1000000000)
			ON CONFLICT (name) DO UPDATE SET
				task = excluded.task, topic = excluded.topic, payload = excluded.payload,
				interval_seconds = excluded.interval_seconds, cron = excluded.cron,
				enabled = excluded.enabled, missed_policy = excluded.missed_policy, source = excluded.source,
				unique_key = excluded.unique_key,
				expected_next_run = CASE
					WHEN tw_schedules.interval_seconds IS excluded.interval_seconds AND tw_schedules.cron IS excluded.cron
					THEN tw_schedules.expected_next_run END,
				next_fire_at = COALESCE(CASE
					WHEN tw_schedules.interval_seconds IS excluded.interval_seconds AND tw_schedules.cron IS excluded.cron
					THEN tw_schedules.expected_next_run END, excluded.next_fire_at),
				updated_at = excluded.updated_at
			RETURNING ` + schedCols,
	GetSchedule:    `SELECT ` + schedCols + ` FROM tw_schedules WHERE name = ?`,
	ListSchedules:  `SELECT ` + schedCols + ` FROM tw_schedules ORDER BY name`,
	DeleteSchedule: `DELETE FROM tw_schedules WHERE name = ?`,
	DueSchedules: `SELECT ` + schedCols + ` FROM tw_schedules
			WHERE enabled = 1 AND next_fire_at <= ?
			ORDER BY next_fire_at, name LIMIT ?`,
	DueSchedulesAfter: `SELECT ` + schedCols + ` FROM tw_schedules
			WHERE enabled = 1 AND next_fire_at <= ?1 AND (next_fire_at, name) > (?2, ?3)
			ORDER BY next_fire_at, name LIMIT ?4`,
	DeferSchedule: `UPDATE tw_schedules SET next_fire_at = ?3
			WHERE name = ?1 AND updated_at = ?2 AND expected_next_run IS NULL AND next_fire_at < ?3`,
	// The fence and the fire run in an IMMEDIATE transaction: the write
	// lock keeps any other writer out until it commits.
	Fence:        `SELECT 1 FROM tw_leases WHERE name = ? AND holder = ? AND term = ? AND expires_at > ?`,
	LockSchedule: `SELECT 1 FROM tw_schedules WHERE name = ?`,
	InsertFire: `INSERT INTO tw_schedule_fires (name, slot, fired_at) VALUES (?, ?, ?)
			ON CONFLICT (name, slot) DO NOTHING`,
	MarkFired:   `UPDATE tw_schedules SET last_attempt = ?3, expected_next_run = ?2, next_fire_at = ?2 WHERE name = ?1`,
	FireMessage: `UPDATE tw_schedule_fires SET message_id = ?3 WHERE name = ?1 AND slot = ?2`,
	ReleaseLease: `UPDATE tw_leases SET expires_at = ?4
			WHERE name = ?1 AND holder = ?2 AND term = ?3 AND expires_at > ?4`,

	ReportCols: reportCols,
	GetReport:  `SELECT ` + reportCols + ` FROM tw_reports WHERE id = ?`,

	Placeholder: func(int) string { return "?" },
}

// schedCols are the schedule columns sqlstore reads, in its order.
const schedCols = `name, task, topic, payload, interval_seconds, cron, enabled, missed_policy, source,
	last_attempt, last_success, expected_next_run, created_at, updated_at, next_fire_at, unique_key`

// reportCols are the report columns sqlstore reads, in its order.
const reportCols = `id, message_id, task, topic, schedule, attempt, worker, status, started_at, ended_at,
	duration_seconds, error, result, progress, logs`
