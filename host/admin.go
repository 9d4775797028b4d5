package host

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/go-chi/chi/v5"

	"github.com/taskhost/taskhost/capability"
)

//go:embed templates/*.html
var templateFS embed.FS

var pages = map[string]*template.Template{
	"admin":  template.Must(template.ParseFS(templateFS, "templates/layout.html", "templates/admin.html")),
	"plugin": template.Must(template.ParseFS(templateFS, "templates/layout.html", "templates/plugin.html")),
	"login":  template.Must(template.ParseFS(templateFS, "templates/layout.html", "templates/login.html")),
}

// flash is the result box shown after a POST.
type flash struct {
	Kind    string // ok or error
	Title   string
	Message string
	Result  string
}

type pageData struct {
	Title      string
	CSRF       string
	Flash      *flash
	Plugins    []Status
	Plugin     *Status
	Stderr     []string
	PluginsDir string
	Next       string
}

func (s *Server) render(w http.ResponseWriter, status int, name string, d pageData) {
	var buf bytes.Buffer
	if err := pages[name].ExecuteTemplate(&buf, name+".html", d); err != nil {
		s.log.Error("render page", "page", name, "error", err)
		http.Error(w, "internal error rendering the page; see the host log", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func (s *Server) adminData(w http.ResponseWriter, r *http.Request, f *flash) pageData {
	return pageData{Title: "Plugins", CSRF: csrfToken(w, r), Flash: f, Plugins: s.h.Plugins(), PluginsDir: s.h.Config().PluginsDir}
}

func (s *Server) adminPage(w http.ResponseWriter, r *http.Request) {
	s.render(w, http.StatusOK, "admin", s.adminData(w, r, nil))
}

func (s *Server) apiPlugins(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"plugins": s.h.Plugins()})
}

func (s *Server) pluginPage(w http.ResponseWriter, r *http.Request) {
	sup, ok := s.h.Plugin(chi.URLParam(r, "plugin"))
	if !ok {
		http.Error(w, "no such plugin", http.StatusNotFound)
		return
	}
	st := sup.Status()
	s.render(w, http.StatusOK, "plugin", pageData{Title: st.Name, CSRF: csrfToken(w, r), Plugin: &st, Stderr: sup.StderrTail()})
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	s.render(w, http.StatusOK, "login", pageData{Title: "Login", Next: safeNext(r.URL.Query().Get("next"))})
}

// maxLoginForm bounds the login form's body: a token, a next path and
// room to spare.
const maxLoginForm = 64 << 10

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	tok := s.h.Config().AdminToken
	if tok == "" {
		http.Redirect(w, r, "/admin/", http.StatusSeeOther)
		return
	}
	form, ok := s.loginForm(w, r)
	if !ok {
		return
	}
	next := safeNext(form.Get("next"))
	if !sameOrigin(r) {
		s.log.Warn("admin login refused: cross-site", "remote", r.RemoteAddr)
		s.render(w, http.StatusForbidden, "login", pageData{Title: "Login", Next: next,
			Flash: &flash{Kind: "error", Title: "Cross-site login refused"}})
		return
	}
	ok, retry := s.verify(r, form.Get("token"), tok)
	if retry > 0 {
		secs := int((retry + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", fmt.Sprint(secs))
		s.render(w, http.StatusTooManyRequests, "login", pageData{Title: "Login", Next: next,
			Flash: &flash{Kind: "error", Title: "Too many wrong tokens", Message: fmt.Sprintf("from this address: every token is refused for %d s more", secs)}})
		return
	}
	if !ok {
		s.log.Warn("admin login refused", "remote", r.RemoteAddr)
		s.render(w, http.StatusUnauthorized, "login", pageData{Title: "Login", Next: next,
			Flash: &flash{Kind: "error", Title: "Wrong token"}})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: s.session, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// loginForm reads the login form: an urlencoded body of at most
// maxLoginForm bytes, as the login page sends. Any other body is refused
// before a byte of it is read; net/http's multipart parsing, which writes
// large parts to the temp directory, is never reached. A body that fails
// to arrive is no wrong token. When it cannot, it answers and returns
// false.
func (s *Server) loginForm(w http.ResponseWriter, r *http.Request) (url.Values, bool) {
	const want = "application/x-www-form-urlencoded"
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != want {
		got := "a body without a Content-Type"
		if ct := r.Header.Get("Content-Type"); ct != "" {
			got = strconv.Quote(ct)
		}
		httpError(w, http.StatusUnsupportedMediaType, fmt.Sprintf("the login takes a form sent as %s, as the login page sends it, not %s: log in at /admin/login, or send the token as Authorization: Bearer <admin_token> instead", want, got))
		return nil, false
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxLoginForm)
	if err := r.ParseForm(); err != nil {
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			httpError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the login form is over %d bytes: send the token and next only", maxLoginForm))
		case isTimeout(err):
			w.Header().Set("Connection", "close")
			httpError(w, http.StatusRequestTimeout, fmt.Sprintf("the login form did not arrive within %s (body_timeout_seconds)", s.h.Config().BodyTimeout))
		default:
			httpError(w, http.StatusBadRequest, "cannot read the login form: "+err.Error())
		}
		return nil, false
	}
	return r.Form, true
}

// safeNext keeps the redirect after a login on this host: next must be a
// clean absolute path under /admin/ or /plugin-pkg/ (the task UI), with
// an optional query. Anything else (a scheme, a host, "//", a backslash,
// dot segments, doubled slashes, control characters, an escaped slash or
// backslash) gives /admin/.
func safeNext(next string) string {
	const fallback = "/admin/"
	if strings.ContainsAny(next, "\\") || strings.ContainsFunc(next, unicode.IsControl) || strings.ContainsFunc(next, unicode.IsSpace) {
		return fallback
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Opaque != "" || u.User != nil || u.Host != "" || u.Fragment != "" {
		return fallback
	}
	p := u.Path
	if !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || strings.ContainsAny(p, "\\") ||
		strings.Contains(strings.ToLower(u.EscapedPath()), "%2f") || strings.Contains(strings.ToLower(u.EscapedPath()), "%5c") {
		return fallback
	}
	clean := path.Clean(p)
	if strings.HasSuffix(p, "/") && clean != "/" {
		clean += "/"
	}
	if clean != p || !(strings.HasPrefix(p, "/admin/") || strings.HasPrefix(p, "/plugin-pkg/")) {
		return fallback
	}
	out := (&url.URL{Path: p, RawQuery: u.RawQuery}).String()
	if !strings.HasPrefix(out, "/") || strings.HasPrefix(out, "//") {
		return fallback
	}
	return out
}

// actionResponse answers a POST: JSON for API clients, the admin page with
// a result box for browsers.
func (s *Server) actionResponse(w http.ResponseWriter, r *http.Request, status int, f flash, result json.RawMessage) {
	if wantsJSON(r) {
		body := map[string]any{"message": f.Message}
		if f.Kind == "error" {
			body = map[string]any{"error": f.Message}
		}
		if len(result) > 0 {
			body["result"] = result
		}
		writeJSON(w, status, body)
		return
	}
	s.render(w, status, "admin", s.adminData(w, r, &f))
}

func (s *Server) invokeAction(w http.ResponseWriter, r *http.Request) {
	name, actionID := chi.URLParam(r, "plugin"), chi.URLParam(r, "action")
	if !checkCSRF(r) {
		s.actionResponse(w, r, http.StatusForbidden, flash{Kind: "error", Title: "Refused", Message: "missing or wrong CSRF token: reload /admin and try again"}, nil)
		return
	}
	sup, ok := s.h.Plugin(name)
	if !ok {
		s.actionResponse(w, r, http.StatusNotFound, flash{Kind: "error", Title: "Unknown plugin", Message: fmt.Sprintf("no plugin named %q", name)}, nil)
		return
	}
	client, st, err := sup.Client()
	if err != nil {
		s.actionResponse(w, r, http.StatusServiceUnavailable, flash{Kind: "error", Title: "Plugin unavailable", Message: fmt.Sprintf("plugin %s is %s; try again when it is running", name, st.State)}, nil)
		return
	}
	var spec *capability.ActionSpec
	for i := range st.Actions {
		if st.Actions[i].ID == actionID {
			spec = &st.Actions[i]
		}
	}
	if spec == nil {
		s.actionResponse(w, r, http.StatusNotFound, flash{Kind: "error", Title: "Unknown action", Message: fmt.Sprintf("plugin %s has no action %q", name, actionID)}, nil)
		return
	}
	params := json.RawMessage(strings.TrimSpace(r.FormValue("params")))
	if len(params) > 0 && !json.Valid(params) {
		s.actionResponse(w, r, http.StatusBadRequest, flash{Kind: "error", Title: spec.Title, Message: "params is not valid JSON"}, nil)
		return
	}
	timeout := s.actionCap
	if spec.TimeoutSeconds > 0 && time.Duration(spec.TimeoutSeconds)*time.Second < timeout {
		timeout = time.Duration(spec.TimeoutSeconds) * time.Second
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	start := time.Now()
	actor := actorOf(r)
	res, err := client.InvokeAction(ctx, capability.ActionRequest{ActionID: actionID, Params: params, Actor: actor, RequestID: randomHex(8)})
	outcome := "ok"
	if err != nil {
		outcome = err.Error()
	}
	// The audit line: who did what, to which plugin, and how it went.
	s.log.Info("audit: admin action", "actor", actor, "remote", r.RemoteAddr, "plugin", name, "action", actionID,
		"outcome", outcome, "duration", time.Since(start).Round(time.Millisecond))
	if err != nil {
		status := http.StatusBadGateway
		var bad *capability.InvalidArgumentError
		switch {
		case errors.As(err, &bad):
			status = http.StatusBadRequest
		case errors.Is(err, context.DeadlineExceeded):
			status = http.StatusGatewayTimeout
		case errors.Is(err, capability.ErrUnavailable):
			status = http.StatusServiceUnavailable
		}
		s.actionResponse(w, r, status, flash{Kind: "error", Title: spec.Title + " failed", Message: err.Error()}, nil)
		return
	}
	f := flash{Kind: "ok", Title: spec.Title, Message: res.Message}
	if len(res.Result) > 0 {
		var pretty bytes.Buffer
		if json.Indent(&pretty, res.Result, "", "  ") == nil {
			f.Result = pretty.String()
		} else {
			f.Result = string(res.Result)
		}
	}
	s.actionResponse(w, r, http.StatusOK, f, res.Result)
}

func (s *Server) restartPlugin(w http.ResponseWriter, r *http.Request) {
	name := chi.URLParam(r, "plugin")
	if !checkCSRF(r) {
		s.actionResponse(w, r, http.StatusForbidden, flash{Kind: "error", Title: "Refused", Message: "missing or wrong CSRF token: reload /admin and try again"}, nil)
		return
	}
	sup, ok := s.h.Plugin(name)
	if !ok {
		s.actionResponse(w, r, http.StatusNotFound, flash{Kind: "error", Title: "Unknown plugin", Message: fmt.Sprintf("no plugin named %q", name)}, nil)
		return
	}
	err := sup.Restart()
	s.log.Info("audit: plugin restart", "actor", actorOf(r), "remote", r.RemoteAddr, "plugin", name, "error", err)
	if err != nil {
		s.actionResponse(w, r, http.StatusConflict, flash{Kind: "error", Title: "Restart " + name, Message: err.Error()}, nil)
		return
	}
	s.actionResponse(w, r, http.StatusAccepted, flash{Kind: "ok", Title: "Restart " + name, Message: "restart requested; the state column shows its progress"}, nil)
}
