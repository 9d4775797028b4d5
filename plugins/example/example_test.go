package example_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/capabilitytest"
	"github.com/taskhost/taskhost/plugins/example"
)

type events struct {
	mu       sync.Mutex
	logs     []string
	progress []float64
}

func (e *events) Log(l string)       { e.mu.Lock(); e.logs = append(e.logs, l); e.mu.Unlock() }
func (e *events) Progress(f float64) { e.mu.Lock(); e.progress = append(e.progress, f); e.mu.Unlock() }

func TestTasksOverTheWire(t *testing.T) {
	c := capabilitytest.Start(t, example.Plugin{}, nil, nil)
	ctx := context.Background()
	specs, err := c.ListTasks(ctx)
	if err != nil || len(specs) != 5 || specs[0].Name != "example.greet" || specs[1].Name != "example.count" {
		t.Fatalf("tasks = %+v, %v", specs, err)
	}
	ev := &events{}
	res, err := c.RunTask(ctx, capability.TaskRun{Task: "example.greet", Payload: json.RawMessage(`{"name": "Ada"}`)}, ev)
	if err != nil || string(res) != `{"greeting":"hello, Ada"}` || len(ev.logs) != 1 {
		t.Fatalf("greet = %s, %v, logs %v", res, err, ev.logs)
	}
	ev = &events{}
	res, err = c.RunTask(ctx, capability.TaskRun{Task: "example.count", Payload: json.RawMessage(`{"to": 5, "step_ms": 0}`)}, ev)
	if err != nil || string(res) != `{"counted":5}` || len(ev.progress) != 5 || ev.progress[4] != 1 {
		t.Fatalf("count = %s, %v, progress %v", res, err, ev.progress)
	}
	_, err = c.RunTask(ctx, capability.TaskRun{Task: "example.greet", Payload: json.RawMessage(`{"nom": "x"}`)}, nil)
	var te *capability.TaskError
	if !errors.As(err, &te) || !strings.Contains(te.Msg, `{"name": "..."}`) || te.Outcome != capability.OutcomePermanent {
		t.Fatalf("bad payload: %#v (%v), want a permanent failure", te, err)
	}
}

// TestOutcomeTasks: example.snooze snoozes until its time, then succeeds;
// example.cancel_self cancels its task; example.sleep ends when its
// context is cancelled, and GET /running counts it while it runs.
func TestOutcomeTasks(t *testing.T) {
	c := capabilitytest.Start(t, example.Plugin{}, nil, nil)
	ctx := context.Background()
	outcome := func(task, payload string) *capability.TaskError {
		t.Helper()
		_, err := c.RunTask(ctx, capability.TaskRun{Task: task, Payload: json.RawMessage(payload)}, nil)
		var te *capability.TaskError
		if !errors.As(err, &te) {
			t.Fatalf("%s %s: %v, want a task error", task, payload, err)
		}
		return te
	}

	later := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	if te := outcome("example.snooze", `{"until": "`+later+`", "seconds": 30}`); te.Outcome != capability.OutcomeSnooze || te.Snooze != 30*time.Second {
		t.Errorf("snooze before its time: %#v", te)
	}
	// Not past its time: a minute to go, asking for an hour.
	soon := time.Now().Add(time.Minute).UTC().Format(time.RFC3339Nano)
	if te := outcome("example.snooze", `{"until": "`+soon+`", "seconds": 3600}`); te.Outcome != capability.OutcomeSnooze || te.Snooze > time.Minute || te.Snooze <= 0 {
		t.Errorf("snooze a minute before its time: %#v", te)
	}
	// Passed on as given, for the host to refuse.
	if te := outcome("example.snooze", `{"until": "`+later+`", "seconds": -5}`); te.Outcome != capability.OutcomeSnooze || te.Snooze != -5*time.Second {
		t.Errorf("negative snooze: %#v", te)
	}
	past := time.Now().Add(-time.Second).UTC().Format(time.RFC3339Nano)
	res, err := c.RunTask(ctx, capability.TaskRun{Task: "example.snooze", Payload: json.RawMessage(`{"until": "` + past + `"}`)}, nil)
	if err != nil || !strings.Contains(string(res), "waited_until") {
		t.Errorf("snooze after its time: %s, %v", res, err)
	}
	if te := outcome("example.snooze", `{"seconds": 1}`); te.Outcome != capability.OutcomePermanent {
		t.Errorf("snooze without a time: %#v", te)
	}
	if te := outcome("example.cancel_self", `{"reason": "not wanted"}`); te.Outcome != capability.OutcomeCancel || te.Msg != "not wanted" {
		t.Errorf("cancel_self: %#v", te)
	}
	if te := outcome("example.sleep", `{"seconds": 0}`); te.Outcome != capability.OutcomePermanent {
		t.Errorf("sleep 0: %#v", te)
	}

	running := func() string {
		var out strings.Builder
		err := c.ProxyHTTP(ctx, capability.ProxyRequest{Method: "GET", Path: "/running"}, func(int, http.Header) {},
			func(b []byte) error { out.Write(b); return nil })
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(out.String())
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := c.RunTask(sctx, capability.TaskRun{Task: "example.sleep", Payload: json.RawMessage(`{"seconds": 3600}`)}, nil)
		done <- err
	}()
	waitUntil(t, "example.sleep runs", func() bool { return running() == `{"running":1}` })
	cancel()
	if err := <-done; err == nil {
		t.Error("a cancelled sleep returned no error")
	}
	waitUntil(t, "example.sleep ends once cancelled", func() bool { return running() == `{"running":0}` })
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestCountRoute(t *testing.T) {
	c := capabilitytest.Start(t, example.Plugin{}, nil, nil)
	ctx := context.Background()
	call := func(method string, body string, streamed bool) (int, string) {
		t.Helper()
		var status int
		var out strings.Builder
		req := capability.ProxyRequest{Method: method, Path: "/count", Body: []byte(body)}
		onHeader := func(s int, _ http.Header) { status = s }
		onBody := func(b []byte) error { out.Write(b); return nil }
		var err error
		if streamed {
			err = c.ProxyHTTPStream(ctx, req, strings.NewReader(body), onHeader, onBody)
		} else {
			err = c.ProxyHTTP(ctx, req, onHeader, onBody)
		}
		if err != nil {
			t.Fatal(err)
		}
		return status, out.String()
	}
	for _, streamed := range []bool{false, true} {
		if s, out := call("POST", "{\"a\":1}\n{\"a\":2}\n{\"a\":3}", streamed); s != 200 || out != "{\"bytes\":23,\"lines\":3}\n" {
			t.Errorf("count (streamed %v) = %d %q", streamed, s, out)
		}
		if s, out := call("POST", "", streamed); s != 200 || out != "{\"bytes\":0,\"lines\":0}\n" {
			t.Errorf("count of nothing (streamed %v) = %d %q", streamed, s, out)
		}
	}
	if s, _ := call("GET", "", false); s != http.StatusMethodNotAllowed {
		t.Errorf("GET /count = %d, want 405", s)
	}
}
