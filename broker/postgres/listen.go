package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/taskhost/taskhost/broker"
)

// This file owns the broker's listener: one connection per broker, not
// per worker pool, that LISTENs on the schema's channel (NotifyChannel)
// and hands the notifications the insert statements send (enqueue.go) to
// the subscribed pools (broker.Notifier). It starts with the first
// Subscribe, so a broker that only submits never opens it, and it
// reconnects with backoff when its connection drops; while it is down,
// Listening is false and the pools poll at their claim idle interval.
// A connection that dies without a word from the server (a cable pulled,
// a partition) is found by a ping after listenPingAfter without a
// notification, which fails within listenPingTimeout.

var _ broker.Notifier = (*Broker)(nil)

// Listener timings.
const (
	listenRetryMin = 100 * time.Millisecond
	listenRetryMax = 5 * time.Second
	// listenStable: a session that lasted this long resets the backoff.
	listenStable = 10 * time.Second
	// listenPingAfter: the listening connection is pinged after this long
	// without a notification.
	listenPingAfter = 15 * time.Second
	// listenConnectTimeout bounds connecting and LISTEN.
	listenConnectTimeout = 10 * time.Second
	// listenPingTimeout bounds that ping.
	listenPingTimeout = 5 * time.Second
	// noticeBuffer is how many notices a subscription holds for a reader
	// that is busy.
	noticeBuffer = 256
)

// Subscribe returns a subscription to the messages submitted to the
// broker's schema by any process (broker.Notifier), starting the
// listening connection if it is not running yet.
func (b *Broker) Subscribe() broker.Subscription { return b.listen.subscribe() }

type listener struct {
	cfg     *pgx.ConnConfig
	dial    func(context.Context, *pgx.ConnConfig) (*pgx.Conn, error) // pgx.ConnectConfig; tests replace it
	channel string
	log     hclog.Logger

	listening atomic.Bool
	pid       atomic.Uint32 // backend pid of the listening connection, 0 when down
	pingAfter time.Duration // listenPingAfter; tests shorten it
	pings     atomic.Int64  // pings that found the connection alive
	// prioritized, when set, hears of the priority of each announcement
	// (the broker drops a claim floor the messages are behind, and the
	// topic is no longer idle: claim.go).
	prioritized func(topic string, priority int)

	// cancelChannel, when set, is listened to as well: its notices go to
	// cancelSubs (cancel.go).
	cancelChannel string

	mu         sync.Mutex
	subs       map[*subscription]struct{}
	cancelSubs []chan int64
	started    bool
	closed     bool
	ctx        context.Context
	cancel     context.CancelFunc
	done       chan struct{}
}

func newListener(cfg *pgx.ConnConfig, channel string, log hclog.Logger) *listener {
	cfg = cfg.Copy()
	if cfg.RuntimeParams["application_name"] == "taskhost-broker" {
		cfg.RuntimeParams["application_name"] = "taskhost-listener"
	}
	// Cancelling a wait for notifications (close) just closes the socket:
	// there is no statement for the server to cancel.
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &listener{
		cfg: cfg, dial: pgx.ConnectConfig, channel: channel, pingAfter: listenPingAfter, log: log.With("channel", channel),
		subs: map[*subscription]struct{}{}, ctx: ctx, cancel: cancel, done: make(chan struct{}),
	}
}

type subscription struct {
	l    *listener
	c    chan broker.Notice
	once sync.Once
}

func (s *subscription) Notices() <-chan broker.Notice { return s.c }
func (s *subscription) Listening() bool               { return s.l.listening.Load() }
func (s *subscription) Close() {
	s.once.Do(func() {
		s.l.mu.Lock()
		delete(s.l.subs, s)
		s.l.mu.Unlock()
	})
}

func (l *listener) subscribe() broker.Subscription {
	s := &subscription{l: l, c: make(chan broker.Notice, noticeBuffer)}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return s // never listening: its reader polls
	}
	l.subs[s] = struct{}{}
	if !l.started {
		l.started = true
		go l.run()
	}
	return s
}

// close stops the listener and waits for it. Closing twice is harmless.
func (l *listener) close() {
	l.mu.Lock()
	started := l.started
	l.closed = true
	l.mu.Unlock()
	l.cancel()
	if started {
		<-l.done
	}
	l.listening.Store(false)
}

// broadcast hands n to every subscription that has room for it.
func (l *listener) broadcast(n broker.Notice) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for s := range l.subs {
		select {
		case s.c <- n:
		default:
		}
	}
}

// run listens, and listens again with backoff after each failure, until
// close.
func (l *listener) run() {
	defer close(l.done)
	wait := listenRetryMin
	for down := 0; ; down++ {
		began := time.Now()
		err := l.session()
		if l.ctx.Err() != nil {
			return
		}
		if time.Since(began) > listenStable {
			wait = listenRetryMin
		}
		if l.listening.Swap(false) {
			l.pid.Store(0)
			l.log.Warn("lost the connection listening for submitted messages: worker pools poll at their claim idle interval until it is back",
				"error", err, "retry_in", wait.String())
			l.broadcast(broker.Notice{})
		} else if down%10 == 0 {
			l.log.Warn("cannot listen for submitted messages: worker pools poll at their claim idle interval until it works",
				"error", err, "retry_in", wait.String())
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-l.ctx.Done():
			t.Stop()
			return
		}
		wait = min(2*wait, listenRetryMax)
	}
}

// session connects, LISTENs and hands notifications on until the
// connection fails or the listener closes.
func (l *listener) session() error {
	ctx, cancel := context.WithTimeout(l.ctx, listenConnectTimeout)
	defer cancel()
	conn, err := l.dial(ctx, l.cfg)
	if err != nil {
		return err
	}
	defer closeConn(conn)
	if _, err := conn.Exec(ctx, `LISTEN `+pgx.Identifier{l.channel}.Sanitize()); err != nil {
		return err
	}
	if l.cancelChannel != "" {
		if _, err := conn.Exec(ctx, `LISTEN `+pgx.Identifier{l.cancelChannel}.Sanitize()); err != nil {
			return err
		}
	}
	cancel()
	l.pid.Store(conn.PgConn().PID())
	l.listening.Store(true)
	l.log.Info("listening for submitted messages", "pid", conn.PgConn().PID())
	// Messages submitted before LISTEN took effect were announced to
	// nobody.
	l.broadcast(broker.Notice{})
	for {
		n, err := l.wait(conn)
		if err != nil {
			return err
		}
		if n == nil {
			continue
		}
		if n.Channel == l.cancelChannel && l.cancelChannel != l.channel {
			l.cancelNotice(n.Payload)
			continue
		}
		var p notifyPayload
		if json.Unmarshal([]byte(n.Payload), &p) != nil || p.Topic == "" {
			l.broadcast(broker.Notice{}) // not ours to read: claim everything
			continue
		}
		if l.prioritized != nil {
			l.prioritized(p.Topic, p.Priority)
		}
		l.broadcast(broker.Notice{Topic: p.Topic, Delay: time.Duration(max(p.DelayUS, 0)) * time.Microsecond})
	}
}

// wait returns the next notification on conn, or nil after
// listenPingAfter without one, once a ping found the connection alive. A
// notification that arrives during the ping is kept for the next wait.
func (l *listener) wait(conn *pgx.Conn) (*pgconn.Notification, error) {
	ctx, cancel := context.WithTimeout(l.ctx, l.pingAfter)
	n, err := conn.WaitForNotification(ctx)
	timedOut := errors.Is(ctx.Err(), context.DeadlineExceeded)
	cancel()
	if err == nil || !timedOut || l.ctx.Err() != nil {
		return n, err
	}
	// The wait timed out: a timeout leaves the connection open.
	pctx, cancel := context.WithTimeout(l.ctx, listenPingTimeout)
	defer cancel()
	if err := conn.Ping(pctx); err != nil {
		return nil, err
	}
	l.pings.Add(1)
	return nil, nil
}
