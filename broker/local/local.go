// Package local is the embedded broker: every message, worker, topic and
// lock lives in one SQLite file (through the pure-Go driver
// modernc.org/sqlite, no cgo), so it needs no server and survives a crash
// of the processes using it. It is the zero-setup default of `make run`.
//
// Several processes on one machine may open the same file at once; they
// share the queue as a fleet sharing a PostgreSQL database would. It keeps
// the rules every broker keeps (package broker's documentation lists them;
// broker/brokertest checks them), plus broker.OrphanReclaimer: a
// running message outlives a worker that crashed, and the reaper reclaims it;
// and broker.Leaser: leases elect one beat among the processes.
//
// # One machine, one clock
//
// The SQL brokers decide ownership by database time. SQLite has no server
// and so no clock of its own: the "database time" of a local store is the
// machine's wall clock, which every process that can open the file shares.
// Each write reads it (time.Now) after its transaction has taken the write
// lock, so stamps follow commit order as long as the clock does not step
// back. Times are stored as unix nanoseconds. The file belongs on a local
// disk: WAL mode needs shared memory between the processes, which network
// filesystems do not provide.
//
// # Concurrency
//
// Every write is one transaction started with BEGIN IMMEDIATE (the DSN's
// _txlock=immediate): it takes the database's write lock up front, so two
// processes never deadlock trying to upgrade read locks, and writers are
// serialised across processes. That makes Claim's check-and-claim (count
// the topic's running rows, then take queued ones) race-free without
// further locking. Within a process the writes go through one connection
// (database/sql queues callers on it, which hands over much faster than
// SQLite's sleeping busy handler); reads use a small pool of their own and,
// in WAL mode, never wait for the writer. Across processes a writer waits
// up to busyTimeout for the lock. Claim first looks for work in a read
// snapshot, so idle workers polling empty topics never take the write lock.
// Statements are prepared once per connection and kept (compiling one costs
// SQLite more than running it), and Claim and Ack update a whole batch in
// one statement.
//
// # Housekeeping
//
// Each Broker runs a pass when it opens and every housekeepingInterval
// after: it deletes workers whose heartbeat is older than WorkerTTL
// (bookkeeping; their running messages are the reaper's business) and, as
// the memory broker does, drops the oldest finished messages past Retain.
package local

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/sqlstore"
)

// Defaults of Options.
const (
	// DefaultLiveAfter is how recent a worker's heartbeat must be for it to
	// count as live in Stats: three heartbeat intervals of 10 s.
	DefaultLiveAfter = 30 * time.Second
	// DefaultWorkerTTL is how long a silent worker's row is kept.
	DefaultWorkerTTL = 24 * time.Hour
	// DefaultRetain is how many finished messages are kept.
	DefaultRetain = 100000
)

const (
	// busyTimeout is how long a connection waits for another process's
	// lock before failing with SQLITE_BUSY.
	busyTimeout = 10 * time.Second
	// maxReaders caps the read pool. Writes have their own connection.
	maxReaders = 4
	// housekeepingInterval is how often a Broker runs housekeeping.
	housekeepingInterval = time.Minute
)

var (
	_ broker.Broker          = (*Broker)(nil)
	_ broker.OrphanReclaimer = (*Broker)(nil)
	_ broker.Leaser          = (*Broker)(nil)
)

// Options configure Open.
type Options struct {
	// Path is the database file. Its directory is created when missing.
	Path string
	// LiveAfter is how recent a worker's heartbeat must be for it to count
	// as live in Stats (Workers, Beats, Subscribers). Zero means
	// DefaultLiveAfter.
	LiveAfter time.Duration
	// WorkerTTL is how long a worker's row is kept after its last
	// heartbeat. Zero means DefaultWorkerTTL.
	WorkerTTL time.Duration
	// Retain caps the finished (done, failed, dead, cancelled) messages
	// kept for reading by id; housekeeping drops the oldest finished ones
	// past it. Zero or less means DefaultRetain.
	Retain int
	// MaxPayload is the largest payload Submit accepts, in bytes. Zero
	// means broker.MaxPayloadSize.
	MaxPayload int
	// Logger gets migrations, housekeeping and its failures. Nil discards.
	Logger hclog.Logger
}

// Broker is the local SQLite broker. Create it with Open.
type Broker struct {
	// shared answers the calls the SQL stores have in common (workers,
	// topics, locks, reads, admin, schedules, reports, leases, orphan
	// reclaim) with this store's dialect.
	*shared

	opts Options
	log  hclog.Logger
	path string

	// writer has one connection: every write transaction runs on it.
	writer *sql.DB
	// reader is the pool for reads.
	reader *sql.DB
	// Prepared statements of each pool, by query text (see stmtCache).
	wstmts, rstmts *stmtCache

	// mu guards closed: calls hold it shared while they use the
	// databases, Close exclusively to close them.
	mu     sync.RWMutex
	closed bool

	rr atomic.Uint64 // rotates the first topic Claim serves

	closeOnce sync.Once
	stop      context.CancelFunc
	bg        sync.WaitGroup
}

// Open opens (creating it when missing) the database at opts.Path, brings
// its schema up to date and starts housekeeping.
func Open(ctx context.Context, opts Options) (*Broker, error) {
	if opts.Path == "" {
		return nil, errors.New("local broker: no database path")
	}
	if opts.LiveAfter <= 0 {
		opts.LiveAfter = DefaultLiveAfter
	}
	if opts.WorkerTTL <= 0 {
		opts.WorkerTTL = DefaultWorkerTTL
	}
	if opts.Retain <= 0 {
		opts.Retain = DefaultRetain
	}
	if opts.MaxPayload <= 0 {
		opts.MaxPayload = broker.MaxPayloadSize
	}
	log := opts.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	path, err := filepath.Abs(opts.Path)
	if err != nil {
		return nil, fmt.Errorf("local broker: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("local broker: data directory: %w", err)
	}
	if err := writable(path); err != nil {
		return nil, fmt.Errorf("local broker: %w", err)
	}

	writer, err := sql.Open("sqlite", dsn(path, true))
	if err != nil {
		return nil, fmt.Errorf("local broker: open %s: %w", path, err)
	}
	writer.SetMaxOpenConns(1)
	writer.SetMaxIdleConns(1)
	writer.SetConnMaxLifetime(0)
	writer.SetConnMaxIdleTime(0)
	reader, err := sql.Open("sqlite", dsn(path, false))
	if err != nil {
		_ = writer.Close()
		return nil, fmt.Errorf("local broker: open %s: %w", path, err)
	}
	reader.SetMaxOpenConns(maxReaders)
	reader.SetMaxIdleConns(maxReaders)
	reader.SetConnMaxLifetime(0)
	reader.SetConnMaxIdleTime(5 * time.Minute)

	b := &Broker{opts: opts, log: log, path: path, writer: writer, reader: reader,
		wstmts: newStmtCache(writer), rstmts: newStmtCache(reader)}
	b.shared = sqlstore.New(dialect{b}, opts.MaxPayload)
	if err := b.migrate(ctx); err != nil {
		_ = writer.Close()
		_ = reader.Close()
		return nil, fmt.Errorf("local broker: %s: %w", path, err)
	}

	// Silent workers are purged before Open returns, so a worker its
	// caller reads is not deleted under it a moment later; the rest of
	// housekeeping (trimming finished messages, which can take a while on
	// a large store) runs in the background, now and every
	// housekeepingInterval.
	if err := b.purgeWorkers(ctx); err != nil {
		b.log.Warn("housekeeping failed", "path", path, "error", err)
	}
	hkCtx, stop := context.WithCancel(context.Background())
	b.stop = stop
	b.bg.Add(1)
	go b.housekeeping(hkCtx)
	return b, nil
}

// dsn is the connection string for path. Every connection runs:
//
//   - busy_timeout first, so the pragmas after it (journal_mode needs a
//     lock to switch a new file to WAL) wait for other processes instead
//     of failing;
//   - foreign_keys on: locks belong to messages, messages to topics;
//   - journal_mode WAL: readers do not block the writer nor it them;
//   - synchronous NORMAL: in WAL mode a commit is durable against a crash
//     of the process (the WAL is in the OS's hands once written), which is
//     the failure orphan recovery is about; only a power loss or OS crash
//     may lose the last commits, and never corrupts the file. FULL would
//     fsync on every commit for that last margin.
//
// Writer connections begin transactions IMMEDIATE (see the package
// documentation); read-only ones are deferred whatever _txlock says.
func dsn(path string, write bool) string {
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeout.Milliseconds()))
	q.Add("_pragma", "foreign_keys(1)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	if write {
		q.Set("_txlock", "immediate")
	}
	u := url.URL{Path: path}
	return "file:" + u.EscapedPath() + "?" + q.Encode()
}

// Kind returns "local".
func (b *Broker) Kind() string { return "local" }

// Path returns the database file's absolute path.
func (b *Broker) Path() string { return b.path }

// Close stops housekeeping and closes the database; every later call
// returns broker.ErrClosed. Closing twice is harmless. It waits for calls in
// flight.
func (b *Broker) Close() error {
	var err error
	b.closeOnce.Do(func() {
		b.stop()
		b.bg.Wait()
		b.mu.Lock()
		defer b.mu.Unlock()
		b.closed = true
		b.wstmts.close()
		b.rstmts.close()
		err = errors.Join(b.writer.Close(), b.reader.Close())
	})
	return err
}

// ns converts a time to the stored form.
func ns(t time.Time) int64 { return t.UnixNano() }

// nullNS converts an optional time to the stored form (NULL for nil).
func nullNS(t *time.Time) any {
	if t == nil {
		return nil
	}
	return t.UnixNano()
}

// fromNS converts a stored time back.
func fromNS(v int64) time.Time { return time.Unix(0, v) }

// addNS returns now + d in the stored form, saturating instead of
// overflowing for absurd delays.
func addNS(now time.Time, d time.Duration) int64 {
	n := now.UnixNano()
	if d > 0 && n > 1<<63-1-int64(d) {
		return 1<<63 - 1
	}
	return n + int64(d)
}

// writable checks that the database at path can be written: its
// directory (SQLite creates its journal and WAL files beside it) and the
// file itself when it exists. SQLite's own error for either is "unable to
// open database file" or "attempt to write a readonly database", which
// does not say where to look.
func writable(path string) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".taskhost-write-check-*")
	if err != nil {
		return fmt.Errorf("data directory %s is not writable (%v): the local store keeps its database and its journal files there; give the plugin's user write access, or set data_dir to another directory", dir, err)
	}
	name := f.Name()
	_ = f.Close()
	_ = os.Remove(name)
	db, err := os.OpenFile(path, os.O_RDWR, 0)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("database file %s cannot be opened for writing (%v): give the plugin's user write access to it", path, err)
	}
	return db.Close()
}
