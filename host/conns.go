package host

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// HTTPServer returns the http.Server for s, with the config's timeouts:
//
//   - ReadHeaderTimeout (10s) bounds the request line and headers;
//   - body_timeout_seconds bounds the reading of a whole request body,
//     set per request with a body as a read deadline and lifted once the
//     body is read (see bodyDeadline): a read deadline still running
//     during the response would cancel the request when it passed;
//   - idle_timeout_seconds closes keep-alive connections left idle;
//   - there is no WriteTimeout: it would cut a response a plugin streams
//     for longer. A proxied request is bounded by the proxy's own timeout
//     (60s) instead, which also ends a response to a client that stops
//     reading.
//
// Serve it on s.Listener(ln): the connection caps need the ConnState and
// ConnContext hooks set here.
func (s *Server) HTTPServer() *http.Server {
	cfg := s.h.Config()
	return &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       cfg.IdleTimeout,
		ConnState:         s.conns.connState,
		ConnContext:       withTrackedConn,
	}
}

// Listener wraps ln in the connection caps (max_connections and
// max_connections_per_client).
func (s *Server) Listener(ln net.Listener) net.Listener {
	s.conns.Listener = ln
	return s.conns
}

// connLimiter caps the connections open at once, in all (max) and from
// one client address (perClient; clientKey groups addresses as the auth
// lockout does, an IPv6 one by its /64).
//
// At a cap a new connection makes room by closing one that keeps the
// host waiting on its client: first the one whose request body has sent
// nothing for longest (stalled for stallAfter at least), then the one
// idle longest (between requests, or not done sending its first
// request's headers for idleAfter at least). So neither bodies that
// never come nor idle keep-alive connections can lock out /healthz or an
// operator. At the per-client cap only that address's own connections
// are candidates, and with none the new connection is refused at once
// (503): one address cannot fill the host. (A per-client cap of max or
// more is none: the address is bounded by max alone, as behind a reverse
// proxy that every client comes through.) At the global cap with none,
// Accept waits for one to end, go idle or stall; requests are bounded by
// the body timeout and the proxy timeout.
type connLimiter struct {
	net.Listener
	max, perClient int // perClient 0: no per-client cap
	log            hclog.Logger
	refusal        []byte // the answer to a refused connection

	mu       sync.Mutex
	changed  chan struct{} // closed and replaced when a connection ends or goes idle
	conns    map[*trackedConn]struct{}
	byClient map[string]map[*trackedConn]struct{}
	warned   time.Time // when refusals were last logged
	unlogged int64     // refusals since

	evicted        atomic.Int64 // idle connections closed to make room
	evictedStalled atomic.Int64 // connections stalled in a request body closed to make room
	refused        atomic.Int64 // new connections refused at perClient
}

const (
	// stallAfter is how long a request body must have sent nothing
	// before its connection may be closed for room: an upload that moves
	// is never taken for a stalled one.
	stallAfter = time.Second
	// idleAfter is how long a connection that has yet to send a request
	// must have been open before it may be closed for room: one just
	// accepted gets the time to send its headers.
	idleAfter = 250 * time.Millisecond
	// refusalLogEvery spaces the warnings about refused connections.
	refusalLogEvery = time.Minute
)

func newConnLimiter(max, perClient int, log hclog.Logger) *connLimiter {
	if perClient >= max {
		perClient = 0
	}
	msg := fmt.Sprintf(`{"error": "too many connections from this address (max_connections_per_client is %d): close idle ones, or send requests over fewer connections"}`+"\n", perClient)
	return &connLimiter{
		max: max, perClient: perClient, log: log,
		refusal: []byte(fmt.Sprintf("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(msg), msg)),
		changed: make(chan struct{}), conns: map[*trackedConn]struct{}{}, byClient: map[string]map[*trackedConn]struct{}{},
	}
}

type trackedConn struct {
	net.Conn
	l      *connLimiter
	client string // clientKey of the peer
	once   sync.Once

	// Under l.mu.
	idle  bool      // between requests, or before the first one's headers
	fresh bool      // no request yet
	since time.Time // when idle last became true

	// body is, while the connection is in a request whose body has not
	// ended, the UnixNano of when the body last moved (or the request
	// began); 0 otherwise.
	body atomic.Int64
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.remove(c) })
	return err
}

// bodyStarted marks c as in a request whose body has yet to arrive.
func (c *trackedConn) bodyStarted() { c.body.Store(time.Now().UnixNano()) }

// bodyMoved records that some of the body arrived.
func (c *trackedConn) bodyMoved() {
	now := time.Now().UnixNano()
	for {
		old := c.body.Load()
		if old == 0 || c.body.CompareAndSwap(old, now) {
			return
		}
	}
}

// bodyEnded records that the body was read to its end.
func (c *trackedConn) bodyEnded() { c.body.Store(0) }

type trackedConnKey struct{}

// withTrackedConn keeps a connection's tracking in its requests'
// context, for http.Server.ConnContext.
func withTrackedConn(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*trackedConn); ok {
		return context.WithValue(ctx, trackedConnKey{}, tc)
	}
	return ctx
}

// trackedConnOf returns the tracking of r's connection; nil when r did
// not come through a connLimiter.
func trackedConnOf(r *http.Request) *trackedConn {
	tc, _ := r.Context().Value(trackedConnKey{}).(*trackedConn)
	return tc
}

func (l *connLimiter) remove(c *trackedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dropLocked(c) {
		l.signal()
	}
}

// dropLocked forgets c; l.mu is held.
func (l *connLimiter) dropLocked(c *trackedConn) bool {
	if _, ok := l.conns[c]; !ok {
		return false
	}
	delete(l.conns, c)
	if own := l.byClient[c.client]; own != nil {
		delete(own, c)
		if len(own) == 0 {
			delete(l.byClient, c.client)
		}
	}
	return true
}

// signal wakes an Accept waiting for room; l.mu is held.
func (l *connLimiter) signal() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// Open returns the number of connections open.
func (l *connLimiter) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		tc := &trackedConn{Conn: c, l: l, client: clientKey(c.RemoteAddr().String()), idle: true, fresh: true, since: time.Now()}
		ok, err := l.admit(tc)
		if err != nil {
			c.Close()
			return nil, err
		}
		if ok {
			return tc, nil
		}
		l.refuse(tc)
	}
}

// victim is a connection to close for room, and whether it is stalled in
// a request body (else it is idle).
type victim struct {
	c       *trackedConn
	stalled bool
}

// pickVictim returns the connection of conns to close for room: the one
// whose request body has sent nothing for longest, if for stallAfter at
// least, else the one idle longest (if it has yet to send a request, for
// idleAfter at least). With none,
// it returns when the first that is too new for either may be picked (the
// zero time if none may). l.mu is held.
func pickVictim(conns map[*trackedConn]struct{}, now time.Time) (victim, time.Time) {
	var stalled, idle *trackedConn
	var stalledSince time.Time
	var next time.Time
	later := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	for c := range conns {
		if b := c.body.Load(); b != 0 && !c.idle {
			moved := time.Unix(0, b)
			if now.Sub(moved) < stallAfter {
				later(moved.Add(stallAfter))
			} else if stalled == nil || moved.Before(stalledSince) {
				stalled, stalledSince = c, moved
			}
			continue
		}
		if !c.idle {
			continue
		}
		if c.fresh && now.Sub(c.since) < idleAfter {
			later(c.since.Add(idleAfter))
		} else if idle == nil || c.since.Before(idle.since) {
			idle = c
		}
	}
	switch {
	case stalled != nil:
		return victim{c: stalled, stalled: true}, time.Time{}
	case idle != nil:
		return victim{c: idle}, time.Time{}
	}
	return victim{}, next
}

// errListenerClosed stops a wait for room once the listener is closed.
var errListenerClosed = errors.New("listener closed")

// admit adds tc to the open connections, closing others to make room as
// needed. It reports false when tc's address is at its cap with none of
// its own to close, and waits while the host is at its cap with none to
// close.
func (l *connLimiter) admit(tc *trackedConn) (bool, error) {
	for {
		now := time.Now()
		l.mu.Lock()
		var out []victim
		if own := l.byClient[tc.client]; l.perClient > 0 && len(own) >= l.perClient {
			v, _ := pickVictim(own, now)
			if v.c == nil {
				l.mu.Unlock()
				return false, nil
			}
			l.dropLocked(v.c)
			out = append(out, v)
		}
		var next time.Time
		if len(l.conns) >= l.max {
			var v victim
			if v, next = pickVictim(l.conns, now); v.c != nil {
				l.dropLocked(v.c)
				out = append(out, v)
			}
		}
		wait := l.changed
		admitted := len(l.conns) < l.max
		if admitted {
			l.conns[tc] = struct{}{}
			own := l.byClient[tc.client]
			if own == nil {
				own = map[*trackedConn]struct{}{}
				l.byClient[tc.client] = own
			}
			own[tc] = struct{}{}
		}
		l.mu.Unlock()
		for _, v := range out {
			l.evict(v)
		}
		if admitted {
			return true, nil
		}
		// Every connection is in a request that moves, or too new to
		// close: wait until one ends or goes idle, or the first too new
		// ages, but look again now and then in case the listener closed.
		d := time.Second
		if !next.IsZero() && time.Until(next) < d {
			d = max(time.Until(next), time.Millisecond)
		}
		t := time.NewTimer(d)
		select {
		case <-wait:
		case <-t.C:
			if l.closed() {
				return false, errListenerClosed
			}
		}
		t.Stop()
	}
}

// evict closes a connection taken out for room.
func (l *connLimiter) evict(v victim) {
	if v.stalled {
		l.evictedStalled.Add(1)
	} else {
		l.evicted.Add(1)
	}
	v.c.once.Do(func() {})
	v.c.Conn.Close()
}

// refuse answers a new connection whose address is at its cap with 503,
// before reading its request, and closes it.
func (l *connLimiter) refuse(tc *trackedConn) {
	l.refused.Add(1)
	_ = tc.Conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, _ = tc.Conn.Write(l.refusal)
	tc.Conn.Close()
	l.mu.Lock()
	l.unlogged++
	now := time.Now()
	if now.Sub(l.warned) < refusalLogEvery {
		l.mu.Unlock()
		return
	}
	n := l.unlogged
	l.warned, l.unlogged = now, 0
	l.mu.Unlock()
	l.log.Warn("HTTP connections refused: an address is at max_connections_per_client", "remote", tc.client,
		"max_connections_per_client", l.perClient, "refused_since_last_warning", n, "refused_total", l.refused.Load())
}

// closed reports whether the wrapped listener was closed.
func (l *connLimiter) closed() bool {
	tl, ok := l.Listener.(interface{ SetDeadline(time.Time) error })
	if !ok {
		return false
	}
	err := tl.SetDeadline(time.Time{})
	return err != nil && (errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrClosed))
}

// connState follows each connection between requests (idle) and in one
// (active), for http.Server.ConnState.
func (l *connLimiter) connState(c net.Conn, st http.ConnState) {
	tc, ok := c.(*trackedConn)
	if !ok {
		return
	}
	switch st {
	case http.StateActive:
		l.mu.Lock()
		tc.idle, tc.fresh = false, false
		l.mu.Unlock()
	case http.StateIdle:
		tc.bodyEnded()
		l.mu.Lock()
		tc.idle, tc.since = true, time.Now()
		l.signal()
		l.mu.Unlock()
	case http.StateHijacked, http.StateClosed:
		tc.once.Do(func() { l.remove(tc) })
	}
}
