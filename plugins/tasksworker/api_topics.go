package tasksworker

// The API's endpoints on the running system: GET /api/topics, PUT
// /api/topics/{name}, GET /api/workers, GET /api/locks and GET
// /api/health.

import (
	"fmt"
	"net/http"
	"slices"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/plugins/tasksworker/service"
)

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

func listTopics(w http.ResponseWriter, r *http.Request, rt *runtime) {
	st, err := rt.svc.Stats(r.Context())
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

func setTopic(w http.ResponseWriter, r *http.Request, rt *runtime) {
	name, err := pathParam(r, "name")
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad topic name in the path: %v", err)
		return
	}
	if err := rt.svc.CheckTopic(r.Context(), name); err != nil {
		writeError(w, http.StatusBadRequest, "bad topic name: %v", err)
		return
	}
	var req topicPatchRequest
	if r.ContentLength != 0 {
		if !decodeBody(w, r, service.BodySlack, &req, topicExample) {
			return
		}
	}
	cfg, err := rt.svc.SetTopic(r.Context(), name, broker.TopicPatch{
		ConcurrencyLimit: req.ConcurrencyLimit, Paused: req.Paused, DeadLetterEnabled: req.DeadLetterEnabled,
	})
	if err != nil {
		writeServiceError(w, "set topic", err)
		return
	}
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

func listWorkers(w http.ResponseWriter, r *http.Request, rt *runtime) {
	ws, err := rt.svc.Workers(r.Context())
	if err != nil {
		writeBrokerError(w, "list workers", err)
		return
	}
	// By the broker's clock, as its counts are.
	live, byClock, err := rt.svc.LiveWorkers(r.Context())
	if err != nil {
		writeBrokerError(w, "list live workers", err)
		return
	}
	out := make([]workerView, len(ws))
	for i, wi := range ws {
		out[i] = workerView{WorkerInfo: wi, Live: !byClock || slices.Contains(live, wi.ID)}
	}
	writeJSON(w, http.StatusOK, map[string]any{"workers": out})
}

func listLocks(w http.ResponseWriter, r *http.Request, rt *runtime) {
	locks, err := rt.svc.Locks(r.Context())
	if err != nil {
		writeBrokerError(w, "list locks", err)
		return
	}
	if locks == nil {
		locks = []broker.Lock{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"locks": locks})
}

func health(w http.ResponseWriter, r *http.Request, rt *runtime) {
	svc := rt.svc
	// The live workers, not Stats: health is read often and must cost the
	// same whatever the queue holds.
	workers, err := svc.LiveWorkerCount(r.Context())
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{
			"status": "error", "broker": svc.Kind(),
			"error": fmt.Sprintf("the %s broker does not answer: %v; check the database, the plugin retries on its own", svc.Kind(), err),
		})
		return
	}
	beatAt, beatErr := svc.LastHeartbeat()
	beat := map[string]any{"candidate": false, "leader": false}
	if b := svc.Beat(); b.Candidate {
		beat = map[string]any{"candidate": true, "leader": b.Leader, "term": b.Term}
	}
	out := map[string]any{
		"status":       "ok",
		"broker":       svc.Kind(),
		"worker_id":    svc.WorkerID(),
		"workers":      workers,
		"running":      svc.Running(),
		"concurrency":  svc.Concurrency(),
		"topics":       svc.Served(),
		"beat":         beat,
		"heartbeat_at": beatAt,
	}
	if err := rt.connectionProblem(); err != nil {
		out["status"] = "degraded"
		out["error"] = disconnectedMessage(svc.Kind(), err)
	} else if beatErr != nil {
		// The broker answers reads and refuses this worker's writes.
		out["status"] = "degraded"
		out["error"] = fmt.Sprintf("the %s broker refuses this worker's heartbeat: %v; outcomes may not be stored", svc.Kind(), beatErr)
	}
	writeJSON(w, http.StatusOK, out)
}
