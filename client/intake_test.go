package client_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/client"
)

// A task with a unique key is stored once: a second submit answers the
// first's id as a duplicate, also within a batch; priority and run_at
// read back.
func TestSubmitUniqueOnAHost(t *testing.T) {
	c := client.New(hostURL)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key := fmt.Sprintf("client-test-%d", time.Now().UnixNano())
	at := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	task := client.Task{Task: "demo.echo", UniqueKey: key, Priority: 9, RunAt: &at}
	id, dup, err := c.SubmitUnique(ctx, task)
	if err != nil || dup || id == "" {
		t.Fatalf("first SubmitUnique = %q, %t, %v", id, dup, err)
	}
	again, dup, err := c.SubmitUnique(ctx, client.Task{Task: "demo.echo", UniqueKey: key})
	if err != nil || !dup || again != id {
		t.Fatalf("second SubmitUnique = %q, %t, %v; want %q as a duplicate", again, dup, err, id)
	}
	if got, err := c.Submit(ctx, client.Task{Task: "demo.echo", UniqueKey: key}); err != nil || got != id {
		t.Fatalf("Submit of a duplicate = %q, %v; want the holder %q", got, err, id)
	}
	got, err := c.Get(ctx, id)
	if err != nil || got.Priority != 9 || got.UniqueKey != key || got.AvailableAt == nil || !got.AvailableAt.Equal(at) || got.State != client.StateQueued {
		t.Fatalf("Get = %+v, %v; want queued, priority 9, key %s, available at %v", got, err, key, at)
	}

	res, err := c.SubmitTasks(ctx, []client.Task{
		{Task: "demo.echo", UniqueKey: key},
		{Task: "demo.echo", UniqueKey: key + "-b", DelaySeconds: 3600},
		{Task: "demo.echo", UniqueKey: key + "-b"},
	})
	if err != nil || len(res.IDs) != 3 || !slices.Equal(res.Duplicates, []int{0, 2}) || res.IDs[0] != id || res.IDs[2] != res.IDs[1] {
		t.Fatalf("SubmitTasks = %+v, %v; want duplicates [0 2] naming %s and item 1", res, err, id)
	}

	_, err = c.Submit(ctx, client.Task{Task: "demo.echo", Priority: 500})
	if !client.IsBadRequest(err) || !strings.Contains(err.Error(), "priority is 500") {
		t.Fatalf("Submit with priority 500: %v, want a bad request naming the priority", err)
	}
}
