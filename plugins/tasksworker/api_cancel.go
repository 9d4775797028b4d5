package tasksworker

// Cancelling tasks: POST /api/tasks/{id}/cancel and POST /api/tasks/cancel.

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/go-chi/chi/v5"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/plugins/tasksworker/service"
)

// cancelView is the answer to a cancel of one task.
type cancelView struct {
	ID              string `json:"id"`
	State           string `json:"state"`
	CancelRequested bool   `json:"cancel_requested,omitempty"`
}

// cancelTask cancels one task: 200 when it was queued (now cancelled),
// 202 when it runs (its cancel is requested; it ends cancelled when its
// worker stops it, unless it finishes first), 404 for an unknown id, 409
// with its state when it has finished.
func cancelTask(w http.ResponseWriter, r *http.Request, rt *runtime) {
	raw := chi.URLParam(r, "id")
	id, ok := service.ParseID(raw)
	if !ok {
		writeError(w, http.StatusBadRequest, "task id must be a positive whole number, got %q", raw)
		return
	}
	m, err := rt.svc.Cancel(r.Context(), id)
	switch {
	case errors.Is(err, broker.ErrNotFound):
		writeError(w, http.StatusNotFound, "no task with id %d: it never existed, or it finished long ago and was dropped", id)
	case errors.Is(err, broker.ErrFinished):
		writeJSON(w, http.StatusConflict, map[string]string{
			"error": "task " + strconv.FormatInt(id, 10) + " has already finished (" + m.State + "); there is nothing to cancel",
			"state": m.State,
		})
	case err != nil:
		writeBrokerError(w, "cancel task", err)
	case m.State == broker.StateRunning:
		writeJSON(w, http.StatusAccepted, cancelView{ID: strconv.FormatInt(id, 10), State: m.State, CancelRequested: true})
	default:
		writeJSON(w, http.StatusOK, cancelView{ID: strconv.FormatInt(id, 10), State: m.State})
	}
}

const cancelQueuedExample = `{"topic": "default", "task": "send_email"}`

// cancelQueued cancels the queued tasks of a topic and/or task: 200
// {"cancelled": n}. Running ones are left alone.
func cancelQueued(w http.ResponseWriter, r *http.Request, rt *runtime) {
	var f broker.CancelFilter
	if !decodeBody(w, r, service.BodySlack, &f, cancelQueuedExample) {
		return
	}
	n, err := rt.svc.CancelQueued(r.Context(), f)
	if err != nil {
		writeServiceError(w, "cancel queued tasks", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"cancelled": n})
}
