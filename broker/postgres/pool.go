package postgres

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
)

// pingAfter is how long a connection may sit idle before it is pinged on
// its way out of the pool, so a connection the server dropped (restart,
// idle timeout) is replaced instead of failing the caller's query.
const pingAfter = time.Second

// pool is a small connection pool over pgx.Conn.
//
// It does what the broker needs of pgxpool and one thing pgxpool does
// not: at most max connections, idle ones reused newest first and pinged
// when they sat idle (pingAfter), broken ones (or ones left inside a
// transaction) discarded, and close returns at once. pgxpool's Close
// blocks until every acquired connection is back, so a broker closing
// while a claim waits on a server that stopped answering would hang with
// it; here the connections in use are closed as they come back.
type pool struct {
	cfg *pgx.ConnConfig
	sem chan struct{} // one token per connection in use or being dialled

	mu     sync.Mutex
	idle   []idleConn
	closed bool
}

type idleConn struct {
	c     *pgx.Conn
	since time.Time
}

func newPool(cfg *pgx.ConnConfig, maxConns int) *pool {
	return &pool{cfg: cfg, sem: make(chan struct{}, maxConns)}
}

// acquire returns a connection for the caller's exclusive use; give it back
// with release.
func (p *pool) acquire(ctx context.Context) (*pgx.Conn, error) {
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			<-p.sem
			return nil, broker.ErrClosed
		}
		n := len(p.idle)
		if n == 0 {
			p.mu.Unlock()
			break
		}
		ic := p.idle[n-1]
		p.idle[n-1] = idleConn{}
		p.idle = p.idle[:n-1]
		p.mu.Unlock()

		if ic.c.IsClosed() {
			continue
		}
		if time.Since(ic.since) > pingAfter {
			if err := ic.c.Ping(ctx); err != nil {
				closeConn(ic.c)
				if ctx.Err() != nil {
					<-p.sem
					return nil, ctx.Err()
				}
				continue
			}
		}
		return ic.c, nil
	}
	c, err := pgx.ConnectConfig(ctx, p.cfg)
	if err != nil {
		<-p.sem
		return nil, err
	}
	// Have the server notice, while a statement runs or waits for a lock,
	// that this client is gone, and abort instead of committing for
	// nobody. PostgreSQL 14+ on Linux, BSD and macOS; elsewhere the
	// setting is refused and the broker goes without.
	_, _ = c.Exec(ctx, `SET client_connection_check_interval = '1s'`)
	registerArrays(c.TypeMap())
	return c, nil
}

// release gives c back. A connection that is closed, busy or not idle at
// transaction level (an error left a transaction open) is closed instead.
func (p *pool) release(c *pgx.Conn) {
	defer func() { <-p.sem }()
	if c.IsClosed() || c.PgConn().IsBusy() || c.PgConn().TxStatus() != 'I' {
		closeConn(c)
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		closeConn(c)
		return
	}
	p.idle = append(p.idle, idleConn{c: c, since: time.Now()})
	p.mu.Unlock()
}

// close closes the idle connections; those in use are closed when
// released. Closing twice is harmless.
func (p *pool) close() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.closed = true
	p.mu.Unlock()
	for _, ic := range idle {
		closeConn(ic.c)
	}
}

func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}
