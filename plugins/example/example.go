// Package example is a task plugin: the way to add tasks to taskhost
// without touching tasks_worker. It implements capability.TaskProvider;
// tasks_worker finds it through the host, registers its tasks, and runs
// them here when their messages are claimed, with the log lines and
// progress they report shown in the task's report.
//
// Copy this package to start a plugin of your own: keep Describe's name
// equal to the config key, and name the binary fp-plugin-<name>.
package example

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/taskhost/taskhost/capability"
)

// Name is the plugin's name: config key, URL segment, binary suffix.
const Name = "example"

// Plugin provides two tasks.
type Plugin struct{}

var (
	_ capability.Lifecycle    = Plugin{}
	_ capability.TaskProvider = Plugin{}
)

// Describe implements capability.Lifecycle.
func (Plugin) Describe(context.Context) (capability.Description, error) {
	return capability.Description{Name: Name, Version: "1.0.0"}, nil
}

// Configure implements capability.Lifecycle; this plugin has no settings.
func (Plugin) Configure(_ context.Context, req capability.ConfigureRequest) error {
	if s := string(bytes.TrimSpace(req.Config)); s != "{}" && s != "" && s != "null" {
		return &capability.InvalidConfigError{Problem: "the example plugin takes no settings; remove its config block"}
	}
	return nil
}

// CheckHealth implements capability.Lifecycle.
func (Plugin) CheckHealth(context.Context) (capability.Health, error) {
	return capability.Health{Status: capability.HealthOK}, nil
}

// Stop implements capability.Lifecycle.
func (Plugin) Stop(context.Context) error { return nil }

// ListTasks implements capability.TaskProvider.
func (Plugin) ListTasks(context.Context) ([]capability.TaskSpec, error) {
	return []capability.TaskSpec{
		{Name: "example.greet", Description: `Greets {"name": "..."}.`, MaxAttempts: 3},
		{Name: "example.count", Description: `Counts to {"to": n} (at most 1000), one step every {"step_ms": m} (default 100), reporting progress.`, MaxAttempts: 3},
	}, nil
}

// RunTask implements capability.TaskProvider.
func (Plugin) RunTask(ctx context.Context, run capability.TaskRun, ev capability.TaskEvents) (json.RawMessage, error) {
	switch run.Task {
	case "example.greet":
		var p struct {
			Name string `json:"name"`
		}
		if err := strictJSON(run.Payload, &p); err != nil || p.Name == "" {
			return nil, fmt.Errorf(`example.greet: the payload must be {"name": "..."}`)
		}
		ev.Log("greeting " + p.Name)
		return json.Marshal(map[string]string{"greeting": "hello, " + p.Name})
	case "example.count":
		p := struct {
			To     int `json:"to"`
			StepMS int `json:"step_ms"`
		}{StepMS: 100}
		if err := strictJSON(run.Payload, &p); err != nil || p.To < 1 || p.To > 1000 || p.StepMS < 0 || p.StepMS > 10000 {
			return nil, fmt.Errorf(`example.count: the payload must be {"to": n, "step_ms": m} with 1 <= n <= 1000 and 0 <= m <= 10000`)
		}
		for i := 1; i <= p.To; i++ {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(time.Duration(p.StepMS) * time.Millisecond):
			}
			ev.Progress(float64(i) / float64(p.To))
			if i%max(1, p.To/5) == 0 || i == p.To {
				ev.Log(fmt.Sprintf("counted %d of %d", i, p.To))
			}
		}
		return json.Marshal(map[string]int{"counted": p.To})
	}
	return nil, fmt.Errorf("task %q: %w", run.Task, capability.ErrNotFound)
}

func strictJSON(b json.RawMessage, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	return d.Decode(v)
}
