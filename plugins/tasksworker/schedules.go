package tasksworker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/scheduler"
)

// scheduleBody is a schedule as the API and the config declare it.
type scheduleBody struct {
	Name            string          `json:"name"`
	Task            string          `json:"task"`
	Topic           string          `json:"topic"`
	Payload         json.RawMessage `json:"payload"`
	IntervalSeconds int             `json:"interval_seconds"`
	Cron            string          `json:"cron"`
	Enabled         *bool           `json:"enabled"`
	MissedPolicy    string          `json:"missed_policy"`
}

const scheduleExample = `{"name": "nightly-report", "task": "demo.echo", "payload": {}, "cron": "0 3 * * *", "enabled": true}`

var scheduleName = regexp.MustCompile(fmt.Sprintf(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,%d}$`, broker.MaxScheduleNameLen-1))

// toSchedule checks a declared schedule against the registry and returns
// it, or an error that says which field is wrong and why.
// check makes the checks that need no running worker: name, timing,
// missed policy and payload; it returns the payload to store.
func (b scheduleBody) check() (json.RawMessage, error) {
	if !scheduleName.MatchString(b.Name) {
		return nil, fmt.Errorf("name %q: use letters, digits and . _ : -, starting with a letter or digit, at most %d characters", b.Name, broker.MaxScheduleNameLen)
	}
	if b.Task == "" {
		return nil, fmt.Errorf("task is required")
	}
	if _, err := scheduler.ParseTiming(b.IntervalSeconds, b.Cron); err != nil {
		return nil, err
	}
	switch b.MissedPolicy {
	case "", broker.MissedSkip, broker.MissedFireOnce:
	default:
		return nil, fmt.Errorf("missed_policy %q: use %q or %q", b.MissedPolicy, broker.MissedSkip, broker.MissedFireOnce)
	}
	payload := bytes.TrimSpace(b.Payload)
	if len(payload) == 0 || string(payload) == "null" {
		payload = []byte("{}")
	}
	if !json.Valid(payload) {
		return nil, fmt.Errorf("payload is not valid JSON")
	}
	return payload, nil
}

func (b scheduleBody) toSchedule(rt *runtime, source string) (broker.Schedule, error) {
	if b.Task == "" {
		return broker.Schedule{}, fmt.Errorf("task is required; the tasks are %s", strings.Join(rt.reg.Names(), ", "))
	}
	payload, err := b.check()
	if err != nil {
		return broker.Schedule{}, err
	}
	topic, err := placeTask(context.Background(), rt, b.Task, b.Topic, source == "api")
	if err != nil {
		return broker.Schedule{}, err
	}
	enabled := true
	if b.Enabled != nil {
		enabled = *b.Enabled
	}
	return broker.Schedule{
		Name: b.Name, Task: b.Task, Topic: topic, Payload: payload,
		IntervalSeconds: b.IntervalSeconds, Cron: strings.TrimSpace(b.Cron),
		Enabled: enabled, MissedPolicy: b.MissedPolicy, Source: source,
	}, nil
}

// applyConfigSchedules upserts the schedules the config declares.
func applyConfigSchedules(ctx context.Context, rt *runtime) error {
	for i, b := range rt.cfg.Schedules {
		s, err := b.toSchedule(rt, "config")
		if err != nil {
			return invalid(fmt.Sprintf("schedules[%d]", i), "%v", err)
		}
		if _, err := rt.broker.PutSchedule(ctx, s); err != nil {
			return fmt.Errorf("store schedule %q: %w", s.Name, err)
		}
	}
	return nil
}

func scheduleRoutes(p *Plugin, r chi.Router) {
	r.Get("/schedules", p.withRuntime(listSchedules))
	r.Post("/schedules", p.withRuntime(putSchedule))
	r.Get("/schedules/{name}", p.withRuntime(getSchedule))
	r.Put("/schedules/{name}", p.withRuntime(putSchedule))
	r.Delete("/schedules/{name}", p.withRuntime(deleteSchedule))
	r.Get("/reports", p.withRuntime(listReports))
	r.Get("/reports/{id}", p.withRuntime(getReport))
}

// scheduleView adds what a person wants to see next to the stored row.
func scheduleView(s broker.Schedule) map[string]any {
	v := map[string]any{"schedule": s}
	if tm, err := scheduler.ParseTiming(s.IntervalSeconds, s.Cron); err == nil {
		v["timing"] = tm.String()
		v["period_seconds"] = tm.Period(time.Now()).Seconds()
	}
	if next, ok := scheduler.NextRun(s); ok && s.Enabled {
		v["next_run"] = next
	}
	return v
}

func listSchedules(w http.ResponseWriter, r *http.Request, rt *runtime) {
	list, err := rt.broker.ListSchedules(r.Context())
	if err != nil {
		writeBrokerError(w, "list schedules", err)
		return
	}
	if list == nil {
		list = []broker.Schedule{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"schedules": list})
}

// scheduleParam is the schedule named by the path; false when the name
// cannot be decoded (answered with a 400).
func scheduleParam(w http.ResponseWriter, r *http.Request) (string, bool) {
	name, err := pathParam(r, "name")
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad schedule name in the path: %v", err)
		return "", false
	}
	return name, true
}

func getSchedule(w http.ResponseWriter, r *http.Request, rt *runtime) {
	name, ok := scheduleParam(w, r)
	if !ok {
		return
	}
	s, err := rt.broker.GetSchedule(r.Context(), name)
	if err != nil {
		writeBrokerError(w, "get schedule", err)
		return
	}
	writeJSON(w, http.StatusOK, scheduleView(s))
}

// putSchedule creates (POST) or replaces (PUT /schedules/{name}) one.
func putSchedule(w http.ResponseWriter, r *http.Request, rt *runtime) {
	var b scheduleBody
	if !decodeBody(w, r, int64(rt.cfg.MaxPayloadBytes)+bodySlack, &b, scheduleExample) {
		return
	}
	status := http.StatusCreated
	name, ok := scheduleParam(w, r)
	if !ok {
		return
	}
	if name != "" {
		if b.Name != "" && b.Name != name {
			writeError(w, http.StatusBadRequest, "the body names schedule %q but the URL names %q; a schedule cannot be renamed: delete it and create another", b.Name, name)
			return
		}
		b.Name = name
		if _, err := rt.broker.GetSchedule(r.Context(), name); err != nil {
			writeBrokerError(w, "update schedule", err)
			return
		}
		status = http.StatusOK
	} else if _, err := rt.broker.GetSchedule(r.Context(), b.Name); err == nil {
		writeError(w, http.StatusConflict, "schedule %q exists; change it with PUT /api/schedules/%s", b.Name, b.Name)
		return
	}
	s, err := b.toSchedule(rt, "api")
	if err != nil {
		if errors.Is(err, errWorkersUnreadable) {
			writeError(w, http.StatusServiceUnavailable, "%v", err)
			return
		}
		writeError(w, http.StatusBadRequest, "schedule refused: %v; for example %s", err, scheduleExample)
		return
	}
	stored, err := rt.broker.PutSchedule(r.Context(), s)
	if err != nil {
		writeBrokerError(w, "store schedule", err)
		return
	}
	writeJSON(w, status, scheduleView(stored))
}

func deleteSchedule(w http.ResponseWriter, r *http.Request, rt *runtime) {
	name, ok := scheduleParam(w, r)
	if !ok {
		return
	}
	if err := rt.broker.DeleteSchedule(r.Context(), name); err != nil {
		writeBrokerError(w, "delete schedule", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"deleted": name})
}

var reportStatuses = []string{broker.ReportSuccess, broker.ReportFailed, broker.ReportError, broker.ReportTimeout,
	broker.ReportCancelled, broker.ReportSkipped, broker.ReportLost}

func listReports(w http.ResponseWriter, r *http.Request, rt *runtime) {
	q := r.URL.Query()
	f := broker.ReportFilter{Task: q.Get("task"), Status: q.Get("status"), Schedule: q.Get("schedule"), Limit: broker.DefaultListLimit}
	if f.Status != "" && !contains(reportStatuses, f.Status) {
		writeError(w, http.StatusBadRequest, "unknown status %q; use one of %s", f.Status, strings.Join(reportStatuses, ", "))
		return
	}
	for key, dst := range map[string]*int64{"message_id": &f.MessageID, "before": &f.Before} {
		if s := q.Get(key); s != "" {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil || n <= 0 {
				writeError(w, http.StatusBadRequest, "%s must be a positive whole number, got %q", key, s)
				return
			}
			*dst = n
		}
	}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > broker.MaxListLimit {
			writeError(w, http.StatusBadRequest, "limit must be a whole number from 1 to %d, got %q", broker.MaxListLimit, s)
			return
		}
		f.Limit = n
	}
	list, err := rt.broker.ListReports(r.Context(), f)
	if err != nil {
		writeBrokerError(w, "list reports", err)
		return
	}
	if list == nil {
		list = []broker.Report{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"reports": list})
}

func getReport(w http.ResponseWriter, r *http.Request, rt *runtime) {
	raw := chi.URLParam(r, "id")
	id, ok := parseID(raw)
	if !ok {
		writeError(w, http.StatusBadRequest, "report id must be a positive whole number, got %q", raw)
		return
	}
	rep, err := rt.broker.GetReport(r.Context(), id)
	if err != nil {
		writeBrokerError(w, "get report", err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}
