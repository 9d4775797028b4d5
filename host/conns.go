package host

import (
	"errors"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// HTTPServer returns the http.Server for s, with the config's timeouts:
//
//   - ReadHeaderTimeout (10s) bounds the request line and headers;
//   - body_timeout_seconds bounds the reading of a request body, set per
//     request with a body as a read deadline and lifted once the body is
//     read (see bodyDeadline): a read deadline still running during the
//     response would cancel the request when it passed;
//   - idle_timeout_seconds closes keep-alive connections left idle;
//   - there is no WriteTimeout: it would cut a response a plugin streams
//     for longer. A proxied request is bounded by the proxy's own timeout
//     (60s) instead, which also ends a response to a client that stops
//     reading.
//
// Serve it on s.Listener(ln): the connection cap needs the ConnState hook
// set here.
func (s *Server) HTTPServer() *http.Server {
	cfg := s.h.Config()
	return &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       cfg.IdleTimeout,
		ConnState:         s.conns.connState,
	}
}

// Listener wraps ln in the connection cap (max_connections).
func (s *Server) Listener(ln net.Listener) net.Listener {
	s.conns.Listener = ln
	return s.conns
}

// connLimiter caps the connections open at once. At the cap a new
// connection makes room by closing the connection idle the longest (one
// between requests, or that has not finished sending its first request's
// headers): a flood of idle keep-alive connections cannot lock out
// /healthz or an operator. Only when every connection is busy with a
// request does Accept wait for one to end; requests are bounded by the
// body timeout and the proxy timeout.
type connLimiter struct {
	net.Listener
	max int

	mu      sync.Mutex
	changed chan struct{} // closed and replaced when a connection ends or goes idle
	conns   map[net.Conn]*trackedConn
	evicted atomic.Int64
}

func newConnLimiter(max int) *connLimiter {
	return &connLimiter{max: max, changed: make(chan struct{}), conns: map[net.Conn]*trackedConn{}}
}

type trackedConn struct {
	net.Conn
	l     *connLimiter
	idle  bool      // between requests, or before the first one
	since time.Time // when idle last became true
	once  sync.Once
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.remove(c) })
	return err
}

func (l *connLimiter) remove(c *trackedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.conns[c]; ok {
		delete(l.conns, c)
		l.signal()
	}
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
		if err := l.makeRoom(); err != nil {
			return nil, err
		}
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		tc := &trackedConn{Conn: c, l: l, idle: true, since: time.Now()}
		l.mu.Lock()
		if len(l.conns) >= l.max {
			// Filled up while we accepted (it cannot: one Accept at a
			// time); refuse rather than exceed the cap.
			l.mu.Unlock()
			c.Close()
			continue
		}
		l.conns[tc] = tc
		l.mu.Unlock()
		return tc, nil
	}
}

// errListenerClosed stops a wait for room once the listener is closed.
var errListenerClosed = errors.New("listener closed")

// makeRoom returns once a connection may be accepted without passing the
// cap, closing the longest idle connection if need be.
func (l *connLimiter) makeRoom() error {
	for {
		l.mu.Lock()
		if len(l.conns) < l.max {
			l.mu.Unlock()
			return nil
		}
		var oldest *trackedConn
		for _, c := range l.conns {
			if c.idle && (oldest == nil || c.since.Before(oldest.since)) {
				oldest = c
			}
		}
		wait := l.changed
		if oldest != nil {
			delete(l.conns, oldest)
			l.mu.Unlock()
			l.evicted.Add(1)
			oldest.once.Do(func() {})
			oldest.Conn.Close()
			return nil
		}
		l.mu.Unlock()
		// Every connection is in a request: wait until one ends or goes
		// idle, but look again now and then in case the listener closed.
		select {
		case <-wait:
		case <-time.After(time.Second):
			if l.closed() {
				return errListenerClosed
			}
		}
	}
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
		tc.idle = false
		l.mu.Unlock()
	case http.StateIdle:
		l.mu.Lock()
		tc.idle, tc.since = true, time.Now()
		l.signal()
		l.mu.Unlock()
	case http.StateHijacked, http.StateClosed:
		tc.once.Do(func() { l.remove(tc) })
	}
}
