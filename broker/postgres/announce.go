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
// up while the previous one was in flight. That transaction writes nothing
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
		ctx, cancel := context.WithTimeout(a.ctx, announceTimeout)
		err := a.b.run(ctx, "announce", func(c *pgx.Conn) error {
			var n int64
			return c.QueryRow(ctx, a.sql, ps).Scan(&n)
		})
		cancel()
		if err != nil && a.ctx.Err() == nil {
			a.b.log.Debug("could not announce submitted messages; the worker pools' fallback poll finds them", "error", err)
		}
	}
}
