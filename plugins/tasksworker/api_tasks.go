package tasksworker

// The API's task endpoints: POST /api/tasks (submit), GET /api/tasks (a
// filtered page) and GET /api/tasks/{id}. POST /api/tasks/batch is in
// api_batch.go.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/plugins/tasksworker/service"
)

type submitRequest struct {
	Task         string          `json:"task"`
	Topic        string          `json:"topic"`
	Payload      json.RawMessage `json:"payload"`
	DelaySeconds float64         `json:"delay_seconds"`
	MaxAttempts  int             `json:"max_attempts"`
	// RunAt is an RFC 3339 time (exclusive with delay_seconds).
	RunAt            *string  `json:"run_at"`
	Priority         int      `json:"priority"`
	UniqueKey        *string  `json:"unique_key"`
	UniqueForSeconds float64  `json:"unique_for_seconds"`
	UniqueStates     []string `json:"unique_states"`
}

// service is the request as the service takes it; a run_at that is not an
// RFC 3339 time is refused.
func (req submitRequest) service() (service.SubmitRequest, error) {
	out := service.SubmitRequest{
		Task: req.Task, Topic: req.Topic, Payload: req.Payload, DelaySeconds: req.DelaySeconds, MaxAttempts: req.MaxAttempts,
		Priority: req.Priority, UniqueForSeconds: req.UniqueForSeconds, UniqueStates: req.UniqueStates,
	}
	if req.UniqueKey != nil {
		out.UniqueKey, out.UniqueKeySet = *req.UniqueKey, true
	}
	if req.RunAt != nil {
		at, err := time.Parse(time.RFC3339Nano, *req.RunAt)
		if err != nil {
			return out, fmt.Errorf("run_at %q is not an RFC 3339 time such as \"2026-12-24T18:00:00Z\" or \"2026-12-24T19:00:00+01:00\"", *req.RunAt)
		}
		if at.IsZero() {
			return out, fmt.Errorf("run_at %q is the zero time", *req.RunAt)
		}
		out.RunAt = at
	}
	return out, nil
}

const submitExample = `{"task": "demo.echo", "topic": "default", "payload": {}, "delay_seconds": 0, "max_attempts": 0}`

func submitTask(w http.ResponseWriter, r *http.Request, rt *runtime) {
	var req submitRequest
	if !decodeBody(w, r, int64(rt.cfg.MaxPayloadBytes)+service.BodySlack, &req, submitExample) {
		return
	}
	sreq, err := req.service()
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	id, _, err := rt.svc.Submit(r.Context(), sreq)
	if holder, dup := broker.DuplicateOf(err); dup {
		writeJSON(w, http.StatusOK, map[string]any{"id": strconv.FormatInt(holder, 10), "duplicate": true})
		return
	}
	if err != nil {
		writeSubmitError(w, "submit", err)
		return
	}
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
	// CancelRequestedAt: a cancel of the running task was requested then.
	CancelRequestedAt *time.Time `json:"cancel_requested_at,omitempty"`
	// Priority: higher runs first. AvailableAt: when the task may run
	// (after delay_seconds, at run_at, or after a retry's delay).
	Priority    int       `json:"priority"`
	UniqueKey   string    `json:"unique_key,omitempty"`
	AvailableAt time.Time `json:"available_at"`
	// ParentTaskID is the task whose attempt submitted this one (from a
	// plugin's task, capability.Submit); SubmittedBy says which plugin
	// did ("plugin:<name>").
	ParentTaskID string `json:"parent_task_id,omitempty"`
	SubmittedBy  string `json:"submitted_by,omitempty"`
}

func viewOf(m broker.Message, svc *service.Service) taskView {
	v := taskView{
		ID: strconv.FormatInt(m.ID, 10), Task: m.Task, Topic: m.Topic, State: m.State,
		Attempts: m.Attempts, MaxAttempts: svc.MaxAttempts(m), CreatedAt: m.CreatedAt,
		ClaimedAt: m.ClaimedAt, FinishedAt: m.FinishedAt, Result: m.Result,
		CancelRequestedAt: m.CancelRequestedAt,
		Priority:          m.Priority, UniqueKey: m.UniqueKey, AvailableAt: m.AvailableAt,
		ParentTaskID: m.Headers[broker.ParentHeader], SubmittedBy: m.Headers[broker.SubmitterHeader],
	}
	if m.ClaimedBy != "" {
		v.ClaimedBy = &m.ClaimedBy
	}
	if m.LastError != "" {
		v.Error = &m.LastError
	}
	return v
}

func getTask(w http.ResponseWriter, r *http.Request, rt *runtime) {
	raw := chi.URLParam(r, "id")
	id, ok := service.ParseID(raw)
	if !ok {
		writeError(w, http.StatusBadRequest, "task id must be a positive whole number, got %q", raw)
		return
	}
	m, err := rt.svc.Message(r.Context(), id)
	if errors.Is(err, broker.ErrNotFound) {
		writeError(w, http.StatusNotFound, "no task with id %d: it never existed, or it finished long ago and was dropped", id)
		return
	}
	if err != nil {
		writeBrokerError(w, "get task", err)
		return
	}
	writeJSON(w, http.StatusOK, viewOf(m, rt.svc))
}

func listTasks(w http.ResponseWriter, r *http.Request, rt *runtime) {
	q := r.URL.Query()
	f := broker.MessageFilter{State: q.Get("state"), Topic: q.Get("topic"), Task: q.Get("task"), Limit: broker.DefaultListLimit}
	if f.State != "" && !slices.Contains(service.MessageStates, f.State) {
		writeError(w, http.StatusBadRequest, "unknown state %q; use one of %s", f.State, strings.Join(service.MessageStates, ", "))
		return
	}
	if !queryLimit(w, q, &f.Limit) {
		return
	}
	if s := q.Get("before"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 {
			writeError(w, http.StatusBadRequest, "before must be a task id (a positive whole number, from next_before), got %q", s)
			return
		}
		f.Before = n
	}
	msgs, err := rt.svc.Messages(r.Context(), f)
	if err != nil {
		writeBrokerError(w, "list tasks", err)
		return
	}
	views := make([]taskView, 0, len(msgs))
	for _, m := range msgs {
		views = append(views, viewOf(m, rt.svc))
	}
	var next *string
	if len(msgs) == f.Limit && len(msgs) > 0 {
		s := strconv.FormatInt(msgs[len(msgs)-1].ID, 10)
		next = &s
	}
	writeJSON(w, http.StatusOK, map[string]any{"tasks": views, "next_before": next})
}

// queryLimit reads a list's limit parameter into dst (kept when absent);
// a bad one is answered 400, and false returned.
func queryLimit(w http.ResponseWriter, q url.Values, dst *int) bool {
	s := q.Get("limit")
	if s == "" {
		return true
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > broker.MaxListLimit {
		writeError(w, http.StatusBadRequest, "limit must be a whole number from 1 to %d, got %q", broker.MaxListLimit, s)
		return false
	}
	*dst = n
	return true
}
