package ui

// Security of the pages: the headers every page carries, and the checks
// of every POST (size, Origin or Referer, CSRF token; see the package
// comment in ui.go), and the signing of flash messages.

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/plugins/tasksworker/service"
)

// secret signs CSRF tokens and flash messages; drawn once per process.
var secret = func() []byte {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return b
}()

// guard sets the security headers of every page and checks every POST:
// size, Origin (or Referer) and CSRF token; see the comment at the top.
func (u *UI) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Cache-Control", "no-store")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("Content-Security-Policy", "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "+
			"img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			next.ServeHTTP(w, r)
			return
		}
		if r.Method != http.MethodPost {
			u.problem(w, r, http.StatusMethodNotAllowed, "Not allowed", r.Method+" is not allowed on "+r.URL.Path+".")
			return
		}
		// A URL-encoded payload takes up to three times its size.
		limit := int64(3*broker.MaxPayloadSize) + service.BodySlack
		if svc := u.current(); svc != nil {
			limit = int64(3*svc.Settings().MaxPayloadBytes) + service.BodySlack
		}
		r.Body = http.MaxBytesReader(w, r.Body, limit)
		if err := r.ParseForm(); err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				u.problem(w, r, http.StatusRequestEntityTooLarge, "Form too large", fmt.Sprintf("The form is over %d bytes. Send a smaller payload.", tooBig.Limit))
				return
			}
			u.problem(w, r, http.StatusBadRequest, "Unreadable form", "The form could not be read: "+err.Error()+".")
			return
		}
		if err := checkOrigin(r); err != nil {
			u.log.Warn("UI form refused", "path", r.URL.Path, "reason", err.Error(), "remote", r.Header.Get("X-Forwarded-For"))
			u.problem(w, r, http.StatusForbidden, "Form refused", "This form was refused: "+err.Error()+". Open the page from this host and submit it again.")
			return
		}
		if err := checkCSRF(r.PostForm.Get(csrfField), time.Now()); err != nil {
			u.log.Warn("UI form refused", "path", r.URL.Path, "reason", err.Error(), "remote", r.Header.Get("X-Forwarded-For"))
			u.problem(w, r, http.StatusForbidden, "Form refused", "This form was refused: "+err.Error()+". Reload the page and submit it again.")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// sign is the HMAC-SHA256 of parts under the process's secret.
func sign(parts ...string) []byte {
	m := hmac.New(sha256.New, secret)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return m.Sum(nil)
}

// csrfToken returns a fresh form token: time.nonce.mac.
func csrfToken(now time.Time) string {
	nonce := make([]byte, 12)
	_, _ = rand.Read(nonce)
	ts := strconv.FormatInt(now.Unix(), 10)
	n := base64.RawURLEncoding.EncodeToString(nonce)
	return ts + "." + n + "." + base64.RawURLEncoding.EncodeToString(sign("csrf", ts, n))
}

// CSRFToken is a form token as the pages carry, signed at now with this
// process's secret: for tests that drive the forms through the plugin.
func CSRFToken(now time.Time) string { return csrfToken(now) }

// SignFlash is the signature of a flash message, as the redirect after a
// form carries it: for tests that drive the pages through the plugin.
func SignFlash(kind, msg, detail string) string { return flashSig(kind, msg, detail) }

// checkCSRF says what is wrong with a form token, or nil.
func checkCSRF(tok string, now time.Time) error {
	if tok == "" {
		return errors.New("it carries no security token")
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return errors.New("its security token is malformed")
	}
	mac, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || !hmac.Equal(mac, sign("csrf", parts[0], parts[1])) {
		return errors.New("its security token is not valid (the plugin restarted since the page was loaded, or the form did not come from this UI)")
	}
	ts, err := strconv.ParseInt(parts[0], 10, 64)
	if err != nil {
		return errors.New("its security token is malformed")
	}
	age := now.Sub(time.Unix(ts, 0))
	if age > csrfMaxAge || age < -5*time.Minute {
		return fmt.Errorf("the page is older than %s", duration(csrfMaxAge))
	}
	return nil
}

// checkOrigin refuses a POST whose Origin (or Referer) is not the host
// the browser addressed.
func checkOrigin(r *http.Request) error {
	host := r.Header.Get("X-Forwarded-Host")
	if host == "" {
		host = r.Host
	}
	if host == "" {
		return errors.New("the host it was sent to is unknown")
	}
	check := func(header, raw string) error {
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			return fmt.Errorf("its %s header (%q) is not a URL", header, raw)
		}
		if !strings.EqualFold(u.Host, host) {
			return fmt.Errorf("it was sent from %s, not from %s", u.Host, host)
		}
		return nil
	}
	if o := r.Header.Get("Origin"); o != "" {
		if o == "null" {
			return errors.New("the browser sent it from an opaque origin (Origin: null)")
		}
		return check("Origin", o)
	}
	if ref := r.Header.Get("Referer"); ref != "" {
		return check("Referer", ref)
	}
	return errors.New("the browser sent neither Origin nor Referer, so where it came from cannot be checked")
}

func flashSig(kind, msg, detail string) string {
	return base64.RawURLEncoding.EncodeToString(sign("flash", kind, msg, detail)[:18])
}

// flashFrom reads a signed flash message from the query string.
func flashFrom(r *http.Request) *flash {
	q := r.URL.Query()
	f := &flash{Kind: q.Get("fk"), Message: q.Get("flash"), Detail: q.Get("fd")}
	if f.Message == "" || (f.Kind != "ok" && f.Kind != "error") {
		return nil
	}
	sig, err := base64.RawURLEncoding.DecodeString(q.Get("fs"))
	if err != nil || !hmac.Equal(sig, sign("flash", f.Kind, f.Message, f.Detail)[:18]) {
		return nil
	}
	return f
}
