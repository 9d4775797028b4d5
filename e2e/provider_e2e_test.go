package e2e

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker/local"
)

type taskView struct {
	ID       string          `json:"id"`
	State    string          `json:"state"`
	Attempts int             `json:"attempts"`
	Result   json.RawMessage `json:"result"`
	Error    string          `json:"error"`
}

func submitTask(t *testing.T, h *hostProc, body string) string {
	t.Helper()
	resp, err := http.Post(h.base+"/plugin-pkg/tasks_worker/api/tasks", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		ID    string `json:"id"`
		Error string `json:"error"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&out)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("submit %s: %d %s", body, resp.StatusCode, out.Error)
	}
	return out.ID
}

// submitOnceRegistered submits body, retrying while tasks_worker has not
// registered task (a provider's tasks come within a refresh), and returns
// the new task's id.
func submitOnceRegistered(t *testing.T, h *hostProc, task, body string) string {
	t.Helper()
	var id string
	waitFor(t, 60*time.Second, task+" is accepted", func() bool {
		resp, err := http.Post(h.base+"/plugin-pkg/tasks_worker/api/tasks", "application/json", strings.NewReader(body))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var out struct {
			ID string `json:"id"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&out)
		id = out.ID
		return resp.StatusCode == http.StatusCreated
	})
	return id
}

func taskState(t *testing.T, h *hostProc, id string) taskView {
	t.Helper()
	var v taskView
	_, body := get(t, h.base+"/plugin-pkg/tasks_worker/api/tasks/"+id)
	_ = json.Unmarshal([]byte(body), &v)
	return v
}

// TestTasksFromAnotherPlugin: the example plugin's tasks run through the
// host; when the provider dies mid-task, that attempt fails with a clear
// error and the normal retry rules bring it to completion once the host
// has restarted the provider.
func TestTasksFromAnotherPlugin(t *testing.T) {
	h := startHost(t, `
listen: LISTEN
plugins_dir: PLUGINS
plugins:
  tasks_worker:
    enabled: true
    config: {broker: memory, workers: 2}
  example:
    enabled: true
`)
	h.waitState(t, "tasks_worker", "running", 30*time.Second)
	ex := h.waitState(t, "example", "running", 30*time.Second)

	// The provider's tasks are registered within a refresh.
	id := submitOnceRegistered(t, h, "example.greet", `{"task": "example.greet", "payload": {"name": "Ada"}}`)
	var v taskView
	waitFor(t, 60*time.Second, "example.greet is done", func() bool {
		v = taskState(t, h, id)
		return v.State == "done"
	})
	if string(v.Result) != `{"greeting":"hello, Ada"}` {
		t.Fatalf("result = %s", v.Result)
	}

	id = submitTask(t, h, `{"task": "example.count", "payload": {"to": 30, "step_ms": 100}}`)
	waitFor(t, 60*time.Second, "example.count runs", func() bool { return taskState(t, h, id).State == "running" })
	time.Sleep(300 * time.Millisecond)
	if err := syscall.Kill(ex.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "example.count completes after its provider came back", func() bool {
		v = taskState(t, h, id)
		return v.State == "done"
	})
	if v.Attempts < 2 || string(v.Result) != `{"counted":30}` {
		t.Fatalf("after the provider's death: attempts %d, result %s", v.Attempts, v.Result)
	}
	_, body := get(t, h.base+"/plugin-pkg/tasks_worker/api/reports?message_id="+id)
	var reps struct {
		Reports []struct {
			Status string   `json:"status"`
			Error  string   `json:"error"`
			Logs   []string `json:"logs"`
		} `json:"reports"`
	}
	_ = json.Unmarshal([]byte(body), &reps)
	var failed, success bool
	for _, r := range reps.Reports {
		if r.Status == "failed" && strings.Contains(r.Error, "example") {
			failed = true
		}
		if r.Status == "success" && len(r.Logs) > 0 {
			success = true
		}
	}
	if !failed || !success {
		t.Fatalf("reports do not show a failed attempt naming the provider and a successful one with its log: %s", body)
	}
}

// TestSIGTERMDrainsProvidedTasks: a deploy (SIGTERM to the host) while a
// task runs in another plugin. The host stops tasks_worker first and the
// task providers after it, so the running task finishes in its provider
// while tasks_worker drains: it ends done, in one attempt. Before, every
// plugin was stopped at once and the task failed for good ("plugin not
// running") with its only attempt.
func TestSIGTERMDrainsProvidedTasks(t *testing.T) {
	dataDir := t.TempDir()
	h := startHost(t, `
listen: LISTEN
plugins_dir: PLUGINS
shutdown_timeout_seconds: 30
plugins:
  tasks_worker:
    enabled: true
    config: {broker: local, data_dir: `+dataDir+`, workers: 2, drain_timeout_seconds: 20}
  example:
    enabled: true
`)
	h.waitState(t, "tasks_worker", "running", 30*time.Second)
	h.waitState(t, "example", "running", 30*time.Second)
	id := submitOnceRegistered(t, h, "example.count", `{"task": "example.count", "payload": {"to": 20, "step_ms": 100}, "max_attempts": 1}`)
	waitFor(t, 60*time.Second, "example.count runs", func() bool { return taskState(t, h, id).State == "running" })
	h.sigterm(t)

	b, err := local.Open(t.Context(), local.Options{Path: filepath.Join(dataDir, "taskhost.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	n, _ := strconv.ParseInt(id, 10, 64)
	m, err := b.GetMessage(t.Context(), n)
	if err != nil {
		t.Fatal(err)
	}
	if m.State != "done" || m.Attempts != 1 || string(m.Result) != `{"counted":20}` {
		t.Fatalf("the task running at SIGTERM: state %s, attempts %d, result %s, last error %q; want done in one attempt",
			m.State, m.Attempts, m.Result, m.LastError)
	}
}

// TestScheduleOfATaskOnlyAnotherHostRuns: two hosts share a PostgreSQL
// broker; only host A runs the example plugin, and only host B may lead
// the beat (A has beat: false, so a lease B loses on a loaded machine
// cannot pass to A).
// A schedule of example.greet, created through A, fires from B's beat and
// runs on A. (The leader used to look the task up in its own registry
// alone: it stamped every slot and submitted nothing, with every gauge
// green.)
func TestScheduleOfATaskOnlyAnotherHostRuns(t *testing.T) {
	schema := pgSchema(t)
	b := startHost(t, twConfig(schema, twOpts{}))
	waitFor(t, 30*time.Second, "host B to lead the beat", func() bool {
		h, err := b.health()
		return err == nil && h.Beat.Leader
	})
	a := startHost(t, twConfig(schema, twOpts{noBeat: true})+"  example:\n    enabled: true\n")
	waitFor(t, 60*time.Second, "the schedule of example.greet to be accepted by host A", func() bool {
		_, err := call("POST", a.api("/schedules"), map[string]any{
			"name": "greet", "task": "example.greet", "payload": map[string]any{"name": "Bob"}, "interval_seconds": 1,
		}, nil)
		return err == nil
	})
	var reports struct {
		Reports []struct {
			Status string `json:"status"`
			Worker string `json:"worker"`
		} `json:"reports"`
	}
	waitFor(t, 30*time.Second, "a successful run of the schedule", func() bool {
		_, err := call("GET", a.api("/reports?schedule=greet&status=success"), nil, &reports)
		return err == nil && len(reports.Reports) > 0
	})
	ah, err := a.health()
	if err != nil || ah.Beat.Candidate || ah.Beat.Leader {
		t.Fatalf("host A's beat: %+v, %v; want no candidate, so that only B's beat fired the schedule", ah.Beat, err)
	}
	if reports.Reports[0].Worker != ah.WorkerID {
		t.Fatalf("the schedule ran on worker %q, want host A's %q (%v)", reports.Reports[0].Worker, ah.WorkerID, err)
	}

	// Host B takes a submit of the task it does not run when the request
	// names the topic, and the task runs on A; without a topic B cannot
	// know the task's own, and says so.
	if _, err := call("POST", b.api("/tasks"), map[string]any{"task": "example.greet", "payload": map[string]any{"name": "Eve"}}, nil); err == nil ||
		!strings.Contains(err.Error(), "name its topic in the request") {
		t.Errorf("submit through B without a topic: %v, want a 400 asking for the topic", err)
	}
	id, err := b.submit("example.greet", "default", map[string]any{"name": "Eve"})
	if err != nil {
		t.Fatalf("submit through B with its topic: %v", err)
	}
	if m := b.waitTask(t, id, 90*time.Second, "done", func(m twTask) bool { return m.State == "done" }); m.claimer() != ah.WorkerID {
		t.Errorf("the task submitted through B ran on %q, want host A's %q", m.claimer(), ah.WorkerID)
	}

	// Host B can also change that schedule, and make one of its own for
	// the task, naming the topic.
	if _, err := call("PUT", b.api("/schedules/greet"), map[string]any{
		"task": "example.greet", "topic": "default", "payload": map[string]any{"name": "Bob"}, "interval_seconds": 1, "enabled": false,
	}, nil); err != nil {
		t.Errorf("disable the schedule through B: %v", err)
	}
	if _, err := call("POST", b.api("/schedules"), map[string]any{
		"name": "greet2", "task": "example.greet", "topic": "default", "interval_seconds": 3600,
	}, nil); err != nil {
		t.Errorf("create a schedule of a task only A runs through B: %v", err)
	}
}
