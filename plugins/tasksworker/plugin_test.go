package tasksworker

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/capabilitytest"
)

func TestDescribe(t *testing.T) {
	c := capabilitytest.Connect(t, New(nil))
	d, err := c.Describe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != "tasks_worker" {
		t.Errorf("name = %q", d.Name)
	}
	for _, want := range []capability.Capability{capability.Lifecycles, capability.Metrics, capability.HTTP, capability.Actions} {
		if !d.Has(want) {
			t.Errorf("capabilities %v lack %s", d.Capabilities, want)
		}
	}
}

func TestEchoRunsAndStoresItsPayloadAsResult(t *testing.T) {
	f := start(t, nil)
	payload := map[string]any{"hello": "world", "n": 3.0, "list": []any{1.0, "two"}}
	body, _ := json.Marshal(map[string]any{"task": "demo.echo", "payload": payload})
	id := f.submit(string(body))
	got := f.waitState(id, "done")
	if !jsonEqual(t, got["result"], payload) {
		t.Errorf("result = %v, want %v", got["result"], payload)
	}
	for _, key := range []string{"id", "task", "topic", "state", "attempts", "max_attempts", "created_at", "claimed_by", "claimed_at", "finished_at", "result", "error"} {
		if _, ok := got[key]; !ok {
			t.Errorf("GET /api/tasks/%s lacks %q: %v", id, key, got)
		}
	}
	if got["id"] != id || got["task"] != "demo.echo" || got["topic"] != "default" || got["attempts"] != 1.0 || got["error"] != nil || got["finished_at"] == nil {
		t.Errorf("task = %v", got)
	}
}

func TestFailEndsDeadWithItsError(t *testing.T) {
	f := start(t, nil)
	id := f.submit(`{"task": "demo.fail"}`)
	got := f.waitState(id, "dead")
	if got["error"] != "demo.fail always fails" {
		t.Errorf("error = %v", got["error"])
	}
}

func TestMaxAttemptsRetries(t *testing.T) {
	f := start(t, nil)
	// The default backoff is 1s: two attempts take about a second.
	id := f.submit(`{"task": "demo.fail", "max_attempts": 2}`)
	got := f.waitState(id, "dead")
	if got["attempts"] != 2.0 || got["max_attempts"] != 2.0 {
		t.Errorf("attempts %v of %v, want 2 of 2", got["attempts"], got["max_attempts"])
	}
}

func TestSleepBadPayloadFails(t *testing.T) {
	f := start(t, nil)
	for _, payload := range []string{`{"seconds": -1}`, `{"seconds": 3601}`, `{"secs": 1}`, `[]`} {
		id := f.submit(`{"task": "demo.sleep", "payload": ` + payload + `}`)
		got := f.waitState(id, "dead")
		if msg, _ := got["error"].(string); !strings.HasPrefix(msg, "demo.sleep: ") {
			t.Errorf("payload %s: error %q", payload, msg)
		}
	}
	id := f.submit(`{"task": "demo.sleep", "payload": {"seconds": 0.01}}`)
	if got := f.waitState(id, "done"); !jsonEqual(t, got["result"], map[string]any{"slept_seconds": 0.01}) {
		t.Errorf("result = %v", got["result"])
	}
}

func TestBadRequestsAre400AndStoreNothing(t *testing.T) {
	f := start(t, map[string]any{"max_payload_bytes": 100})
	big := `{"task": "demo.echo", "payload": {"x": "` + strings.Repeat("a", 200) + `"}}`
	cases := []struct {
		name, method, path, body, wantInError string
	}{
		{"bad JSON", "POST", "/api/tasks", `{"task": "demo.echo",`, "not valid JSON"},
		{"not an object", "POST", "/api/tasks", `["demo.echo"]`, "must be a JSON object"},
		{"empty body", "POST", "/api/tasks", ``, "empty"},
		{"unknown task", "POST", "/api/tasks", `{"task": "no.such.task"}`, `unknown task "no.such.task"`},
		{"missing task", "POST", "/api/tasks", `{"payload": {}}`, "task is required"},
		{"unknown field", "POST", "/api/tasks", `{"task": "demo.echo", "colour": 9}`, `unknown field "colour"`},
		{"wrong type", "POST", "/api/tasks", `{"task": "demo.echo", "delay_seconds": "soon"}`, `"delay_seconds" must be a JSON number`},
		{"fraction for a whole number", "POST", "/api/tasks", `{"task": "demo.echo", "max_attempts": 0.5}`, `"max_attempts" must be a JSON whole number (within range), got number 0.5`},
		{"whole number out of range", "POST", "/api/tasks", `{"task": "demo.echo", "max_attempts": 1e20}`, `"max_attempts" must be a JSON whole number (within range)`},
		{"two values", "POST", "/api/tasks", `{"task": "demo.echo"} {}`, "more than one JSON value"},
		{"task named twice", "POST", "/api/tasks", `{"task": "demo.echo", "task": "demo.fail"}`, `key "task" appears twice`},
		{"payload key twice", "POST", "/api/tasks", `{"task": "demo.echo", "payload": {"a": {"b": 1, "b": 2}}}`, `key "payload.a.b" appears twice`},
		{"payload key twice in a list", "POST", "/api/tasks", `{"task": "demo.echo", "payload": [{"a": 1}, {"a": 1, "a": 2}]}`, `key "payload[].a" appears twice`},
		{"field in another case", "POST", "/api/tasks", `{"Task": "demo.echo"}`, `unknown field "Task"`},
		{"payload too big", "POST", "/api/tasks", big, "the limit is 100"},
		{"NUL in the payload", "POST", "/api/tasks", `{"task": "demo.echo", "payload": {"s": "a\u0000"}}`, "NUL"},
		{"body over the limit", "POST", "/api/tasks", `{"task": "demo.echo", "payload": "` + strings.Repeat("a", 70<<10) + `"}`, "over"},
		{"negative delay", "POST", "/api/tasks", `{"task": "demo.echo", "delay_seconds": -1}`, "delay_seconds"},
		{"negative max attempts", "POST", "/api/tasks", `{"task": "demo.echo", "max_attempts": -1}`, "max_attempts"},
		{"topic nobody serves", "POST", "/api/tasks", `{"task": "demo.echo", "topic": "nowhere"}`, `topic "nowhere" is not served`},
		{"negative limit in PUT topics", "PUT", "/api/topics/default", `{"concurrency_limit": -1}`, "concurrency_limit"},
		{"unknown field in PUT topics", "PUT", "/api/topics/default", `{"limit": 1}`, `unknown field "limit"`},
		{"bad state filter", "GET", "/api/tasks?state=sleeping", ``, `unknown state "sleeping"`},
		{"bad limit", "GET", "/api/tasks?limit=0", ``, "limit"},
		{"bad before", "GET", "/api/tasks?before=x", ``, "before"},
		{"non-numeric id", "GET", "/api/tasks/abc", ``, "task id must be"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := f.do(tc.method, tc.path, tc.body)
			if res.status != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %s", res.status, res.body)
			}
			msg, _ := res.json(t)["error"].(string)
			if !strings.Contains(msg, tc.wantInError) {
				t.Errorf("error %q does not say %q", msg, tc.wantInError)
			}
		})
	}
	list := f.do("GET", "/api/tasks", "").json(t)
	if tasks, _ := list["tasks"].([]any); len(tasks) != 0 {
		t.Errorf("bad requests stored tasks: %v", tasks)
	}
	topics := f.do("GET", "/api/topics", "").json(t)["topics"].([]any)
	for _, tp := range topics {
		if m := tp.(map[string]any); m["concurrency_limit"] != 0.0 {
			t.Errorf("a refused PUT changed topic %v", m)
		}
	}
}

func TestUnknownTaskID(t *testing.T) {
	f := start(t, nil)
	res := f.do("GET", "/api/tasks/12345", "")
	if res.status != http.StatusNotFound {
		t.Fatalf("status %d, want 404", res.status)
	}
	if msg, _ := res.json(t)["error"].(string); !strings.Contains(msg, "no task with id 12345") {
		t.Errorf("error = %q", msg)
	}
	if res := f.do("GET", "/api/nothing", ""); res.status != http.StatusNotFound || res.json(t)["error"] == nil {
		t.Errorf("unknown route: %d %s", res.status, res.body)
	}
	if res := f.do("DELETE", "/api/tasks", ""); res.status != http.StatusMethodNotAllowed || res.json(t)["error"] == nil {
		t.Errorf("wrong method: %d %s", res.status, res.body)
	}
	id := f.submit(`{"task": "demo.echo"}`)
	for _, raw := range []string{"+" + id, "0" + id, " " + id} {
		if res := f.do("GET", "/api/tasks/"+url.PathEscape(raw), ""); res.status != http.StatusBadRequest {
			t.Errorf("GET tasks/%q: %d %s, want 400: ids are written plainly", raw, res.status, res.body)
		}
	}
	if res := f.do("HEAD", "/api/tasks/"+id, ""); res.status != http.StatusOK {
		t.Errorf("HEAD tasks/%s: %d, want 200 as GET", id, res.status)
	}
	for _, page := range []string{"/ui/", "/ui/tasks"} {
		if res := f.uiRequest("HEAD", page, nil, nil); res.status != http.StatusOK {
			t.Errorf("HEAD %s: %d, want 200 as GET", page, res.status)
		}
	}
}

func TestListTasksFiltersAndPages(t *testing.T) {
	f := start(t, map[string]any{"topics": map[string]any{"slow": map[string]any{"paused": true}}})
	var ids []string
	for range 5 {
		ids = append(ids, f.submit(`{"task": "demo.echo", "topic": "slow"}`))
	}
	failed := f.submit(`{"task": "demo.fail"}`)
	f.waitState(failed, "dead")

	page := f.do("GET", "/api/tasks?topic=slow&limit=3", "").json(t)
	tasks := page["tasks"].([]any)
	if len(tasks) != 3 || tasks[0].(map[string]any)["id"] != ids[4] || page["next_before"] != ids[2] {
		t.Fatalf("first page = %v", page)
	}
	page = f.do("GET", "/api/tasks?topic=slow&limit=3&before="+ids[2], "").json(t)
	if tasks := page["tasks"].([]any); len(tasks) != 2 || page["next_before"] != nil {
		t.Fatalf("second page = %v", page)
	}
	dead := f.do("GET", "/api/tasks?state=dead", "").json(t)["tasks"].([]any)
	if len(dead) != 1 || dead[0].(map[string]any)["id"] != failed {
		t.Errorf("state=dead lists %v", dead)
	}
	byTask := f.do("GET", "/api/tasks?task=demo.echo&state=queued", "").json(t)["tasks"].([]any)
	if len(byTask) != 5 {
		t.Errorf("task=demo.echo&state=queued lists %d", len(byTask))
	}
}

func TestTopicsWorkersLocksHealth(t *testing.T) {
	f := start(t, map[string]any{"workers": 3, "topics": map[string]any{"reports": map[string]any{"concurrency_limit": 2, "dead_letter_enabled": false}}})

	res := f.do("PUT", "/api/topics/reports", `{"paused": true}`)
	if res.status != http.StatusOK {
		t.Fatalf("PUT topic: %d %s", res.status, res.body)
	}
	want := map[string]any{"name": "reports", "concurrency_limit": 2.0, "dead_letter_enabled": false, "paused": true}
	if got := res.json(t); !jsonEqual(t, got, want) {
		t.Errorf("PUT answered %v, want %v", got, want)
	}
	f.submit(`{"task": "demo.echo", "topic": "reports"}`)

	var reports map[string]any
	for _, tp := range f.do("GET", "/api/topics", "").json(t)["topics"].([]any) {
		if m := tp.(map[string]any); m["name"] == "reports" {
			reports = m
		}
	}
	wantTopic := map[string]any{
		"name": "reports", "queued": 1.0, "running": 0.0, "dead_letter": 0.0, "subscribers": 1.0,
		"concurrency_limit": 2.0, "dead_letter_enabled": false, "paused": true, "oldest_claim_seconds": 0.0,
	}
	if !jsonEqual(t, reports, wantTopic) {
		t.Errorf("topic = %v, want %v", reports, wantTopic)
	}

	ws := f.do("GET", "/api/workers", "").json(t)["workers"].([]any)
	if len(ws) != 1 || ws[0].(map[string]any)["capacity"] != 3.0 {
		t.Errorf("workers = %v", ws)
	}
	if locks := f.do("GET", "/api/locks", "").json(t)["locks"].([]any); len(locks) != 0 {
		t.Errorf("locks = %v", locks)
	}
	h := f.do("GET", "/api/health", "").json(t)
	if h["status"] != "ok" || h["broker"] != "memory" || h["concurrency"] != 3.0 {
		t.Errorf("health = %v", h)
	}
	health, err := f.client.CheckHealth(context.Background())
	if err != nil || health.Status != capability.HealthOK || !strings.Contains(health.Message, "memory broker") {
		t.Errorf("CheckHealth = %+v, %v", health, err)
	}
}

func TestDemoCrashOnlyWithDemoTasks(t *testing.T) {
	f := start(t, nil)
	res := f.do("POST", "/api/tasks", `{"task": "demo.crash"}`)
	if res.status != http.StatusBadRequest || !strings.Contains(res.json(t)["error"].(string), `unknown task "demo.crash"`) {
		t.Errorf("demo.crash without demo_tasks: %d %s", res.status, res.body)
	}

	g := start(t, map[string]any{"demo_tasks": true})
	// Registered, but delayed so that it never runs in the test process.
	id := g.submit(`{"task": "demo.crash", "delay_seconds": 3600}`)
	if got := g.waitState(id, "queued"); got["task"] != "demo.crash" {
		t.Errorf("task = %v", got)
	}
}

func TestWatchdogTaskOnMemory(t *testing.T) {
	f := start(t, nil)
	id := f.submit(`{"task": "watchdog.reclaim_orphaned_messages"}`)
	got := f.waitState(id, "done")
	if !jsonEqual(t, got["result"], map[string]any{"reclaimed": 0.0, "dead_lettered": 0.0, "locks_released": 0.0, "within_grace": 0.0, "unsupported": true,
		"reason": "the memory broker cannot orphan anything: its messages and locks die with the process"}) {
		t.Errorf("result = %v", got["result"])
	}
}

func TestReclaimActionOnMemory(t *testing.T) {
	f := start(t, nil)
	actions, err := f.client.ListActions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(actions) != 1 || actions[0].ID != "reclaim_orphaned_messages" || actions[0].Title != "Reclaim orphaned messages now" ||
		!actions[0].Confirm || actions[0].TimeoutSeconds != 30 || actions[0].Description == "" {
		t.Errorf("actions = %+v", actions)
	}
	res, err := f.client.InvokeAction(context.Background(), capability.ActionRequest{ActionID: "reclaim_orphaned_messages", Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Message != "the memory broker cannot orphan anything: its messages and locks die with the process" {
		t.Errorf("message = %q", res.Message)
	}
	var got map[string]any
	if err := json.Unmarshal(res.Result, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"reclaimed": 0.0, "dead_lettered": 0.0, "locks_released": 0.0, "within_grace": 0.0, "unsupported": true,
		"reason": "the memory broker cannot orphan anything: its messages and locks die with the process"}
	if !jsonEqual(t, got, want) {
		t.Errorf("result = %v, want %v", got, want)
	}
	_, err = f.client.InvokeAction(context.Background(), capability.ActionRequest{ActionID: "format_disk"})
	if !errors.Is(err, capability.ErrNotFound) {
		t.Errorf("unknown action: %v, want ErrNotFound", err)
	}
}

func TestStopIsIdempotent(t *testing.T) {
	p := New(testLogger(t))
	if err := p.Stop(context.Background()); err != nil {
		t.Errorf("stop before configure: %v", err)
	}
	f := start(t, map[string]any{"drain_timeout_seconds": 0.05})
	id := f.submit(`{"task": "demo.sleep", "payload": {"seconds": 60}}`)
	f.waitState(id, "running")
	if err := f.client.Stop(context.Background()); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if err := f.client.Stop(context.Background()); err != nil {
		t.Errorf("second stop: %v", err)
	}
	if err := f.plugin.Stop(context.Background()); err != nil {
		t.Errorf("third stop: %v", err)
	}
	if h, _ := f.client.CheckHealth(context.Background()); h.Status != capability.HealthError {
		t.Errorf("health after stop = %+v", h)
	}
	res := f.do("GET", "/api/tasks/"+id, "")
	if res.status != http.StatusServiceUnavailable || res.json(t)["error"] == nil {
		t.Errorf("API after stop: %d %s", res.status, res.body)
	}
	if _, err := f.client.InvokeAction(context.Background(), capability.ActionRequest{ActionID: ActionReclaim}); !errors.Is(err, capability.ErrUnavailable) {
		t.Errorf("action after stop: %v", err)
	}
	if _, err := f.client.CollectMetrics(context.Background()); err != nil {
		t.Errorf("metrics after stop: %v", err)
	}
}

func TestConfigureAgainReplacesTheRuntime(t *testing.T) {
	f := start(t, map[string]any{"workers": 2})
	first := f.do("GET", "/api/health", "").json(t)["worker_id"]
	err := f.client.Configure(context.Background(), capability.ConfigureRequest{
		Config: json.RawMessage(`{"broker": "memory", "workers": 4, "drain_timeout_seconds": 0}`), Host: &capabilitytest.Host{},
	})
	if err != nil {
		t.Fatalf("configure again: %v", err)
	}
	h := f.do("GET", "/api/health", "").json(t)
	if h["worker_id"] == first || h["concurrency"] != 4.0 {
		t.Errorf("after reconfigure: %v (first worker %v)", h, first)
	}
	ws := f.do("GET", "/api/workers", "").json(t)["workers"].([]any)
	if len(ws) != 1 {
		t.Errorf("workers after reconfigure = %v", ws)
	}
	id := f.submit(`{"task": "demo.echo", "payload": 1}`)
	f.waitState(id, "done")
}

// TestPathNamesAreDecodedOnce: a topic or schedule name in the path is
// decoded exactly once, whether or not Go's URL parser kept the escaped
// form, so a name holding % or / reaches the broker as sent.
func TestPathNamesAreDecodedOnce(t *testing.T) {
	f := start(t, nil)
	for path, want := range map[string]string{
		"/api/topics/50%25off":  "50%off",
		"/api/topics/x%2541":    "x%41",
		"/api/topics/a%2Fb":     "a/b",
		"/api/topics/caf%C3%A9": "café",
	} {
		res := f.do("PUT", path, `{"paused": true}`)
		if res.status != http.StatusOK || res.json(t)["name"] != want {
			t.Errorf("PUT %s: %d %s; want 200 for topic %q", path, res.status, res.body, want)
		}
	}
	if res := f.do("DELETE", "/api/schedules/no%2541such", ""); res.status != http.StatusNotFound || !strings.Contains(string(res.body), "no%41such") {
		t.Errorf("DELETE an unknown schedule with %%25 in its name: %d %s; want 404 naming no%%41such", res.status, res.body)
	}
}

// TestStrictTopicNamesOnlyForNewTopics: a topic name with white space at
// its end is refused for a new topic, and still usable for one an earlier
// version stored.
func TestStrictTopicNamesOnlyForNewTopics(t *testing.T) {
	f := start(t, nil)
	if _, err := f.plugin.current().broker.SetTopic(context.Background(), "old ", broker.TopicPatch{}); err != nil {
		t.Fatal(err)
	}
	if res := f.do("PUT", "/api/topics/old%20", `{"paused": true}`); res.status != http.StatusOK {
		t.Errorf("PUT an existing topic named %q: %d %s, want 200", "old ", res.status, res.body)
	}
	if res := f.do("PUT", "/api/topics/new%20", `{"paused": true}`); res.status != http.StatusBadRequest || !strings.Contains(string(res.body), "white space") {
		t.Errorf("PUT a new topic named %q: %d %s, want 400 about the white space", "new ", res.status, res.body)
	}
	if res := f.do("POST", "/api/tasks", `{"task": "demo.echo", "topic": "new\u0001"}`); res.status != http.StatusBadRequest || !strings.Contains(string(res.body), "control character") {
		t.Errorf("submit to a topic holding a control character: %d %s, want 400", res.status, res.body)
	}
}
