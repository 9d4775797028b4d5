package ui

// The dashboard (/ui/): counts, workers, the beat, the reaper and the
// charts; and its "reclaim orphaned messages now" form.

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/plugins/tasksworker/service"
)

type workerRow struct {
	broker.WorkerInfo
	Self  bool
	Age   time.Duration
	Stale bool // the reaper counts it as dead
	Late  bool // missed two heartbeats
}

type beat struct {
	Enabled, Candidate, Leader bool
	Term                       int64
	Beats                      int
}

type dashboardView struct {
	Err                       string
	Topics                    []broker.TopicStats
	Queued, Running, Dead     int
	Locks, LiveWorkers        int
	Workers                   []workerRow
	Beat                      beat
	HereRunning, HereCapacity int
	Charts                    []chart
	Reaper                    struct {
		Enabled      bool
		Every, After time.Duration
		Grace        time.Duration
		MaxAttempts  int
		Reclaims     bool
	}
}

func (u *UI) workers(ctx context.Context, svc *service.Service) ([]workerRow, error) {
	ws, err := svc.Workers(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	out := make([]workerRow, 0, len(ws))
	for _, w := range ws {
		age := max(0, now.Sub(w.HeartbeatAt))
		out = append(out, workerRow{WorkerInfo: w, Self: w.ID == svc.WorkerID(), Age: age,
			Stale: age > svc.Settings().Reaper.After, Late: age > 2*svc.Settings().HeartbeatInterval})
	}
	return out, nil
}

func (u *UI) dashboard(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	ctx := r.Context()
	d := dashboardView{HereRunning: svc.Running(), HereCapacity: svc.Concurrency()}
	var problems []string
	st, statsErr := svc.Stats(ctx)
	if statsErr != nil {
		problems = append(problems, brokerProblem("read the topics", statsErr))
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
		problems = append(problems, brokerProblem("read the workers", err))
	}
	b := svc.Beat()
	d.Beat = beat{Enabled: b.Enabled, Candidate: b.Candidate, Leader: b.Leader, Term: b.Term, Beats: st.Beats}
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
	u.render(w, r, svc, status, "dashboard", &page{Title: "Dashboard", D: d})
}

func (u *UI) reclaim(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	ctx, cancel := context.WithTimeout(r.Context(), actionTimeout)
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
