package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Task states, as the host names them.
const (
	StateQueued  = "queued"
	StateRunning = "running"
	StateDone    = "done"
	StateFailed  = "failed"
	StateDead    = "dead"
	// StateCancelled: cancelled (Cancel, CancelQueued) before it ran, or
	// its running attempt stopped on a cancel; never retried.
	StateCancelled = "cancelled"
)

// Task is a task to submit, and a submitted one as Get, Wait and List
// read it back. Submit sends the fields marked "submit" (Task is
// required); the others are the host's.
type Task struct {
	// ID is the host's id of a submitted task.
	ID string `json:"id,omitempty"`
	// Task is the task's name, such as "demo.echo" (submit; required).
	Task string `json:"task"`
	// Topic is the queue (submit; empty: the task's own).
	Topic string `json:"topic,omitempty"`
	// Payload is the task's input, a JSON value (submit; empty: {}).
	Payload json.RawMessage `json:"payload,omitempty"`
	// DelaySeconds: it may run no sooner (submit only; 0 to 31536000).
	DelaySeconds float64 `json:"delay_seconds,omitempty"`
	// MaxAttempts bounds its tries (submit: 0 is the task's default; read:
	// the one that applies).
	MaxAttempts int `json:"max_attempts,omitempty"`
	// RunAt: it may run no sooner than this time (submit only; exclusive
	// with DelaySeconds; at most 24 hours in the past).
	RunAt *time.Time `json:"run_at,omitempty"`
	// Priority: a higher one runs first within its topic (submit and
	// read; -100 to 100, default 0).
	Priority int `json:"priority,omitempty"`
	// UniqueKey (submit and read): while another task with this key is
	// queued or running (or in UniqueStates), or was created less than
	// UniqueForSeconds ago, the submit stores nothing and answers that
	// task's id as a duplicate (see SubmitUnique). 1 to 200 bytes; keys
	// are global across topics and tasks.
	UniqueKey string `json:"unique_key,omitempty"`
	// UniqueForSeconds (submit only): the window of UniqueKey.
	UniqueForSeconds float64 `json:"unique_for_seconds,omitempty"`
	// UniqueStates (submit only): the states in which the task holds its
	// key (default queued and running; must include both).
	UniqueStates []string `json:"unique_states,omitempty"`
	// AvailableAt is when it may run next (read only).
	AvailableAt *time.Time `json:"available_at,omitempty"`

	// State is one of the State constants.
	State string `json:"state,omitempty"`
	// Attempts is how many times it was tried.
	Attempts   int        `json:"attempts,omitempty"`
	CreatedAt  time.Time  `json:"created_at,omitzero"`
	ClaimedBy  *string    `json:"claimed_by,omitempty"`
	ClaimedAt  *time.Time `json:"claimed_at,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	// Result is what a done task returned.
	Result json.RawMessage `json:"result,omitempty"`
	// Error is the last attempt's error.
	Error *string `json:"error,omitempty"`
	// CancelRequestedAt: the running task was asked to stop then
	// (Cancel); it ends cancelled unless it finishes first.
	CancelRequestedAt *time.Time `json:"cancel_requested_at,omitempty"`
}

// Finished reports whether the task is in a state it leaves only when
// someone requeues it: done, failed, dead or cancelled (which is never
// requeued).
func (t Task) Finished() bool {
	return t.State == StateDone || t.State == StateFailed || t.State == StateDead || t.State == StateCancelled
}

// submitItem is what Submit and the batch calls send of a Task.
type submitItem struct {
	Task             string          `json:"task"`
	Topic            string          `json:"topic,omitempty"`
	Payload          json.RawMessage `json:"payload,omitempty"`
	DelaySeconds     float64         `json:"delay_seconds,omitempty"`
	MaxAttempts      int             `json:"max_attempts,omitempty"`
	RunAt            *time.Time      `json:"run_at,omitempty"`
	Priority         int             `json:"priority,omitempty"`
	UniqueKey        string          `json:"unique_key,omitempty"`
	UniqueForSeconds float64         `json:"unique_for_seconds,omitempty"`
	UniqueStates     []string        `json:"unique_states,omitempty"`
}

func itemOf(t Task) submitItem {
	return submitItem{Task: t.Task, Topic: t.Topic, Payload: t.Payload, DelaySeconds: t.DelaySeconds, MaxAttempts: t.MaxAttempts,
		RunAt: t.RunAt, Priority: t.Priority, UniqueKey: t.UniqueKey, UniqueForSeconds: t.UniqueForSeconds, UniqueStates: t.UniqueStates}
}

// Submit stores one task and returns its id: for a duplicate (see
// Task.UniqueKey), the id of the task that holds the key (SubmitUnique
// tells them apart). A 503 (the plugin is restarting) or a connection that
// could not be made is retried per the policy; see the package doc on
// duplicates.
func (c *Client) Submit(ctx context.Context, t Task) (string, error) {
	id, _, err := c.SubmitUnique(ctx, t)
	return id, err
}

// SubmitUnique is Submit saying whether the task was a duplicate: then
// nothing was stored and id is the task that holds t.UniqueKey.
func (c *Client) SubmitUnique(ctx context.Context, t Task) (id string, duplicate bool, err error) {
	var out struct {
		ID        string `json:"id"`
		Duplicate bool   `json:"duplicate"`
	}
	err = c.call(ctx, request{method: http.MethodPost, path: apiPrefix + "/tasks", body: itemOf(t), retry: true}, &out)
	if err != nil {
		return "", false, err
	}
	return out.ID, out.Duplicate, nil
}

// Get reads one task; IsNotFound(err) when there is no such task.
func (c *Client) Get(ctx context.Context, id string) (Task, error) {
	var t Task
	err := c.call(ctx, request{method: http.MethodGet, path: apiPrefix + "/tasks/" + url.PathEscape(id)}, &t)
	return t, err
}

// Wait polls the task until it is finished (done, failed, dead or
// cancelled: see Task.Finished) and returns it. The polls start close
// together and grow apart, up to a few seconds, so that a short task is
// seen finished soon and a long one costs the host few reads. ctx bounds
// the wait: when it ends first, Wait returns the task as last read with
// ctx's error. A finished task's State says how it ended; a failed, dead
// or cancelled task is not an error of Wait.
func (c *Client) Wait(ctx context.Context, id string) (Task, error) {
	delay := 100 * time.Millisecond
	for {
		t, err := c.Get(ctx, id)
		if err != nil {
			if ctx.Err() != nil {
				return t, fmt.Errorf("wait for task %s: %w", id, ctx.Err())
			}
			return t, err
		}
		if t.Finished() {
			return t, nil
		}
		if err := sleep(ctx, delay); err != nil {
			return t, fmt.Errorf("wait for task %s (still %s): %w", id, t.State, err)
		}
		delay = min(delay*3/2, 2*time.Second)
	}
}

// Filter selects the tasks List returns; the zero Filter is the newest
// 50 of every state.
type Filter struct {
	// State, Topic and Task, when set, must match.
	State, Topic, Task string
	// Limit is the page size, 1 to 1000; 0: the host's default (50).
	Limit int
	// Before continues a listing: the NextBefore of the previous page.
	Before string
}

// Page is one page of List, newest first.
type Page struct {
	Tasks []Task `json:"tasks"`
	// NextBefore, when not empty, gives the next (older) page as
	// Filter.Before; empty on the last page.
	NextBefore string `json:"next_before"`
}

// List returns a page of tasks, newest first.
func (c *Client) List(ctx context.Context, f Filter) (Page, error) {
	q := url.Values{}
	for k, v := range map[string]string{"state": f.State, "topic": f.Topic, "task": f.Task, "before": f.Before} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if f.Limit != 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	var raw struct {
		Tasks      []Task  `json:"tasks"`
		NextBefore *string `json:"next_before"`
	}
	if err := c.call(ctx, request{method: http.MethodGet, path: apiPrefix + "/tasks", query: q}, &raw); err != nil {
		return Page{}, err
	}
	p := Page{Tasks: raw.Tasks}
	if raw.NextBefore != nil {
		p.NextBefore = *raw.NextBefore
	}
	return p, nil
}
