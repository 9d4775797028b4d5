package postgres

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/sqlstore"
)

// shared is the part of the broker common to the SQL stores; embedded
// under this name, it stays out of the exported fields.
type shared = sqlstore.Store

// dialect is the PostgreSQL sqlstore.Dialect: its statements, run on the
// broker's pooled connections, times by the database's clock (now()).
type dialect struct{ b *Broker }

var _ sqlstore.Dialect = dialect{}

func (d dialect) Read(ctx context.Context, op string, fn func(c sqlstore.Conn) error) error {
	return d.b.run(ctx, op, func(c *pgx.Conn) error { return fn(conn{ctx: ctx, q: c}) })
}

// Write is Read: a statement commits on its own, a batch in one implicit
// transaction.
func (d dialect) Write(ctx context.Context, op string, fn func(c sqlstore.Conn) error) error {
	return d.Read(ctx, op, fn)
}

func (d dialect) Tx(ctx context.Context, op string, fn func(c sqlstore.Conn) error) error {
	return d.b.run(ctx, op, func(c *pgx.Conn) error {
		return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error { return fn(conn{ctx: ctx, q: tx}) })
	})
}

// Time and NullTime: pgx scans timestamptz into time.Time and *time.Time.
func (dialect) Time(t *time.Time) any { return t }

func (dialect) NullTime(t **time.Time) any { return t }

func (dialect) ScanMessage(r sqlstore.Row) (broker.Message, error) { return scanMessage(r, false) }

func (dialect) SQL() *sqlstore.Queries { return &queries }

// querier is what pgx.Conn and pgx.Tx have in common.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// conn is a sqlstore.Conn over a connection or a transaction.
type conn struct {
	ctx context.Context
	q   querier
}

// bind turns sqlstore's markers into what the statements take: Now is
// dropped (the statements say now(); it is always the last argument), Ago
// is microseconds (the statements say now() - $n * interval '1
// microsecond'), a time is itself.
func bind(args []any) []any {
	if n := len(args); n > 0 && sqlstore.IsNow(args[n-1]) {
		args = args[:n-1]
	}
	out := make([]any, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case sqlstore.AgoArg:
			out[i] = micros(v.D)
		case sqlstore.AtArg:
			if v.Null && v.T.IsZero() {
				out[i] = nil
			} else {
				out[i] = v.T
			}
		default:
			if sqlstore.IsNow(a) {
				panic("sqlstore.Now must be the last argument")
			}
			out[i] = a
		}
	}
	return out
}

func (c conn) Exec(q string, args ...any) (int64, error) {
	tag, err := c.q.Exec(c.ctx, q, bind(args)...)
	return tag.RowsAffected(), err
}

func (c conn) Query(q string, args ...any) (sqlstore.Rows, error) {
	return c.q.Query(c.ctx, q, bind(args)...)
}

func (c conn) QueryRow(q string, args ...any) sqlstore.Row {
	return row{c.q.QueryRow(c.ctx, q, bind(args)...)}
}

type row struct{ pgx.Row }

func (r row) Scan(dest ...any) error {
	err := r.Row.Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return sqlstore.ErrNoRows
	}
	return err
}

// queries are the PostgreSQL statements of the shared operations; see
// sqlstore.Queries for their arguments. Now is the database's now().
var queries = sqlstore.Queries{
	Heartbeat:        `UPDATE tw_workers SET heartbeat_at = now() WHERE id = $1`,
	ExpireWorker:     `UPDATE tw_workers SET heartbeat_at = now() - interval '100 years' WHERE id = $1`,
	UnregisterWorker: `DELETE FROM tw_workers WHERE id = $1`,
	RunningClaims:    workerHolds("$1", ""),
	LiveWorkers: `
			SELECT id FROM tw_workers
			WHERE heartbeat_at > now() - $1::bigint * interval '1 microsecond'
			ORDER BY id`,

	SetTopic: `
			INSERT INTO tw_topics AS t (name, concurrency_limit, dead_letter_enabled, paused)
			VALUES ($1, coalesce($2::int, 0), coalesce($3::bool, true), coalesce($4::bool, false))
			ON CONFLICT (name) DO UPDATE SET
				concurrency_limit = coalesce($2::int, t.concurrency_limit),
				dead_letter_enabled = coalesce($3::bool, t.dead_letter_enabled),
				paused = coalesce($4::bool, t.paused)
			RETURNING name, concurrency_limit, dead_letter_enabled, paused`,
	Topics: `SELECT name, concurrency_limit, dead_letter_enabled, paused FROM tw_topics ORDER BY name`,

	ReleaseLock:      `DELETE FROM tw_locks WHERE name = $1 AND message_id = $2 AND token::text = $3`,
	ForceReleaseLock: `DELETE FROM tw_locks WHERE name = $1`,
	Locks:            `SELECT name, holder, message_id, acquired_at FROM tw_locks ORDER BY name`,

	MessageCols: msgCols,
	GetMessage:  getMessageSQL,

	// Cancel locks the row first: an ack or nack waits and then sees the
	// request. The state it reads shows a held message as running
	// (claims.go). A queued message is cancelled only under the topic's
	// lock (CancelQueuedOneLock), which claims take: a claim that took the
	// message meanwhile is seen by CancelQueuedOne, whose snapshot comes
	// after the lock, and the message gets a cancel request instead. (The
	// row, then the topic: the order of an AckAndClaim, which writes its
	// acked rows before it claims. Purge, which takes the topic first,
	// passes locked rows by.)
	CancelLock: `SELECT CASE WHEN m.state = 'queued' AND m.id IN ` + heldIDs("m.topic") + ` THEN 'running' ELSE m.state END
			FROM tw_messages m WHERE m.id = $1
			FOR NO KEY UPDATE`,
	CancelQueuedOneLock: `SELECT 1 FROM tw_topics WHERE name = (SELECT topic FROM tw_messages WHERE id = $1) FOR UPDATE`,
	CancelQueuedOne: `UPDATE tw_messages m
			SET state = CASE WHEN h.held THEN m.state ELSE 'cancelled' END,
				finished_at = CASE WHEN h.held THEN m.finished_at ELSE now() END,
				last_error = CASE WHEN h.held THEN m.last_error ELSE $2 END,
				waiting_since = CASE WHEN h.held THEN m.waiting_since END,
				cancel_requested_at = CASE WHEN h.held THEN coalesce(m.cancel_requested_at, now()) ELSE m.cancel_requested_at END
			FROM (SELECT EXISTS (SELECT 1 FROM tw_messages q WHERE q.id = $1 AND q.id IN ` + heldIDs("q.topic") + `) AS held) h
			WHERE m.id = $1`,
	RequestCancel: `UPDATE tw_messages SET cancel_requested_at = coalesce(cancel_requested_at, now()) WHERE id = $1`,
	// The rows are locked in id order first, as the reaper and Ack lock
	// theirs.
	CancelQueued: func(where string, n int) string {
		return `WITH c AS (
				SELECT id FROM tw_messages WHERE ` + queuedRow + ` AND ` + where + `
				ORDER BY id FOR NO KEY UPDATE)
			UPDATE tw_messages
			SET state = 'cancelled', finished_at = now(), last_error = $` + strconv.Itoa(n) + `, waiting_since = NULL
			WHERE id = ANY (ARRAY (SELECT id FROM c)) AND state = 'queued'`
	},
	CancelQueuedLock: func(where string) string {
		return `SELECT 1 FROM tw_topics
			WHERE name IN (SELECT DISTINCT topic FROM tw_messages WHERE state = 'queued' AND ` + where + `)
			ORDER BY name FOR UPDATE`
	},
	CancelRequests: workerHolds("$1", "m.cancel_requested_at IS NOT NULL"),

	ScheduleCols:   schedCols,
	PutSchedule:    putScheduleSQL,
	GetSchedule:    `SELECT ` + schedCols + ` FROM tw_schedules WHERE name = $1`,
	ListSchedules:  `SELECT ` + schedCols + ` FROM tw_schedules ORDER BY name`,
	DeleteSchedule: `DELETE FROM tw_schedules WHERE name = $1`,
	DueSchedules: `SELECT ` + schedCols + ` FROM tw_schedules
		WHERE enabled AND next_fire_at <= $1
		ORDER BY next_fire_at, name LIMIT $2`,
	DueSchedulesAfter: `SELECT ` + schedCols + ` FROM tw_schedules
		WHERE enabled AND next_fire_at <= $1 AND (next_fire_at, name) > ($2, $3)
		ORDER BY next_fire_at, name LIMIT $4`,
	DeferSchedule: `UPDATE tw_schedules SET next_fire_at = $3
		WHERE name = $1 AND updated_at = $2 AND expected_next_run IS NULL AND next_fire_at < $3`,
	// The fence locks the lease row FOR SHARE so no takeover commits
	// before the transaction does; the fire locks the schedule row,
	// serialising fires of one schedule, and against its deletion.
	Fence: `
		SELECT 1 FROM tw_leases
		WHERE name = $1 AND holder = $2 AND term = $3 AND expires_at > now()
		FOR SHARE`,
	LockSchedule: `SELECT 1 FROM tw_schedules WHERE name = $1 FOR NO KEY UPDATE`,
	InsertFire: `INSERT INTO tw_schedule_fires (name, slot, fired_at) VALUES ($1, $2, now())
				ON CONFLICT (name, slot) DO NOTHING`,
	MarkFired:   `UPDATE tw_schedules SET last_attempt = now(), expected_next_run = $2, next_fire_at = $2 WHERE name = $1`,
	FireMessage: `UPDATE tw_schedule_fires SET message_id = $3 WHERE name = $1 AND slot = $2`,
	ReleaseLease: `
			UPDATE tw_leases SET expires_at = now()
			WHERE name = $1 AND holder = $2 AND term = $3 AND expires_at > now()`,

	ReportCols: reportCols,
	GetReport:  getReportSQL,

	Placeholder: func(n int) string { return "$" + strconv.Itoa(n) },
}

// schedCols are the schedule columns sqlstore reads, in its order.
const schedCols = `name, task, topic, payload::text, interval_seconds, cron, enabled, missed_policy, source,
	last_attempt, last_success, expected_next_run, created_at, updated_at, next_fire_at, unique_key`

// putScheduleSQL upserts a schedule: a replaced one keeps created_at and
// its run state, except expected_next_run when the timing changed.
// next_fire_at is the kept expected_next_run, or the start of the second
// of now (the first slot of an interval, a lower bound of a cron's).
const putScheduleSQL = `
	INSERT INTO tw_schedules AS s
		(name, task, topic, payload, interval_seconds, cron, enabled, missed_policy, source, unique_key, created_at, updated_at, next_fire_at)
	VALUES ($1, $2, $3, $4::text::jsonb, $5::int, $6::text, $7, $8, $9, $10::text, now(), now(), date_trunc('second', now()))
	ON CONFLICT (name) DO UPDATE SET
		task = excluded.task, topic = excluded.topic, payload = excluded.payload,
		interval_seconds = excluded.interval_seconds, cron = excluded.cron,
		enabled = excluded.enabled, missed_policy = excluded.missed_policy, source = excluded.source,
		unique_key = excluded.unique_key,
		expected_next_run = CASE
			WHEN s.interval_seconds IS NOT DISTINCT FROM excluded.interval_seconds
				AND s.cron IS NOT DISTINCT FROM excluded.cron
			THEN s.expected_next_run END,
		next_fire_at = COALESCE(CASE
			WHEN s.interval_seconds IS NOT DISTINCT FROM excluded.interval_seconds
				AND s.cron IS NOT DISTINCT FROM excluded.cron
			THEN s.expected_next_run END, date_trunc('second', now())),
		updated_at = now()
	RETURNING ` + schedCols

// reportCols are the report columns sqlstore reads, in its order.
const reportCols = `id, message_id, task, topic, schedule, attempt, worker, status, started_at, ended_at,
	duration_seconds, error, result::text, progress, logs::text`
