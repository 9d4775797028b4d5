package postgres

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
)

// This file owns the announcer: after Submit and SubmitMany commit, it
// announces their messages (enqueue.go) from a transaction of its own,
// one at a time per broker, each carrying every announcement that piled
// up while the previous one was in flight. It has a connection of its own
// (opened with the first announcement), so an announcement never queues
// behind the submits for one of the pool's. That transaction writes nothing
// that must survive a crash, so it commits without waiting for the WAL
// flush (synchronous_commit off) and holds PostgreSQL's notification lock
// only briefly; the submits' own commits never wait for it. A process
// that dies between a submit's commit and its announcement leaves the
// message to the pools' fallback poll.

// announceSQL is notifySQL, committing asynchronously.
func announceSQL(channel string) string {
	return `SELECT count(*) FROM (SELECT pg_notify('` + channel + `', p) FROM unnest($1::text[]) p) n,
		(SELECT set_config('synchronous_commit', 'off', true)) s`
}

// announceTimeout bounds one announcement.
const announceTimeout = 5 * time.Second

type announcer struct {
	b   *Broker
	sql string

	mu      sync.Mutex
	pending map[string]bool // payload texts
	started bool
	closed  bool
	kick    chan struct{}
	conn    *pgx.Conn // run's own
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{}
}

func newAnnouncer(b *Broker) *announcer {
	ctx, cancel := context.WithCancel(context.Background())
	return &announcer{b: b, sql: announceSQL(b.ins.Channel()), pending: map[string]bool{},
		kick: make(chan struct{}, 1), ctx: ctx, cancel: cancel, done: make(chan struct{})}
}

// add announces reqs, which were committed, soon. It never blocks on the
// database.
func (a *announcer) add(reqs []broker.SubmitRequest) {
	ps := payloads(reqs)
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return
	}
	for _, p := range ps {
		a.pending[p] = true
	}
	if !a.started {
		a.started = true
		go a.run()
	}
	a.mu.Unlock()
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// close stops the announcer (what is pending is dropped: the pools'
// fallback poll finds those messages) and waits for it.
func (a *announcer) close() {
	a.mu.Lock()
	a.closed = true
	started := a.started
	a.mu.Unlock()
	a.cancel()
	if started {
		<-a.done
	}
}

func (a *announcer) run() {
	defer close(a.done)
	defer func() {
		if a.conn != nil {
			closeConn(a.conn)
		}
	}()
	for {
		select {
		case <-a.kick:
		case <-a.ctx.Done():
			return
		}
		a.mu.Lock()
		ps := make([]string, 0, len(a.pending))
		for p := range a.pending {
			ps = append(ps, p)
		}
		clear(a.pending)
		a.mu.Unlock()
		if len(ps) == 0 {
			continue
		}
		if err := a.send(ps); err != nil && a.ctx.Err() == nil {
			a.b.log.Debug("could not announce submitted messages; the worker pools' fallback poll finds them", "error", err)
		}
	}
}

// send sends one announcement of ps on the announcer's connection,
// opening it when needed. A connection that fails is dropped, and when it
// was an old one (the server may have closed it while it sat idle) the
// announcement is sent once more on a new one.
func (a *announcer) send(ps []string) error {
	ctx, cancel := context.WithTimeout(a.ctx, announceTimeout)
	defer cancel()
	for {
		fresh := false
		if a.conn == nil || a.conn.IsClosed() {
			c, err := pgx.ConnectConfig(ctx, a.b.pool.cfg)
			if err != nil {
				return err
			}
			a.conn, fresh = c, true
		}
		var n int64
		err := a.conn.QueryRow(ctx, a.sql, ps).Scan(&n)
		if err == nil {
			return nil
		}
		closeConn(a.conn)
		a.conn = nil
		if fresh || ctx.Err() != nil {
			return err
		}
	}
}
