package host

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// This file decides who a request comes from: the admin token as a bearer
// token or a session cookie, the lockout of addresses that sent wrong ones,
// and the CSRF checks of forms.

// authState is what auth found for one request: computed once, so that a
// wrong token counts as one failure however often it is looked at.
type authState struct {
	once  sync.Once
	ok    bool
	retry time.Duration
}

type authStateKey struct{}

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
