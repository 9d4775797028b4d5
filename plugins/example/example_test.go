package example_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"

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
	if err != nil || len(specs) != 2 || specs[0].Name != "example.greet" || specs[1].Name != "example.count" {
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
	if !errors.As(err, &te) || !strings.Contains(te.Msg, `{"name": "..."}`) {
		t.Fatalf("bad payload: %v", err)
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
