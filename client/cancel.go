package client

import (
	"context"
	"net/http"
	"net/url"
)

// Cancelled is the host's answer to Cancel.
type Cancelled struct {
	// ID is the task's id.
	ID string `json:"id"`
	// State is StateCancelled when the task was queued (it never runs),
	// StateRunning when it runs: then CancelRequested is set, its worker
	// is asked to stop it, and it ends cancelled unless it finishes first
	// (Wait tells).
	State           string `json:"state"`
	CancelRequested bool   `json:"cancel_requested,omitempty"`
}

// Cancel cancels task id. A queued task is cancelled at once; a running
// one is asked to stop (see Cancelled). A task that has already finished
// is an *APIError with IsConflict(err) true, whose Message names its
// state; an unknown id is IsNotFound(err). A 503 (the plugin is
// restarting) or a connection that could not be made is retried per the
// policy: cancelling twice is harmless.
func (c *Client) Cancel(ctx context.Context, id string) (Cancelled, error) {
	var out Cancelled
	err := c.call(ctx, request{method: http.MethodPost, path: apiPrefix + "/tasks/" + url.PathEscape(id) + "/cancel", retry: true}, &out)
	return out, err
}

// CancelFilter selects the queued tasks CancelQueued cancels: those of
// Topic and of Task where set (at least one must be).
type CancelFilter struct {
	Topic string `json:"topic,omitempty"`
	Task  string `json:"task,omitempty"`
}

// CancelQueuedResult is the host's answer to CancelQueued.
type CancelQueuedResult struct {
	// Cancelled is how many queued tasks were cancelled.
	Cancelled int `json:"cancelled"`
}

// CancelQueued cancels the queued tasks f selects and returns how many;
// running ones are left alone (Cancel them by id). An empty filter is an
// *APIError with IsBadRequest(err) true. It is retried as Cancel is.
func (c *Client) CancelQueued(ctx context.Context, f CancelFilter) (CancelQueuedResult, error) {
	var out CancelQueuedResult
	err := c.call(ctx, request{method: http.MethodPost, path: apiPrefix + "/tasks/cancel", body: f, retry: true}, &out)
	return out, err
}
