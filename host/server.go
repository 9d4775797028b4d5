package host

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/capability"
)

// Server is the host's HTTP side.
type Server struct {
	h            *Host
	log          hclog.Logger
	authRequired bool
	loopbackOnly bool   // the listen address is a loopback one: Host must name it
	session      string // cookie value proving the admin token was given
	proxyTimeout time.Duration
	actionCap    time.Duration
	guard        *authGuard
	conns        *connLimiter
}

const (
	sessionCookie = "taskhost_admin"
	csrfCookie    = "taskhost_csrf"
	csrfField     = "csrf_token"
)

// NewServer builds the HTTP side of h.
func NewServer(h *Host, log hclog.Logger) *Server {
	cfg := h.Config()
	host, _, _ := net.SplitHostPort(cfg.Listen)
	s := &Server{
		h:            h,
		log:          log.Named("http"),
		authRequired: !IsLoopback(host) || cfg.AdminToken != "",
		loopbackOnly: IsLoopback(host),
		proxyTimeout: 60 * time.Second,
		actionCap:    2 * time.Minute,
		guard:        newAuthGuard(cfg.AuthMaxFailures, cfg.AuthLockout),
		conns:        newConnLimiter(cfg.MaxConnections),
	}
	h.setHTTPStats(s)
	if cfg.AdminToken != "" {
		mac := hmac.New(sha256.New, []byte(cfg.AdminToken))
		mac.Write([]byte("taskhost admin session v1"))
		s.session = hex.EncodeToString(mac.Sum(nil))
	}
	return s
}

// Handler returns the router.
func (s *Server) Handler() http.Handler {
	r := chi.NewRouter()
	r.Use(s.checkHost)
	r.Use(s.perRequest)
	r.Use(middleware.GetHead) // HEAD /healthz answers as GET does
	r.Get("/", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/admin", http.StatusFound) })
	r.Get("/healthz", s.healthz)
	r.HandleFunc("/plugin-pkg/{plugin}", s.proxy)
	r.HandleFunc("/plugin-pkg/{plugin}/*", s.proxy)
	r.Route("/admin", func(r chi.Router) {
		r.Get("/login", s.loginPage)
		r.Post("/login", s.login)
		r.Group(func(r chi.Router) {
			r.Use(s.requireAdmin)
			r.Get("/", s.adminPage)
			r.Get("/api/plugins", s.apiPlugins)
			r.Get("/plugins/{plugin}", s.pluginPage)
			r.Post("/plugins/{plugin}/actions/{action}", s.invokeAction)
			r.Post("/plugins/{plugin}/restart", s.restartPlugin)
		})
	})
	r.Get("/admin", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/admin/", http.StatusFound) })
	return r
}

// checkHost refuses, on a host that listens on a loopback address, a
// request whose Host header is not a loopback name. Such a request came
// through a name that resolved to 127.0.0.1 for a browser (DNS
// rebinding): the page that sent it would otherwise be same-origin with
// this host, and on loopback without an admin_token, admin too.
func (s *Server) checkHost(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.loopbackOnly && !loopbackName(r.Host) {
			writeJSON(w, http.StatusMisdirectedRequest, map[string]string{"error": fmt.Sprintf(
				"this host listens on a loopback address and answers only to loopback names (127.0.0.1, localhost, [::1]), not to Host %q: a guard against DNS rebinding; to serve other names, listen on another address and set admin_token", r.Host)})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// loopbackName reports whether a Host header names this machine's
// loopback: localhost or a loopback IP, with or without a port. An empty
// Host (HTTP/1.0) passes: browsers always send one.
func loopbackName(hostport string) bool {
	if hostport == "" {
		return true
	}
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	return strings.EqualFold(host, "localhost") || IsLoopback(host)
}

// healthz answers 200 while the host serves (a liveness probe must not
// restart the host for a plugin it is restarting itself); status is
// "degraded" when an enabled plugin is not running or reports itself
// degraded, and plugins gives each plugin's state.
func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	plugins := map[string]string{}
	status := "ok"
	for _, st := range s.h.Plugins() {
		plugins[st.Name] = string(st.State)
		if st.Enabled && st.State != StateRunning {
			status = "degraded"
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": status, "plugins": plugins})
}

// authState is what auth found for one request: computed once, so that a
// wrong token counts as one failure however often it is looked at.
type authState struct {
	once  sync.Once
	ok    bool
	retry time.Duration
}

type authStateKey struct{}

// perRequest prepares each request: its auth state, and the deadline for
// reading its body.
func (s *Server) perRequest(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r = r.WithContext(context.WithValue(r.Context(), authStateKey{}, &authState{}))
		s.bodyDeadline(w, r)
		next.ServeHTTP(w, r)
	})
}

// bodyDeadline gives a request with a body body_timeout_seconds to send
// it, as a read deadline on the connection. A body still incomplete at
// the deadline fails to read (the proxy answers 408) and the connection
// closes, also when the handler answered without reading it (the server
// then discards the rest, under the same deadline).
//
// The deadline ends with the body: once a body is read to its end, the
// server starts a background read to notice a client that goes away, and
// a deadline passing there would cancel the request as if the client had
// gone, cutting a long (streamed) response. net/http clears the deadline
// as it starts that read; deadlineBody clears it as well, so this does
// not rest on that detail.
func (s *Server) bodyDeadline(w http.ResponseWriter, r *http.Request) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 && len(r.TransferEncoding) == 0 {
		return
	}
	rc := http.NewResponseController(w)
	if rc.SetReadDeadline(time.Now().Add(s.h.Config().BodyTimeout)) != nil {
		return // not a connection with deadlines (HTTP/2 has its own)
	}
	r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc}
}

// deadlineBody lifts the read deadline once the body is read.
type deadlineBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	done bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.done {
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// isTimeout reports whether err is a read deadline passing.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// auth reports whether r carries the admin token (as a bearer token or the
// session cookie set by /admin/login); without a token configured on a
// loopback address, everyone local is the admin. retry > 0 says r's
// address is locked out for that long after too many wrong tokens: its
// credential was not even looked at.
func (s *Server) auth(r *http.Request) (ok bool, retry time.Duration) {
	st, _ := r.Context().Value(authStateKey{}).(*authState)
	if st == nil {
		st = &authState{}
	}
	st.once.Do(func() { st.ok, st.retry = s.checkAuth(r) })
	return st.ok, st.retry
}

func (s *Server) checkAuth(r *http.Request) (bool, time.Duration) {
	if !s.authRequired {
		return true, 0
	}
	if got, ok := bearerToken(r); ok {
		return s.verify(r, got, s.h.Config().AdminToken)
	}
	if c, err := r.Cookie(sessionCookie); err == nil {
		return s.verify(r, c.Value, s.session)
	}
	return false, 0
}

// verify compares a presented secret with the expected one, unless r's
// address is locked out, and counts a wrong one against the address.
func (s *Server) verify(r *http.Request, got, want string) (bool, time.Duration) {
	client, now := clientKey(r.RemoteAddr), time.Now()
	if retry := s.guard.locked(client, now); retry > 0 {
		return false, retry
	}
	if want != "" && equalSecret(got, want) {
		s.guard.succeed(client, now)
		return true, 0
	}
	if lock := s.guard.fail(client, now); lock > 0 {
		s.log.Warn("too many wrong admin tokens: address locked out", "remote", client, "for", lock,
			"failures_total", s.guard.failures.Load())
	}
	return false, 0
}

// authorized reports whether r carries the admin token.
func (s *Server) authorized(r *http.Request) bool {
	ok, _ := s.auth(r)
	return ok
}

// tooManyFailures answers a request from an address locked out after too
// many wrong tokens.
func tooManyFailures(w http.ResponseWriter, retry time.Duration) {
	secs := int((retry + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	httpError(w, http.StatusTooManyRequests, fmt.Sprintf("too many wrong admin tokens from this address: every token is refused for %d s more", secs))
}

// bearerToken returns the token of an "Authorization: Bearer <token>"
// header; the scheme's case does not matter (RFC 7235).
func bearerToken(r *http.Request) (string, bool) {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimSpace(tok), true
}

func actorOf(r *http.Request) string {
	if _, ok := bearerToken(r); ok {
		return "token"
	}
	if _, err := r.Cookie(sessionCookie); err == nil {
		return "admin-session"
	}
	return "local"
}

func (s *Server) requireAdmin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ok, retry := s.auth(r)
		if ok {
			next.ServeHTTP(w, r)
			return
		}
		if retry > 0 {
			tooManyFailures(w, retry)
			return
		}
		if wantsJSON(r) || r.Method != http.MethodGet || strings.HasPrefix(r.URL.Path, "/admin/api/") {
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "admin token required: send Authorization: Bearer <admin_token> or log in at /admin/login"})
			return
		}
		http.Redirect(w, r, "/admin/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusFound)
	})
}

// acceptsHTML reports whether r comes from a browser navigating (that
// gets the login page rather than a 401).
func acceptsHTML(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "text/html") && !wantsJSON(r)
}

func wantsJSON(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "application/json")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// sameOrigin refuses browser requests sent from another site. Requests
// without an Origin header (curl, Prometheus) pass.
func sameOrigin(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	return err == nil && u.Host == r.Host
}

// pluginPath is the path a plugin gets for r: what follows
// /plugin-pkg/<name>, still escaped as the client sent it, so that the
// plugin decodes it once (a decoded path decoded again would turn %2541
// into A, and fail on %25 followed by anything but two hex digits).
func pluginPath(r *http.Request, name string) string {
	rest := strings.TrimPrefix(r.URL.EscapedPath(), "/plugin-pkg/"+name)
	if !strings.HasPrefix(rest, "/") {
		rest = "/" + rest
	}
	return rest
}

// notUTF8 returns the first header whose name or a value is not valid
// UTF-8.
func notUTF8(h http.Header) (string, bool) {
	for k, vs := range h {
		if !utf8.ValidString(k) {
			return strconv.Quote(k), true
		}
		for _, v := range vs {
			if !utf8.ValidString(v) {
				return k, true
			}
		}
	}
	return "", false
}

// hopHeaders are never forwarded in either direction.
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func filterRequestHeaders(in http.Header) http.Header {
	out := in.Clone()
	for _, v := range in.Values("Connection") {
		for _, f := range strings.Split(v, ",") {
			out.Del(strings.TrimSpace(f))
		}
	}
	for _, h := range hopHeaders {
		out.Del(h)
	}
	// The host's credentials are the host's: a plugin gets the actor
	// instead. Client-sent forwarding headers are replaced by ours.
	out.Del("Cookie")
	out.Del("Authorization")
	for k := range out {
		if strings.HasPrefix(k, "X-Forwarded-") || k == "X-Taskhost-Actor" {
			out.Del(k)
		}
	}
	return out
}

func (s *Server) proxy(w http.ResponseWriter, r *http.Request) {
	name := chi.URLParam(r, "plugin")
	mutating := !safeMethod(r.Method)
	if !mutating && (r.ContentLength != 0 || len(r.TransferEncoding) > 0) {
		// A body here is read by nobody but costs memory in the host and
		// the plugin, and needs no token: refused before it is read.
		w.Header().Set("Connection", "close")
		httpError(w, http.StatusBadRequest, "a "+r.Method+" request carries no body: send the body with POST or PUT, or drop it")
		return
	}
	if mutating && !sameOrigin(r) {
		httpError(w, http.StatusForbidden, "cross-site request refused")
		return
	}
	if mutating || !s.h.Config().PublicReads {
		ok, retry := s.auth(r)
		switch {
		case ok:
		case retry > 0:
			tooManyFailures(w, retry)
			return
		case !mutating && r.Method == http.MethodGet && acceptsHTML(r):
			http.Redirect(w, r, "/admin/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusFound)
			return
		case mutating:
			httpError(w, http.StatusUnauthorized, "admin token required for "+r.Method+": send Authorization: Bearer <admin_token>")
			return
		default:
			httpError(w, http.StatusUnauthorized, "admin token required (public_reads is false): send Authorization: Bearer <admin_token> or log in at /admin/login")
			return
		}
	}
	sup, ok := s.h.Plugin(name)
	if !ok {
		httpError(w, http.StatusNotFound, fmt.Sprintf("no plugin named %q is configured", name))
		return
	}
	client, st, err := sup.Client()
	if err != nil {
		if !st.Enabled {
			httpError(w, http.StatusNotFound, fmt.Sprintf("plugin %q is disabled in the config", name))
			return
		}
		if st.State == StateFailed {
			// Not restarted until an operator asks: retrying is useless.
			msg := fmt.Sprintf("plugin %q failed and stays down until an operator presses Restart in /admin/", name)
			if s.authorized(r) {
				// The last error may name hosts, users and paths: only
				// for the admin.
				msg += ": " + st.LastError
			} else {
				msg += " (its last error is shown to the admin, in /admin/)"
			}
			httpError(w, http.StatusServiceUnavailable, msg)
			return
		}
		state := string(st.State)
		if st.State == StateBackoff {
			state = "waiting to restart after a failure"
		}
		w.Header().Set("Retry-After", "5")
		httpError(w, http.StatusServiceUnavailable, fmt.Sprintf("plugin %q is %s; try again shortly", name, state))
		return
	}
	if !st.Has(capability.HTTP) {
		httpError(w, http.StatusNotFound, fmt.Sprintf("plugin %q serves no HTTP", name))
		return
	}
	if path := chi.URLParam(r, "*"); strings.ContainsFunc(path, unicode.IsControl) {
		httpError(w, http.StatusBadRequest, "the path holds a control character (such as %00): no plugin serves such a path")
		return
	}
	streamed := streamsBody(r, st)
	var body []byte
	if !streamed {
		if body, ok = s.readBody(w, r); !ok {
			return
		}
	}
	headers := filterRequestHeaders(r.Header)
	if !utf8.ValidString(r.URL.RawQuery) {
		httpError(w, http.StatusBadRequest, "the query string holds bytes that are not UTF-8: percent-encode them")
		return
	}
	if k, ok := notUTF8(headers); ok {
		// The plugin protocol carries headers as UTF-8 strings.
		httpError(w, http.StatusBadRequest, fmt.Sprintf("header %s holds bytes that are not UTF-8: send it percent-encoded or as UTF-8", k))
		return
	}
	remote, _, _ := net.SplitHostPort(r.RemoteAddr)
	headers.Set("X-Forwarded-For", remote)
	headers.Set("X-Forwarded-Host", r.Host)
	headers.Set("X-Forwarded-Prefix", "/plugin-pkg/"+name)
	preq := capability.ProxyRequest{
		Method:     r.Method,
		Path:       pluginPath(r, name),
		RawQuery:   r.URL.RawQuery,
		Header:     headers,
		Body:       body,
		RemoteAddr: r.RemoteAddr,
		Actor:      actorOf(r),
	}
	if streamed {
		s.proxyStream(w, r, name, client, preq)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.proxyTimeout)
	defer cancel()
	rel := newRelay(w, s.h.Config().BodyTimeout, nil)
	defer rel.done()
	err = client.ProxyHTTP(ctx, preq, rel.header, rel.body)
	if err == nil {
		return
	}
	if rel.wrote {
		s.log.Warn("proxied response cut short", "plugin", name, "path", r.URL.Path, "error", err)
		return
	}
	s.proxyFailed(w, r, name, err)
}

// readBody reads a request body whole, bounded by max_body_bytes. When it
// cannot, it answers and returns false.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	limit := s.h.Config().MaxBodyBytes
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err == nil {
		return body, true
	}
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		httpError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over the %d-byte limit (max_body_bytes)", limit))
		return nil, false
	}
	s.bodyFailed(w, err, "the request body did not arrive", "")
	return nil, false
}

// bodyFailed answers a request whose body could not be read; late says
// what did not arrive in time, and more is added to the message.
func (s *Server) bodyFailed(w http.ResponseWriter, err error, late, more string) {
	if isTimeout(err) {
		w.Header().Set("Connection", "close")
		httpError(w, http.StatusRequestTimeout, fmt.Sprintf("%s within %s (body_timeout_seconds)%s", late, s.h.Config().BodyTimeout, more))
		return
	}
	httpError(w, http.StatusBadRequest, "cannot read request body: "+err.Error()+more)
}

// relay copies a plugin's answer to w as it arrives. No WriteTimeout
// bounds a response (it would cut a long stream); a client that stops
// reading is cut instead once one chunk has waited stall
// (body_timeout_seconds). done lifts the deadline before the connection
// serves its next request.
type relay struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	flusher http.Flusher
	stall   time.Duration
	touch   func() // called on each piece of the answer, when set
	wrote   bool
}

func newRelay(w http.ResponseWriter, stall time.Duration, touch func()) *relay {
	flusher, _ := w.(http.Flusher)
	return &relay{w: w, rc: http.NewResponseController(w), flusher: flusher, stall: stall, touch: touch}
}

func (p *relay) header(status int, h http.Header) {
	if p.touch != nil {
		p.touch()
	}
	p.wrote = true
	for _, k := range hopHeaders {
		h.Del(k)
	}
	h.Del("Set-Cookie") // a plugin cannot set cookies on the host's origin
	for k, v := range h {
		p.w.Header()[k] = v
	}
	if p.w.Header().Get("Content-Type") == "" {
		p.w.Header().Set("Content-Type", "application/octet-stream")
	}
	p.w.WriteHeader(status)
}

func (p *relay) body(b []byte) error {
	_ = p.rc.SetWriteDeadline(time.Now().Add(p.stall))
	if _, err := p.w.Write(b); err != nil {
		return err
	}
	if p.flusher != nil {
		p.flusher.Flush()
	}
	if p.touch != nil {
		p.touch()
	}
	return nil
}

func (p *relay) done() { _ = p.rc.SetWriteDeadline(time.Time{}) }

// outcomeHeader is set to "unknown" on a proxy error answered to a request
// that may have changed something: the plugin received it, or may have,
// and stopped before it answered. Such a request may have been done; a
// client checks before it sends it again.
const outcomeHeader = "X-Taskhost-Outcome"

// proxyFailed answers a proxied request whose plugin gave no response. The
// answer must never read as success, nor invite a blind retry of something
// that may have been done: once the request has left for the plugin, a
// plugin that stops (a gRPC Canceled as its connection closes, or
// Unavailable) may have stored it first. Safe methods (GET, HEAD, OPTIONS)
// can be retried whatever happened; any other method gets a 502 that says
// the outcome is unknown.
func (s *Server) proxyFailed(w http.ResponseWriter, r *http.Request, name string, err error) {
	if r.Context().Err() != nil {
		return // the client went away: nobody reads an answer
	}
	if errors.Is(err, capability.ErrUnimplemented) || errors.Is(err, capability.ErrNotFound) {
		httpError(w, http.StatusNotFound, fmt.Sprintf("plugin %q serves no HTTP", name))
		return
	}
	timedOut := errors.Is(err, context.DeadlineExceeded)
	what := fmt.Sprintf("plugin %q stopped before it answered", name)
	switch {
	case errors.Is(err, errProxyIdle):
		what = fmt.Sprintf("the upload to plugin %q stalled: no body piece went in and no answer came out for %s", name, s.proxyTimeout)
	case timedOut:
		what = fmt.Sprintf("plugin %q did not answer within %s", name, s.proxyTimeout)
	default:
		s.log.Warn("proxied request got no answer", "plugin", name, "method", r.Method, "path", r.URL.Path, "error", err)
	}
	if !safeMethod(r.Method) {
		w.Header().Set(outcomeHeader, "unknown")
		status := http.StatusBadGateway
		if timedOut {
			status = http.StatusGatewayTimeout
		}
		httpError(w, status, what+"; the outcome of this "+r.Method+" is unknown: it may have been done. "+
			"Check before sending it again (for a submitted task, list the task's recent messages: GET api/tasks?task=NAME)")
		return
	}
	if timedOut {
		httpError(w, http.StatusGatewayTimeout, what)
		return
	}
	w.Header().Set("Retry-After", "5")
	httpError(w, http.StatusServiceUnavailable, what+"; try again shortly")
}

// safeMethod reports whether a request of this method changes nothing, so
// that sending it again is always safe.
func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

func httpError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// csrfToken returns the request's CSRF token, setting the cookie if new.
// Forms echo it in a hidden field (double-submit); the cookie is
// SameSite=Strict, so another site can neither read nor send it.
func csrfToken(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(csrfCookie); err == nil && len(c.Value) == 64 {
		return c.Value
	}
	tok := randomHex(32)
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: tok, Path: "/admin", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	return tok
}

func checkCSRF(r *http.Request) bool {
	if _, ok := bearerToken(r); ok {
		return true // not sent by browsers on their own
	}
	c, err := r.Cookie(csrfCookie)
	if err != nil || c.Value == "" {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(c.Value), []byte(r.FormValue(csrfField))) == 1 && sameOrigin(r)
}
