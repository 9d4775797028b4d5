// Package ui is the operator's web UI of the task system, served under
// /ui/ (through the host: /plugin-pkg/tasks_worker/ui/). Server-rendered
// html/template pages; the only script is the confirm() of dangerous
// forms. It reads and changes the task system only through package service,
// which the plugin hands it (Options.Current), and so links neither the
// worker nor the beat; the pages' templates are embedded from templates/.
//
// This file holds the UI type, its routes and the page plumbing
// (rendering, redirects with a flash message, paths); the pages are in
// the other files, one per page or concern.
//
// # Why not the host's CSRF scheme
//
// The host's admin UI uses a double-submit cookie. A plugin cannot: the host
// proxy strips Cookie from the requests it forwards and Set-Cookie from the
// answers (a plugin must neither read nor set cookies on the host's origin).
// So every form here carries a token instead:
//
//   - the token is a timestamp and a random nonce, signed with HMAC-SHA256
//     under a secret drawn at random when the process starts (var secret). A
//     POST is refused unless its token verifies and is younger than
//     csrfMaxAge. Another site cannot read a token out of a page (the
//     same-origin policy; the pages send no CORS headers and refuse to be
//     framed), so it cannot build a form this plugin accepts. No server
//     state is kept; a restart draws a new secret, and a form left open
//     across it is refused with a message that says to reload the page.
//   - the Origin header (or, when a browser sends none, the Referer) must
//     name the host the browser talked to: X-Forwarded-Host, which the host
//     proxy sets itself (it drops any the client sent), or Host when the
//     plugin is called directly. A POST with neither header is refused.
//
// The host adds its own checks in front: it refuses mutating requests whose
// Origin is another site and, when admin_token is set, mutating requests
// without the admin session (log in at /admin/login first).
//
// Flash messages travel in the query string of the 303 redirect that
// follows a POST; they are signed with the same secret, so a link from
// elsewhere cannot make the UI display a message of its choosing.
package ui

import (
	"bytes"
	"embed"
	"html/template"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/plugins/tasksworker/service"
)

const (
	csrfField  = "csrf_token"
	csrfMaxAge = 12 * time.Hour
	listLimit  = broker.DefaultListLimit
	// actionTimeout bounds a reaper pass started from the UI.
	actionTimeout = 30 * time.Second
)

//go:embed templates/*.html
var templateFS embed.FS

var funcs = template.FuncMap{
	"when":   when,
	"rel":    rel,
	"dur":    duration,
	"secs":   func(f float64) string { return duration(time.Duration(f * float64(time.Second))) },
	"pct":    func(f float64) int { return int(math.Round(math.Max(0, math.Min(1, f)) * 100)) },
	"pretty": prettyJSON,
	"json":   jsonView,
	"clip":   clip,
	"api":    apiBase,
	"limit": func(n int) string {
		if n == 0 {
			return "unlimited"
		}
		return strconv.Itoa(n)
	},
}

// apiBase is the API's root as the browser sees it, from the UI's
// (page.Base): /plugin-pkg/tasks_worker/api.
func apiBase(base string) string { return strings.TrimSuffix(base, "/ui") + "/api" }

var pageNames = []string{"dashboard", "tasks", "task", "running", "dead", "schedules", "schedule", "locks", "topics", "run", "error"}

var pages = func() map[string]*template.Template {
	m := map[string]*template.Template{}
	for _, name := range pageNames {
		m[name] = template.Must(template.New(name).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html"))
	}
	return m
}()

// nav is the tab bar.
var nav = []struct{ Key, Path, Label string }{
	{"dashboard", "/", "Dashboard"},
	{"tasks", "/tasks", "Tasks"},
	{"running", "/running", "Running"},
	{"dead", "/dead", "Dead letters"},
	{"schedules", "/schedules", "Schedules"},
	{"topics", "/topics", "Topics"},
	{"locks", "/locks", "Locks"},
	{"run", "/run", "Run a task"},
}

// Options are what the UI reads from the plugin.
type Options struct {
	// Current is the running task system, nil while the plugin does not
	// run; the UI reads it on each request.
	Current func() *service.Service
	// Throughput are this process's counts of finished attempts, for the
	// dashboard's charts; may be nil.
	Throughput func() (done, failed float64)
	Logger     hclog.Logger
}

// UI serves the pages; it reads the running service on each request.
type UI struct {
	current    func() *service.Service
	throughput func() (done, failed float64)
	log        hclog.Logger
}

// New returns the UI of opts.
func New(opts Options) *UI {
	u := &UI{current: opts.Current, throughput: opts.Throughput, log: opts.Logger}
	if u.throughput == nil {
		u.throughput = func() (float64, float64) { return 0, 0 }
	}
	if u.log == nil {
		u.log = hclog.NewNullLogger()
	}
	return u
}

// page is what every template gets; D is the page's own data.
type page struct {
	Title    string
	Nav      string
	Navs     any
	Base     string // the UI's root path as the browser sees it, e.g. /plugin-pkg/tasks_worker/ui
	HostUI   bool   // served through the host: link its pages
	CSRF     string
	Flash    *flash
	Broker   string
	WorkerID string
	Refresh  int // seconds; the page reloads itself when > 0
	D        any
}

type flash struct {
	Kind    string // ok or error
	Message string
	Detail  string
}

// Routes serves the UI's pages on r, mounted at /ui.
func (u *UI) Routes(r chi.Router) {
	// The parent router's GetHead sees this whole subtree as one route
	// that takes HEAD: HEAD becomes GET here.
	r.Use(middleware.GetHead)
	r.Use(u.guard)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		u.problem(w, r, http.StatusNotFound, "Not found", "There is no page at "+r.URL.Path+".")
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		u.problem(w, r, http.StatusMethodNotAllowed, "Not allowed", r.Method+" is not allowed on "+r.URL.Path+".")
	})
	r.Get("/", u.with(u.dashboard))
	r.Post("/reclaim", u.with(u.reclaim))
	r.Get("/tasks", u.with(u.tasks))
	r.Get("/tasks/{id}", u.with(u.task))
	r.Post("/tasks/{id}/requeue", u.with(u.requeue))
	r.Post("/tasks/{id}/cancel", u.with(u.cancel))
	r.Get("/running", u.with(u.running))
	r.Get("/dead", u.with(u.dead))
	r.Get("/schedules", u.with(u.schedules))
	r.Post("/schedules", u.with(u.createSchedule))
	r.Get("/schedules/{name}", u.with(u.schedule))
	r.Post("/schedules/{name}", u.with(u.updateSchedule))
	r.Post("/schedules/{name}/toggle", u.with(u.toggleSchedule))
	r.Post("/schedules/{name}/delete", u.with(u.deleteSchedule))
	r.Get("/locks", u.with(u.locks))
	r.Post("/locks/release", u.with(u.releaseLock))
	r.Get("/topics", u.with(u.topics))
	r.Post("/topics/{op}", u.with(u.topicAction))
	r.Get("/run", u.with(u.runForm))
	r.Post("/run", u.with(u.run))
}

var prefix = regexp.MustCompile(`^(/[A-Za-z0-9_.~-]+)+$`)

// base is the UI's root as the browser sees it: the host sets
// X-Forwarded-Prefix (/plugin-pkg/tasks_worker) and drops any a client sent.
func base(r *http.Request) string {
	p := r.Header.Get("X-Forwarded-Prefix")
	if !prefix.MatchString(p) {
		p = ""
	}
	return p + "/ui"
}

// self is the request's own page relative to the UI root, without flash
// parameters: where a form on it sends the person back.
func self(r *http.Request) string {
	q := r.URL.Query()
	for _, k := range []string{"flash", "fk", "fd", "fs"} {
		q.Del(k)
	}
	s := strings.TrimPrefix(r.URL.Path, "/ui")
	if s == "" {
		s = "/"
	}
	if len(q) > 0 {
		s += "?" + q.Encode()
	}
	return s
}

// backTo is the form's "back" field if it is a page of this UI, else def.
func backTo(r *http.Request, def string) string {
	b := r.PostForm.Get("back")
	if b == "" || !strings.HasPrefix(b, "/") || strings.HasPrefix(b, "//") || strings.ContainsAny(b, "\\\r\n") {
		return def
	}
	if u, err := url.Parse(b); err != nil || u.Scheme != "" || u.Host != "" {
		return def
	}
	return b
}

func (u *UI) with(h func(http.ResponseWriter, *http.Request, *service.Service)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		svc := u.current()
		if svc == nil {
			w.Header().Set("Retry-After", "5")
			u.problem(w, r, http.StatusServiceUnavailable, "tasks_worker is not running",
				"It is not configured yet, restarting or stopped. Retry in a few seconds; the host's admin page shows its state.")
			return
		}
		h(w, r, svc)
	}
}

func (u *UI) render(w http.ResponseWriter, r *http.Request, svc *service.Service, status int, name string, pg *page) {
	pg.Base = base(r)
	pg.HostUI = pg.Base != "/ui"
	pg.Navs = nav
	pg.CSRF = csrfToken(time.Now())
	if pg.Nav == "" {
		pg.Nav = name
	}
	if pg.Flash == nil {
		pg.Flash = flashFrom(r)
	}
	if svc != nil {
		pg.Broker = svc.Kind()
		pg.WorkerID = svc.WorkerID()
	}
	var buf bytes.Buffer
	if err := pages[name].ExecuteTemplate(&buf, "layout", pg); err != nil {
		u.log.Error("render UI page", "page", name, "error", err)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte("internal error rendering the page; the plugin's log (in the host's log) says why\n"))
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

type problemView struct{ Title, Message string }

// problem renders a page that says what went wrong, in plain words.
func (u *UI) problem(w http.ResponseWriter, r *http.Request, status int, title, msg string) {
	u.render(w, r, u.current(), status, "error", &page{Title: title, Nav: "-", D: problemView{Title: title, Message: msg}})
}

// redirect answers a POST: 303 to path (relative to the UI root) with a
// signed flash message.
func (u *UI) redirect(w http.ResponseWriter, r *http.Request, path, kind, msg, detail string) {
	target, err := url.Parse(base(r) + path)
	if err != nil {
		target, _ = url.Parse(base(r) + "/")
	}
	q := target.Query()
	q.Set("flash", msg)
	q.Set("fk", kind)
	q.Del("fd")
	if detail != "" {
		q.Set("fd", detail)
	}
	q.Set("fs", flashSig(kind, msg, detail))
	target.RawQuery = q.Encode()
	http.Redirect(w, r, target.String(), http.StatusSeeOther)
}

// audit logs an operator's action.
func (u *UI) audit(r *http.Request, action string, args ...any) {
	args = append([]any{"action", action, "actor", r.Header.Get("X-Taskhost-Actor"), "remote", r.Header.Get("X-Forwarded-For")}, args...)
	u.log.Info("audit: UI action", args...)
}

// query encodes the non-empty values; a state fixed by the page is left out.
func query(v map[string]string, forceState string) string {
	q := url.Values{}
	for k, s := range v {
		if s != "" && !(k == "state" && forceState != "") {
			q.Set(k, s)
		}
	}
	if len(q) == 0 {
		return ""
	}
	return "?" + q.Encode()
}

// pageStatus is 503 when the broker failed: the page shows what it could.
func pageStatus(brokerDown bool) int {
	if brokerDown {
		return http.StatusServiceUnavailable
	}
	return http.StatusOK
}
