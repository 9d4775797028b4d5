package example_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
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
	if err != nil || len(specs) != 9 || specs[0].Name != "example.greet" || specs[1].Name != "example.count" {
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

	running := func() int { return runningNow(t, c).Running }
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := c.RunTask(sctx, capability.TaskRun{Task: "example.sleep", Payload: json.RawMessage(`{"seconds": 3600}`)}, nil)
		done <- err
	}()
	waitUntil(t, "example.sleep runs", func() bool { return running() == 1 })
	cancel()
	if err := <-done; err == nil {
		t.Error("a cancelled sleep returned no error")
	}
	waitUntil(t, "example.sleep ends once cancelled", func() bool { return running() == 0 })
}

type runningCount struct {
	Running int `json:"running"`
	Most    int `json:"most"`
}

// runningNow asks the plugin's GET /running (DELETE with reset).
func runningNow(t *testing.T, c *capability.Client, reset ...bool) runningCount {
	t.Helper()
	method := "GET"
	if len(reset) > 0 && reset[0] {
		method = "DELETE"
	}
	var out strings.Builder
	err := c.ProxyHTTP(context.Background(), capability.ProxyRequest{Method: method, Path: "/running"}, func(int, http.Header) {},
		func(b []byte) error { out.Write(b); return nil })
	if err != nil {
		t.Fatal(err)
	}
	var rc runningCount
	if err := json.Unmarshal([]byte(out.String()), &rc); err != nil {
		t.Fatalf("GET /running: %q: %v", out.String(), err)
	}
	return rc
}

// TestRetryLaterAndFanout: retry_later's first attempt asks for its retry
// to wait; fanout submits its children from its context, with itself as
// their parent.
func TestRetryLaterAndFanout(t *testing.T) {
	var got []capability.TaskSubmission
	host := &capabilitytest.Host{SubmitTasksFunc: func(_ context.Context, tasks []capability.TaskSubmission) ([]capability.SubmittedTask, error) {
		got = append(got, tasks...)
		out := make([]capability.SubmittedTask, len(tasks))
		for i := range out {
			out[i].ID = strconv.Itoa(100 + i)
		}
		return out, nil
	}}
	c := capabilitytest.Start(t, example.Plugin{}, nil, host)
	ctx := context.Background()
	_, err := c.RunTask(ctx, capability.TaskRun{Task: "example.retry_later", Payload: json.RawMessage(`{"seconds": 7}`), Attempt: 1}, nil)
	var te *capability.TaskError
	if !errors.As(err, &te) || te.RetryAfter != 7*time.Second || te.Outcome != capability.OutcomeError {
		t.Fatalf("first attempt: %v; want a failure retried after 7s", err)
	}
	res, err := c.RunTask(ctx, capability.TaskRun{Task: "example.retry_later", Payload: json.RawMessage(`{"seconds": 7}`), Attempt: 2}, nil)
	if err != nil || string(res) != `{"succeeded_at_attempt":2}` {
		t.Fatalf("second attempt: %s, %v", res, err)
	}
	res, err = c.RunTask(ctx, capability.TaskRun{Task: "example.fanout", Payload: json.RawMessage(`{"count": 3}`), MessageID: "41"}, nil)
	if err != nil || string(res) != `{"children":["100","101","102"]}` {
		t.Fatalf("fanout: %s, %v", res, err)
	}
	if len(got) != 3 || got[0].Task != "example.greet" || got[2].ParentTaskID != "41" {
		t.Fatalf("the host got %+v; want 3 children of task 41", got)
	}
}

// TestStubbornIgnoresItsCancel: example.stubborn returns only when its
// time is up, cancelled or not; /running counts it until then.
func TestStubbornIgnoresItsCancel(t *testing.T) {
	c := capabilitytest.Start(t, example.Plugin{}, nil, nil)
	runningNow(t, c, true)
	ctx, cancel := context.WithCancel(context.Background())
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := c.RunTask(ctx, capability.TaskRun{Task: "example.stubborn", Payload: json.RawMessage(`{"seconds": 0.5}`)}, nil)
		done <- err
	}()
	waitUntil(t, "example.stubborn runs", func() bool { return runningNow(t, c).Running == 1 })
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the cancelled call returned no error")
	}
	waitUntil(t, "example.stubborn returns", func() bool { return runningNow(t, c).Running == 0 })
	if d := time.Since(start); d < 500*time.Millisecond {
		t.Fatalf("example.stubborn stopped running after %s, before its half second: it heeded its cancel", d)
	}
	if rc := runningNow(t, c); rc.Most != 1 {
		t.Fatalf("/running = %+v after one stubborn task; want at most 1", rc)
	}
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
