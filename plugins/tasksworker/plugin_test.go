package tasksworker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/capabilitytest"
)

func testLogger(t *testing.T) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "tasks_worker", Level: hclog.Warn, Output: testWriter{t}})
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// fixture is a configured plugin behind the in-process gRPC harness.
type fixture struct {
	t      *testing.T
	plugin *Plugin
	client *capability.Client
}

func start(t *testing.T, config map[string]any) *fixture {
	t.Helper()
	p := New(testLogger(t))
	if config == nil {
		config = map[string]any{}
	}
	if _, ok := config["broker"]; !ok {
		config["broker"] = "memory"
	}
	if _, ok := config["drain_timeout_seconds"]; !ok {
		config["drain_timeout_seconds"] = 0 // tests end with tasks still sleeping
	}
	c := capabilitytest.Start(t, p, config, nil)
	return &fixture{t: t, plugin: p, client: c}
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("response is not a JSON object: %v: %s", err, r.body)
	}
	return m
}

// do sends an HTTP request through the plugin's HTTP capability.
func (f *fixture) do(method, target, body string) response {
	f.t.Helper()
	path, query, _ := strings.Cut(target, "?")
	var res response
	var buf bytes.Buffer
	err := f.client.ProxyHTTP(context.Background(), capability.ProxyRequest{
		Method: method, Path: path, RawQuery: query, Body: []byte(body),
		Header: http.Header{"Content-Type": {"application/json"}},
	}, func(status int, h http.Header) {
		res.status, res.header = status, h
	}, func(b []byte) error {
		buf.Write(b)
		return nil
	})
	if err != nil {
		f.t.Fatalf("%s %s: %v", method, target, err)
	}
	res.body = buf.Bytes()
	if ct := res.header.Get("Content-Type"); ct != "application/json" {
		f.t.Errorf("%s %s: Content-Type %q, want application/json", method, target, ct)
	}
	return res
}

// submit posts a task and returns its id.
func (f *fixture) submit(body string) string {
	f.t.Helper()
	res := f.do("POST", "/api/tasks", body)
	if res.status != http.StatusCreated {
		f.t.Fatalf("submit %s: %d %s", body, res.status, res.body)
	}
	id, _ := res.json(f.t)["id"].(string)
	if id == "" {
		f.t.Fatalf("submit answered no id: %s", res.body)
	}
	return id
}

// waitState polls GET /api/tasks/{id} until the task is in state.
func (f *fixture) waitState(id, state string) map[string]any {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var last map[string]any
	for time.Now().Before(deadline) {
		res := f.do("GET", "/api/tasks/"+id, "")
		if res.status != http.StatusOK {
			f.t.Fatalf("get task %s: %d %s", id, res.status, res.body)
		}
		last = res.json(f.t)
		if last["state"] == state {
			return last
		}
		time.Sleep(10 * time.Millisecond)
	}
	f.t.Fatalf("task %s never reached %s: %v", id, state, last)
	return nil
}

func jsonEqual(t *testing.T, got, want any) bool {
	t.Helper()
	g, err1 := json.Marshal(got)
	w, err2 := json.Marshal(want)
	if err1 != nil || err2 != nil {
		t.Fatalf("marshal: %v %v", err1, err2)
	}
	return bytes.Equal(g, w)
}

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
		{"unknown field", "POST", "/api/tasks", `{"task": "demo.echo", "priority": 9}`, `unknown field "priority"`},
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

func TestInvalidConfig(t *testing.T) {
	t.Setenv(DSNEnv, "")
	t.Chdir(t.TempDir()) // configs that get as far as the default local store write in ./var
	cases := []struct {
		name, config, key, problem string
	}{
		{"unknown key", `{"worker": 8}`, "worker", "unknown setting"},
		{"workers zero", `{"workers": 0}`, "workers", "from 1 to 1000"},
		{"workers too many", `{"workers": 1001}`, "workers", "from 1 to 1000"},
		{"workers fraction", `{"workers": 2.5}`, "workers", "whole number"},
		{"workers string", `{"workers": "8"}`, "workers", "whole number"},
		{"postgres broker without dsn", `{"broker": "postgres"}`, "dsn", "the postgres broker needs a dsn"},
		{"dsn that does not parse", `{"broker": "postgres", "dsn": "not a dsn"}`, "dsn", "the dsn does not parse"},
		{"dsn with a bad sslmode", `{"broker": "postgres", "dsn": "postgres://u@127.0.0.1/db?sslmode=bogus"}`, "dsn", "the dsn does not parse"},
		{"schema that is not a name", `{"broker": "postgres", "dsn": "postgres://u@127.0.0.1/db", "schema": "bad; drop table x"}`, "schema", "letters, digits and underscores"},
		{"reaper after under two heartbeats", `{"heartbeat_interval_seconds": 5, "orphan_reclaim_after_seconds": 9}`, "", "at least two heartbeat intervals"},
		{"negative grace", `{"orphan_claim_grace_seconds": -1}`, "orphan_claim_grace_seconds", "from 0"},
		{"zero max attempts", `{"orphan_max_attempts": 0}`, "orphan_max_attempts", "from 1"},
		{"reaper enabled not bool", `{"orphan_reclaim_enabled": "no"}`, "orphan_reclaim_enabled", "true or false"},
		{"unknown broker", `{"broker": "kafka"}`, "broker", "unknown broker"},
		{"broker not a string", `{"broker": 1}`, "broker", "must be a string"},
		{"zero heartbeat", `{"heartbeat_interval_seconds": 0}`, "heartbeat_interval_seconds", "above 0"},
		{"negative drain", `{"drain_timeout_seconds": -1}`, "drain_timeout_seconds", "from 0"},
		{"zero payload limit", `{"max_payload_bytes": 0}`, "max_payload_bytes", "from 1"},
		{"demo_tasks not bool", `{"demo_tasks": "yes"}`, "demo_tasks", "true or false"},
		{"data_dir not string", `{"data_dir": 3}`, "data_dir", "must be a string"},
		{"topics not a map", `{"topics": []}`, "topics", "must be a map"},
		{"topic negative limit", `{"topics": {"a": {"concurrency_limit": -1}}}`, "topics.a.concurrency_limit", "0 for unlimited"},
		{"topic unknown key", `{"topics": {"a": {"limit": 1}}}`, "topics.a.limit", "unknown topic setting"},
		{"topic bad paused", `{"topics": {"a": {"paused": 1}}}`, "topics.a.paused", "true or false"},
		{"negative message retention", `{"message_retention_hours": -1}`, "message_retention_hours", "from 0"},
		{"message retention not a number", `{"message_retention_hours": "week"}`, "message_retention_hours", "whole number"},
		{"not an object", `[1]`, "", "not a JSON object"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := New(testLogger(t))
			defer p.Stop(context.Background())
			err := p.Configure(context.Background(), capability.ConfigureRequest{Config: json.RawMessage(tc.config), Host: &capabilitytest.Host{}})
			var ice *capability.InvalidConfigError
			if !errors.As(err, &ice) {
				t.Fatalf("error %v (%T), want *capability.InvalidConfigError", err, err)
			}
			if ice.Key != tc.key || !strings.Contains(ice.Problem, tc.problem) {
				t.Errorf("got key %q problem %q; want key %q and a problem saying %q", ice.Key, ice.Problem, tc.key, tc.problem)
			}
			if h, _ := p.CheckHealth(context.Background()); h.Status != capability.HealthError {
				t.Errorf("health after a refused config = %v", h)
			}
		})
	}

	// Over gRPC the host still sees an InvalidConfigError.
	c := capabilitytest.Connect(t, New(testLogger(t)))
	err := c.Configure(context.Background(), capability.ConfigureRequest{Config: json.RawMessage(`{"workers": -3}`), Host: &capabilitytest.Host{}})
	var ice *capability.InvalidConfigError
	if !errors.As(err, &ice) || !strings.Contains(ice.Error(), "workers") {
		t.Errorf("over gRPC: %v", err)
	}
}

func TestParseConfigDefaults(t *testing.T) {
	t.Setenv(DSNEnv, "postgres://from-env")
	cfg, err := ParseConfig(json.RawMessage(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Broker != "local" || cfg.DataDir != "var" || cfg.Workers != 8 || cfg.HeartbeatInterval != 5*time.Second || cfg.DrainTimeout != 30*time.Second ||
		cfg.MaxPayloadBytes != 1048576 || cfg.DemoTasks || cfg.DSN != "postgres://from-env" {
		t.Errorf("defaults = %+v", cfg)
	}
	cfg, err = ParseConfig(json.RawMessage(`{"dsn": "postgres://mine", "heartbeat_interval_seconds": 0.5, "drain_timeout_seconds": 0, "data_dir": "/var/lib/x", "topics": {"t": {"paused": true}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DSN != "postgres://mine" || cfg.HeartbeatInterval != 500*time.Millisecond || cfg.DrainTimeout != 0 || cfg.DataDir != "/var/lib/x" ||
		cfg.Topics["t"].Paused == nil || !*cfg.Topics["t"].Paused || cfg.Topics["t"].ConcurrencyLimit != nil {
		t.Errorf("parsed = %+v", cfg)
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

func TestMessageRetentionSetting(t *testing.T) {
	cfg, err := ParseConfig(json.RawMessage(`{}`))
	if err != nil || cfg.MessageRetention != 7*24*time.Hour {
		t.Fatalf("default message retention = %v, %v; want 168h", cfg.MessageRetention, err)
	}
	cfg, err = ParseConfig(json.RawMessage(`{"message_retention_hours": 0}`))
	if err != nil || cfg.MessageRetention != 0 {
		t.Fatalf("message_retention_hours 0 = %v, %v; want 0 (keep)", cfg.MessageRetention, err)
	}
	cfg, err = ParseConfig(json.RawMessage(`{"message_retention_hours": 24}`))
	if err != nil || cfg.MessageRetention != 24*time.Hour {
		t.Fatalf("message_retention_hours 24 = %v, %v", cfg.MessageRetention, err)
	}
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
