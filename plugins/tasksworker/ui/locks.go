package ui

// The locks page (/ui/locks) and its force-release form.

import (
	"fmt"
	"net/http"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/plugins/tasksworker/service"
)

type lockRow struct {
	broker.Lock
	Age    time.Duration
	Worker *workerRow
}

type locksView struct {
	Err  string
	Rows []lockRow
}

func (u *UI) locks(w http.ResponseWriter, r *http.Request, svc *service.Service) {
	var d locksView
	locks, err := svc.Locks(r.Context())
	if err != nil {
		d.Err = brokerProblem("list the locks", err)
	}
	workers := map[string]workerRow{}
	if ws, err := u.workers(r.Context(), svc); err == nil {
		for _, w := range ws {
			workers[w.ID] = w
		}
	}
	now := time.Now()
	for _, l := range locks {
		row := lockRow{Lock: l, Age: max(0, now.Sub(l.AcquiredAt))}
		if wr, ok := workers[l.Holder]; ok {
			row.Worker = &wr
		}
		d.Rows = append(d.Rows, row)
	}
	u.render(w, r, svc, pageStatus(d.Err != ""), "locks", &page{Title: "Locks", D: d})
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
		u.redirect(w, r, "/locks", "error", brokerProblem(fmt.Sprintf("release lock %q", name), err), "")
	case !released:
		u.redirect(w, r, "/locks", "ok", fmt.Sprintf("Lock %s was not held (any more): nothing to release.", name), "")
	default:
		u.redirect(w, r, "/locks", "ok", fmt.Sprintf("Lock %s released. A task still running under it no longer holds it; another may take it now.", name), "")
	}
}
