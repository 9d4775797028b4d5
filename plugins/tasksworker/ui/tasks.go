package ui

// The task pages: the lists (/ui/tasks, /ui/running, /ui/dead), one task
// (/ui/tasks/{id}) and its requeue and cancel forms.

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/plugins/tasksworker/service"
)

type list struct {
	Err             string
	Down            bool // the broker failed (not just a bad filter)
	Rows            []taskRow
	State           string
	Topic, Task     string
	States          []string
	Topics, Tasks   []string
	NextURL, NewURL string
	Back            string
	Workers         map[string]workerRow
	ListedAt        time.Time
}

type taskRow struct {
	broker.Message
	ClaimAge    time.Duration
	MaxAttempts int
	Worker      *workerRow
}

// listPage reads a page of messages filtered by the query (state, topic,
// task, before), for the tasks, running and dead pages.
func (u *UI) listPage(r *http.Request, svc *service.Service, path, forceState string) list {
	ctx := r.Context()
	q := r.URL.Query()
	l := list{State: q.Get("state"), Topic: q.Get("topic"), Task: q.Get("task"), States: service.MessageStates, Back: self(r), ListedAt: time.Now()}
	if forceState != "" {
		l.State = forceState
	}
	f := broker.MessageFilter{State: l.State, Topic: l.Topic, Task: l.Task, Limit: listLimit}
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
			l.NewURL = base(r) + path + query(map[string]string{"state": l.State, "topic": l.Topic, "task": l.Task}, forceState)
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
		problems = append(problems, brokerProblem("list the tasks", err))
		l.Down = true
	}
	if ws, err := u.workers(ctx, svc); err == nil {
		l.Workers = map[string]workerRow{}
		for _, w := range ws {
			l.Workers[w.ID] = w
		}
	}
	now := time.Now()
	for _, m := range msgs {
		row := taskRow{Message: m, MaxAttempts: m.MaxAttempts}
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
		l.NextURL = base(r) + path + query(map[string]string{"state": l.State, "topic": l.Topic, "task": l.Task,
			"before": strconv.FormatInt(msgs[len(msgs)-1].ID, 10)}, forceState)
	}
	l.Err = strings.Join(problems, " ")
	return l
}

func (u *UI) tasks(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	l := u.listPage(r, svc, "/tasks", "")
	u.render(w, r, svc, pageStatus(l.Down), "tasks", &page{Title: "Tasks", D: l})
}

func (u *UI) running(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	l := u.listPage(r, svc, "/running", broker.StateRunning)
	// Oldest claims first: those are the ones to look at.
	sort.SliceStable(l.Rows, func(i, j int) bool { return l.Rows[i].ClaimAge > l.Rows[j].ClaimAge })
	u.render(w, r, svc, pageStatus(l.Down), "running", &page{Title: "Running", D: l, Refresh: 10})
}

func (u *UI) dead(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	l := u.listPage(r, svc, "/dead", broker.StateDead)
	u.render(w, r, svc, pageStatus(l.Down), "dead", &page{Title: "Dead letters", D: l})
}

type taskView struct {
	M           broker.Message
	MaxAttempts int
	Description string
	Reports     []broker.Report
	ReportsErr  string
	Final       bool
	CanRequeue  bool
	CanCancel   bool
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
		u.problem(w, r, http.StatusServiceUnavailable, "Task unavailable", brokerProblem(fmt.Sprintf("read task %d", id), err))
		return
	}
	d := taskView{M: m, MaxAttempts: m.MaxAttempts, Back: self(r), Lock: service.PayloadLock(m.Payload)}
	if t, ok := svc.Task(m.Task); ok {
		d.Description = t.Description
		if d.MaxAttempts == 0 {
			d.MaxAttempts = t.MaxAttempts
		}
	}
	d.Final = broker.Finished(m.State)
	d.CanRequeue = m.State == broker.StateFailed || m.State == broker.StateDead
	d.CanCancel = m.State == broker.StateQueued || m.State == broker.StateRunning && m.CancelRequestedAt == nil
	d.Reports, err = svc.Reports(r.Context(), broker.ReportFilter{MessageID: id, Limit: 100})
	if err != nil {
		d.ReportsErr = brokerProblem("read the task's reports", err)
	}
	pg := &page{Title: fmt.Sprintf("Task %d", id), Nav: "tasks", D: d}
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
	back := backTo(r, fmt.Sprintf("/tasks/%d", id))
	err := svc.Requeue(r.Context(), id)
	u.audit(r, "requeue", "message_id", id, "error", err)
	if err != nil {
		u.redirect(w, r, back, "error", brokerProblem(fmt.Sprintf("requeue task %d", id), err), "")
		return
	}
	u.redirect(w, r, back, "ok", fmt.Sprintf("Task %d is queued again.", id), "")
}

func (u *UI) cancel(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	id, ok := u.taskID(w, r)
	if !ok {
		return
	}
	back := backTo(r, fmt.Sprintf("/tasks/%d", id))
	m, err := svc.Cancel(r.Context(), id)
	u.audit(r, "cancel", "message_id", id, "state", m.State, "error", err)
	switch {
	case errors.Is(err, broker.ErrFinished):
		u.redirect(w, r, back, "error", fmt.Sprintf("Task %d has already finished (%s): there is nothing to cancel.", id, m.State), "")
	case err != nil:
		u.redirect(w, r, back, "error", brokerProblem(fmt.Sprintf("cancel task %d", id), err), "")
	case m.State == broker.StateRunning:
		u.redirect(w, r, back, "ok", fmt.Sprintf("Task %d is asked to stop: it ends cancelled when its worker stops it, unless it finishes first.", id), "")
	default:
		u.redirect(w, r, back, "ok", fmt.Sprintf("Task %d is cancelled.", id), "")
	}
}
