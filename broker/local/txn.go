package local

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	sqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/taskhost/taskhost/broker"
)

// enter checks ctx and the closed flag; on success the caller must call the
// returned function when done with the databases.
func (b *Broker) enter(ctx context.Context) (func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b.mu.RLock()
	if b.closed {
		b.mu.RUnlock()
		return nil, broker.ErrClosed
	}
	return b.mu.RUnlock, nil
}

// write runs fn in one IMMEDIATE transaction on the writer connection, with
// now read after the write lock was taken, and commits when fn returns nil.
func (b *Broker) write(ctx context.Context, what string, fn func(tx *txn, now time.Time) error) error {
	leave, err := b.enter(ctx)
	if err != nil {
		return err
	}
	defer leave()
	sqlTx, err := b.writer.BeginTx(ctx, nil)
	if err != nil {
		return b.dbErr(ctx, what, err)
	}
	tx := &txn{ctx: ctx, tx: sqlTx, stmts: b.wstmts}
	defer tx.fill()
	if err := fn(tx, time.Now()); err != nil {
		_ = sqlTx.Rollback()
		return b.dbErr(ctx, what, err)
	}
	if err := sqlTx.Commit(); err != nil {
		return b.dbErr(ctx, what, err)
	}
	return nil
}

// read runs fn in one read-only (deferred) transaction on the read pool:
// one consistent snapshot, with now read once it began.
func (b *Broker) read(ctx context.Context, what string, fn func(tx *txn, now time.Time) error) error {
	leave, err := b.enter(ctx)
	if err != nil {
		return err
	}
	defer leave()
	sqlTx, err := b.reader.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return b.dbErr(ctx, what, err)
	}
	tx := &txn{ctx: ctx, tx: sqlTx, stmts: b.rstmts}
	defer tx.fill()
	defer func() { _ = sqlTx.Rollback() }()
	if err := fn(tx, time.Now()); err != nil {
		return b.dbErr(ctx, what, err)
	}
	return nil
}

// txn is a transaction that runs its queries through prepared statements:
// compiling a statement costs SQLite more than running these small ones,
// so each query text is prepared once per connection and kept.
type txn struct {
	ctx    context.Context
	tx     *sql.Tx
	stmts  *stmtCache
	missed []string
}

// stmt returns q's cached statement bound to the transaction, or nil when
// q is not prepared yet: it is then run unprepared and prepared once the
// transaction ended (preparing now would wait for the writer's one
// connection, which this transaction holds).
func (t *txn) stmt(q string) *sql.Stmt {
	if s := t.stmts.get(q); s != nil {
		return t.tx.StmtContext(t.ctx, s)
	}
	t.missed = append(t.missed, q)
	return nil
}

func (t *txn) Exec(q string, args ...any) (sql.Result, error) {
	if s := t.stmt(q); s != nil {
		return s.ExecContext(t.ctx, args...)
	}
	return t.tx.ExecContext(t.ctx, q, args...)
}

func (t *txn) Query(q string, args ...any) (*sql.Rows, error) {
	if s := t.stmt(q); s != nil {
		return s.QueryContext(t.ctx, args...)
	}
	return t.tx.QueryContext(t.ctx, q, args...)
}

func (t *txn) QueryRow(q string, args ...any) *sql.Row {
	if s := t.stmt(q); s != nil {
		return s.QueryRowContext(t.ctx, args...)
	}
	return t.tx.QueryRowContext(t.ctx, q, args...)
}

// Prepare returns q as a statement of the transaction, for loops.
func (t *txn) Prepare(q string) (*sql.Stmt, error) {
	if s := t.stmt(q); s != nil {
		return s, nil
	}
	return t.tx.PrepareContext(t.ctx, q)
}

// fill prepares the queries the transaction missed; it runs after the
// transaction ended.
func (t *txn) fill() {
	if len(t.missed) > 0 {
		t.stmts.fill(t.missed)
	}
}

// maxStmts bounds a stmtCache; the broker's query texts are a fixed set
// (ListMessages builds at most 16), so it is never reached in practice.
const maxStmts = 128

// stmtCache holds prepared statements of one pool by query text.
// database/sql prepares a statement again on each connection that uses it
// and keeps it there.
type stmtCache struct {
	db *sql.DB
	mu sync.RWMutex
	m  map[string]*sql.Stmt
}

func newStmtCache(db *sql.DB) *stmtCache {
	return &stmtCache{db: db, m: make(map[string]*sql.Stmt)}
}

func (c *stmtCache) get(q string) *sql.Stmt {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.m[q]
}

// fill prepares qs. A failure leaves q unprepared; it runs unprepared and
// is tried again later.
func (c *stmtCache) fill(qs []string) {
	for _, q := range qs {
		c.mu.RLock()
		_, ok := c.m[q]
		n := len(c.m)
		c.mu.RUnlock()
		if ok || n >= maxStmts {
			continue
		}
		s, err := c.db.Prepare(q)
		if err != nil {
			continue
		}
		c.mu.Lock()
		if _, ok := c.m[q]; ok {
			_ = s.Close()
		} else {
			c.m[q] = s
		}
		c.mu.Unlock()
	}
}

func (c *stmtCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for q, s := range c.m {
		_ = s.Close()
		delete(c.m, q)
	}
}

// dbErr passes the broker's own errors through and wraps the database's.
func (b *Broker) dbErr(ctx context.Context, what string, err error) error {
	switch {
	case errors.Is(err, broker.ErrClaimLost), errors.Is(err, broker.ErrNotFound),
		errors.Is(err, broker.ErrInvalid), errors.Is(err, broker.ErrClosed),
		errors.Is(err, broker.ErrNotLeader):
		return err
	case ctx.Err() != nil && !errors.Is(err, ctx.Err()):
		return fmt.Errorf("local broker: %s: %w (%v)", what, ctx.Err(), err)
	}
	return fmt.Errorf("local broker: %s: %w", what, err)
}

// isBusy reports whether err is SQLite's "database is locked".
func isBusy(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_BUSY
}
