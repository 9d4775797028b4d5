package ui

// The operator's web UI of the task system, served under /ui/ (through the
// host: /plugin-pkg/tasks_worker/ui/). Server-rendered html/template pages;
// the only script is the confirm() of dangerous forms.
//
// # Why not the host's CSRF scheme
//
// The host's admin UI uses a double-submit cookie. A plugin cannot: the host
// proxy strips Cookie from the requests it forwards and Set-Cookie from the
// answers (a plugin must neither read nor set cookies on the host's origin).
// So every form here carries a token instead:
//
//   - the token is a timestamp and a random nonce, signed with HMAC-SHA256
//     under a secret drawn at random when the process starts (uiSecret). A
//     POST is refused unless its token verifies and is younger than
//     uiCSRFMaxAge. Another site cannot read a token out of a page (the
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

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/plugins/tasksworker/service"
	"github.com/taskhost/taskhost/scheduler"
	"github.com/taskhost/taskhost/worker"
)

const (
	uiCSRFField  = "csrf_token"
	uiCSRFMaxAge = 12 * time.Hour
	uiListLimit  = broker.DefaultListLimit
	// uiActionTimeout bounds a reaper pass started from the UI.
	uiActionTimeout = 30 * time.Second
)

//go:embed templates/*.html
var uiTemplateFS embed.FS

// uiSecret signs CSRF tokens and flash messages; drawn once per process.
var uiSecret = func() []byte {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return b
}()

var uiFuncs = template.FuncMap{
	"when":   uiWhen,
	"rel":    uiRel,
	"dur":    uiDuration,
	"secs":   func(f float64) string { return uiDuration(time.Duration(f * float64(time.Second))) },
	"pct":    func(f float64) int { return int(math.Round(math.Max(0, math.Min(1, f)) * 100)) },
	"pretty": uiPrettyJSON,
	"clip":   uiClip,
	"limit": func(n int) string {
		if n == 0 {
			return "unlimited"
		}
		return strconv.Itoa(n)
	},
}

var uiPageNames = []string{"dashboard", "tasks", "task", "running", "dead", "schedules", "schedule", "locks", "topics", "run", "error"}

var uiPages = func() map[string]*template.Template {
	m := map[string]*template.Template{}
	for _, name := range uiPageNames {
		m[name] = template.Must(template.New(name).Funcs(uiFuncs).ParseFS(uiTemplateFS, "templates/layout.html", "templates/"+name+".html"))
	}
	return m
}()

// uiNav is the tab bar.
var uiNav = []struct{ Key, Path, Label string }{
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

// uiPage is what every template gets; D is the page's own data.
type uiPage struct {
	Title    string
	Nav      string
	Navs     any
	Base     string // the UI's root path as the browser sees it, e.g. /plugin-pkg/tasks_worker/ui
	HostUI   bool   // served through the host: link its pages
	CSRF     string
	Flash    *uiFlash
	Broker   string
	WorkerID string
	Refresh  int // seconds; the page reloads itself when > 0
	D        any
}

type uiFlash struct {
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
		if err := uiCheckOrigin(r); err != nil {
			u.log.Warn("UI form refused", "path", r.URL.Path, "reason", err.Error(), "remote", r.Header.Get("X-Forwarded-For"))
			u.problem(w, r, http.StatusForbidden, "Form refused", "This form was refused: "+err.Error()+". Open the page from this host and submit it again.")
			return
		}
		if err := uiCheckCSRF(r.PostForm.Get(uiCSRFField), time.Now()); err != nil {
			u.log.Warn("UI form refused", "path", r.URL.Path, "reason", err.Error(), "remote", r.Header.Get("X-Forwarded-For"))
			u.problem(w, r, http.StatusForbidden, "Form refused", "This form was refused: "+err.Error()+". Reload the page and submit it again.")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// uiMAC signs parts under the process's secret.
func uiMAC(parts ...string) []byte {
	m := hmac.New(sha256.New, uiSecret)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return m.Sum(nil)
}

// uiCSRFToken returns a fresh form token: time.nonce.mac.
func uiCSRFToken(now time.Time) string {
	nonce := make([]byte, 12)
	_, _ = rand.Read(nonce)
	ts := strconv.FormatInt(now.Unix(), 10)
	n := base64.RawURLEncoding.EncodeToString(nonce)
	return ts + "." + n + "." + base64.RawURLEncoding.EncodeToString(uiMAC("csrf", ts, n))
}

// CSRFToken is a form token as the pages carry, signed at now with this
// process's secret: for tests that drive the forms through the plugin.
func CSRFToken(now time.Time) string { return uiCSRFToken(now) }

// SignFlash is the signature of a flash message, as the redirect after a
// form carries it: for tests that drive the pages through the plugin.
func SignFlash(kind, msg, detail string) string { return uiFlashSig(kind, msg, detail) }

// uiCheckCSRF says what is wrong with a form token, or nil.
func uiCheckCSRF(tok string, now time.Time) error {
	if tok == "" {
		return errors.New("it carries no security token")
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return errors.New("its security token is malformed")
	}
	mac, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || !hmac.Equal(mac, uiMAC("csrf", parts[0], parts[1])) {
		return errors.New("its security token is not valid (the plugin restarted since the page was loaded, or the form did not come from this UI)")
	}
	ts, err := strconv.ParseInt(parts[0], 10, 64)
	if err != nil {
		return errors.New("its security token is malformed")
	}
	age := now.Sub(time.Unix(ts, 0))
	if age > uiCSRFMaxAge || age < -5*time.Minute {
		return fmt.Errorf("the page is older than %s", uiDuration(uiCSRFMaxAge))
	}
	return nil
}

// uiCheckOrigin refuses a POST whose Origin (or Referer) is not the host
// the browser addressed.
func uiCheckOrigin(r *http.Request) error {
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

func uiFlashSig(kind, msg, detail string) string {
	return base64.RawURLEncoding.EncodeToString(uiMAC("flash", kind, msg, detail)[:18])
}

// uiFlashFrom reads a signed flash message from the query string.
func uiFlashFrom(r *http.Request) *uiFlash {
	q := r.URL.Query()
	f := &uiFlash{Kind: q.Get("fk"), Message: q.Get("flash"), Detail: q.Get("fd")}
	if f.Message == "" || (f.Kind != "ok" && f.Kind != "error") {
		return nil
	}
	sig, err := base64.RawURLEncoding.DecodeString(q.Get("fs"))
	if err != nil || !hmac.Equal(sig, uiMAC("flash", f.Kind, f.Message, f.Detail)[:18]) {
		return nil
	}
	return f
}

var uiPrefix = regexp.MustCompile(`^(/[A-Za-z0-9_.~-]+)+$`)

// uiBase is the UI's root as the browser sees it: the host sets
// X-Forwarded-Prefix (/plugin-pkg/tasks_worker) and drops any a client sent.
func uiBase(r *http.Request) string {
	p := r.Header.Get("X-Forwarded-Prefix")
	if !uiPrefix.MatchString(p) {
		p = ""
	}
	return p + "/ui"
}

// uiSelf is the request's own page relative to the UI root, without flash
// parameters: where a form on it sends the person back.
func uiSelf(r *http.Request) string {
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

// uiBack is the form's "back" field if it is a page of this UI, else def.
func uiBack(r *http.Request, def string) string {
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

func (u *UI) render(w http.ResponseWriter, r *http.Request, svc *service.Service, status int, name string, pg *uiPage) {
	pg.Base = uiBase(r)
	pg.HostUI = pg.Base != "/ui"
	pg.Navs = uiNav
	pg.CSRF = uiCSRFToken(time.Now())
	if pg.Nav == "" {
		pg.Nav = name
	}
	if pg.Flash == nil {
		pg.Flash = uiFlashFrom(r)
	}
	if svc != nil {
		pg.Broker = svc.Kind()
		pg.WorkerID = svc.WorkerID()
	}
	var buf bytes.Buffer
	if err := uiPages[name].ExecuteTemplate(&buf, "layout", pg); err != nil {
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

type uiProblem struct{ Title, Message string }

// problem renders a page that says what went wrong, in plain words.
func (u *UI) problem(w http.ResponseWriter, r *http.Request, status int, title, msg string) {
	u.render(w, r, u.current(), status, "error", &uiPage{Title: title, Nav: "-", D: uiProblem{Title: title, Message: msg}})
}

// redirect answers a POST: 303 to path (relative to the UI root) with a
// signed flash message.
func (u *UI) redirect(w http.ResponseWriter, r *http.Request, path, kind, msg, detail string) {
	target, err := url.Parse(uiBase(r) + path)
	if err != nil {
		target, _ = url.Parse(uiBase(r) + "/")
	}
	q := target.Query()
	q.Set("flash", msg)
	q.Set("fk", kind)
	q.Del("fd")
	if detail != "" {
		q.Set("fd", detail)
	}
	q.Set("fs", uiFlashSig(kind, msg, detail))
	target.RawQuery = q.Encode()
	http.Redirect(w, r, target.String(), http.StatusSeeOther)
}

// audit logs an operator's action.
func (u *UI) audit(r *http.Request, action string, args ...any) {
	args = append([]any{"action", action, "actor", r.Header.Get("X-Taskhost-Actor"), "remote", r.Header.Get("X-Forwarded-For")}, args...)
	u.log.Info("audit: UI action", args...)
}

// uiFailure is the one mapping of the service's errors to a page's
// status and a message: a refusal of the service (a *service.Problem)
// says what is wrong in its own words; a broker's failure is told by
// uiBrokerProblem, what being what could not be done.
func uiFailure(what string, err error) (int, string) {
	if p, ok := service.IsProblem(err); ok {
		switch {
		case errors.Is(p, service.ErrConflict):
			return http.StatusConflict, p.Msg
		case errors.Is(p, service.ErrUnavailable):
			return http.StatusServiceUnavailable, p.Msg
		}
		return http.StatusBadRequest, p.Msg
	}
	status := http.StatusServiceUnavailable
	switch {
	case errors.Is(err, broker.ErrInvalid):
		status = http.StatusBadRequest
	case errors.Is(err, broker.ErrNotFound):
		status = http.StatusNotFound
	}
	return status, uiBrokerProblem(what, err)
}

// uiBrokerProblem says in plain words why a broker call failed.
func uiBrokerProblem(what string, err error) string {
	msg := err.Error()
	switch {
	case errors.Is(err, broker.ErrInvalid):
		msg = strings.Replace(msg, broker.ErrInvalid.Error()+": ", "", 1)
		return fmt.Sprintf("Could not %s: %s.", what, strings.TrimSuffix(msg, "."))
	case errors.Is(err, broker.ErrNotFound):
		return fmt.Sprintf("Could not %s: it does not exist (any more).", what)
	case errors.Is(err, broker.ErrClosed):
		return fmt.Sprintf("Could not %s: the broker is closed (the plugin is stopping or restarting). Retry in a few seconds.", what)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("Could not %s: the broker did not answer in time. Retry later, and check the broker's health if it persists.", what)
	}
	return fmt.Sprintf("Could not %s: the broker failed (%s). Retry later, and check the broker's health if it persists.", what, msg)
}

// ---- dashboard

type uiWorkerRow struct {
	broker.WorkerInfo
	Self  bool
	Age   time.Duration
	Stale bool // the reaper counts it as dead
	Late  bool // missed two heartbeats
}

type uiBeat struct {
	Enabled, Candidate, Leader bool
	Term                       int64
	Beats                      int
}

type uiDashboard struct {
	Err                       string
	Topics                    []broker.TopicStats
	Queued, Running, Dead     int
	Locks, LiveWorkers        int
	Workers                   []uiWorkerRow
	Beat                      uiBeat
	HereRunning, HereCapacity int
	Charts                    []uiChart
	Reaper                    struct {
		Enabled      bool
		Every, After time.Duration
		Grace        time.Duration
		MaxAttempts  int
		Reclaims     bool
	}
}

func (u *UI) workers(ctx context.Context, svc *service.Service) ([]uiWorkerRow, error) {
	ws, err := svc.Workers(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	out := make([]uiWorkerRow, 0, len(ws))
	for _, w := range ws {
		age := max(0, now.Sub(w.HeartbeatAt))
		out = append(out, uiWorkerRow{WorkerInfo: w, Self: w.ID == svc.WorkerID(), Age: age,
			Stale: age > svc.Settings().Reaper.After, Late: age > 2*svc.Settings().HeartbeatInterval})
	}
	return out, nil
}

func (u *UI) dashboard(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	ctx := r.Context()
	d := uiDashboard{HereRunning: svc.Running(), HereCapacity: svc.Concurrency()}
	var problems []string
	st, statsErr := svc.Stats(ctx)
	if statsErr != nil {
		problems = append(problems, uiBrokerProblem("read the topics", statsErr))
	} else {
		d.Topics, d.Locks, d.LiveWorkers = st.Topics, st.Locks, st.Workers
		for _, t := range st.Topics {
			d.Queued += t.Queued
			d.Running += t.Running
			d.Dead += t.DeadLetter
		}
	}
	var err error
	if d.Workers, err = u.workers(ctx, svc); err != nil {
		problems = append(problems, uiBrokerProblem("read the workers", err))
	}
	b := svc.Beat()
	d.Beat = uiBeat{Enabled: b.Enabled, Candidate: b.Candidate, Leader: b.Leader, Term: b.Term, Beats: st.Beats}
	d.Reaper.Enabled, d.Reaper.Every, d.Reaper.After = svc.Settings().Reaper.Enabled, svc.Settings().Reaper.Interval, svc.Settings().Reaper.After
	d.Reaper.Grace, d.Reaper.MaxAttempts = svc.Settings().Reaper.Grace, svc.Settings().Reaper.MaxAttempts
	d.Reaper.Reclaims = svc.ReclaimsOrphans()

	// The stats just read are a sample too, so the charts agree with the
	// numbers above them.
	s := u.sampler(svc)
	if statsErr == nil {
		done, failed := u.throughput()
		s.record(time.Now(), st, done, failed)
	}
	d.Charts = s.charts(time.Now())
	d.Err = strings.Join(problems, " ")
	status := http.StatusOK
	if d.Err != "" {
		status = http.StatusServiceUnavailable
	}
	u.render(w, r, svc, status, "dashboard", &uiPage{Title: "Dashboard", D: d})
}

func (u *UI) reclaim(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	ctx, cancel := context.WithTimeout(r.Context(), uiActionTimeout)
	defer cancel()
	res := svc.Reclaim(ctx)
	u.audit(r, "reclaim orphaned messages", "result", res.Summary())
	kind := "ok"
	if res.Skipped != "" || res.NotLeader || res.Reason == "cancelled" {
		kind = "error"
	}
	detail, _ := json.MarshalIndent(res, "", "  ")
	u.redirect(w, r, "/", kind, "Reclaim orphaned messages: "+res.Summary(), string(detail))
}

// ---- task lists

type uiList struct {
	Err             string
	Down            bool // the broker failed (not just a bad filter)
	Rows            []uiTaskRow
	State           string
	Topic, Task     string
	States          []string
	Topics, Tasks   []string
	NextURL, NewURL string
	Back            string
	Workers         map[string]uiWorkerRow
	ListedAt        time.Time
}

type uiTaskRow struct {
	broker.Message
	ClaimAge    time.Duration
	MaxAttempts int
	Worker      *uiWorkerRow
}

// listPage reads a page of messages filtered by the query (state, topic,
// task, before), for the tasks, running and dead pages.
func (u *UI) listPage(r *http.Request, svc *service.Service, path, forceState string) uiList {
	ctx := r.Context()
	q := r.URL.Query()
	l := uiList{State: q.Get("state"), Topic: q.Get("topic"), Task: q.Get("task"), States: service.MessageStates, Back: uiSelf(r), ListedAt: time.Now()}
	if forceState != "" {
		l.State = forceState
	}
	f := broker.MessageFilter{State: l.State, Topic: l.Topic, Task: l.Task, Limit: uiListLimit}
	var problems []string
	if f.State != "" && !slices.Contains(service.MessageStates, f.State) {
		problems = append(problems, fmt.Sprintf("There is no state %q; the states are %s.", f.State, strings.Join(service.MessageStates, ", ")))
		f.State, l.State = "", ""
	}
	if s := q.Get("before"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 {
			problems = append(problems, fmt.Sprintf("The page marker before=%q is not a task id; showing the newest tasks.", s))
		} else {
			f.Before = n
			l.NewURL = uiBase(r) + path + uiQuery(map[string]string{"state": l.State, "topic": l.Topic, "task": l.Task}, forceState)
		}
	}
	if topics, err := svc.Topics(ctx); err == nil {
		for _, t := range topics {
			l.Topics = append(l.Topics, t.Name)
		}
	}
	l.Tasks = svc.TaskNames()
	msgs, err := svc.Messages(ctx, f)
	if err != nil {
		problems = append(problems, uiBrokerProblem("list the tasks", err))
		l.Down = true
	}
	if ws, err := u.workers(ctx, svc); err == nil {
		l.Workers = map[string]uiWorkerRow{}
		for _, w := range ws {
			l.Workers[w.ID] = w
		}
	}
	now := time.Now()
	for _, m := range msgs {
		row := uiTaskRow{Message: m, MaxAttempts: m.MaxAttempts}
		if row.MaxAttempts == 0 {
			if t, ok := svc.Task(m.Task); ok {
				row.MaxAttempts = t.MaxAttempts
			}
		}
		if m.ClaimedAt != nil {
			row.ClaimAge = max(0, now.Sub(*m.ClaimedAt))
		}
		if wr, ok := l.Workers[m.ClaimedBy]; ok {
			row.Worker = &wr
		}
		l.Rows = append(l.Rows, row)
	}
	if len(msgs) == f.Limit && len(msgs) > 0 {
		l.NextURL = uiBase(r) + path + uiQuery(map[string]string{"state": l.State, "topic": l.Topic, "task": l.Task,
			"before": strconv.FormatInt(msgs[len(msgs)-1].ID, 10)}, forceState)
	}
	l.Err = strings.Join(problems, " ")
	return l
}

// uiQuery encodes the non-empty values; a state fixed by the page is left out.
func uiQuery(v map[string]string, forceState string) string {
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

func (u *UI) tasks(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	l := u.listPage(r, svc, "/tasks", "")
	u.render(w, r, svc, uiStatus(l.Down), "tasks", &uiPage{Title: "Tasks", D: l})
}

func (u *UI) running(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	l := u.listPage(r, svc, "/running", broker.StateRunning)
	// Oldest claims first: those are the ones to look at.
	sort.SliceStable(l.Rows, func(i, j int) bool { return l.Rows[i].ClaimAge > l.Rows[j].ClaimAge })
	u.render(w, r, svc, uiStatus(l.Down), "running", &uiPage{Title: "Running", D: l, Refresh: 10})
}

func (u *UI) dead(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	l := u.listPage(r, svc, "/dead", broker.StateDead)
	u.render(w, r, svc, uiStatus(l.Down), "dead", &uiPage{Title: "Dead letters", D: l})
}

// uiStatus is 503 when the broker failed: the page shows what it could.
func uiStatus(brokerDown bool) int {
	if brokerDown {
		return http.StatusServiceUnavailable
	}
	return http.StatusOK
}

// ---- one task

type uiTask struct {
	M           broker.Message
	MaxAttempts int
	Description string
	Reports     []broker.Report
	ReportsErr  string
	Final       bool
	CanRequeue  bool
	Back        string
	Lock        string
}

func (u *UI) taskID(w http.ResponseWriter, r *http.Request) (int64, bool) {
	raw := chi.URLParam(r, "id")
	id, ok := service.ParseID(raw)
	if !ok {
		u.problem(w, r, http.StatusNotFound, "No such task", fmt.Sprintf("%q is not a task id: ids are positive whole numbers.", raw))
		return 0, false
	}
	return id, true
}

func (u *UI) task(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	id, ok := u.taskID(w, r)
	if !ok {
		return
	}
	m, err := svc.Message(r.Context(), id)
	if errors.Is(err, broker.ErrNotFound) {
		u.problem(w, r, http.StatusNotFound, "No such task", fmt.Sprintf("There is no task %d: it never existed, or it finished long ago and was dropped.", id))
		return
	}
	if err != nil {
		u.problem(w, r, http.StatusServiceUnavailable, "Task unavailable", uiBrokerProblem(fmt.Sprintf("read task %d", id), err))
		return
	}
	d := uiTask{M: m, MaxAttempts: m.MaxAttempts, Back: uiSelf(r), Lock: service.PayloadLock(m.Payload)}
	if t, ok := svc.Task(m.Task); ok {
		d.Description = t.Description
		if d.MaxAttempts == 0 {
			d.MaxAttempts = t.MaxAttempts
		}
	}
	d.Final = m.State == broker.StateDone || m.State == broker.StateFailed || m.State == broker.StateDead
	d.CanRequeue = m.State == broker.StateFailed || m.State == broker.StateDead
	d.Reports, err = svc.Reports(r.Context(), broker.ReportFilter{MessageID: id, Limit: 100})
	if err != nil {
		d.ReportsErr = uiBrokerProblem("read the task's reports", err)
	}
	pg := &uiPage{Title: fmt.Sprintf("Task %d", id), Nav: "tasks", D: d}
	switch {
	case d.Final:
	case m.State == broker.StateQueued && time.Until(m.AvailableAt) > 30*time.Second:
		pg.Refresh = 15 // delayed: nothing happens soon
	default:
		pg.Refresh = 2
	}
	u.render(w, r, svc, http.StatusOK, "task", pg)
}

func (u *UI) requeue(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	id, ok := u.taskID(w, r)
	if !ok {
		return
	}
	back := uiBack(r, fmt.Sprintf("/tasks/%d", id))
	err := svc.Requeue(r.Context(), id)
	u.audit(r, "requeue", "message_id", id, "error", err)
	if err != nil {
		u.redirect(w, r, back, "error", uiBrokerProblem(fmt.Sprintf("requeue task %d", id), err), "")
		return
	}
	u.redirect(w, r, back, "ok", fmt.Sprintf("Task %d is queued again.", id), "")
}

// ---- run a task

type uiRunForm struct {
	Task, Topic, Payload, Delay, MaxAttempts string
}

type uiRun struct {
	Tasks  []worker.Task
	Topics []string
	Form   uiRunForm
}

func (u *UI) runPage(w http.ResponseWriter, r *http.Request, svc *service.Service, status int, f uiRunForm, fl *uiFlash) {
	d := uiRun{Tasks: svc.Tasks(), Topics: svc.Served(), Form: f}
	u.render(w, r, svc, status, "run", &uiPage{Title: "Run a task", Flash: fl, D: d})
}

func (u *UI) runForm(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	q := r.URL.Query()
	f := uiRunForm{Task: q.Get("task"), Payload: "{}"}
	if from := q.Get("from"); from != "" {
		// "Run again": start from a stored message.
		if id, err := strconv.ParseInt(from, 10, 64); err == nil && id > 0 {
			if m, err := svc.Message(r.Context(), id); err == nil {
				f.Task, f.Topic, f.Payload = m.Task, m.Topic, uiPrettyJSON(m.Payload)
			}
		}
	}
	u.runPage(w, r, svc, http.StatusOK, f, nil)
}

func (u *UI) run(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	pf := r.PostForm
	f := uiRunForm{Task: pf.Get("task"), Topic: strings.TrimSpace(pf.Get("topic")), Payload: pf.Get("payload"),
		Delay: strings.TrimSpace(pf.Get("delay_seconds")), MaxAttempts: strings.TrimSpace(pf.Get("max_attempts"))}
	fail := func(status int, msg string) {
		u.runPage(w, r, svc, status, f, &uiFlash{Kind: "error", Message: msg})
	}
	payload := strings.TrimSpace(f.Payload)
	if payload == "" {
		payload = "{}"
	}
	if msg := uiJSONProblem("payload", payload); msg != "" {
		fail(http.StatusBadRequest, msg)
		return
	}
	req := service.SubmitRequest{Task: f.Task, Topic: f.Topic, Payload: json.RawMessage(payload)}
	if f.Delay != "" {
		n, err := strconv.ParseFloat(f.Delay, 64)
		if err != nil || math.IsNaN(n) || math.IsInf(n, 0) {
			fail(http.StatusBadRequest, fmt.Sprintf("The delay must be a number of seconds, such as 30 or 0.5; %q is not.", f.Delay))
			return
		}
		req.DelaySeconds = n
	}
	if f.MaxAttempts != "" {
		n, err := strconv.Atoi(f.MaxAttempts)
		if err != nil {
			fail(http.StatusBadRequest, fmt.Sprintf("Max attempts must be a whole number (0 for the task's default); %q is not.", f.MaxAttempts))
			return
		}
		req.MaxAttempts = n
	}
	// The service checks and submits, so the UI accepts exactly what
	// POST /api/tasks accepts, and counts it the same way.
	id, _, err := svc.Submit(r.Context(), req)
	if err != nil {
		status, msg := uiFailure("submit the task", err)
		if _, ok := service.IsProblem(err); ok {
			msg = "The task was not submitted: " + strings.TrimSuffix(msg, ".") + "."
		}
		fail(status, msg)
		return
	}
	u.audit(r, "run task", "task", f.Task, "topic", f.Topic, "message_id", strconv.FormatInt(id, 10))
	u.redirect(w, r, fmt.Sprintf("/tasks/%d", id), "ok", fmt.Sprintf("Task %d submitted (%s).", id, f.Task), "")
}

// uiJSONProblem says in plain words what is wrong with a JSON text, or "".
func uiJSONProblem(what, s string) string {
	if json.Valid([]byte(s)) {
		return ""
	}
	var v any
	err := json.Unmarshal([]byte(s), &v)
	var syn *json.SyntaxError
	where := ""
	if errors.As(err, &syn) {
		line, col := 1, 1
		// Offset counts the offending byte; point at it.
		for _, c := range s[:max(0, min(int(syn.Offset)-1, len(s)))] {
			if c == '\n' {
				line, col = line+1, 1
			} else {
				col++
			}
		}
		where = fmt.Sprintf(" (%s, near line %d, column %d)", syn.Error(), line, col)
	} else if err != nil {
		where = " (" + err.Error() + ")"
	}
	return fmt.Sprintf(`The %s is not valid JSON%s. Write a JSON value such as {"hello": "world"}, or leave it empty for {}.`, what, where)
}

// ---- schedules

type uiSchedForm struct {
	Name, Task, Topic, Payload, Interval, Cron, MissedPolicy string
	Enabled                                                  bool
	Source                                                   string
}

type uiSchedRow struct {
	broker.Schedule
	Timing string
}

type uiSchedules struct {
	Err      string
	Rows     []uiSchedRow
	Form     uiSchedForm
	Tasks    []string
	Topics   []string
	Policies []string
	// the edit page
	Edit       bool
	Stored     *uiSchedRow
	Reports    []broker.Report
	ReportsErr string
}

func uiSchedRowOf(s broker.Schedule) uiSchedRow {
	row := uiSchedRow{Schedule: s}
	if tm, err := scheduler.ParseTiming(s.IntervalSeconds, s.Cron); err == nil {
		row.Timing = tm.String()
	} else {
		row.Timing = "invalid: " + err.Error()
	}
	return row
}

func uiSchedFormOf(s broker.Schedule) uiSchedForm {
	f := uiSchedForm{Name: s.Name, Task: s.Task, Topic: s.Topic, Payload: uiPrettyJSON(s.Payload), Cron: s.Cron,
		MissedPolicy: s.MissedPolicy, Enabled: s.Enabled, Source: s.Source}
	if s.IntervalSeconds > 0 {
		f.Interval = strconv.Itoa(s.IntervalSeconds)
	}
	return f
}

func uiSchedFormFrom(r *http.Request) uiSchedForm {
	pf := r.PostForm
	return uiSchedForm{Name: strings.TrimSpace(pf.Get("name")), Task: pf.Get("task"), Topic: strings.TrimSpace(pf.Get("topic")),
		Payload: pf.Get("payload"), Interval: strings.TrimSpace(pf.Get("interval_seconds")), Cron: strings.TrimSpace(pf.Get("cron")),
		MissedPolicy: pf.Get("missed_policy"), Enabled: pf.Get("enabled") != ""}
}

// body turns the form into what the API takes; the service then checks
// it exactly as it checks the API's.
func (f uiSchedForm) body() (service.ScheduleSpec, error) {
	payload := strings.TrimSpace(f.Payload)
	if payload == "" {
		payload = "{}"
	}
	if msg := uiJSONProblem("payload", payload); msg != "" {
		return service.ScheduleSpec{}, errors.New(msg)
	}
	interval := 0
	if f.Interval != "" {
		n, err := strconv.Atoi(f.Interval)
		if err != nil {
			return service.ScheduleSpec{}, fmt.Errorf("the interval must be a whole number of seconds, such as 60; %q is not", f.Interval)
		}
		interval = n
	}
	enabled := f.Enabled
	return service.ScheduleSpec{Name: f.Name, Task: f.Task, Topic: f.Topic, Payload: json.RawMessage(payload),
		IntervalSeconds: interval, Cron: f.Cron, Enabled: &enabled, MissedPolicy: f.MissedPolicy}, nil
}

func (u *UI) schedulesPage(w http.ResponseWriter, r *http.Request, svc *service.Service, status int, f uiSchedForm, fl *uiFlash) {
	d := uiSchedules{Form: f, Tasks: svc.TaskNames(), Topics: svc.Served(), Policies: []string{broker.MissedSkip, broker.MissedFireOnce}}
	list, err := svc.Schedules(r.Context())
	if err != nil {
		d.Err = uiBrokerProblem("list the schedules", err)
	}
	for _, s := range list {
		d.Rows = append(d.Rows, uiSchedRowOf(s))
	}
	u.render(w, r, svc, status, "schedules", &uiPage{Title: "Schedules", Flash: fl, D: d})
}

func (u *UI) schedules(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	u.schedulesPage(w, r, svc, http.StatusOK, uiSchedForm{Payload: "{}", Enabled: true, Interval: "3600"}, nil)
}

func (u *UI) createSchedule(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	f := uiSchedFormFrom(r)
	fail := func(status int, msg string) {
		u.schedulesPage(w, r, svc, status, f, &uiFlash{Kind: "error", Message: msg})
	}
	b, err := f.body()
	if err != nil {
		fail(http.StatusBadRequest, "Schedule not created: "+err.Error())
		return
	}
	stored, err := svc.CreateSchedule(r.Context(), b)
	if p, ok := service.IsProblem(err); ok {
		if errors.Is(p, service.ErrConflict) {
			fail(http.StatusConflict, fmt.Sprintf("Schedule not created: a schedule named %q exists. Edit it, or choose another name.", b.Name))
		} else {
			fail(http.StatusBadRequest, "Schedule not created: "+p.Msg+".")
		}
		return
	}
	u.audit(r, "create schedule", "schedule", b.Name, "error", err)
	if err != nil {
		fail(http.StatusServiceUnavailable, uiBrokerProblem("store the schedule", err))
		return
	}
	u.redirect(w, r, "/schedules", "ok", fmt.Sprintf("Schedule %s created: %s, task %s.", stored.Name, uiSchedRowOf(stored).Timing, stored.Task), "")
}

func uiSchedName(r *http.Request) string {
	name := chi.URLParam(r, "name")
	if n, err := url.PathUnescape(name); err == nil {
		name = n
	}
	return name
}

func (u *UI) schedulePage(w http.ResponseWriter, r *http.Request, svc *service.Service, status int, stored broker.Schedule, f uiSchedForm, fl *uiFlash) {
	row := uiSchedRowOf(stored)
	d := uiSchedules{Form: f, Tasks: svc.TaskNames(), Topics: svc.Served(), Policies: []string{broker.MissedSkip, broker.MissedFireOnce},
		Edit: true, Stored: &row}
	var err error
	if d.Reports, err = svc.Reports(r.Context(), broker.ReportFilter{Schedule: stored.Name, Limit: 20}); err != nil {
		d.ReportsErr = uiBrokerProblem("read the schedule's reports", err)
	}
	u.render(w, r, svc, status, "schedule", &uiPage{Title: "Schedule " + stored.Name, Nav: "schedules", Flash: fl, D: d})
}

func (u *UI) loadSchedule(w http.ResponseWriter, r *http.Request, svc *service.Service) (broker.Schedule, bool) {
	name := uiSchedName(r)
	s, err := svc.Schedule(r.Context(), name)
	if errors.Is(err, broker.ErrNotFound) {
		u.problem(w, r, http.StatusNotFound, "No such schedule", fmt.Sprintf("There is no schedule named %q (deleted?).", name))
		return s, false
	}
	if err != nil {
		u.problem(w, r, http.StatusServiceUnavailable, "Schedule unavailable", uiBrokerProblem(fmt.Sprintf("read schedule %q", name), err))
		return s, false
	}
	return s, true
}

func (u *UI) schedule(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	s, ok := u.loadSchedule(w, r, svc)
	if !ok {
		return
	}
	u.schedulePage(w, r, svc, http.StatusOK, s, uiSchedFormOf(s), nil)
}

func (u *UI) updateSchedule(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	stored, ok := u.loadSchedule(w, r, svc)
	if !ok {
		return
	}
	f := uiSchedFormFrom(r)
	f.Name, f.Source = stored.Name, stored.Source // a schedule cannot be renamed
	fail := func(status int, msg string) {
		u.schedulePage(w, r, svc, status, stored, f, &uiFlash{Kind: "error", Message: msg})
	}
	b, err := f.body()
	if err != nil {
		fail(http.StatusBadRequest, "Not saved: "+err.Error())
		return
	}
	saved, err := svc.UpdateSchedule(r.Context(), b)
	if p, ok := service.IsProblem(err); ok {
		fail(http.StatusBadRequest, "Not saved: "+p.Msg+".")
		return
	}
	u.audit(r, "update schedule", "schedule", b.Name, "error", err)
	if err != nil {
		fail(http.StatusServiceUnavailable, uiBrokerProblem("store the schedule", err))
		return
	}
	u.redirect(w, r, "/schedules", "ok", fmt.Sprintf("Schedule %s saved: %s.", saved.Name, uiSchedRowOf(saved).Timing), "")
}

func (u *UI) toggleSchedule(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	name := uiSchedName(r)
	// Disabling always works, even for a task that is gone; enabling
	// checks the schedule as the API would.
	s, err := svc.ToggleSchedule(r.Context(), name)
	if p, ok := service.IsProblem(err); ok {
		u.redirect(w, r, "/schedules", "error", fmt.Sprintf("Schedule %s stays disabled: %s.", name, p.Msg), "")
		return
	}
	u.audit(r, "toggle schedule", "schedule", name, "enabled", s.Enabled, "error", err)
	if err != nil {
		u.redirect(w, r, "/schedules", "error", uiBrokerProblem(fmt.Sprintf("toggle schedule %q", name), err), "")
		return
	}
	state := "disabled"
	if s.Enabled {
		state = "enabled"
	}
	u.redirect(w, r, "/schedules", "ok", fmt.Sprintf("Schedule %s %s.", name, state), "")
}

func (u *UI) deleteSchedule(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	name := uiSchedName(r)
	err := svc.DeleteSchedule(r.Context(), name)
	u.audit(r, "delete schedule", "schedule", name, "error", err)
	if err != nil {
		u.redirect(w, r, "/schedules", "error", uiBrokerProblem(fmt.Sprintf("delete schedule %q", name), err), "")
		return
	}
	u.redirect(w, r, "/schedules", "ok", fmt.Sprintf("Schedule %s deleted.", name), "")
}

// ---- locks

type uiLockRow struct {
	broker.Lock
	Age    time.Duration
	Worker *uiWorkerRow
}

type uiLocks struct {
	Err  string
	Rows []uiLockRow
}

func (u *UI) locks(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	var d uiLocks
	locks, err := svc.Locks(r.Context())
	if err != nil {
		d.Err = uiBrokerProblem("list the locks", err)
	}
	workers := map[string]uiWorkerRow{}
	if ws, err := u.workers(r.Context(), svc); err == nil {
		for _, w := range ws {
			workers[w.ID] = w
		}
	}
	now := time.Now()
	for _, l := range locks {
		row := uiLockRow{Lock: l, Age: max(0, now.Sub(l.AcquiredAt))}
		if wr, ok := workers[l.Holder]; ok {
			row.Worker = &wr
		}
		d.Rows = append(d.Rows, row)
	}
	u.render(w, r, svc, uiStatus(d.Err != ""), "locks", &uiPage{Title: "Locks", D: d})
}

func (u *UI) releaseLock(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	name := r.PostForm.Get("name")
	if name == "" {
		u.redirect(w, r, "/locks", "error", "No lock named: the form lacks the lock's name.", "")
		return
	}
	released, err := svc.ReleaseLock(r.Context(), name)
	u.audit(r, "force-release lock", "lock", name, "released", released, "error", err)
	switch {
	case err != nil:
		u.redirect(w, r, "/locks", "error", uiBrokerProblem(fmt.Sprintf("release lock %q", name), err), "")
	case !released:
		u.redirect(w, r, "/locks", "ok", fmt.Sprintf("Lock %s was not held (any more): nothing to release.", name), "")
	default:
		u.redirect(w, r, "/locks", "ok", fmt.Sprintf("Lock %s released. A task still running under it no longer holds it; another may take it now.", name), "")
	}
}

// ---- topics

type uiTopics struct {
	Err    string
	Topics []broker.TopicStats
	Served []string
}

func (u *UI) topics(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	d := uiTopics{Served: svc.Served()}
	st, err := svc.Stats(r.Context())
	if err != nil {
		d.Err = uiBrokerProblem("read the topics", err)
	}
	d.Topics = st.Topics
	u.render(w, r, svc, uiStatus(d.Err != ""), "topics", &uiPage{Title: "Topics", D: d})
}

func (u *UI) topicAction(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	op := chi.URLParam(r, "op")
	topic := r.PostForm.Get("topic")
	if err := broker.ValidateTopicName(topic); err != nil {
		u.redirect(w, r, "/topics", "error", uiBrokerProblem("change the topic", err), "")
		return
	}
	ctx := r.Context()
	var msg string
	var err error
	setBool := func(field string) (bool, bool) {
		v, perr := strconv.ParseBool(r.PostForm.Get(field))
		if perr != nil {
			u.redirect(w, r, "/topics", "error", fmt.Sprintf("The form's %s field must be true or false.", field), "")
			return false, false
		}
		return v, true
	}
	switch op {
	case "limit":
		s := strings.TrimSpace(r.PostForm.Get("limit"))
		n, perr := strconv.Atoi(s)
		if perr != nil || n < 0 {
			u.redirect(w, r, "/topics", "error", fmt.Sprintf("The concurrency limit of %s must be a whole number, 0 for unlimited; %q is not.", topic, s), "")
			return
		}
		_, err = svc.SetTopic(ctx, topic, broker.TopicPatch{ConcurrencyLimit: &n})
		msg = fmt.Sprintf("Topic %s: at most %s running at once.", topic, uiFuncs["limit"].(func(int) string)(n))
	case "pause":
		v, ok := setBool("paused")
		if !ok {
			return
		}
		_, err = svc.SetTopic(ctx, topic, broker.TopicPatch{Paused: &v})
		msg = fmt.Sprintf("Topic %s resumed: its queued tasks are claimed again.", topic)
		if v {
			msg = fmt.Sprintf("Topic %s paused: no new claims; running tasks finish.", topic)
		}
	case "dead-letters":
		v, ok := setBool("enabled")
		if !ok {
			return
		}
		_, err = svc.SetTopic(ctx, topic, broker.TopicPatch{DeadLetterEnabled: &v})
		msg = fmt.Sprintf("Topic %s: tasks that fail for good now end failed (no dead letters).", topic)
		if v {
			msg = fmt.Sprintf("Topic %s: tasks that fail for good now become dead letters.", topic)
		}
	case "drain":
		err = svc.Drain(ctx, topic)
		msg = fmt.Sprintf("Topic %s is draining: it takes no new work, and its running tasks finish. Resume it to take work again.", topic)
	case "purge":
		deadLetters := r.PostForm.Get("dead_letters") != ""
		var res broker.PurgeResult
		res, err = svc.Purge(ctx, topic, deadLetters)
		msg = fmt.Sprintf("Topic %s purged: %d queued task(s) deleted", topic, res.Queued)
		if deadLetters {
			msg += fmt.Sprintf(", and %d dead letter(s)", res.DeadLetter)
		}
		msg += ". Running tasks were left alone."
	default:
		u.problem(w, r, http.StatusNotFound, "Not found", fmt.Sprintf("There is no topic action %q.", op))
		return
	}
	u.audit(r, "topic "+op, "topic", topic, "error", err)
	if err != nil {
		u.redirect(w, r, "/topics", "error", uiBrokerProblem(fmt.Sprintf("%s topic %s", op, topic), err), "")
		return
	}
	u.redirect(w, r, "/topics", "ok", msg, "")
}

// ---- template helpers

func uiTimeOf(v any) (time.Time, bool) {
	switch t := v.(type) {
	case time.Time:
		return t, !t.IsZero()
	case *time.Time:
		if t == nil {
			return time.Time{}, false
		}
		return *t, !t.IsZero()
	}
	return time.Time{}, false
}

// uiWhen formats a time (or *time.Time) in UTC; "—" for none.
func uiWhen(v any) string {
	t, ok := uiTimeOf(v)
	if !ok {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05") + " UTC"
}

// uiRel says how long ago (or in how long) a time is; "—" for none.
func uiRel(v any) string {
	t, ok := uiTimeOf(v)
	if !ok {
		return "—"
	}
	d := time.Until(t)
	switch {
	case d > time.Second:
		return "in " + uiDuration(d)
	case d > -time.Second:
		return "just now"
	}
	return uiDuration(-d) + " ago"
}

// uiDuration is a short, rounded duration: 45s, 3m 05s, 2h 03m, 3d 4h.
func uiDuration(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	switch {
	case d < time.Second:
		if d == 0 {
			return "0s"
		}
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return uiUnits(int(d.Minutes()), "m", int(d.Seconds())%60, "s")
	case d < 48*time.Hour:
		return uiUnits(int(d.Hours()), "h", int(d.Minutes())%60, "m")
	}
	return uiUnits(int(d.Hours())/24, "d", int(d.Hours())%24, "h")
}

// uiUnits prints "3m 05s", or "3m" when the second unit is zero.
func uiUnits(a int, au string, b int, bu string) string {
	if b == 0 {
		return fmt.Sprintf("%d%s", a, au)
	}
	return fmt.Sprintf("%d%s %02d%s", a, au, b, bu)
}

// uiPrettyJSON indents JSON for reading; anything else comes back as is.
func uiPrettyJSON(v any) string {
	var raw []byte
	switch b := v.(type) {
	case json.RawMessage:
		raw = b
	case []byte:
		raw = b
	case string:
		raw = []byte(b)
	default:
		return fmt.Sprint(v)
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return ""
	}
	var out bytes.Buffer
	if json.Indent(&out, raw, "", "  ") != nil {
		return string(raw)
	}
	return out.String()
}

// uiClip shortens s to n characters.
func uiClip(n int, s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}
