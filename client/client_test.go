package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/client"
)

// The tests in this file run against the real host TestMain starts.

func TestSubmitGetWait(t *testing.T) {
	c := client.New(hostURL)
	ctx := context.Background()
	id, err := c.Submit(ctx, client.Task{Task: "demo.echo", Payload: json.RawMessage(`{"n":1}`)})
	if err != nil || id == "" {
		t.Fatalf("Submit: %q, %v", id, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	done, err := c.Wait(wctx, id)
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if done.ID != id || done.State != client.StateDone || !done.Finished() || string(done.Result) != `{"n":1}` || done.FinishedAt == nil {
		t.Fatalf("Wait gave %+v; want task %s done with result {\"n\":1}", done, id)
	}
	got, err := c.Get(ctx, id)
	if err != nil || got.Task != "demo.echo" || got.Topic == "" || got.Attempts != 1 || got.State != client.StateDone {
		t.Fatalf("Get: %+v, %v", got, err)
	}
	reps, err := c.Reports(ctx, client.ReportFilter{TaskID: id})
	if err != nil || len(reps) != 1 || reps[0].Status != "success" || fmt.Sprint(reps[0].MessageID) != id {
		t.Fatalf("Reports of task %s: %+v, %v", id, reps, err)
	}
	if _, err := c.GetReport(ctx, reps[0].ID); err != nil {
		t.Fatalf("GetReport(%d): %v", reps[0].ID, err)
	}
}

func TestTypedErrors(t *testing.T) {
	c := client.New(hostURL)
	ctx := context.Background()
	cases := []struct {
		name    string
		call    func() error
		is      func(error) bool
		status  int
		message string
	}{
		{"a task that does not exist is not found", func() error { _, err := c.Get(ctx, "987654321"); return err },
			client.IsNotFound, 404, "no task with id 987654321"},
		{"an id that is no number is a bad request", func() error { _, err := c.Get(ctx, "abc"); return err },
			client.IsBadRequest, 400, "task id must be a positive whole number"},
		{"an unknown task is refused with the host's message", func() error {
			_, err := c.Submit(ctx, client.Task{Task: "no.such.task"})
			return err
		}, client.IsBadRequest, 400, `unknown task "no.such.task"`},
		{"a bad state filter is a bad request", func() error { _, err := c.List(ctx, client.Filter{State: "sleeping"}); return err },
			client.IsBadRequest, 400, `unknown state "sleeping"`},
		{"a schedule that does not exist is not found", func() error { _, err := c.GetSchedule(ctx, "no-such-schedule"); return err },
			client.IsNotFound, 404, "no-such-schedule"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			var ae *client.APIError
			if !errors.As(err, &ae) || !tc.is(err) || ae.Status != tc.status || !strings.Contains(ae.Message, tc.message) {
				t.Fatalf("got %#v (%v); want an *APIError %d saying %q", err, err, tc.status, tc.message)
			}
			if errors.Is(err, client.ErrOutcomeUnknown) {
				t.Fatalf("%v: a refusal is not an unknown outcome", err)
			}
		})
	}
}

func TestWaitEndsWithTheContext(t *testing.T) {
	c := client.New(hostURL)
	ctx := context.Background()
	id, err := c.Submit(ctx, client.Task{Task: "demo.echo", DelaySeconds: 3600})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
	defer cancel()
	got, err := c.Wait(wctx, id)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait on a task delayed by an hour: %v; want the context's deadline", err)
	}
	if got.ID != id || got.State != client.StateQueued {
		t.Fatalf("Wait returned %+v; want the task as last read, queued", got)
	}
}

func TestListPages(t *testing.T) {
	c := client.New(hostURL)
	ctx := context.Background()
	var ids []string
	for i := range 5 {
		id, err := c.Submit(ctx, client.Task{Task: "demo.sleep", Payload: json.RawMessage(fmt.Sprintf(`{"seconds":%d}`, i)), DelaySeconds: 3600})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	slices.Reverse(ids) // newest first, as List gives them
	var seen []string
	f := client.Filter{Task: "demo.sleep", State: client.StateQueued, Limit: 2}
	for pages := 0; ; pages++ {
		p, err := c.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Tasks) > 2 || pages > 100 {
			t.Fatalf("page %d has %d tasks, or too many pages; limit 2", pages, len(p.Tasks))
		}
		for _, tk := range p.Tasks {
			if tk.Task != "demo.sleep" || tk.State != client.StateQueued {
				t.Fatalf("List with a filter gave %+v", tk)
			}
			if slices.Contains(ids, tk.ID) {
				seen = append(seen, tk.ID)
			}
		}
		if p.NextBefore == "" {
			break
		}
		f.Before = p.NextBefore
	}
	if !slices.Equal(seen, ids) {
		t.Fatalf("paging with NextBefore saw %v; want %v, newest first, each once", seen, ids)
	}
}

func TestSchedules(t *testing.T) {
	c := client.New(hostURL)
	ctx := context.Background()
	off := false
	spec := client.ScheduleSpec{Name: "client-test", Task: "demo.echo", Payload: json.RawMessage(`{}`), IntervalSeconds: 3600}
	s, err := c.CreateSchedule(ctx, spec)
	if err != nil || s.Name != spec.Name || !s.Enabled || s.Timing == "" || s.NextRun == nil || s.Source != "api" {
		t.Fatalf("CreateSchedule: %+v, %v", s, err)
	}
	// The list carries the next run as the single get does, also before
	// the first fire.
	list, err := c.Schedules(ctx)
	if i := slices.IndexFunc(list, func(l client.Schedule) bool { return l.Name == spec.Name }); err != nil || i < 0 || list[i].NextRun == nil || !list[i].NextRun.Equal(*s.NextRun) {
		t.Fatalf("Schedules: %+v, %v; want %s with next run %s", list, err, spec.Name, s.NextRun)
	}
	if _, err := c.CreateSchedule(ctx, spec); !client.IsConflict(err) {
		t.Fatalf("creating it again: %v; want a conflict", err)
	}
	spec.Enabled = &off
	if s, err = c.UpdateSchedule(ctx, spec); err != nil || s.Enabled || s.NextRun != nil {
		t.Fatalf("UpdateSchedule (disable): %+v, %v", s, err)
	}
	list, err = c.Schedules(ctx)
	if err != nil || !slices.ContainsFunc(list, func(s client.Schedule) bool { return s.Name == spec.Name && !s.Enabled && s.NextRun == nil }) {
		t.Fatalf("Schedules: %+v, %v", list, err)
	}
	if _, err := c.CreateSchedule(ctx, client.ScheduleSpec{Name: "bad", Task: "demo.echo"}); !client.IsBadRequest(err) || !strings.Contains(err.Error(), "interval") {
		t.Fatalf("a schedule without timing: %v; want a 400 that says so", err)
	}
	// A schedule of a task no worker runs is stored and waits for one.
	w, err := c.CreateSchedule(ctx, client.ScheduleSpec{Name: "client-test-waiting", Task: "images.resize", IntervalSeconds: 3600})
	if err != nil || w.Waiting == nil || !strings.Contains(w.Waiting.Why, `no live worker runs task "images.resize"`) {
		t.Fatalf("CreateSchedule of a task no worker runs: %+v, %v; want it waiting, saying why", w, err)
	}
	if err := c.DeleteSchedule(ctx, w.Name); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSchedule(ctx, spec.Name); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSchedule(ctx, spec.Name); !client.IsNotFound(err) {
		t.Fatalf("deleting it again: %v; want not found", err)
	}
}

func TestTopicsPluginsReclaim(t *testing.T) {
	c := client.New(hostURL)
	ctx := context.Background()
	paused := true
	if err := c.SetTopic(ctx, "paused-by-client", client.TopicPatch{Paused: &paused}); err != nil {
		t.Fatal(err)
	}
	topics, err := c.Topics(ctx)
	if err != nil || !slices.ContainsFunc(topics, func(tp client.Topic) bool { return tp.Name == "paused-by-client" && tp.Paused }) {
		t.Fatalf("Topics after pausing one: %+v, %v", topics, err)
	}
	plugins, err := c.Plugins(ctx)
	if err != nil || !slices.ContainsFunc(plugins, func(p client.Plugin) bool { return p.Name == "tasks_worker" && p.State == "running" && p.PID > 0 }) {
		t.Fatalf("Plugins: %+v, %v", plugins, err)
	}
	res, err := c.Reclaim(ctx)
	if err != nil || res.Message == "" {
		t.Fatalf("Reclaim: %+v, %v", res, err)
	}
	if _, err := c.Action(ctx, "tasks_worker", "no_such_action", nil); !client.IsNotFound(err) {
		t.Fatalf("an unknown action: %v; want not found", err)
	}
}
