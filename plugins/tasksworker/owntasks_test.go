package tasksworker

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/capabilitytest"
	"github.com/taskhost/taskhost/worker"
)

// TestOwnTasksRunBesideTheBuiltIns: a task registered with WithTasks runs
// in the plugin as a built-in one does, through the API.
func TestOwnTasksRunBesideTheBuiltIns(t *testing.T) {
	p := New(testLogger(t), WithTasks(func(reg *worker.Registry) error {
		return reg.Register(worker.Task{Name: "own.double", Handler: func(_ context.Context, tc *worker.TaskContext) (any, error) {
			var n int
			if err := json.Unmarshal(tc.Payload, &n); err != nil {
				return nil, err
			}
			return 2 * n, nil
		}})
	}))
	f := &fixture{t: t, plugin: p, client: capabilitytest.Start(t, p, map[string]any{"broker": "memory", "drain_timeout_seconds": 0}, nil)}
	id := f.submit(`{"task": "own.double", "payload": 21}`)
	f.waitState(id, "done")
	got := f.do("GET", "/api/tasks/"+id, "").json(t)
	if r, _ := json.Marshal(got["result"]); string(r) != "42" {
		t.Errorf("own.double(21): result %s, want 42 (the task: %v)", r, got)
	}
	echo := f.submit(`{"task": "demo.echo", "payload": 1}`)
	f.waitState(echo, "done")
}

// TestOwnTaskNamedAsABuiltInFailsTheStart: a program's task that takes a
// built-in task's name fails Configure, saying which and why, and no
// worker pool runs.
func TestOwnTaskNamedAsABuiltInFailsTheStart(t *testing.T) {
	p := New(testLogger(t), WithTasks(func(reg *worker.Registry) error {
		return reg.Register(worker.Task{Name: "demo.echo", Handler: func(context.Context, *worker.TaskContext) (any, error) { return nil, nil }})
	}))
	t.Cleanup(func() { _ = p.Stop(context.Background()) })
	c := capabilitytest.Connect(t, p)
	err := c.Configure(context.Background(), capability.ConfigureRequest{
		Config: json.RawMessage(`{"broker": "memory"}`), Host: &capabilitytest.Host{}, HostVersion: "test",
	})
	if err == nil {
		t.Fatal("Configure accepted a program's task named as the built-in demo.echo")
	}
	if !strings.Contains(err.Error(), "WithTasks") || !strings.Contains(err.Error(), "demo.echo") {
		t.Errorf("the error does not say what failed: %v", err)
	}
	if p.current() != nil {
		t.Error("a runtime runs after the failed start")
	}
}

// TestOwnTasksErrorFailsTheStart: the error a program's register returns
// fails Configure with it.
func TestOwnTasksErrorFailsTheStart(t *testing.T) {
	mine := errors.New("the mail server's address is not set")
	p := New(testLogger(t), WithTasks(func(*worker.Registry) error { return mine }))
	t.Cleanup(func() { _ = p.Stop(context.Background()) })
	c := capabilitytest.Connect(t, p)
	err := c.Configure(context.Background(), capability.ConfigureRequest{
		Config: json.RawMessage(`{"broker": "memory"}`), Host: &capabilitytest.Host{}, HostVersion: "test",
	})
	if err == nil || !strings.Contains(err.Error(), mine.Error()) {
		t.Errorf("Configure: %v; want the program's error %q", err, mine)
	}
}
