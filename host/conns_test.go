package host

// Tests of the connection caps against floods of requests whose bodies
// never come, over real sockets. Linux routes all of 127.0.0.0/8 to the
// loopback interface, so a dialer bound to 127.0.0.2 is another client
// address than one bound to 127.0.0.1.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/internal/testhost"
)

// stalledRequests announce a body and send none (or a part) of it: a
// GET that should have none, a chunked GET, a login form, a proxied POST
// without the token.
var stalledRequests = []string{
	"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n",
	"POST /admin/login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\ntoken=",
	"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
	"POST /plugin-pkg/echo/echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n",
}

// dialFrom dials addr from the local IP from.
func dialFrom(ctx context.Context, from, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 2 * time.Second}
	return d.DialContext(ctx, "tcp", addr)
}

// clientFrom is an HTTP client whose connections come from the local IP
// from.
func clientFrom(from string, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext:       func(ctx context.Context, _, addr string) (net.Conn, error) { return dialFrom(ctx, from, addr) },
			DisableKeepAlives: true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// flood opens connections to addr from the IPs of from, in turn, each
// sending one of requests, in turn, and nothing more, until n are open
// or stop is closed; it never reads them. Connections stay open until the
// test ends. sent counts the requests sent.
type flood struct {
	sent, failed atomic.Int64
	done         chan struct{}
	mu           sync.Mutex
	conns        []net.Conn
}

func startFlood(t *testing.T, addr string, from, requests []string, n int, stop <-chan struct{}) *flood {
	t.Helper()
	f := &flood{done: make(chan struct{})}
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				select {
				case <-stop:
					return
				default:
				}
				c, err := dialFrom(context.Background(), from[int(i)%len(from)], addr)
				if err != nil {
					f.failed.Add(1)
					continue
				}
				f.mu.Lock()
				f.conns = append(f.conns, c)
				f.mu.Unlock()
				_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
				if _, err := io.WriteString(c, requests[int(i)%len(requests)]); err == nil {
					f.sent.Add(1)
				}
			}
		}()
	}
	go func() { wg.Wait(); close(f.done) }()
	t.Cleanup(func() {
		<-f.done
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, c := range f.conns {
			c.Close()
		}
	})
	return f
}

// inBody counts l's connections in a request whose body has yet to end.
func inBody(l *connLimiter) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for c := range l.conns {
		if c.body.Load() != 0 {
			n++
		}
	}
	return n
}

// floodSize is how many flood connections the test process can hold
// beside the server's cap and some spare, at most want.
func floodSize(t *testing.T, want, serverSide int) int {
	t.Helper()
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Cur < rl.Max {
		rl.Cur = rl.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
		_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl)
	}
	room := int(rl.Cur) - serverSide - 500
	if room < want {
		t.Logf("open-file limit %d: the flood is %d connections, not %d", rl.Cur, room, want)
		return room
	}
	return want
}

// probe asks for /healthz from the local IP from and fails the test
// unless it answers 200 within 10 s.
func probe(t *testing.T, base, from, during string) {
	t.Helper()
	start := time.Now()
	resp, err := clientFrom(from, 10*time.Second).Get(base + "/healthz")
	if err != nil {
		t.Fatalf("/healthz from %s %s: no answer after %s: %v", from, during, time.Since(start).Round(time.Millisecond), err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz from %s %s: %d", from, during, resp.StatusCode)
	}
	t.Logf("/healthz from %s %s answered in %s", from, during, time.Since(start).Round(time.Millisecond))
}

// Thousands of connections from one address, each announcing a body it
// never sends: /healthz still answers another address at once, during
// the flood and after it, and the cap holds. (Before the caps, the
// stalled bodies took every one of the 512 connections for
// body_timeout_seconds each, and the probe waited behind them.)
func TestAFloodOfStalledBodiesLeavesHealthzAnswering(t *testing.T) {
	const maxConns = 512
	s, base := serve(t, "listen: 127.0.0.1:0\nadmin_token: "+testToken+"\nplugins:\n  echo:\n    enabled: true\n")
	addr := strings.TrimPrefix(base, "http://")
	n := floodSize(t, 3000, maxConns)
	stop := make(chan struct{})
	f := startFlood(t, addr, []string{"127.0.0.1"}, stalledRequests, n, stop)
	defer close(stop)
	// Well into the flood: a third of it sent, or 20 s gone.
	deadline := time.Now().Add(20 * time.Second)
	for f.sent.Load() < int64(n/3) && time.Now().Before(deadline) {
		select {
		case <-f.done:
		case <-time.After(20 * time.Millisecond):
			continue
		}
		break
	}
	probe(t, base, "127.0.0.2", fmt.Sprintf("during a flood of stalled bodies from 127.0.0.1 (%d sent)", f.sent.Load()))
	select {
	case <-f.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("the flood of %d connections is not through after 60 s (%d sent, %d failed): the host stopped accepting", n, f.sent.Load(), f.failed.Load())
	}
	probe(t, base, "127.0.0.2", fmt.Sprintf("after %d stalled bodies from 127.0.0.1", f.sent.Load()))
	if open := s.conns.Open(); open > maxConns {
		t.Errorf("%d connections open; max_connections is %d", open, maxConns)
	}
	s.conns.mu.Lock()
	own := len(s.conns.byClient["127.0.0.1"])
	s.conns.mu.Unlock()
	if own > DefaultMaxConnectionsPerClient {
		t.Errorf("%d connections open from 127.0.0.1; max_connections_per_client is %d", own, DefaultMaxConnectionsPerClient)
	}
	if s.conns.refused.Load() == 0 {
		t.Error("no connection refused at max_connections_per_client")
	}
}

// A request that should have no body (a GET) and announces one, and a
// request refused before its body is read, are answered at once: the
// host does not wait for a body nobody reads, and closes the connection
// instead.
func TestBodiesNobodyReadsAreNotWaitedFor(t *testing.T) {
	_, base := serve(t, "listen: 127.0.0.1:0\nadmin_token: "+testToken+"\nplugins:\n  echo:\n    enabled: true\n")
	addr := strings.TrimPrefix(base, "http://")
	for _, tc := range []struct {
		name, req string
		status    int
	}{
		{"GET /healthz with a Content-Length", stalledRequests[0], http.StatusOK},
		{"GET /healthz with a chunked body", stalledRequests[2], http.StatusOK},
		{"a proxied GET with a Content-Length", "GET /plugin-pkg/echo/echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n", http.StatusBadRequest},
		{"a proxied POST without the token", stalledRequests[3], http.StatusUnauthorized},
		{"a POST to /healthz", "POST /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n", http.StatusMethodNotAllowed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			start := time.Now()
			if _, err := io.WriteString(c, tc.req); err != nil {
				t.Fatal(err)
			}
			// body_timeout_seconds is 30: an answer within 10 s did not
			// wait for it.
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer after %s: %v (the host waits for the body)", time.Since(start).Round(time.Millisecond), err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Errorf("status %d; want %d", resp.StatusCode, tc.status)
			}
			if _, err := br.ReadByte(); err == nil {
				t.Error("the connection is still open after the answer; want it closed, as the body was left unread")
			} else if ne := (net.Error)(nil); errors.As(err, &ne) && ne.Timeout() {
				t.Errorf("the connection is still open %s after the answer; want it closed", time.Since(start).Round(time.Millisecond))
			}
		})
	}
}

// Stalled bodies from many addresses, each within its own cap, fill the
// host's: a new connection closes the body stalled longest, never the
// idle keep-alive connection of a client that did nothing wrong, and
// /healthz answers another address. (Before, the stalled bodies were
// never closed: the idle connection was, and the probe then waited for
// a body to time out.)
func TestStalledBodiesAreClosedForRoomBeforeIdleConnections(t *testing.T) {
	const maxConns, perClient = 64, 16
	s, base := serve(t, fmt.Sprintf("listen: 127.0.0.1:0\nadmin_token: %s\nmax_connections: %d\nmax_connections_per_client: %d\n", testToken, maxConns, perClient))
	addr := strings.TrimPrefix(base, "http://")
	// A client with one keep-alive connection, idle between requests.
	keep, err := dialFrom(context.Background(), "127.0.0.3", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Close()
	keepReader := bufio.NewReader(keep)
	healthz := func(what string) {
		t.Helper()
		_ = keep.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(keep, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		resp, err := http.ReadResponse(keepReader, nil)
		if err != nil {
			t.Fatalf("%s: %v (the host closed the idle keep-alive connection)", what, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	healthz("the keep-alive connection's first request")
	// The host's cap filled with stalled login bodies from 4 addresses.
	stop := make(chan struct{})
	defer close(stop)
	login := []string{stalledRequests[1]}
	first := startFlood(t, addr, []string{"127.0.1.1", "127.0.1.2", "127.0.1.3", "127.0.1.4"}, login, maxConns-1, stop)
	<-first.done
	testhost.WaitFor(t, 30*time.Second, "the host holds the stalled bodies", func() bool { return inBody(s.conns) == maxConns-1 })
	time.Sleep(stallAfter + 500*time.Millisecond) // now they are stalled
	// More of them, from 2 more addresses, and a probe from another.
	second := startFlood(t, addr, []string{"127.0.2.1", "127.0.2.2"}, login, 2*perClient, stop)
	probe(t, base, "127.0.0.2", "while stalled bodies fill max_connections")
	<-second.done
	healthz("the keep-alive connection after the flood")
	if n := s.conns.Open(); n > maxConns {
		t.Errorf("%d connections open; max_connections is %d", n, maxConns)
	}
	if n := s.conns.evictedStalled.Load(); n < 1 {
		t.Errorf("%d stalled connections closed for room; want some", n)
	}
	if n := s.conns.evicted.Load(); n != 0 {
		t.Errorf("%d idle connections closed for room; want none while stalled bodies could be", n)
	}
}

// At its cap an address makes room among its own connections only: it
// closes its idle one, else its stalled one, and with neither its new
// connection is refused with 503 while another address's is accepted.
func TestOneAddressIsHeldToItsCap(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	l := newConnLimiter(8, 2, hclog.NewNullLogger())
	l.Listener = ln
	addr := ln.Addr().String()
	var clients []net.Conn
	t.Cleanup(func() {
		for _, c := range clients {
			c.Close()
		}
	})
	dial := func(from string) net.Conn {
		t.Helper()
		c, err := dialFrom(context.Background(), from, addr)
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
		return c
	}
	accept := func() *trackedConn {
		t.Helper()
		type accepted struct {
			c   net.Conn
			err error
		}
		ch := make(chan accepted, 1)
		go func() { c, err := l.Accept(); ch <- accepted{c, err} }()
		select {
		case a := <-ch:
			if a.err != nil {
				t.Fatal(a.err)
			}
			t.Cleanup(func() { a.c.Close() })
			return a.c.(*trackedConn)
		case <-time.After(10 * time.Second):
			t.Fatal("Accept gave no connection within 10 s")
			return nil
		}
	}
	// closedByHost reports whether the host closed c, and what it said.
	closedByHost := func(c net.Conn) (string, bool) {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, err := io.ReadAll(c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return "", false
		}
		return string(b), true
	}

	// Two busy connections from 127.0.0.5: its third is refused, and
	// Accept goes on to 127.0.0.6's.
	var busy []*trackedConn
	for i := 0; i < 2; i++ {
		dial("127.0.0.5")
		c := accept()
		l.connState(c, http.StateActive)
		busy = append(busy, c)
	}
	third := dial("127.0.0.5")
	dial("127.0.0.6")
	if c := accept(); c.client != "127.0.0.6" {
		t.Fatalf("accepted a connection from %s; want 127.0.0.6's, past 127.0.0.5's refused one", c.client)
	}
	if said, closed := closedByHost(third); !closed || said != "" && !strings.Contains(said, "503 Service Unavailable") {
		t.Errorf("the third connection from 127.0.0.5: closed %v, answered %q; want it closed, with a 503 if anything", closed, said)
	}
	if l.refused.Load() != 1 {
		t.Errorf("%d refused; want 1", l.refused.Load())
	}

	// One of them goes idle: a new one from 127.0.0.5 closes it.
	l.connState(busy[0], http.StateIdle)
	dial("127.0.0.5")
	accept()
	if l.evicted.Load() != 1 {
		t.Errorf("%d idle connections closed; want 1", l.evicted.Load())
	}
	if _, err := busy[0].Conn.Write([]byte("x")); err == nil {
		t.Error("the idle connection is still open")
	}

	// 127.0.0.7: one body stalled for 2 s, one that moved just now; its
	// third closes the stalled one.
	var stalled, moving *trackedConn
	for i := 0; i < 2; i++ {
		dial("127.0.0.7")
		c := accept()
		l.connState(c, http.StateActive)
		c.bodyStarted()
		if i == 0 {
			c.body.Store(time.Now().Add(-2 * time.Second).UnixNano())
			stalled = c
		} else {
			moving = c
		}
	}
	dial("127.0.0.7")
	accept()
	if l.evictedStalled.Load() != 1 {
		t.Errorf("%d stalled connections closed; want 1", l.evictedStalled.Load())
	}
	if _, err := stalled.Conn.Write([]byte("x")); err == nil {
		t.Error("the stalled connection is still open")
	}
	if _, err := moving.Conn.Write([]byte("x")); err != nil {
		t.Errorf("the connection whose body moves was closed: %v", err)
	}
	if n := l.Open(); n != 5 {
		t.Errorf("%d open; want 5 (2 from 127.0.0.5, 1 from 127.0.0.6, 2 from 127.0.0.7)", n)
	}
}

func TestPickVictim(t *testing.T) {
	now := time.Now()
	idle := func(ago time.Duration, fresh bool) *trackedConn {
		return &trackedConn{idle: true, fresh: fresh, since: now.Add(-ago)}
	}
	inBody := func(movedAgo time.Duration) *trackedConn {
		c := &trackedConn{}
		c.body.Store(now.Add(-movedAgo).UnixNano())
		return c
	}
	busy := &trackedConn{}
	oldIdle, newIdle := idle(time.Minute, false), idle(time.Second, false)
	stalledLong, stalledShort := inBody(10*time.Second), inBody(2*time.Second)
	moving := inBody(100 * time.Millisecond)
	idleJustNow := idle(time.Millisecond, false)
	justAccepted := idle(10*time.Millisecond, true)
	waitedForHeaders := idle(time.Second, true)
	for _, tc := range []struct {
		name        string
		conns       []*trackedConn
		want        *trackedConn
		wantStalled bool
		wantNext    time.Time
	}{
		{"the body stalled longest goes before any idle one", []*trackedConn{oldIdle, stalledShort, stalledLong, busy}, stalledLong, true, time.Time{}},
		{"a body that moved within stallAfter is not stalled: the idle one goes", []*trackedConn{moving, newIdle}, newIdle, false, time.Time{}},
		{"the one idle longest goes", []*trackedConn{newIdle, oldIdle}, oldIdle, false, time.Time{}},
		{"one idle between requests goes at once", []*trackedConn{idleJustNow, busy}, idleJustNow, false, time.Time{}},
		{"one that has yet to send its headers is spared for idleAfter", []*trackedConn{justAccepted, busy}, nil, false, justAccepted.since.Add(idleAfter)},
		{"one that has not sent its headers for longer goes", []*trackedConn{justAccepted, waitedForHeaders}, waitedForHeaders, false, time.Time{}},
		{"none while each is in a request that moves; look again as the first may stall", []*trackedConn{moving, busy}, nil, false, now.Add(-100*time.Millisecond + stallAfter)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := map[*trackedConn]struct{}{}
			for _, c := range tc.conns {
				set[c] = struct{}{}
			}
			v, next := pickVictim(set, now)
			if v.c != tc.want || v.stalled != tc.wantStalled {
				t.Errorf("picked %p (stalled %v); want %p (stalled %v)", v.c, v.stalled, tc.want, tc.wantStalled)
			}
			if !next.Equal(tc.wantNext) {
				t.Errorf("look again at %v; want %v", next, tc.wantNext)
			}
		})
	}
}
