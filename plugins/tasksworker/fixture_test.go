package tasksworker

// The test fixture: a plugin configured and served over the real gRPC
// capabilities, and helpers to call its API.

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

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

// settle bounds the waits of these tests for a condition: a wait ends as
// soon as its condition holds, and on a loaded machine getting there may
// take many times what it takes on an idle one.
const settle = time.Minute

// waitState polls GET /api/tasks/{id} until the task is in state.
func (f *fixture) waitState(id, state string) map[string]any {
	f.t.Helper()
	deadline := time.Now().Add(settle)
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
