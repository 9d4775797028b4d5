package tasksworker

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/capability"
)

// TestPluginSubmitsRecordTheirParent: tasks another plugin submits are
// queued all or none, each recorded with the plugin that submitted it and
// its parent, shown by the API and the task's page.
func TestPluginSubmitsRecordTheirParent(t *testing.T) {
	f := start(t, nil)
	parent := f.submit(`{"task": "demo.echo", "payload": {"i": "parent"}}`)
	ctx := context.Background()
	got, err := f.plugin.SubmitTasks(ctx, "greeter", []capability.TaskSubmission{
		{Task: "demo.echo", Payload: json.RawMessage(`{"i": 1}`), ParentTaskID: parent},
		{Task: "demo.echo", Payload: json.RawMessage(`{"i": 2}`), ParentTaskID: parent, Priority: 3},
	})
	if err != nil || len(got) != 2 {
		t.Fatalf("SubmitTasks = %+v, %v", got, err)
	}
	for _, s := range got {
		m := f.waitState(s.ID, "done")
		if m["parent_task_id"] != parent || m["submitted_by"] != "plugin:greeter" {
			t.Fatalf("task %s: parent %v, submitted by %v; want %s and plugin:greeter", s.ID, m["parent_task_id"], m["submitted_by"], parent)
		}
	}
	mustContain(t, "a child's page", f.uiGet("/ui/tasks/"+got[0].ID), `id="parent" href="`+uiTestPrefix+`/ui/tasks/`+parent+`"`, `<code id="submitted-by">plugin:greeter</code>`)
	if m := f.apiJSON("/api/tasks/" + parent); m["parent_task_id"] != nil || m["submitted_by"] != nil {
		t.Fatalf("a task submitted through the API shows parent %v, submitted by %v; want neither", m["parent_task_id"], m["submitted_by"])
	}
}

// TestPluginSubmitsAreAllOrNone: one refused task refuses the batch, with
// an error naming it, and nothing is queued.
func TestPluginSubmitsAreAllOrNone(t *testing.T) {
	f := start(t, nil)
	ctx := context.Background()
	before := len(f.apiJSON("/api/tasks")["tasks"].([]any))
	for _, c := range []struct {
		name string
		subs []capability.TaskSubmission
		want string
	}{
		{"an unknown task", []capability.TaskSubmission{{Task: "demo.echo"}, {Task: "no.such"}}, "task 2 (no.such)"},
		{"a parent that is no task id", []capability.TaskSubmission{{Task: "demo.echo", ParentTaskID: "abc"}}, `parent_task_id "abc" is not a task id`},
		{"a delay and a run_at", []capability.TaskSubmission{{Task: "demo.echo", Delay: time.Second, RunAt: time.Now()}}, "not both"},
		{"a payload that is not JSON", []capability.TaskSubmission{{Task: "demo.echo", Payload: json.RawMessage(`{`)}}, "payload"},
		{"nothing", nil, "no task to submit"},
	} {
		_, err := f.plugin.SubmitTasks(ctx, "greeter", c.subs)
		var bad *capability.InvalidArgumentError
		if !errors.As(err, &bad) || !strings.Contains(bad.Msg, c.want) {
			t.Errorf("%s: err = %v; want an InvalidArgumentError saying %q", c.name, err, c.want)
		}
	}
	if after := len(f.apiJSON("/api/tasks")["tasks"].([]any)); after != before {
		t.Fatalf("%d tasks after refused submits, %d before", after, before)
	}
}

// TestPluginSubmitsBeforeTheTaskSystemRuns are unavailable.
func TestPluginSubmitsBeforeTheTaskSystemRuns(t *testing.T) {
	p := New(nil)
	_, err := p.SubmitTasks(context.Background(), "greeter", []capability.TaskSubmission{{Task: "demo.echo"}})
	if !errors.Is(err, capability.ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable", err)
	}
}
