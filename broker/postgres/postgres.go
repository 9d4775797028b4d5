// Package postgres is the PostgreSQL broker: the distributed mode, where
// the processes of several hosts share one database.
//
// It keeps the rules every broker keeps (package broker's documentation
// lists them; broker/brokertest checks them) with the database as the
// only shared state and its clock (now()) as the only clock that decides
// ownership:
//
//   - Claim serves each requested topic in its own short transaction. The
//     transaction first locks the topic's tw_topics row (SELECT ... FOR
//     UPDATE, a statement of its own), whatever the topic's limit, and
//     only then, in the next statement and so with a snapshot taken after
//     the lock was granted, counts the topic's running messages and takes
//     up to limit-running of the oldest available queued ones. The count
//     is the concurrency gate, as the specification says, and the lock
//     makes count-then-claim race-free across processes. A claim writes
//     one claim row holding the ids it took (one the topic's
//     outcomes left empty, when there is one, else a new one), not the
//     messages' rows,
//     which stay queued: a message is running while a claim row holds it
//     (claims.go). A claim starts its walk of the queued index where the
//     previous claim of the topic ended (claimFloors), past the dead
//     entries acked messages leave until VACUUM and the held messages.
//     A topic whose last claim here took nothing is not claimed again
//     until a look at its kept counts (tw_topic_counts) finds it may hold
//     a message (idleTopics in claim.go): a claim that finds nothing still
//     takes the topic's lock and flushes its commit.
//   - AckAndClaim (broker.AckClaimer), the worker pool's way to write
//     acks, puts them at the head of the transaction of its next claim:
//     they lock their claim rows (in id order) and their messages' rows
//     before the transaction waits for the topic lock, which cannot
//     deadlock since a transaction holding a topic lock waits for no row
//     (a claim writes only its claim row, and takes an empty one only when
//     no one holds it locked); and the count that gates the
//     claim sees their slots free. One round trip and one commit serve
//     both.
//   - SubmitMany (broker.BatchSubmitter) queues many messages with one
//     multi-row insert per 5,000.
//   - Every write for a claim (ack, nack, dead letter, lock release) names
//     its token and changes nothing, returning broker.ErrClaimLost, when the
//     message is no longer running under it. A token names its claim row
//     and fences its message (claimToken); a row made running by an earlier
//     version's claim, or by the rabbitmq broker's state store, carries its
//     own token, which exists exactly while it runs (a CHECK constraint says
//     so).
//   - Ending a claim releases the locks held under it in the same
//     transaction; AcquireLock holds what holds the message (its claim row,
//     or its own row) FOR SHARE while it inserts, so a lock can never
//     outlive its claim.
//   - Statements run on generic plans made from the planner's statistics,
//     so the broker keeps those of tw_messages current when autovacuum
//     does not: it analyzes the table when they are missing or stale
//     (analyze.go).
//   - The broker implements broker.OrphanReclaimer for the reaper, and
//     broker.Leaser (tw_leases) for the beat's leader election; a fenced
//     reclaim pass locks the lease row, so no takeover commits under it.
//
// The tables live in one schema (Options.Schema) and are created and
// upgraded by versioned migrations embedded in the binary (migrate.go).
//
// Connections come from a small pool (pool.go). Each one runs with
// search_path set to the schema, jit off and plan_cache_mode
// force_generic_plan (every statement is an index walk; the dsn may
// override both), and a cancelled context sends the server a cancel
// request, so a claim abandoned by its caller is rolled back rather than
// committed for nobody.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/sqlstore"
)

// Defaults of Options.
const (
	DefaultSchema = "public"
	// DefaultLiveAfter: a worker is live while its heartbeat is fresher than
	// this (three heartbeat intervals of 10 s).
	DefaultLiveAfter = 30 * time.Second
	// DefaultWorkerTTL: worker rows whose heartbeat is older than this are
	// purged (bookkeeping only; liveness is LiveAfter).
	DefaultWorkerTTL = 24 * time.Hour
)

// ErrUnavailable wraps errors that mean the database cannot be reached or
// went away (connection refused or lost, server shutting down, no such
// database). The cause stays in the chain.
var ErrUnavailable = errors.New("database unavailable")

var (
	_ broker.Broker          = (*Broker)(nil)
	_ broker.OrphanReclaimer = (*Broker)(nil)
	_ broker.Leaser          = (*Broker)(nil)
)

// Options configure New.
type Options struct {
	// DSN is a PostgreSQL connection string, URL or key=value form (the
	// caller takes it from its config or TASKHOST_DATABASE_URL).
	DSN string
	// Schema holds the broker's tables; it is created when missing.
	// Default "public".
	Schema string
	// MaxConns bounds the connections the broker opens. Default
	// max(4, number of CPUs).
	MaxConns int32
	// LiveAfter: a worker is live while its heartbeat is fresher than this,
	// by database time (Stats' Workers, Beats and Subscribers). Default
	// DefaultLiveAfter.
	LiveAfter time.Duration
	// WorkerTTL: RegisterWorker purges worker rows whose heartbeat is older
	// than this. Default DefaultWorkerTTL.
	WorkerTTL time.Duration
	// MaxPayload bounds a message payload in bytes. Default
	// broker.MaxPayloadSize.
	MaxPayload int
	// Logger receives migration and retry notes. Default: discard.
	Logger hclog.Logger
}

// Broker is the PostgreSQL broker. Its methods are safe for concurrent use.
type Broker struct {
	// shared answers the calls the SQL stores have in common (workers,
	// topics, locks, reads, admin, schedules, reports, leases, orphan
	// reclaim) with this store's dialect.
	*shared

	schema     string
	liveAfter  time.Duration
	workerTTL  time.Duration
	maxPayload int
	log        hclog.Logger

	ins      *Inserter    // the insert statements (enqueue.go)
	listen   *listener    // LISTEN for submits and cancels, started by the first Subscribe or CancelNotices (listen.go)
	announce *announcer   // NOTIFY after submits (announce.go)
	stats    *statsKeeper // ANALYZE when the statistics are stale (analyze.go)
	pool     *pool
	closed   atomic.Bool
	rr       atomic.Uint64 // rotates the topic Claim serves first
	floors   claimFloors
	idle     idleTopics // topics whose last claim took nothing
}

// New connects, brings the schema up to date (see Migrate) and returns the
// broker.
func New(ctx context.Context, opts Options) (*Broker, error) {
	if strings.TrimSpace(opts.DSN) == "" {
		return nil, errors.New("postgres broker: no dsn given: set the broker's dsn in the config or TASKHOST_DATABASE_URL " +
			"(for example postgres://user@127.0.0.1:5432/taskhost?sslmode=disable)")
	}
	cfg, schema, err := connConfig(opts.DSN, opts.Schema)
	if err != nil {
		return nil, err
	}
	b := &Broker{
		schema:     schema,
		liveAfter:  opts.LiveAfter,
		workerTTL:  opts.WorkerTTL,
		maxPayload: opts.MaxPayload,
		log:        opts.Logger,
	}
	if b.liveAfter <= 0 {
		b.liveAfter = DefaultLiveAfter
	}
	if b.workerTTL <= 0 {
		b.workerTTL = DefaultWorkerTTL
	}
	if b.log == nil {
		b.log = hclog.NewNullLogger()
	}
	b.shared = sqlstore.New(dialect{b}, b.maxPayload)
	if b.ins, err = NewInserter(schema); err != nil {
		return nil, err
	}
	b.listen = newListener(cfg, b.ins.Channel(), b.log)
	b.listen.cancelChannel = CancelChannel(schema)
	b.listen.prioritized = func(topic string, priority int) {
		b.floors.raised(topic, priority)
		b.idle.heard(topic)
	}
	b.announce = newAnnouncer(b)
	maxConns := int(opts.MaxConns)
	if maxConns <= 0 {
		maxConns = max(4, runtime.NumCPU())
	}
	b.pool = newPool(cfg, maxConns)

	conn, err := b.pool.acquire(ctx)
	if err != nil {
		b.pool.close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("postgres broker: connecting: %w", err)
		}
		return nil, connectError(cfg, err)
	}
	err = migrate(ctx, conn, schema, b.log)
	b.pool.release(conn)
	if err != nil {
		b.pool.close()
		return nil, err
	}
	b.stats = newStatsKeeper(b)
	return b, nil
}

// Kind returns "postgres".
func (b *Broker) Kind() string { return "postgres" }

// Schema returns the schema holding the broker's tables.
func (b *Broker) Schema() string { return b.schema }

// Close closes the connections; later calls return broker.ErrClosed.
// Closing twice is harmless.
func (b *Broker) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	b.announce.close()
	b.stats.close()
	b.listen.close()
	b.pool.close()
	return nil
}

// cancelWait is how long a call whose context ended waits for the server
// to confirm the cancellation before it drops the connection.
const cancelWait = 2 * time.Second

var schemaName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// CheckSchema reports whether schema can name the broker's schema (empty
// is the default, public).
func CheckSchema(schema string) error {
	if schema != "" && !schemaName.MatchString(schema) {
		return broker.Invalid("postgres schema name %q: use letters, digits and underscores (at most 63, not starting with a digit)", schema)
	}
	return nil
}

// CheckDSN reports whether dsn parses, without connecting.
func CheckDSN(dsn string) error {
	if _, err := pgx.ParseConfig(dsn); err != nil {
		return broker.Invalid("the dsn does not parse: %v", err)
	}
	return nil
}

// connConfig parses dsn and points the connections' search_path at schema.
func connConfig(dsn, schema string) (*pgx.ConnConfig, string, error) {
	if schema == "" {
		schema = DefaultSchema
	}
	if err := CheckSchema(schema); err != nil {
		return nil, "", err
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, "", fmt.Errorf("postgres broker: the dsn does not parse (check the dsn setting or TASKHOST_DATABASE_URL): %w", err)
	}
	cfg.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize()
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "taskhost-broker"
	}
	// The broker's statements are short index lookups, but the planner
	// can price a statement over a deep queue high enough to JIT-compile
	// it, and the compilation costs far more than the walk it would
	// speed up. The dsn may still turn it on.
	if cfg.RuntimeParams["jit"] == "" {
		cfg.RuntimeParams["jit"] = "off"
	}
	// Every statement is prepared once per connection (pgx's statement
	// cache) and is an index walk whatever its parameters (TestClaimPlans
	// checks the claim). Generic plans skip the re-planning PostgreSQL
	// otherwise repeats on each execution when it judges custom plans
	// cheaper: half the time of an ack of one message.
	// A cancelled context sends the server a cancel request at once (and
	// gives up on the socket after cancelWait). pgx's default only closes
	// the socket: a claim waiting for a topic lock would then carry on on
	// the server, claim and commit for a caller that has gone away, and the
	// message would stay running under a live worker.
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: cancelWait}
	}
	if cfg.RuntimeParams["plan_cache_mode"] == "" {
		cfg.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	}
	return cfg, schema, nil
}

// connectError explains a failed connection: where, and what to check.
func connectError(cfg *pgx.ConnConfig, err error) error {
	return fmt.Errorf("postgres broker: %w: cannot connect to %s:%d (database %q, user %q); "+
		"is PostgreSQL running? check the dsn (the broker's dsn setting or TASKHOST_DATABASE_URL): %w",
		ErrUnavailable, cfg.Host, cfg.Port, cfg.Database, cfg.User, err)
}

// run runs fn on a pooled connection. fn is retried (at most three tries)
// when the database reports a deadlock or serialisation failure, or the
// connection failed before anything was sent: fn must therefore be one
// transaction (a statement or a batch) that leaves nothing behind when it
// fails.
func (b *Broker) run(ctx context.Context, op string, fn func(c *pgx.Conn) error) error {
	if b.closed.Load() {
		return broker.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var err error
	for try := 1; ; try++ {
		var c *pgx.Conn
		c, err = b.pool.acquire(ctx)
		if err != nil {
			break
		}
		err = fn(c)
		b.pool.release(c)
		if err == nil || try == 3 || ctx.Err() != nil || !retryable(err) {
			break
		}
		b.log.Debug("retrying", "op", op, "try", try, "error", err)
	}
	return b.fail(ctx, op, err)
}

// fail gives err its final shape: the broker's own errors pass as they
// are; database errors are wrapped with the operation, and with
// ErrUnavailable or the context's error when one of those is the reason.
func (b *Broker) fail(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	for _, own := range []error{broker.ErrClaimLost, broker.ErrNotFound, broker.ErrInvalid, broker.ErrClosed, broker.ErrNotLeader} {
		if errors.Is(err, own) {
			return err
		}
	}
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(err, cerr) {
			return fmt.Errorf("postgres broker: %s: %w", op, err)
		}
		return fmt.Errorf("postgres broker: %s: %w: %w", op, cerr, err)
	}
	if b.closed.Load() {
		return fmt.Errorf("postgres broker: %s: %w: %w", op, broker.ErrClosed, err)
	}
	if unavailable(err) {
		return fmt.Errorf("postgres broker: %s: %w (is PostgreSQL running? check the dsn): %w", op, ErrUnavailable, err)
	}
	// A value the database refuses (class 22, data exception: bad
	// encoding, a NUL character, a number out of range; class 54, program
	// limit exceeded: a string too long for jsonb, say) is refused again
	// on every try: the caller must not retry it as if the database were
	// down.
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "54")) {
		return fmt.Errorf("postgres broker: %s: %w: %w", op, broker.ErrInvalid, err)
	}
	return fmt.Errorf("postgres broker: %s: %w", op, err)
}

// unavailable reports whether err says the database cannot be reached or
// went away.
func unavailable(err error) bool {
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case strings.HasPrefix(pe.Code, "08"), // connection exception
			pe.Code == "57P01", // admin_shutdown
			pe.Code == "57P02", // crash_shutdown
			pe.Code == "57P03", // cannot_connect_now
			pe.Code == "3D000": // invalid_catalog_name: the database is gone
			return true
		}
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		strings.Contains(err.Error(), "conn closed")
}

// retryable reports whether running the same transaction again is safe and
// may succeed.
func retryable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "40P01" || pe.Code == "40001" // deadlock_detected, serialization_failure
	}
	return pgconn.SafeToRetry(err)
}

// micros expresses d for SQL as "$n::bigint * interval '1 microsecond'".
func micros(d time.Duration) int64 { return d.Microseconds() }
