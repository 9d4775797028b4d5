package host

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/hashicorp/go-hclog"
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
	}
	s.conns = newConnLimiter(cfg.MaxConnections, cfg.MaxConnectionsPerClient, s.log)
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

// perRequest prepares each request: its auth state, and the deadline for
// reading its body.
func (s *Server) perRequest(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r = r.WithContext(context.WithValue(r.Context(), authStateKey{}, &authState{}))
		if !hasBody(r) {
			next.ServeHTTP(w, r)
			return
		}
		if safeMethod(r.Method) {
			// GET, HEAD and OPTIONS take no body on this host: nothing
			// waits for one. The request is answered as if it had none
			// (the proxy refuses it) and its connection closes, as
			// whatever follows on it is the rest of that body.
			w.Header().Set("Connection", "close")
			_ = http.NewResponseController(w).SetReadDeadline(time.Now())
			next.ServeHTTP(w, r)
			return
		}
		body := s.bodyDeadline(w, r)
		next.ServeHTTP(w, r)
		if body != nil {
			body.handlerDone()
		}
	})
}

// hasBody reports whether r announces a body.
func hasBody(r *http.Request) bool {
	return r.Body != nil && r.Body != http.NoBody && (r.ContentLength != 0 || len(r.TransferEncoding) > 0)
}

// unreadBodyWait is the longest the host waits, once a handler answered
// without reading the whole body (a 401 before the body, say), for the
// rest of it to arrive, so that the connection can serve the next
// request; a body that does not arrive by then closes the connection.
const unreadBodyWait = time.Second

// bodyDeadline gives a request with a body body_timeout_seconds to send
// it whole, as one read deadline on the connection set as the handler
// starts: each read does not get it anew. A body still incomplete at the
// deadline fails to read (the proxy answers 408) and the connection
// closes; a handler that answers without reading the body leaves it at
// most unreadBodyWait more (see deadlineBody.handlerDone). While the body
// has yet to end, the connection counts as in a body for the connection
// caps, which close it for room once nothing of it arrived for
// stallAfter.
//
// The deadline ends with the body: once a body is read to its end, the
// server starts a background read to notice a client that goes away, and
// a deadline passing there would cancel the request as if the client had
// gone, cutting a long (streamed) response. net/http clears the deadline
// as it starts that read; deadlineBody clears it as well, so this does
// not rest on that detail.
//
// A streamed upload (proxyStream) sets its own deadline before each read
// instead: an upload of any length that keeps moving is not cut.
func (s *Server) bodyDeadline(w http.ResponseWriter, r *http.Request) *deadlineBody {
	rc := http.NewResponseController(w)
	deadline := time.Now().Add(s.h.Config().BodyTimeout)
	if rc.SetReadDeadline(deadline) != nil {
		return nil // not a connection with deadlines (HTTP/2 has its own)
	}
	b := &deadlineBody{ReadCloser: r.Body, rc: rc, deadline: deadline, conn: trackedConnOf(r)}
	if b.conn != nil {
		b.conn.bodyStarted()
	}
	r.Body = b
	return b
}

// deadlineBody lifts the read deadline once the body is read, and tells
// the connection's tracking how the body moves.
type deadlineBody struct {
	io.ReadCloser
	rc       *http.ResponseController
	deadline time.Time
	conn     *trackedConn // nil when not served through a connLimiter
	done     atomic.Bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 && b.conn != nil {
		b.conn.bodyMoved()
	}
	if err == io.EOF && b.done.CompareAndSwap(false, true) {
		_ = b.rc.SetReadDeadline(time.Time{})
		if b.conn != nil {
			b.conn.bodyEnded()
		}
	}
	return n, err
}

// handlerDone bounds, once the handler returned without reading the body
// to its end, the wait for the rest: net/http reads it after the answer
// to reuse the connection, and would wait up to the body deadline.
func (b *deadlineBody) handlerDone() {
	if b.done.Load() {
		return
	}
	_ = b.rc.SetReadDeadline(minTime(b.deadline, time.Now().Add(unreadBodyWait)))
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// isTimeout reports whether err is a read deadline passing.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
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

func httpError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}
