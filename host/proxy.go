package host

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"

	"github.com/taskhost/taskhost/capability"
)

// This file proxies /plugin-pkg/<plugin>/... to the plugin: the path and
// headers it gets, the body bounds, the relay of its answer, and what a
// client is told when no answer came.

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
