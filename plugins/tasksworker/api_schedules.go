package tasksworker

// The API's schedule and report endpoints: /api/schedules and
// /api/reports.

import (
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/plugins/tasksworker/service"
	"github.com/taskhost/taskhost/scheduler/timing"
)

// scheduleView adds what a person wants to see next to the stored row,
// which carries its waiting status (service.ScheduleStatus).
func scheduleView(svc *service.Service, s broker.Schedule) map[string]any {
	v := map[string]any{"schedule": svc.StatusOf(s)}
	if tm, err := timing.Parse(s.IntervalSeconds, s.Cron); err == nil {
		v["timing"] = tm.String()
		v["period_seconds"] = tm.Period(time.Now()).Seconds()
	}
	if next := nextRun(s); next != nil {
		v["next_run"] = *next
	}
	return v
}

// nextRun is the next slot the beat fires s, also before its first; nil
// when it is disabled (or its timing does not parse).
func nextRun(s broker.Schedule) *time.Time {
	if next, ok := timing.NextRun(s); ok && s.Enabled {
		return &next
	}
	return nil
}

// scheduleListItem is a schedule as GET schedules lists it: the stored
// row with its waiting status, and next_run as GET schedules/{name}
// shows it.
type scheduleListItem struct {
	service.ScheduleStatus
	NextRun *time.Time `json:"next_run,omitempty"`
}

func listSchedules(w http.ResponseWriter, r *http.Request, rt *runtime) {
	list, err := rt.svc.Schedules(r.Context())
	if err != nil {
		writeBrokerError(w, "list schedules", err)
		return
	}
	out := make([]scheduleListItem, 0, len(list))
	for _, s := range list {
		out = append(out, scheduleListItem{ScheduleStatus: rt.svc.StatusOf(s), NextRun: nextRun(s)})
	}
	writeJSON(w, http.StatusOK, map[string]any{"schedules": out})
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
	s, err := rt.svc.Schedule(r.Context(), name)
	if err != nil {
		writeBrokerError(w, "get schedule", err)
		return
	}
	writeJSON(w, http.StatusOK, scheduleView(rt.svc, s))
}

// putSchedule creates (POST) or replaces (PUT /schedules/{name}) one.
func putSchedule(w http.ResponseWriter, r *http.Request, rt *runtime) {
	var b service.ScheduleSpec
	if !decodeBody(w, r, int64(rt.cfg.MaxPayloadBytes)+service.BodySlack, &b, service.ScheduleExample) {
		return
	}
	name, ok := scheduleParam(w, r)
	if !ok {
		return
	}
	var stored broker.Schedule
	var err error
	status := http.StatusCreated
	if name != "" {
		if b.Name != "" && b.Name != name {
			writeError(w, http.StatusBadRequest, "the body names schedule %q but the URL names %q; a schedule cannot be renamed: delete it and create another", b.Name, name)
			return
		}
		b.Name = name
		if _, err := rt.svc.Schedule(r.Context(), name); err != nil {
			writeBrokerError(w, "update schedule", err)
			return
		}
		status = http.StatusOK
		stored, err = rt.svc.UpdateSchedule(r.Context(), b)
	} else {
		stored, err = rt.svc.CreateSchedule(r.Context(), b)
	}
	if p, ok := service.IsProblem(err); ok {
		switch {
		case errors.Is(p, service.ErrConflict):
			writeError(w, http.StatusConflict, "schedule %q exists; change it with PUT /api/schedules/%s", b.Name, b.Name)
		case errors.Is(p, service.ErrUnavailable):
			writeError(w, http.StatusServiceUnavailable, "%s", p.Msg)
		default:
			writeError(w, http.StatusBadRequest, "schedule refused: %s; for example %s", p.Msg, service.ScheduleExample)
		}
		return
	}
	if err != nil {
		writeBrokerError(w, "store schedule", err)
		return
	}
	writeJSON(w, status, scheduleView(rt.svc, stored))
}

func deleteSchedule(w http.ResponseWriter, r *http.Request, rt *runtime) {
	name, ok := scheduleParam(w, r)
	if !ok {
		return
	}
	if err := rt.svc.DeleteSchedule(r.Context(), name); err != nil {
		writeBrokerError(w, "delete schedule", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"deleted": name})
}

func listReports(w http.ResponseWriter, r *http.Request, rt *runtime) {
	q := r.URL.Query()
	f := broker.ReportFilter{Task: q.Get("task"), Status: q.Get("status"), Schedule: q.Get("schedule"), Limit: broker.DefaultListLimit}
	if f.Status != "" && !slices.Contains(service.ReportStatuses, f.Status) {
		writeError(w, http.StatusBadRequest, "unknown status %q; use one of %s", f.Status, strings.Join(service.ReportStatuses, ", "))
		return
	}
	var taskID int64
	for key, dst := range map[string]*int64{"task_id": &taskID, "message_id": &f.MessageID, "before": &f.Before} {
		if s := q.Get(key); s != "" {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil || n <= 0 {
				writeError(w, http.StatusBadRequest, "%s must be a positive whole number, got %q", key, s)
				return
			}
			*dst = n
		}
	}
	// task_id is the tasks API's id; message_id, the same number, is its
	// deprecated name. Both may be given only when they agree.
	if taskID != 0 {
		if f.MessageID != 0 && f.MessageID != taskID {
			writeError(w, http.StatusBadRequest, "task_id %d and message_id %d name different tasks; give task_id only (message_id is its deprecated name)", taskID, f.MessageID)
			return
		}
		f.MessageID = taskID
	}
	if !queryLimit(w, q, &f.Limit) {
		return
	}
	list, err := rt.svc.Reports(r.Context(), f)
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
	id, ok := service.ParseID(raw)
	if !ok {
		writeError(w, http.StatusBadRequest, "report id must be a positive whole number, got %q", raw)
		return
	}
	rep, err := rt.svc.Report(r.Context(), id)
	if err != nil {
		writeBrokerError(w, "get report", err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}
