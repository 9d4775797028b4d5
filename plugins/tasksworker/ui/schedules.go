package ui

// The schedule pages (/ui/schedules and /ui/schedules/{name}): list,
// create, edit, enable or disable, delete.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/plugins/tasksworker/service"
)

type schedForm struct {
	Name, Task, Topic, Payload, Interval, Cron, MissedPolicy string
	Enabled                                                  bool
	Source                                                   string
}

type schedRow struct {
	broker.Schedule
	Timing string
	// Waiting: the schedule waits for a live worker that runs its task.
	Waiting *service.Waiting
}

type schedulesView struct {
	Err      string
	Rows     []schedRow
	Form     schedForm
	Tasks    []string
	Topics   []string
	Policies []string
	// the edit page
	Edit       bool
	Stored     *schedRow
	Reports    []broker.Report
	ReportsErr string
}

func schedRowOf(s broker.Schedule) schedRow {
	row := schedRow{Schedule: s}
	if timing, err := service.Timing(s.IntervalSeconds, s.Cron); err == nil {
		row.Timing = timing
	} else {
		row.Timing = "invalid: " + err.Error()
	}
	return row
}

func schedFormOf(s broker.Schedule) schedForm {
	f := schedForm{Name: s.Name, Task: s.Task, Topic: s.Topic, Payload: prettyJSON(s.Payload), Cron: s.Cron,
		MissedPolicy: s.MissedPolicy, Enabled: s.Enabled, Source: s.Source}
	if s.IntervalSeconds > 0 {
		f.Interval = strconv.Itoa(s.IntervalSeconds)
	}
	return f
}

func schedFormFrom(r *http.Request) schedForm {
	pf := r.PostForm
	return schedForm{Name: strings.TrimSpace(pf.Get("name")), Task: pf.Get("task"), Topic: strings.TrimSpace(pf.Get("topic")),
		Payload: pf.Get("payload"), Interval: strings.TrimSpace(pf.Get("interval_seconds")), Cron: strings.TrimSpace(pf.Get("cron")),
		MissedPolicy: pf.Get("missed_policy"), Enabled: pf.Get("enabled") != ""}
}

// body turns the form into what the API takes; the service then checks
// it exactly as it checks the API's.
func (f schedForm) body() (service.ScheduleSpec, error) {
	payload := strings.TrimSpace(f.Payload)
	if payload == "" {
		payload = "{}"
	}
	if msg := jsonProblem("payload", payload); msg != "" {
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

func (u *UI) schedulesPage(w http.ResponseWriter, r *http.Request, svc *service.Service, status int, f schedForm, fl *flash) {
	d := schedulesView{Form: f, Tasks: svc.TaskNames(), Topics: svc.Served(), Policies: []string{broker.MissedSkip, broker.MissedFireOnce}}
	list, err := svc.Schedules(r.Context())
	if err != nil {
		d.Err = brokerProblem("list the schedules", err)
	}
	for _, s := range list {
		row := schedRowOf(s)
		row.Waiting = svc.ScheduleWaiting(s)
		d.Rows = append(d.Rows, row)
	}
	u.render(w, r, svc, status, "schedules", &page{Title: "Schedules", Flash: fl, D: d})
}

func (u *UI) schedules(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	u.schedulesPage(w, r, svc, http.StatusOK, schedForm{Payload: "{}", Enabled: true, Interval: "3600"}, nil)
}

func (u *UI) createSchedule(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	f := schedFormFrom(r)
	fail := func(status int, msg string) {
		u.schedulesPage(w, r, svc, status, f, &flash{Kind: "error", Message: msg})
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
		fail(http.StatusServiceUnavailable, brokerProblem("store the schedule", err))
		return
	}
	u.redirect(w, r, "/schedules", "ok", fmt.Sprintf("Schedule %s created: %s, task %s.", stored.Name, schedRowOf(stored).Timing, stored.Task), "")
}

func schedName(r *http.Request) string {
	name := chi.URLParam(r, "name")
	if n, err := url.PathUnescape(name); err == nil {
		name = n
	}
	return name
}

func (u *UI) schedulePage(w http.ResponseWriter, r *http.Request, svc *service.Service, status int, stored broker.Schedule, f schedForm, fl *flash) {
	row := schedRowOf(stored)
	row.Waiting = svc.ScheduleWaiting(stored)
	d := schedulesView{Form: f, Tasks: svc.TaskNames(), Topics: svc.Served(), Policies: []string{broker.MissedSkip, broker.MissedFireOnce},
		Edit: true, Stored: &row}
	var err error
	if d.Reports, err = svc.Reports(r.Context(), broker.ReportFilter{Schedule: stored.Name, Limit: 20}); err != nil {
		d.ReportsErr = brokerProblem("read the schedule's reports", err)
	}
	u.render(w, r, svc, status, "schedule", &page{Title: "Schedule " + stored.Name, Nav: "schedules", Flash: fl, D: d})
}

func (u *UI) loadSchedule(w http.ResponseWriter, r *http.Request, svc *service.Service) (broker.Schedule, bool) {
	name := schedName(r)
	s, err := svc.Schedule(r.Context(), name)
	if errors.Is(err, broker.ErrNotFound) {
		u.problem(w, r, http.StatusNotFound, "No such schedule", fmt.Sprintf("There is no schedule named %q (deleted?).", name))
		return s, false
	}
	if err != nil {
		u.problem(w, r, http.StatusServiceUnavailable, "Schedule unavailable", brokerProblem(fmt.Sprintf("read schedule %q", name), err))
		return s, false
	}
	return s, true
}

func (u *UI) schedule(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	s, ok := u.loadSchedule(w, r, svc)
	if !ok {
		return
	}
	u.schedulePage(w, r, svc, http.StatusOK, s, schedFormOf(s), nil)
}

func (u *UI) updateSchedule(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	stored, ok := u.loadSchedule(w, r, svc)
	if !ok {
		return
	}
	f := schedFormFrom(r)
	f.Name, f.Source = stored.Name, stored.Source // a schedule cannot be renamed
	fail := func(status int, msg string) {
		u.schedulePage(w, r, svc, status, stored, f, &flash{Kind: "error", Message: msg})
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
		fail(http.StatusServiceUnavailable, brokerProblem("store the schedule", err))
		return
	}
	u.redirect(w, r, "/schedules", "ok", fmt.Sprintf("Schedule %s saved: %s.", saved.Name, schedRowOf(saved).Timing), "")
}

func (u *UI) toggleSchedule(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	name := schedName(r)
	// Disabling always works, even for a task that is gone; enabling
	// checks the schedule as the API would.
	s, err := svc.ToggleSchedule(r.Context(), name)
	if p, ok := service.IsProblem(err); ok {
		u.redirect(w, r, "/schedules", "error", fmt.Sprintf("Schedule %s stays disabled: %s.", name, p.Msg), "")
		return
	}
	u.audit(r, "toggle schedule", "schedule", name, "enabled", s.Enabled, "error", err)
	if err != nil {
		u.redirect(w, r, "/schedules", "error", brokerProblem(fmt.Sprintf("toggle schedule %q", name), err), "")
		return
	}
	state := "disabled"
	if s.Enabled {
		state = "enabled"
	}
	u.redirect(w, r, "/schedules", "ok", fmt.Sprintf("Schedule %s %s.", name, state), "")
}

func (u *UI) deleteSchedule(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	name := schedName(r)
	err := svc.DeleteSchedule(r.Context(), name)
	u.audit(r, "delete schedule", "schedule", name, "error", err)
	if err != nil {
		u.redirect(w, r, "/schedules", "error", brokerProblem(fmt.Sprintf("delete schedule %q", name), err), "")
		return
	}
	u.redirect(w, r, "/schedules", "ok", fmt.Sprintf("Schedule %s deleted.", name), "")
}
