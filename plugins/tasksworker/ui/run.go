package ui

// The "Run a task" page (/ui/run): its form submits through the service
// exactly as POST /api/tasks does.

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/plugins/tasksworker/service"
)

type runFields struct {
	Task, Topic, Payload, Delay, MaxAttempts string
	RunAt, Priority, UniqueKey               string
}

type runView struct {
	Tasks  []service.TaskInfo
	Topics []string
	Form   runFields
}

func (u *UI) runPage(w http.ResponseWriter, r *http.Request, svc *service.Service, status int, f runFields, fl *flash) {
	d := runView{Tasks: svc.Tasks(), Topics: svc.Served(), Form: f}
	u.render(w, r, svc, status, "run", &page{Title: "Run a task", Flash: fl, D: d})
}

func (u *UI) runForm(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	q := r.URL.Query()
	f := runFields{Task: q.Get("task"), Payload: "{}"}
	if from := q.Get("from"); from != "" {
		// "Run again": start from a stored message.
		if id, err := strconv.ParseInt(from, 10, 64); err == nil && id > 0 {
			if m, err := svc.Message(r.Context(), id); err == nil {
				f.Task, f.Topic, f.Payload = m.Task, m.Topic, prettyJSON(m.Payload)
			}
		}
	}
	u.runPage(w, r, svc, http.StatusOK, f, nil)
}

func (u *UI) run(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	pf := r.PostForm
	f := runFields{Task: pf.Get("task"), Topic: strings.TrimSpace(pf.Get("topic")), Payload: pf.Get("payload"),
		Delay: strings.TrimSpace(pf.Get("delay_seconds")), MaxAttempts: strings.TrimSpace(pf.Get("max_attempts")),
		RunAt: strings.TrimSpace(pf.Get("run_at")), Priority: strings.TrimSpace(pf.Get("priority")), UniqueKey: pf.Get("unique_key")}
	fail := func(status int, msg string) {
		u.runPage(w, r, svc, status, f, &flash{Kind: "error", Message: msg})
	}
	payload := strings.TrimSpace(f.Payload)
	if payload == "" {
		payload = "{}"
	}
	if msg := jsonProblem("payload", payload); msg != "" {
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
	if f.RunAt != "" {
		at, err := time.Parse(time.RFC3339Nano, f.RunAt)
		if err != nil {
			fail(http.StatusBadRequest, fmt.Sprintf("Run at must be an RFC 3339 time, such as 2026-12-24T18:00:00Z; %q is not.", f.RunAt))
			return
		}
		req.RunAt = at
	}
	if f.Priority != "" {
		n, err := strconv.Atoi(f.Priority)
		if err != nil {
			fail(http.StatusBadRequest, fmt.Sprintf("The priority must be a whole number from -100 to 100; %q is not.", f.Priority))
			return
		}
		req.Priority = n
	}
	if f.UniqueKey != "" {
		req.UniqueKey, req.UniqueKeySet = f.UniqueKey, true
	}
	// The service checks and submits, so the UI accepts exactly what
	// POST /api/tasks accepts, and counts it the same way.
	id, _, err := svc.Submit(r.Context(), req)
	if holder, dup := broker.DuplicateOf(err); dup {
		u.redirect(w, r, fmt.Sprintf("/tasks/%d", holder), "ok", fmt.Sprintf("Nothing submitted: task %d holds the unique key %q.", holder, f.UniqueKey), "")
		return
	}
	if err != nil {
		status, msg := failure("submit the task", err)
		if _, ok := service.IsProblem(err); ok {
			msg = "The task was not submitted: " + strings.TrimSuffix(msg, ".") + "."
		}
		fail(status, msg)
		return
	}
	u.audit(r, "run task", "task", f.Task, "topic", f.Topic, "message_id", strconv.FormatInt(id, 10))
	u.redirect(w, r, fmt.Sprintf("/tasks/%d", id), "ok", fmt.Sprintf("Task %d submitted (%s).", id, f.Task), "")
}
