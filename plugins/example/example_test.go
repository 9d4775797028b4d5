package example_test

import (
	"context"
	"encoding/json"
	"errors"
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
