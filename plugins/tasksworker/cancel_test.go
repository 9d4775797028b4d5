package tasksworker

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/taskhost/taskhost/broker"
)

// runningElsewhere stores a demo.sleep task on a topic this process does
// not serve and claims it as another worker would: it stays running,
// whatever this process's pool does, until that worker ends it.
func (f *fixture) runningElsewhere() string {
	f.t.Helper()
	rt := f.plugin.current()
	if rt == nil {
		f.t.Fatal("the plugin is not running")
	}
	ctx := context.Background()
	id, err := rt.broker.Submit(ctx, broker.SubmitRequest{Topic: "elsewhere", Task: "demo.sleep"})
	if err != nil {
		f.t.Fatal(err)
	}
	ms, err := rt.broker.Claim(ctx, broker.ClaimRequest{WorkerID: "worker-elsewhere", Topics: []string{"elsewhere"}, Max: 1})
	if err != nil || len(ms) != 1 || ms[0].ID != id {
		f.t.Fatalf("claim as another worker = %v, %v", ms, err)
	}
	return strconv.FormatInt(id, 10)
}

// TestCancelAPI: POST /api/tasks/{id}/cancel answers 200 for a queued
// task (now cancelled), 202 for a running one (its cancel requested),
// 409 with the state for a finished one, 404 for an unknown one; POST
// /api/tasks/cancel cancels the queued tasks of a topic and/or task and
// counts them, refusing an empty filter. The cancelled counters count the
// queued ones cancelled.
func TestCancelAPI(t *testing.T) {
	f := start(t, nil)
	queued := f.submit(`{"task": "demo.echo", "delay_seconds": 3600}`)
	res := f.do("POST", "/api/tasks/"+queued+"/cancel", "")
	if res.status != http.StatusOK || !jsonEqual(t, res.json(t), map[string]any{"id": queued, "state": "cancelled"}) {
		t.Fatalf("cancel of a queued task: %d %s", res.status, res.body)
	}
	got := f.waitState(queued, "cancelled")
	if got["finished_at"] == nil || got["error"] != "cancelled" {
		t.Fatalf("the cancelled task reads %v", got)
	}
	res = f.do("POST", "/api/tasks/"+queued+"/cancel", "")
	if m := res.json(t); res.status != http.StatusConflict || m["state"] != "cancelled" || !strings.Contains(m["error"].(string), "already finished") {
		t.Fatalf("second cancel: %d %s; want 409 with the state", res.status, res.body)
	}
	done := f.submit(`{"task": "demo.echo"}`)
	f.waitState(done, "done")
	if res := f.do("POST", "/api/tasks/"+done+"/cancel", ""); res.status != http.StatusConflict || res.json(t)["state"] != "done" {
		t.Fatalf("cancel of a done task: %d %s; want 409 with state done", res.status, res.body)
	}
	if res := f.do("POST", "/api/tasks/987654/cancel", ""); res.status != http.StatusNotFound {
		t.Fatalf("cancel of an unknown task: %d %s", res.status, res.body)
	}
	if res := f.do("POST", "/api/tasks/x1/cancel", ""); res.status != http.StatusBadRequest {
		t.Fatalf("cancel of a bad id: %d %s", res.status, res.body)
	}

	running := f.runningElsewhere()
	res = f.do("POST", "/api/tasks/"+running+"/cancel", "")
	if res.status != http.StatusAccepted || !jsonEqual(t, res.json(t), map[string]any{"id": running, "state": "running", "cancel_requested": true}) {
		t.Fatalf("cancel of a running task: %d %s", res.status, res.body)
	}
	if m := f.apiJSON("/api/tasks/" + running); m["cancel_requested_at"] == nil {
		t.Fatalf("the running task after its cancel: %v; want cancel_requested_at", m)
	}

	for body, want := range map[string]string{
		`{}`:                  "name a topic or a task",
		`{"topic": ""}`:       "name a topic or a task",
		`{"state": "queued"}`: `unknown field \"state\"`,
		`[]`:                  "must be a JSON object",
	} {
		res := f.do("POST", "/api/tasks/cancel", body)
		if res.status != http.StatusBadRequest || !strings.Contains(string(res.body), want) {
			t.Errorf("POST tasks/cancel %s: %d %s; want 400 saying %q", body, res.status, res.body, want)
		}
	}
	for range 3 {
		f.submit(`{"task": "demo.sleep", "payload": {"seconds": 1}, "delay_seconds": 3600}`)
	}
	f.submit(`{"task": "demo.echo", "delay_seconds": 3600}`)
	res = f.do("POST", "/api/tasks/cancel", `{"topic": "default", "task": "demo.sleep"}`)
	if res.status != http.StatusOK || !jsonEqual(t, res.json(t), map[string]any{"cancelled": 3}) {
		t.Fatalf("cancel of the queued demo.sleep tasks: %d %s", res.status, res.body)
	}
	res = f.do("POST", "/api/tasks/cancel", `{"task": "demo.echo"}`)
	if res.status != http.StatusOK || !jsonEqual(t, res.json(t), map[string]any{"cancelled": 1}) {
		t.Fatalf("cancel of the queued demo.echo tasks: %d %s", res.status, res.body)
	}
	if m := f.apiJSON("/api/tasks/" + running); m["state"] != "running" {
		t.Fatalf("the running task after the cancels by filter: %v", m["state"])
	}
	list := f.apiJSON("/api/tasks?state=cancelled")
	if tasks, _ := list["tasks"].([]any); len(tasks) != 5 {
		t.Fatalf("cancelled tasks listed: %d, want 5: %v", len(tasks), list)
	}

	fams := f.scrape()
	if v := value(fams, "fastpluggy_tasks_cancelled_total"); v != 5 {
		t.Errorf("fastpluggy_tasks_cancelled_total = %v, want 5", v)
	}
	if v := value(fams, "fastpluggy_tasks_cancelled_per_topic_total", "topic", "default"); v != 5 {
		t.Errorf("fastpluggy_tasks_cancelled_per_topic_total{topic=default} = %v, want 5", v)
	}
}

// TestUICancel: the task page of a queued or running task has a Cancel
// form, posted with the page's token; the list filters offer the state.
func TestUICancel(t *testing.T) {
	f := start(t, nil)
	queued := f.submit(`{"task": "demo.echo", "delay_seconds": 3600}`)
	page := f.uiGet("/ui/tasks/" + queued)
	mustContain(t, "queued task page", page, `id="cancel"`, `/ui/tasks/`+queued+`/cancel"`)

	// Without the form token nothing happens.
	res := f.uiRequest("POST", "/ui/tasks/"+queued+"/cancel", url.Values{}, http.Header{"Origin": {"http://" + uiTestHost}})
	if res.status != http.StatusForbidden {
		t.Fatalf("cancel without a token: %d, want 403", res.status)
	}
	if m := f.apiJSON("/api/tasks/" + queued); m["state"] != "queued" {
		t.Fatalf("a refused cancel changed the task: %v", m["state"])
	}

	if got := flashOf(f.follow(f.uiPost("/ui/tasks/"+queued+"/cancel", nil))); got != "Task "+queued+" is cancelled." {
		t.Fatalf("flash %q", got)
	}
	page = f.uiGet("/ui/tasks/" + queued)
	mustContain(t, "cancelled task page", page, `id="state">cancelled`, `badge st-cancelled`)
	if strings.Contains(page.body, `id="cancel"`) {
		t.Fatal("a cancelled task still offers Cancel")
	}
	if got := flashOf(f.follow(f.uiPost("/ui/tasks/"+queued+"/cancel", nil))); !strings.Contains(got, "already finished (cancelled)") {
		t.Fatalf("cancel of a cancelled task: flash %q", got)
	}

	running := f.runningElsewhere()
	mustContain(t, "running task page", f.uiGet("/ui/tasks/"+running), `id="cancel"`)
	if got := flashOf(f.follow(f.uiPost("/ui/tasks/"+running+"/cancel", nil))); !strings.Contains(got, "is asked to stop") {
		t.Fatalf("cancel of a running task: flash %q", got)
	}
	page = f.uiGet("/ui/tasks/" + running)
	mustContain(t, "running task page after the request", page, `id="cancel-requested"`)
	if strings.Contains(page.body, `id="cancel"`) {
		t.Fatal("a task whose cancel is requested still offers Cancel")
	}

	mustContain(t, "running list", f.uiGet("/ui/running"), `>cancelling</span>`)
	mustContain(t, "tasks list", f.uiGet("/ui/tasks?state=cancelled"), `<option selected>cancelled</option>`, "/ui/tasks/"+queued)
}
