package tasksworker

// The JSON API's plumbing: the router (the API under /api, the UI under
// /ui), path parameters, the not-running answer, and the one mapping of
// the service's and the broker's errors to HTTP statuses. The handlers
// are in api_*.go; they decode a request, call the service and encode
// its answer.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/plugins/tasksworker/service"
	"github.com/taskhost/taskhost/plugins/tasksworker/ui"
)

func (p *Plugin) routes() chi.Router {
	r := chi.NewRouter()
	r.Use(escapedRouting)
	r.Use(middleware.GetHead) // HEAD answers as GET does, without the body
	// sections names the API's first path segments, from its routes.
	var sections string
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such endpoint: %s %s; the API is under /api (%s)", r.Method, r.URL.Path, sections)
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusMethodNotAllowed, "%s is not allowed on %s", r.Method, r.URL.Path)
	})
	api := r.Route("/api", func(r chi.Router) {
		r.Post("/tasks", p.withRuntime(submitTask))
		r.Post("/tasks/batch", p.withRuntime(p.submitBatch))
		r.Get("/tasks", p.withRuntime(listTasks))
		r.Get("/tasks/{id}", p.withRuntime(getTask))
		r.Post("/tasks/{id}/cancel", p.withRuntime(cancelTask))
		r.Post("/tasks/cancel", p.withRuntime(cancelQueued))
		r.Get("/topics", p.withRuntime(listTopics))
		r.Put("/topics/{name}", p.withRuntime(setTopic))
		r.Get("/workers", p.withRuntime(listWorkers))
		r.Get("/locks", p.withRuntime(listLocks))
		r.Get("/health", p.withRuntime(health))
		r.Get("/schedules", p.withRuntime(listSchedules))
		r.Post("/schedules", p.withRuntime(putSchedule))
		r.Get("/schedules/{name}", p.withRuntime(getSchedule))
		r.Put("/schedules/{name}", p.withRuntime(putSchedule))
		r.Delete("/schedules/{name}", p.withRuntime(deleteSchedule))
		r.Get("/reports", p.withRuntime(listReports))
		r.Get("/reports/{id}", p.withRuntime(getReport))
	})
	sections = apiSections(api)
	u := ui.New(ui.Options{
		Current: func() *service.Service {
			if rt := p.current(); rt != nil {
				return rt.svc
			}
			return nil
		},
		Throughput: func() (done, failed float64) {
			return counterValue(p.metrics.completed), counterValue(p.metrics.failed)
		},
		Logger: p.log,
	})
	r.Route("/ui", u.Routes)
	return r
}

// apiSections lists the first path segments of api's routes ("health,
// locks, ..., workers"), for the 404 answer to name them all.
func apiSections(api chi.Routes) string {
	var names []string
	_ = chi.Walk(api, func(_, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		seg, _, _ := strings.Cut(strings.TrimPrefix(route, "/"), "/")
		if seg != "" && !slices.Contains(names, seg) {
			names = append(names, seg)
		}
		return nil
	})
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// escapedRouting makes the router match the path as the client escaped
// it, whatever Go's URL parser kept (it drops RawPath when the default
// escaping gives the same text), so every path parameter comes escaped
// and pathParam decodes it exactly once: a topic named "50%off" arrives
// as 50%25off and a name holding a slash as a%2Fb.
func escapedRouting(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.URL.RawPath = r.URL.EscapedPath()
		next.ServeHTTP(w, r)
	})
}

// pathParam is the path parameter key, decoded (see escapedRouting).
func pathParam(r *http.Request, key string) (string, error) {
	return url.PathUnescape(chi.URLParam(r, key))
}

type runtimeHandler func(w http.ResponseWriter, r *http.Request, rt *runtime)

// withRuntime answers 503 while the plugin is not running.
func (p *Plugin) withRuntime(h runtimeHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		rt := p.current()
		if rt == nil {
			writeError(w, http.StatusServiceUnavailable, "tasks_worker is not running (not configured yet, restarting or stopped); retry in a few seconds")
			return
		}
		h(w, r, rt)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, format string, args ...any) {
	writeJSON(w, status, map[string]string{"error": fmt.Sprintf(format, args...)})
}

// problemStatus is the status of a refusal of the service.
func problemStatus(p *service.Problem) int {
	switch {
	case errors.Is(p, service.ErrConflict):
		return http.StatusConflict
	case errors.Is(p, service.ErrUnavailable):
		return http.StatusServiceUnavailable
	}
	return http.StatusBadRequest
}

// outcomeHeader says, with "unknown", that a write failed in a way that
// leaves it unknown whether it was done: the name and value the host uses
// for a plugin that stopped while it handled a write, which the Go client
// reads as client.ErrOutcomeUnknown and never retries.
const outcomeHeader = "X-Taskhost-Outcome"

// writeSubmitError answers a submit that failed: as writeServiceError,
// except a submit whose store lost the answer of its write
// (broker.ErrOutcomeUnknown), which may be stored: a 502 saying the outcome
// is unknown. A 503 would tell the client to send it again, and a task
// stored but not confirmed would be stored twice.
func writeSubmitError(w http.ResponseWriter, what string, err error) {
	if errors.Is(err, broker.ErrOutcomeUnknown) {
		w.Header().Set(outcomeHeader, "unknown")
		writeError(w, http.StatusBadGateway, "%s: %v; it may have been stored: look it up before sending it again, or give each task a unique_key, which makes sending it again safe", what, err)
		return
	}
	writeServiceError(w, what, err)
}

// writeServiceError answers an error of the service: its own refusal
// with its message, a broker's failure as writeBrokerError does.
func writeServiceError(w http.ResponseWriter, what string, err error) {
	if p, ok := service.IsProblem(err); ok {
		writeError(w, problemStatus(p), "%s", p.Msg)
		return
	}
	writeBrokerError(w, what, err)
}

// writeBrokerError maps a broker error to a status and a message.
func writeBrokerError(w http.ResponseWriter, what string, err error) {
	switch {
	case errors.Is(err, broker.ErrInvalid):
		writeError(w, http.StatusBadRequest, "%s: %v", what, err)
	case errors.Is(err, broker.ErrNotFound):
		writeError(w, http.StatusNotFound, "%s: %v", what, err)
	case errors.Is(err, broker.ErrClosed):
		writeError(w, http.StatusServiceUnavailable, "%s: the broker is closed (the plugin is stopping or restarting); retry in a few seconds", what)
	default:
		writeError(w, http.StatusServiceUnavailable, "%s: the broker failed: %v; retry later, and check the broker's health if it persists", what, err)
	}
}
