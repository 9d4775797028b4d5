package host

// In-process tests of the HTTP side: a Host whose plugins are never
// started, served on a loopback port by the same http.Server and listener
// the host binary uses.

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/internal/testhost"
)

const testToken = "test-token-0123456789"

// serve runs a Server for the config text on 127.0.0.1 until the test
// ends and returns it and its base URL.
func serve(t *testing.T, config string) (*Server, string) {
	t.Helper()
	cfg, err := ParseConfig("taskhost.yaml", []byte(config))
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(New(cfg, hclog.NewNullLogger(), "test"), hclog.NewNullLogger())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := s.HTTPServer()
	done := make(chan struct{})
	go func() { _ = srv.Serve(s.Listener(ln)); close(done) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	return s, "http://" + ln.Addr().String()
}

type answer struct {
	status int
	header http.Header
	body   string
}

func do(t *testing.T, client *http.Client, method, url string, body io.Reader, header map[string]string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	if client == nil {
		client = noRedirects
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// A client that sends its body at a trickle is cut off once
// body_timeout_seconds have passed, however long it would go on.
func TestSlowBodyIsCutOff(t *testing.T) {
	_, base := serve(t, "listen: 127.0.0.1:0\nadmin_token: "+testToken+"\nbody_timeout_seconds: 1\n")
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	fmt.Fprintf(conn, "POST /admin/login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 100000\r\n\r\ntoken=")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // one byte every 100 ms, for at most 30 s
		defer wg.Done()
		for i := 0; i < 300; i++ {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := conn.Write([]byte("x")); err != nil {
				return
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	_ = conn.SetReadDeadline(time.Now().Add(25 * time.Second))
	_, err = io.ReadAll(conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the connection still read a 1 byte per 100 ms body after %s; want it cut off after about 1 s", time.Since(start).Round(time.Second))
	}
	if took := time.Since(start); took < time.Second {
		t.Errorf("cut off after %s, before body_timeout_seconds", took)
	}
}

// A keep-alive connection left idle is closed after idle_timeout_seconds.
func TestIdleConnectionIsClosed(t *testing.T) {
	_, base := serve(t, "listen: 127.0.0.1:0\nidle_timeout_seconds: 1\n")
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	_ = conn.SetReadDeadline(time.Now().Add(25 * time.Second))
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("idle connection: read gave %v; want EOF (closed by the host after idle_timeout_seconds)", err)
	}
}

// Many idle keep-alive connections: the cap holds, the longest idle ones
// are closed to make room, and /healthz still answers.
func TestConnectionCapClosesIdleConnections(t *testing.T) {
	const limit, opened = 50, 150
	s, base := serve(t, fmt.Sprintf("listen: 127.0.0.1:0\nmax_connections: %d\n", limit))
	addr := strings.TrimPrefix(base, "http://")
	var closedMu sync.Mutex
	closed := 0
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := 0; i < opened; i++ {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, conn)
		_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
		fmt.Fprintf(conn, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("connection %d: %v (the host made no room for it)", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		go func() { // left idle; counts when the host closes it
			var ne net.Error
			if _, err := br.ReadByte(); err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
				closedMu.Lock()
				closed++
				closedMu.Unlock()
			}
		}()
		if n := s.conns.Open(); n > limit {
			t.Fatalf("%d connections open; the cap is %d", n, limit)
		}
	}
	testhost.WaitFor(t, 30*time.Second, fmt.Sprintf("the host closed at least %d idle connections", opened-limit), func() bool {
		closedMu.Lock()
		defer closedMu.Unlock()
		return closed >= opened-limit
	})
	if a := do(t, nil, "GET", base+"/healthz", nil, nil); a.status != 200 {
		t.Fatalf("/healthz at the cap: %d %s", a.status, a.body)
	}
	if n := s.conns.Open(); n > limit {
		t.Fatalf("%d connections open; the cap is %d", n, limit)
	}
}

// GET, HEAD and OPTIONS carry no body through the proxy: refused before a
// byte of it is read, token or not.
func TestSafeMethodBodiesAreRefused(t *testing.T) {
	_, base := serve(t, "listen: 127.0.0.1:0\nadmin_token: "+testToken+"\nplugins:\n  echo:\n    enabled: true\n")
	url := base + "/plugin-pkg/echo/echo"
	for _, m := range []string{"GET", "HEAD", "OPTIONS"} {
		a := do(t, nil, m, url, strings.NewReader("0123456789"), nil)
		if a.status != http.StatusBadRequest {
			t.Errorf("%s with a body: %d %s; want 400", m, a.status, a.body)
		}
		// Chunked: no Content-Length.
		a = do(t, nil, m, url, io.MultiReader(strings.NewReader("chunk")), map[string]string{"Authorization": "Bearer " + testToken})
		if a.status != http.StatusBadRequest {
			t.Errorf("chunked %s with the token: %d %s; want 400", m, a.status, a.body)
		}
		// Without a body it goes through (to a plugin that is not running).
		a = do(t, nil, m, url, nil, nil)
		if a.status != http.StatusServiceUnavailable {
			t.Errorf("%s without a body: %d %s; want 503 from the stopped plugin", m, a.status, a.body)
		}
	}
}

func TestSafeNext(t *testing.T) {
	for next, want := range map[string]string{
		"":                                       "/admin/",
		"/admin/":                                "/admin/",
		"/admin/plugins/echo":                    "/admin/plugins/echo",
		"/plugin-pkg/tasks_worker/ui/":           "/plugin-pkg/tasks_worker/ui/",
		"/plugin-pkg/tasks_worker/ui/?x=1&y=%2F": "/plugin-pkg/tasks_worker/ui/?x=1&y=%2F",
		"/admin":                                 "/admin/",
		"/admin/../\\evil.example":               "/admin/",
		"/admin/..\\evil.example":                "/admin/",
		"/\\evil.example":                        "/admin/",
		"//evil.example/admin/":                  "/admin/",
		"///evil.example/admin/":                 "/admin/",
		"https://evil.example/admin/":            "/admin/",
		"javascript:alert(1)":                    "/admin/",
		"/admin/../evil":                         "/admin/",
		"/admin/./x":                             "/admin/",
		"/admin//evil.example":                   "/admin/",
		"/admin/%2e%2e/%5cevil.example":          "/admin/",
		"/admin/%2F%2Fevil.example":              "/admin/",
		"/admin/%5Cevil.example":                 "/admin/",
		"/admin/\tx":                             "/admin/",
		"/admin/\r\nLocation: x":                 "/admin/",
		"/admin/x#frag":                          "/admin/",
		"admin/":                                 "/admin/",
		"/adminx":                                "/admin/",
		"/healthz":                               "/admin/",
		"/plugin-pkg/../admin/":                  "/admin/",
	} {
		if got := safeNext(next); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", next, got, want)
		}
	}
}

// The login redirects only to a next that safeNext keeps.
func TestLoginRedirectStaysOnTheHost(t *testing.T) {
	_, base := serve(t, "listen: 127.0.0.1:0\nadmin_token: "+testToken+"\n")
	a := do(t, nil, "POST", base+"/admin/login", strings.NewReader(url.Values{"token": {testToken}, "next": {"/admin/../\\evil.example"}}.Encode()),
		map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
	if a.status != http.StatusSeeOther || a.header.Get("Location") != "/admin/" {
		t.Fatalf("login with a hostile next: %d Location %q; want 303 to /admin/", a.status, a.header.Get("Location"))
	}
}

// After auth_max_failures wrong tokens an address gets 429 with
// Retry-After, for the right token too, on every route that takes one.
func TestWrongTokensLockTheAddressOut(t *testing.T) {
	const cfg = "listen: 127.0.0.1:0\nadmin_token: " + testToken + "\nauth_max_failures: 3\nauth_lockout_seconds: 600\nplugins:\n  echo:\n    enabled: true\n"
	form := map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
	login := func(base, tok string) answer {
		return do(t, nil, "POST", base+"/admin/login", strings.NewReader(url.Values{"token": {tok}}.Encode()), form)
	}
	bearer := func(tok string) map[string]string { return map[string]string{"Authorization": "Bearer " + tok} }
	locked := func(what string, a answer) {
		t.Helper()
		if a.status != http.StatusTooManyRequests || a.header.Get("Retry-After") == "" {
			t.Errorf("%s after the failures: %d Retry-After %q; want 429 with Retry-After", what, a.status, a.header.Get("Retry-After"))
		}
	}
	t.Run("login", func(t *testing.T) {
		s, base := serve(t, cfg)
		for i := 0; i < 3; i++ {
			if a := login(base, fmt.Sprintf("wrong-token-%014d", i)); a.status != http.StatusUnauthorized {
				t.Fatalf("wrong token %d: %d", i, a.status)
			}
		}
		locked("the right token at /admin/login", login(base, testToken))
		locked("the right bearer token on a POST", do(t, nil, "POST", base+"/plugin-pkg/echo/echo", strings.NewReader("x"), bearer(testToken)))
		locked("the right bearer token at /admin/api", do(t, nil, "GET", base+"/admin/api/plugins", nil, bearer(testToken)))
		if s.guard.refused.Load() < 3 || s.guard.failures.Load() != 3 {
			t.Errorf("counters: %d failures, %d refused; want 3 and at least 3", s.guard.failures.Load(), s.guard.refused.Load())
		}
	})
	t.Run("bearer", func(t *testing.T) {
		_, base := serve(t, cfg)
		for i := 0; i < 3; i++ {
			a := do(t, nil, "POST", base+"/plugin-pkg/echo/echo", strings.NewReader("x"), bearer(fmt.Sprintf("wrong-token-%014d", i)))
			if a.status != http.StatusUnauthorized {
				t.Fatalf("wrong bearer %d: %d", i, a.status)
			}
		}
		locked("the right bearer token on a POST", do(t, nil, "POST", base+"/plugin-pkg/echo/echo", strings.NewReader("x"), bearer(testToken)))
		locked("the right token at /admin/login", login(base, testToken))
	})
	t.Run("cookie", func(t *testing.T) {
		_, base := serve(t, cfg)
		for i := 0; i < 3; i++ {
			a := do(t, nil, "GET", base+"/admin/api/plugins", nil, map[string]string{"Cookie": sessionCookie + "=guess" + fmt.Sprint(i)})
			if a.status != http.StatusUnauthorized {
				t.Fatalf("wrong cookie %d: %d", i, a.status)
			}
		}
		locked("the right token at /admin/login", login(base, testToken))
	})
	t.Run("no credential is no failure", func(t *testing.T) {
		_, base := serve(t, cfg)
		for i := 0; i < 5; i++ {
			do(t, nil, "POST", base+"/plugin-pkg/echo/echo", strings.NewReader("x"), nil)
		}
		if a := login(base, testToken); a.status != http.StatusSeeOther {
			t.Errorf("login after requests without a token: %d; want 303", a.status)
		}
	})
}

func TestAuthGuardForgets(t *testing.T) {
	g := newAuthGuard(3, time.Minute)
	t0 := time.Unix(1e9, 0)
	for i := 0; i < 2; i++ {
		g.fail("a", t0)
	}
	if g.fail("a", t0.Add(2*time.Minute)) != 0 {
		t.Error("failures older than the window still counted")
	}
	g.fail("a", t0.Add(2*time.Minute))
	if lock := g.fail("a", t0.Add(2*time.Minute)); lock != time.Minute {
		t.Fatalf("third failure within the window: lock %s", lock)
	}
	if g.locked("a", t0.Add(2*time.Minute+59*time.Second)) <= 0 {
		t.Error("not locked within the lockout")
	}
	if g.locked("a", t0.Add(3*time.Minute)) != 0 {
		t.Error("still locked once the lockout passed")
	}
	if g.locked("b", t0) != 0 {
		t.Error("another address is locked")
	}
	for i := 0; i < 3*guardMaxEntries; i++ {
		g.fail(fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255), t0.Add(10*time.Minute))
	}
	if n := len(g.clients); n > guardMaxEntries {
		t.Errorf("%d addresses remembered; the bound is %d", n, guardMaxEntries)
	}
	if clientKey("[2001:db8::1]:5000") != clientKey("[2001:db8::2]:6000") {
		t.Error("two addresses of one IPv6 /64 counted apart")
	}
}

func TestPublicReadsDefault(t *testing.T) {
	for listen, want := range map[string]bool{"127.0.0.1:8080": true, "[::1]:8080": true, "localhost:8080": true, "0.0.0.0:8080": false, "10.1.2.3:8080": false} {
		cfg, err := ParseConfig("t.yaml", []byte("listen: \""+listen+"\"\nadmin_token: "+testToken+"\n"))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.PublicReads != want {
			t.Errorf("listen %s: public_reads %v, want %v", listen, cfg.PublicReads, want)
		}
	}
	if _, err := ParseConfig("t.yaml", []byte("public_reads: false\n")); err == nil || !strings.Contains(err.Error(), "public_reads: false needs admin_token") {
		t.Errorf("public_reads: false without a token: %v", err)
	}
}

// public_reads: false puts plugin reads behind the token: a bearer token
// or the session cookie of /admin/login, which is sent for the task UI
// under /plugin-pkg/ too; a browser is sent to the login.
func TestPrivateReads(t *testing.T) {
	_, base := serve(t, "listen: 127.0.0.1:0\nadmin_token: "+testToken+"\npublic_reads: false\nplugins:\n  echo:\n    enabled: true\n")
	page := base + "/plugin-pkg/echo/ui/?topic=a"
	if a := do(t, nil, "GET", page, nil, nil); a.status != http.StatusUnauthorized {
		t.Errorf("read without the token: %d %s; want 401", a.status, a.body)
	}
	if a := do(t, nil, "HEAD", page, nil, nil); a.status != http.StatusUnauthorized {
		t.Errorf("HEAD without the token: %d; want 401", a.status)
	}
	a := do(t, nil, "GET", page, nil, map[string]string{"Accept": "text/html"})
	if a.status != http.StatusFound || a.header.Get("Location") != "/admin/login?next="+url.QueryEscape("/plugin-pkg/echo/ui/?topic=a") {
		t.Errorf("browser read without the token: %d Location %q; want a redirect to the login", a.status, a.header.Get("Location"))
	}
	// Past the gate, the plugin is not running: 503.
	if a := do(t, nil, "GET", page, nil, map[string]string{"Authorization": "Bearer " + testToken}); a.status != http.StatusServiceUnavailable {
		t.Errorf("read with the token: %d %s; want past the gate (503)", a.status, a.body)
	}
	// The login's cookie opens the task UI and lands on next.
	a = do(t, nil, "POST", base+"/admin/login", strings.NewReader(url.Values{"token": {testToken}, "next": {"/plugin-pkg/echo/ui/?topic=a"}}.Encode()),
		map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
	if a.status != http.StatusSeeOther || a.header.Get("Location") != "/plugin-pkg/echo/ui/?topic=a" {
		t.Fatalf("login: %d Location %q", a.status, a.header.Get("Location"))
	}
	var session *http.Cookie
	for _, c := range (&http.Response{Header: a.header}).Cookies() {
		if c.Name == sessionCookie {
			session = c
		}
	}
	if session == nil || session.Path != "/" {
		t.Fatalf("session cookie %+v; want one with Path=/ (sent to /plugin-pkg/ too)", session)
	}
	if a := do(t, nil, "GET", page, nil, map[string]string{"Cookie": session.Name + "=" + session.Value}); a.status != http.StatusServiceUnavailable {
		t.Errorf("read with the session cookie: %d %s; want past the gate (503)", a.status, a.body)
	}
	if a := do(t, nil, "GET", base+"/healthz", nil, nil); a.status != 200 {
		t.Errorf("/healthz without the token: %d; want it public", a.status)
	}
}

// public_reads: true (the loopback default) leaves reads open and
// mutations guarded.
func TestPublicReads(t *testing.T) {
	_, base := serve(t, "listen: 127.0.0.1:0\nadmin_token: "+testToken+"\nplugins:\n  echo:\n    enabled: true\n")
	if a := do(t, nil, "GET", base+"/plugin-pkg/echo/echo", nil, nil); a.status != http.StatusServiceUnavailable {
		t.Errorf("read without the token: %d %s; want past the gate (503)", a.status, a.body)
	}
	if a := do(t, nil, "POST", base+"/plugin-pkg/echo/echo", strings.NewReader("x"), nil); a.status != http.StatusUnauthorized {
		t.Errorf("POST without the token: %d; want 401", a.status)
	}
	if a := do(t, nil, "GET", base+"/admin/api/plugins", nil, nil); a.status != http.StatusUnauthorized {
		t.Errorf("/admin/api without the token: %d; want 401", a.status)
	}
}

// The body deadline is lifted once the body is read: a response streamed
// for longer than body_timeout_seconds (a plugin's long response) is not
// cut, and its request's context is not cancelled.
func TestBodyDeadlineSparesLongResponses(t *testing.T) {
	cfg, err := ParseConfig("taskhost.yaml", []byte("listen: 127.0.0.1:0\nbody_timeout_seconds: 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(New(cfg, hclog.NewNullLogger(), "test"), hclog.NewNullLogger())
	srv := s.HTTPServer()
	srv.Handler = s.perRequest(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.WriteHeader(200)
		// 3 s of streaming, three times the body timeout.
		for i := 0; i < 30; i++ {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			fmt.Fprintf(w, "%d\n", i)
			w.(http.Flusher).Flush()
		}
		fmt.Fprintln(w, "end")
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(s.Listener(ln)) }()
	t.Cleanup(func() { _ = srv.Close() })
	a := do(t, nil, "POST", "http://"+ln.Addr().String()+"/", strings.NewReader("body"), nil)
	if a.status != 200 || !strings.HasSuffix(a.body, "end\n") {
		t.Fatalf("streamed response: %d %q; want it whole", a.status, a.body)
	}
}

// At the cap with every connection in a request, Accept waits; closing
// the listener (Shutdown does) ends that wait.
func TestConnLimiterWaitEndsWithTheListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newConnLimiter(1, 1, hclog.NewNullLogger())
	l.Listener = ln
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	l.connState(sc, http.StateActive)
	done := make(chan error, 1)
	go func() { _, err := l.Accept(); done <- err }()
	select {
	case err := <-done:
		t.Fatalf("Accept past the cap returned %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	ln.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Accept on a closed listener gave a connection")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Accept still waits 30 s after the listener closed")
	}
	if l.Open() != 1 {
		t.Errorf("%d open; want the active one", l.Open())
	}
	// The active connection going idle makes room at once.
	l2 := newConnLimiter(1, 1, hclog.NewNullLogger())
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	l2.Listener = ln2
	for i := 0; i < 2; i++ {
		c, err := net.Dial("tcp", ln2.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	first, err := l2.Accept()
	if err != nil {
		t.Fatal(err)
	}
	l2.connState(first, http.StateActive)
	go func() { time.Sleep(100 * time.Millisecond); l2.connState(first, http.StateIdle) }()
	second, err := l2.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if l2.Open() != 1 || l2.evicted.Load() != 1 {
		t.Errorf("%d open, %d evicted; want the idle one evicted for the new one", l2.Open(), l2.evicted.Load())
	}
}
