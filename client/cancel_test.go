package client_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/client"
)

// TestCancel: on the real host, a queued task is cancelled at once (Wait
// sees it finished), a running one is asked to stop, a finished one is a
// conflict naming its state, an unknown one is not found; CancelQueued
// cancels a topic's queued tasks and counts them.
func TestCancel(t *testing.T) {
	c := client.New(hostURL)
	ctx := t.Context()
	id, err := c.Submit(ctx, client.Task{Task: "demo.echo", DelaySeconds: 3600})
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Cancel(ctx, id)
	if err != nil || got.ID != id || got.State != client.StateCancelled || got.CancelRequested {
		t.Fatalf("Cancel of a queued task = %+v, %v; want it cancelled", got, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	done, err := c.Wait(wctx, id)
	if err != nil || done.State != client.StateCancelled || !done.Finished() || done.FinishedAt == nil {
		t.Fatalf("Wait after the cancel = %+v, %v; want it finished, cancelled", done, err)
	}

	_, err = c.Cancel(ctx, id)
	if !client.IsConflict(err) || !strings.Contains(err.Error(), "cancelled") {
		t.Fatalf("second Cancel: %v; want a conflict naming the state", err)
	}
	if _, err := c.Cancel(ctx, "987654321"); !client.IsNotFound(err) {
		t.Fatalf("Cancel of an unknown task: %v; want not found", err)
	}
	if _, err := c.Cancel(ctx, "abc"); !client.IsBadRequest(err) {
		t.Fatalf("Cancel of a bad id: %v; want a bad request", err)
	}

	// A running task is asked to stop.
	run, err := c.Submit(ctx, client.Task{Task: "demo.sleep", Payload: json.RawMessage(`{"seconds": 600}`)})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		tk, err := c.Get(ctx, run)
		if err != nil {
			t.Fatal(err)
		}
		if tk.State == client.StateRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s is still %s after 60s", run, tk.State)
		}
		time.Sleep(50 * time.Millisecond)
	}
	got, err = c.Cancel(ctx, run)
	if err != nil || got.State != client.StateRunning || !got.CancelRequested {
		t.Fatalf("Cancel of a running task = %+v, %v; want it running with its cancel requested", got, err)
	}
	// The worker that runs it may have stopped it already.
	tk, err := c.Get(ctx, run)
	if err != nil || tk.CancelRequestedAt == nil || (tk.State != client.StateRunning && tk.State != client.StateCancelled) {
		t.Fatalf("Get after the cancel request = %+v, %v; want it running or cancelled, with cancel_requested_at", tk, err)
	}

	// CancelQueued: the queued ones of the task, not the running one.
	// First those an earlier run of this test left on the shared host.
	if _, err := c.CancelQueued(ctx, client.CancelFilter{Topic: tk.Topic, Task: "demo.sleep"}); err != nil {
		t.Fatal(err)
	}
	var queued []string
	for range 3 {
		id, err := c.Submit(ctx, client.Task{Task: "demo.sleep", Payload: json.RawMessage(`{"seconds": 1}`), DelaySeconds: 3600})
		if err != nil {
			t.Fatal(err)
		}
		queued = append(queued, id)
	}
	res, err := c.CancelQueued(ctx, client.CancelFilter{Topic: tk.Topic, Task: "demo.sleep"})
	if err != nil || res.Cancelled != 3 {
		t.Fatalf("CancelQueued = %+v, %v; want 3 cancelled", res, err)
	}
	for _, id := range queued {
		if tk, err := c.Get(ctx, id); err != nil || tk.State != client.StateCancelled {
			t.Fatalf("task %s after CancelQueued: %s, %v; want cancelled", id, tk.State, err)
		}
	}
	if tk, err := c.Get(ctx, run); err != nil || (tk.State != client.StateRunning && tk.State != client.StateCancelled) {
		t.Fatalf("running task %s after CancelQueued: %s, %v; want it left to its worker", run, tk.State, err)
	}
	if _, err := c.CancelQueued(ctx, client.CancelFilter{}); !client.IsBadRequest(err) || !strings.Contains(err.Error(), "name a topic or a task") {
		t.Fatalf("CancelQueued with an empty filter: %v; want a bad request saying what to name", err)
	}
}
