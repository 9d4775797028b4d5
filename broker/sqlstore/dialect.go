// Package sqlstore holds what the SQL stores (broker/local on SQLite,
// broker/postgres) have in common: the rules of the broker methods that do
// not differ between them (validation, defaults, error mapping, result
// assembly), written once over a Dialect that each store implements with
// its SQL and its driver's quirks.
//
// A Store answers the workers, topics, locks, reads and admin calls on
// messages, schedules, reports, leases and orphan reclaim. Submit, Claim,
// Ack, Nack and DeadLetter stay in each store: their SQL differs in shape,
// not only in text, and they are the hot path. Where an operation's
// statements differ in shape too (one PostgreSQL statement doing what
// SQLite needs several for), the Dialect has a method for it and the Store
// keeps the rules around it.
//
// # Statements and arguments
//
// The statements of the shared operations are a Queries value each
// dialect fills. Their arguments are the same for both dialects, in the
// same order; values that a dialect stores its own way are passed as
// markers that its Conn binds: At and NullAt (a time), Ago (the broker's
// now minus a duration) and Now (the broker's now). PostgreSQL decides
// time by its own clock, now() in the SQL, so its Conn drops Now: Now is
// always the last argument, and a PostgreSQL statement numbers only those
// before it.
package sqlstore

import (
	"context"
	"errors"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// ErrNoRows is what Row.Scan returns when the query found no row,
// whatever the driver's own error for it.
var ErrNoRows = errors.New("no rows in result set")

// Row is one result row.
type Row interface {
	Scan(dest ...any) error
}

// Rows is a result set; Close may be called more than once.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// Conn runs the statements of one call: in one transaction (SQLite, and
// PostgreSQL under Dialect.Tx) or on one connection (PostgreSQL under
// Read and Write). Arguments go through the dialect's binding of the
// markers (see the package documentation).
type Conn interface {
	// Exec runs q and returns the count of rows it changed.
	Exec(q string, args ...any) (int64, error)
	Query(q string, args ...any) (Rows, error)
	// QueryRow runs q; its Scan returns ErrNoRows when q found nothing.
	QueryRow(q string, args ...any) Row
}

// Dialect is what a SQL store gives a Store: how it runs a call, how its
// driver reads stored values, its statements, and the operations whose
// statements differ in shape.
type Dialect interface {
	// Read runs fn for a read: one snapshot (SQLite) or one pooled
	// connection (PostgreSQL). Write runs fn for a write of one statement
	// (or a PostgreSQL batch): one IMMEDIATE transaction (SQLite) or one
	// pooled connection, retried on a deadlock or a lost connection
	// (PostgreSQL). Tx runs fn in one transaction on both. Each returns
	// the broker's own errors as they are and wraps the database's with
	// the store's name and op; after Close they return broker.ErrClosed.
	Read(ctx context.Context, op string, fn func(c Conn) error) error
	Write(ctx context.Context, op string, fn func(c Conn) error) error
	Tx(ctx context.Context, op string, fn func(c Conn) error) error

	// Time returns a scan destination that stores a time column into t;
	// NullTime one that stores a nullable time column into *t (nil for
	// NULL).
	Time(t *time.Time) any
	NullTime(t **time.Time) any
	// ScanMessage reads a row of Queries.MessageCols, without the token.
	ScanMessage(r Row) (broker.Message, error)

	// SQL returns the dialect's statements.
	SQL() *Queries

	// Operations whose statements differ in shape between the dialects.
	// The Store has validated their arguments.
	DialectOps
}

// DialectOps are the operations each dialect writes its own way.
type DialectOps interface {
	// RegisterWorker records w (its id checked), keeping StartedAt when
	// the same host and pid register again.
	RegisterWorker(ctx context.Context, w broker.WorkerInfo) error
	// Workers lists every worker by id, with Running counted.
	Workers(ctx context.Context) ([]broker.WorkerInfo, error)
	// Stats counts per topic and overall, Workers, Beats and Subscribers
	// over live workers only.
	Stats(ctx context.Context) (broker.Stats, error)
	// AcquireLock inserts lock name for c unless it is held; held says
	// whether c holds its message, ok whether c holds the lock now.
	AcquireLock(c Conn, name, holder string, cl broker.Claim) (held, ok bool, err error)
	// Requeue puts message id back in the queue if it is dead or failed;
	// otherwise it reports the state it found ("" when there is no such
	// message).
	Requeue(c Conn, id int64) (state string, requeued bool, err error)
	// Purge deletes the topic's queued messages and, with deadLetters, its
	// dead ones.
	Purge(ctx context.Context, topic string, deadLetters bool) (broker.PurgeResult, error)
	// ListMessagesSQL is ListMessages's statement for f (checked) and
	// limit.
	ListMessagesSQL(f broker.MessageFilter, limit int) (string, []any)
	// ListReportsSQL is ListReports's statement for f (checked) and
	// limit: Queries.ReportCols, newest first.
	ListReportsSQL(f broker.ReportFilter, limit int) (string, []any)
	// InsertMessage queues the validated req within a FireSchedule.
	InsertMessage(c Conn, req broker.SubmitRequest) (int64, error)
	// AddReports stores the validated reports in one transaction and
	// returns their ids in order.
	AddReports(ctx context.Context, rs []broker.Report) ([]int64, error)
	// PurgeReports deletes the reports that ended before the cutoff.
	PurgeReports(ctx context.Context, before time.Time) (int, error)
	// TryLease acquires or renews lease name for holder for ttl.
	TryLease(ctx context.Context, name, holder string, ttl time.Duration) (broker.Lease, error)
	// ReclaimOrphans does one checked reaper pass (fence included); with
	// req.Dead set, a reclaim of those workers only, whatever the age of
	// their claims and locks (Store.ReclaimDead).
	ReclaimOrphans(ctx context.Context, req broker.ReclaimRequest) (broker.ReclaimResult, error)
}

// Queries are the statements of the shared operations. The comment of
// each names its arguments, in order.
type Queries struct {
	// Heartbeat: worker id, Now. ExpireWorker: worker id.
	// UnregisterWorker: worker id.
	Heartbeat, ExpireWorker, UnregisterWorker string
	// RunningClaims: worker id; selects (id, token) by id.
	RunningClaims string
	// LiveWorkers: Ago(after); selects id by id.
	LiveWorkers string

	// SetTopic: name, *int limit, *bool dead letter, *bool paused;
	// returns the topic's columns as Topics selects them.
	SetTopic string
	// Topics: selects (name, concurrency_limit, dead_letter_enabled,
	// paused) by name.
	Topics string

	// ReleaseLock: name, message id, token. ForceReleaseLock: name.
	ReleaseLock, ForceReleaseLock string
	// Locks: selects (name, holder, message_id, acquired_at) by name.
	Locks string

	// MessageCols are the columns ScanMessage reads. GetMessage: id.
	MessageCols, GetMessage string

	// ScheduleCols are the columns scanSchedule reads.
	ScheduleCols string
	// PutSchedule: name, task, topic, payload text, *int32 interval
	// seconds, *string cron, enabled, missed policy, source, Now; returns
	// ScheduleCols.
	PutSchedule string
	// GetSchedule: name. ListSchedules: none, by name. DeleteSchedule:
	// name.
	GetSchedule, ListSchedules, DeleteSchedule string
	// DueSchedules: At(at), limit. DueSchedulesAfter: At(at),
	// At(after next), after name, limit. Both select ScheduleCols of the
	// enabled schedules with next_fire_at <= at, by (next_fire_at, name),
	// the second after the given pair, from the due index.
	DueSchedules, DueSchedulesAfter string
	// DeferSchedule: name, At(updated_at), At(until); sets next_fire_at
	// to until where the schedule has that updated_at, no
	// expected_next_run, and a next_fire_at before until.
	DeferSchedule string
	// Fence: lease name, holder, term, Now; a row when the fence holds.
	Fence string
	// LockSchedule: name; a row when the schedule exists (locked for the
	// fire where the dialect locks).
	LockSchedule string
	// InsertFire: name, At(slot), Now; changes a row unless the slot
	// fired before. MarkFired: name, NullAt(next), Now; sets
	// expected_next_run and next_fire_at to next. FireMessage:
	// name, At(slot), message id.
	InsertFire, MarkFired, FireMessage string
	// ReleaseLease: name, holder, term, Now.
	ReleaseLease string

	// CancelLock: id; selects the message's state, locking its row for
	// the rest of the transaction where the dialect locks.
	// CancelQueuedOne: id, last error, Now; ends the (queued) message
	// cancelled. RequestCancel: id, Now; sets cancel_requested_at unless
	// set.
	CancelLock, CancelQueuedOne, RequestCancel string
	// CancelQueuedOneLock: id; when set, runs before CancelQueuedOne:
	// what a cancel of the queued message must lock first (PostgreSQL:
	// its topic, which its claims lock). CancelQueuedOne then finds the
	// message queued or taken by a claim meanwhile, and must handle both.
	CancelQueuedOneLock string
	// CancelQueued returns the statement that ends cancelled the queued
	// messages matching where (conditions from a Filter, whose arguments
	// come first), with the last error as argument n and Now after it.
	CancelQueued func(where string, n int) string
	// CancelQueuedLock, when set, returns a statement that CancelQueued
	// runs first, in the same transaction, with the arguments of where
	// alone: what a cancel of those messages must lock first (PostgreSQL:
	// their topics, which its claims lock).
	CancelQueuedLock func(where string) string
	// CancelRequests: worker id; selects (id, token) by id of the
	// messages running under it whose cancel was requested.
	CancelRequests string

	// ReportCols are the columns scanReport reads. GetReport: id.
	ReportCols, GetReport string

	// Placeholder returns the marker of the n-th argument (from 1) of a
	// statement built from parts (filters).
	Placeholder func(n int) string
}

// markers

type nowArg struct{}

// Now stands for the broker's now; it must be the last argument.
var Now any = nowArg{}

// AgoArg is the broker's now minus D.
type AgoArg struct{ D time.Duration }

// Ago stands for the broker's now minus d.
func Ago(d time.Duration) any { return AgoArg{D: d} }

// AtArg is a time argument; Null makes a zero T NULL.
type AtArg struct {
	T    time.Time
	Null bool
}

// At stands for t as the dialect stores times.
func At(t time.Time) any { return AtArg{T: t} }

// NullAt stands for t as the dialect stores times, NULL when t is zero.
func NullAt(t time.Time) any { return AtArg{T: t, Null: true} }

// IsNow reports whether v is Now.
func IsNow(v any) bool { _, ok := v.(nowArg); return ok }

// Collect reads every row of rows with scan, closing rows; err is the
// error of the query that returned rows. The result is never nil.
func Collect[T any](rows Rows, err error, scan func(r Row) (T, error)) ([]T, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []T{}
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, nil
}
