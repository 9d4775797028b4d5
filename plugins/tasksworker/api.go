package tasksworker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/taskhost/taskhost/broker"
)

// bodySlack is what a request body may hold besides its payload. The
// limits on what a request asks for are the broker's (broker/limits.go).
const bodySlack = 64 << 10

var messageStates = []string{broker.StateQueued, broker.StateRunning, broker.StateDone, broker.StateFailed, broker.StateDead}

func (p *Plugin) routes() chi.Router {
	r := chi.NewRouter()
	r.Use(escapedRouting)
	r.Use(middleware.GetHead) // HEAD answers as GET does, without the body
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such endpoint: %s %s; the API is under /api (tasks, topics, workers, locks, health)", r.Method, r.URL.Path)
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusMethodNotAllowed, "%s is not allowed on %s", r.Method, r.URL.Path)
	})
	r.Route("/api", func(r chi.Router) {
		r.Post("/tasks", p.withRuntime(p.submitTask))
		r.Get("/tasks", p.withRuntime(p.listTasks))
		r.Get("/tasks/{id}", p.withRuntime(p.getTask))
		r.Get("/topics", p.withRuntime(p.listTopics))
		r.Put("/topics/{name}", p.withRuntime(p.setTopic))
		r.Get("/workers", p.withRuntime(p.listWorkers))
		r.Get("/locks", p.withRuntime(p.listLocks))
		r.Get("/health", p.withRuntime(p.health))
		scheduleRoutes(p, r)
	})
	r.Route("/ui", func(r chi.Router) { uiRoutes(p, r) })
	return r
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

// errWorkersUnreadable: the broker's list of workers could not be read, so
// whether another worker runs a task is not known (a passing failure).
var errWorkersUnreadable = errors.New("the broker's worker list cannot be read")

// placeTask returns the topic a message or schedule of task goes to
// (topic, or the task's own when empty) once it checked the topic's name
// and that a worker runs the task there: this one, or with api (a
// client's request) another live worker, hosts sharing a broker need not
// run the same plugins or claim the same topics; the config's schedules
// are checked against this worker alone, since other hosts may not be up
// yet. The error says what is wrong; errWorkersUnreadable when it cannot
// be told.
func placeTask(ctx context.Context, rt *runtime, task, topic string, api bool) (string, error) {
	t, local := rt.reg.Lookup(task)
	if topic == "" {
		if !local {
			return "", fmt.Errorf("unknown task %q: it is not registered here (the tasks are %s); if a worker on another host runs it, name its topic in the request",
				task, strings.Join(rt.reg.Names(), ", "))
		}
		topic = t.Topic
	}
	check := broker.ValidateTopicName
	if api {
		check = func(topic string) error { return checkTopic(ctx, rt, topic) }
	}
	if err := check(topic); err != nil {
		return "", fmt.Errorf("bad topic: %w", err)
	}
	served := rt.pool.Topics()
	if local && contains(served, topic) {
		return topic, nil
	}
	if api {
		elsewhere, err := rt.pool.RunsElsewhere(task, topic)
		if err != nil {
			return "", fmt.Errorf("cannot tell whether a worker elsewhere runs task %q on topic %q: %w: %v; retry shortly", task, topic, errWorkersUnreadable, err)
		}
		if elsewhere {
			return topic, nil
		}
	}
	if !local {
		return "", fmt.Errorf("unknown task %q: it is not registered here, and no live worker runs it on topic %q; the tasks here are %s",
			task, topic, strings.Join(rt.reg.Names(), ", "))
	}
	return "", fmt.Errorf("topic %q is not served by this worker (it claims from %s), nor by another live worker that runs %s: omit topic to use the task's own (%s), or add the topic under topics in the plugin config",
		topic, strings.Join(served, ", "), task, t.Topic)
}

// checkTopic checks a topic a client names: strictly
// (broker.ValidateNewTopicName) unless the topic exists already, so that
// a name an earlier version stored can still be used and managed.
func checkTopic(ctx context.Context, rt *runtime, topic string) error {
	err := broker.ValidateNewTopicName(topic)
	if err == nil || broker.ValidateTopicName(topic) != nil {
		return err
	}
	if topics, lerr := rt.broker.Topics(ctx); lerr == nil {
		for _, t := range topics {
			if t.Name == topic {
				return nil
			}
		}
	}
	return err
}

// parseID reads a task or report id: a positive whole number written
// plainly (not "+1" or "01", which name the same id another way).
func parseID(raw string) (int64, bool) {
	id, err := strconv.ParseInt(raw, 10, 64)
	return id, err == nil && id > 0 && strconv.FormatInt(id, 10) == raw
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

// decodeBody decodes one JSON object strictly into v: unknown fields,
// trailing data and an over-long body are errors with a message for a
// person. example shows a good body.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, v any, example string) bool {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err == nil {
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		err = dec.Decode(v)
		if err == nil && dec.Decode(&struct{}{}) != io.EOF {
			writeError(w, http.StatusBadRequest, "the request body holds more than one JSON value; send one object, such as %s", example)
			return false
		}
	}
	if err == nil {
		dup, unknown := checkKeys(data, jsonNames(v))
		switch {
		case dup != "":
			writeError(w, http.StatusBadRequest, "key %q appears twice in the request body; each key of an object must be unique", dup)
			return false
		case unknown != "":
			writeError(w, http.StatusBadRequest, "unknown field %q in the request body (keys are case-sensitive); the fields are those of %s", unknown, example)
			return false
		}
		return true
	}
	var tooBig *http.MaxBytesError
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &tooBig):
		writeError(w, http.StatusBadRequest, "the request body is over %d bytes; send a smaller payload", tooBig.Limit)
	case errors.Is(err, io.EOF):
		writeError(w, http.StatusBadRequest, "the request body is empty; send a JSON object, such as %s", example)
	case errors.As(err, &syntax), errors.Is(err, io.ErrUnexpectedEOF):
		writeError(w, http.StatusBadRequest, "the request body is not valid JSON (%v); send an object, such as %s", err, example)
	case errors.As(err, &typ):
		if typ.Field == "" {
			writeError(w, http.StatusBadRequest, "the request body must be a JSON object, such as %s", example)
		} else {
			writeError(w, http.StatusBadRequest, "field %q must be a JSON %s, got %s", typ.Field, jsonKind(typ.Type.Kind().String()), typ.Value)
		}
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		writeError(w, http.StatusBadRequest, "%s in the request body; the fields are those of %s", strings.TrimPrefix(err.Error(), "json: "), example)
	default:
		writeError(w, http.StatusBadRequest, "bad request body: %v; send an object, such as %s", err, example)
	}
	return false
}

func jsonKind(goKind string) string {
	switch {
	case strings.HasPrefix(goKind, "int"), strings.HasPrefix(goKind, "uint"):
		return "whole number (within range)"
	case strings.HasPrefix(goKind, "float"):
		return "number"
	case goKind == "bool":
		return "boolean"
	case goKind == "ptr":
		return "value of another type"
	}
	return goKind
}

type submitRequest struct {
	Task         string          `json:"task"`
	Topic        string          `json:"topic"`
	Payload      json.RawMessage `json:"payload"`
	DelaySeconds float64         `json:"delay_seconds"`
	MaxAttempts  int             `json:"max_attempts"`
}

const submitExample = `{"task": "demo.echo", "topic": "default", "payload": {}, "delay_seconds": 0, "max_attempts": 0}`

func (p *Plugin) submitTask(w http.ResponseWriter, r *http.Request, rt *runtime) {
	var req submitRequest
	if !decodeBody(w, r, int64(rt.cfg.MaxPayloadBytes)+bodySlack, &req, submitExample) {
		return
	}
	if req.Task == "" {
		writeError(w, http.StatusBadRequest, "task is required: name one of the registered tasks (%s)", strings.Join(rt.reg.Names(), ", "))
		return
	}
	topic, err := placeTask(r.Context(), rt, req.Task, req.Topic, true)
	if err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, errWorkersUnreadable) {
			status = http.StatusServiceUnavailable
		}
		writeError(w, status, "%v", err)
		return
	}
	task, _ := rt.reg.Lookup(req.Task) // zero for a task only another worker runs
	payload := bytes.TrimSpace(req.Payload)
	if len(payload) == 0 || string(payload) == "null" {
		payload = []byte("{}")
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, payload); err == nil {
		payload = compact.Bytes()
	}
	if len(payload) > rt.cfg.MaxPayloadBytes {
		writeError(w, http.StatusBadRequest, "payload is %d bytes, the limit is %d (max_payload_bytes); send less, or store the data elsewhere and pass a reference", len(payload), rt.cfg.MaxPayloadBytes)
		return
	}
	if req.DelaySeconds < 0 || req.DelaySeconds > broker.MaxDelay.Seconds() {
		writeError(w, http.StatusBadRequest, "delay_seconds must be from 0 to %.0f, got %v", broker.MaxDelay.Seconds(), req.DelaySeconds)
		return
	}
	if req.MaxAttempts < 0 || req.MaxAttempts > broker.MaxAttempts {
		writeError(w, http.StatusBadRequest, "max_attempts must be from 0 (the task's default, %d) to %d, got %d", task.MaxAttempts, broker.MaxAttempts, req.MaxAttempts)
		return
	}
	maxAttempts := req.MaxAttempts
	if maxAttempts == 0 {
		maxAttempts = task.MaxAttempts
	}
	id, err := rt.broker.Submit(r.Context(), broker.SubmitRequest{
		Topic:       topic,
		Task:        req.Task,
		Payload:     payload,
		Delay:       time.Duration(req.DelaySeconds * float64(time.Second)),
		MaxAttempts: maxAttempts,
	})
	if err != nil {
		writeBrokerError(w, "submit", err)
		return
	}
	p.metrics.Submitted(topic)
	rt.pool.Wake()
	writeJSON(w, http.StatusCreated, map[string]string{"id": strconv.FormatInt(id, 10)})
}

// taskView is a message as the API shows it.
type taskView struct {
	ID          string          `json:"id"`
	Task        string          `json:"task"`
	Topic       string          `json:"topic"`
	State       string          `json:"state"`
	Attempts    int             `json:"attempts"`
	MaxAttempts int             `json:"max_attempts"`
	CreatedAt   time.Time       `json:"created_at"`
	ClaimedBy   *string         `json:"claimed_by"`
	ClaimedAt   *time.Time      `json:"claimed_at"`
	FinishedAt  *time.Time      `json:"finished_at"`
	Result      json.RawMessage `json:"result"`
	Error       *string         `json:"error"`
}

func viewOf(m broker.Message, rt *runtime) taskView {
	v := taskView{
		ID: strconv.FormatInt(m.ID, 10), Task: m.Task, Topic: m.Topic, State: m.State,
		Attempts: m.Attempts, MaxAttempts: m.MaxAttempts, CreatedAt: m.CreatedAt,
		ClaimedAt: m.ClaimedAt, FinishedAt: m.FinishedAt, Result: m.Result,
	}
	if v.MaxAttempts == 0 {
		if t, ok := rt.reg.Lookup(m.Task); ok {
			v.MaxAttempts = t.MaxAttempts
		}
	}
	if m.ClaimedBy != "" {
		v.ClaimedBy = &m.ClaimedBy
	}
	if m.LastError != "" {
		v.Error = &m.LastError
	}
	return v
}

func (p *Plugin) getTask(w http.ResponseWriter, r *http.Request, rt *runtime) {
	raw := chi.URLParam(r, "id")
	id, ok := parseID(raw)
	if !ok {
		writeError(w, http.StatusBadRequest, "task id must be a positive whole number, got %q", raw)
		return
	}
	m, err := rt.broker.GetMessage(r.Context(), id)
	if errors.Is(err, broker.ErrNotFound) {
		writeError(w, http.StatusNotFound, "no task with id %d: it never existed, or it finished long ago and was dropped", id)
		return
	}
	if err != nil {
		writeBrokerError(w, "get task", err)
		return
	}
	writeJSON(w, http.StatusOK, viewOf(m, rt))
}

func (p *Plugin) listTasks(w http.ResponseWriter, r *http.Request, rt *runtime) {
	q := r.URL.Query()
	f := broker.MessageFilter{State: q.Get("state"), Topic: q.Get("topic"), Task: q.Get("task"), Limit: broker.DefaultListLimit}
	if f.State != "" && !contains(messageStates, f.State) {
		writeError(w, http.StatusBadRequest, "unknown state %q; use one of %s", f.State, strings.Join(messageStates, ", "))
		return
	}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > broker.MaxListLimit {
			writeError(w, http.StatusBadRequest, "limit must be a whole number from 1 to %d, got %q", broker.MaxListLimit, s)
			return
		}
		f.Limit = n
	}
	if s := q.Get("before"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 {
			writeError(w, http.StatusBadRequest, "before must be a task id (a positive whole number, from next_before), got %q", s)
			return
		}
		f.Before = n
	}
	msgs, err := rt.broker.ListMessages(r.Context(), f)
	if err != nil {
		writeBrokerError(w, "list tasks", err)
		return
	}
	views := make([]taskView, 0, len(msgs))
	for _, m := range msgs {
		views = append(views, viewOf(m, rt))
	}
	var next *string
	if len(msgs) == f.Limit && len(msgs) > 0 {
		s := strconv.FormatInt(msgs[len(msgs)-1].ID, 10)
		next = &s
	}
	writeJSON(w, http.StatusOK, map[string]any{"tasks": views, "next_before": next})
}

type topicView struct {
	Name               string  `json:"name"`
	Queued             int     `json:"queued"`
	Running            int     `json:"running"`
	DeadLetter         int     `json:"dead_letter"`
	Subscribers        int     `json:"subscribers"`
	ConcurrencyLimit   int     `json:"concurrency_limit"`
	DeadLetterEnabled  bool    `json:"dead_letter_enabled"`
	Paused             bool    `json:"paused"`
	OldestClaimSeconds float64 `json:"oldest_claim_seconds"`
}

func (p *Plugin) listTopics(w http.ResponseWriter, r *http.Request, rt *runtime) {
	st, err := rt.broker.Stats(r.Context())
	if err != nil {
		writeBrokerError(w, "list topics", err)
		return
	}
	out := make([]topicView, 0, len(st.Topics))
	for _, t := range st.Topics {
		out = append(out, topicView{
			Name: t.Name, Queued: t.Queued, Running: t.Running, DeadLetter: t.DeadLetter, Subscribers: t.Subscribers,
			ConcurrencyLimit: t.ConcurrencyLimit, DeadLetterEnabled: t.DeadLetterEnabled, Paused: t.Paused,
			OldestClaimSeconds: t.OldestClaimAge.Seconds(),
		})
	}
	writeJSON(w, http.StatusOK, map[string]any{"topics": out})
}

type topicPatchRequest struct {
	ConcurrencyLimit  *int  `json:"concurrency_limit"`
	Paused            *bool `json:"paused"`
	DeadLetterEnabled *bool `json:"dead_letter_enabled"`
}

const topicExample = `{"concurrency_limit": 2, "paused": false, "dead_letter_enabled": true}`

func (p *Plugin) setTopic(w http.ResponseWriter, r *http.Request, rt *runtime) {
	name, err := pathParam(r, "name")
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad topic name in the path: %v", err)
		return
	}
	if err := checkTopic(r.Context(), rt, name); err != nil {
		writeError(w, http.StatusBadRequest, "bad topic name: %v", err)
		return
	}
	var req topicPatchRequest
	if r.ContentLength != 0 {
		if !decodeBody(w, r, bodySlack, &req, topicExample) {
			return
		}
	}
	if req.ConcurrencyLimit != nil && *req.ConcurrencyLimit < 0 {
		writeError(w, http.StatusBadRequest, "concurrency_limit must be 0 (unlimited) or more, got %d", *req.ConcurrencyLimit)
		return
	}
	cfg, err := rt.broker.SetTopic(r.Context(), name, broker.TopicPatch{
		ConcurrencyLimit: req.ConcurrencyLimit, Paused: req.Paused, DeadLetterEnabled: req.DeadLetterEnabled,
	})
	if err != nil {
		writeBrokerError(w, "set topic", err)
		return
	}
	rt.pool.Wake() // an unpaused or widened topic may have work
	writeJSON(w, http.StatusOK, cfg)
}

// workerView is a worker as GET workers shows it.
type workerView struct {
	broker.WorkerInfo
	// Live: its heartbeat is fresher than orphan_reclaim_after_seconds,
	// the broker's LiveAfter, as in its counts (the workers of GET health,
	// the broker gauges). A worker that is not stays listed until its row
	// is purged (postgres_worker_ttl_seconds); the reaper takes its
	// messages.
	Live bool `json:"live"`
}

func (p *Plugin) listWorkers(w http.ResponseWriter, r *http.Request, rt *runtime) {
	ws, err := rt.broker.Workers(r.Context())
	if err != nil {
		writeBrokerError(w, "list workers", err)
		return
	}
	var live []string
	rec, byClock := rt.broker.(broker.OrphanReclaimer)
	if byClock {
		// By the broker's clock, as its counts are.
		if live, err = rec.LiveWorkers(r.Context(), rt.cfg.Reaper.After); err != nil {
			writeBrokerError(w, "list live workers", err)
			return
		}
	}
	out := make([]workerView, len(ws))
	for i, wi := range ws {
		out[i] = workerView{WorkerInfo: wi, Live: !byClock || slices.Contains(live, wi.ID)}
	}
	writeJSON(w, http.StatusOK, map[string]any{"workers": out})
}

func (p *Plugin) listLocks(w http.ResponseWriter, r *http.Request, rt *runtime) {
	locks, err := rt.broker.Locks(r.Context())
	if err != nil {
		writeBrokerError(w, "list locks", err)
		return
	}
	if locks == nil {
		locks = []broker.Lock{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"locks": locks})
}

func (p *Plugin) health(w http.ResponseWriter, r *http.Request, rt *runtime) {
	st, err := rt.broker.Stats(r.Context())
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{
			"status": "error", "broker": rt.broker.Kind(),
			"error": fmt.Sprintf("the %s broker does not answer: %v; check the database, the plugin retries on its own", rt.broker.Kind(), err),
		})
		return
	}
	beatAt, beatErr := rt.pool.LastHeartbeat()
	out := map[string]any{
		"status":       "ok",
		"broker":       rt.broker.Kind(),
		"worker_id":    rt.pool.WorkerID(),
		"workers":      st.Workers,
		"running":      rt.pool.Running(),
		"concurrency":  rt.pool.Concurrency(),
		"topics":       rt.pool.Topics(),
		"beat":         beatState(rt),
		"heartbeat_at": beatAt,
	}
	if beatErr != nil {
		// The broker answers reads and refuses this worker's writes.
		out["status"] = "degraded"
		out["error"] = fmt.Sprintf("the %s broker refuses this worker's heartbeat: %v; outcomes may not be stored", rt.broker.Kind(), beatErr)
	}
	writeJSON(w, http.StatusOK, out)
}

// beatState says whether this process leads the beat, and at which term.
func beatState(rt *runtime) map[string]any {
	if rt.leader == nil {
		return map[string]any{"candidate": false, "leader": false}
	}
	f, ok := rt.leader.Fence()
	return map[string]any{"candidate": true, "leader": ok, "term": f.Term}
}
