// Package example is a task plugin: the way to add tasks to taskhost
// without touching tasks_worker. It implements capability.TaskProvider;
// tasks_worker finds it through the host, registers its tasks, and runs
// them here when their messages are claimed, with the log lines and
// progress they report shown in the task's report.
//
// It also serves one HTTP route, POST /count, a demo and test route for
// streamed uploads (see Plugin.ServeHTTP).
//
// Copy this package to start a plugin of your own: keep Describe's name
// equal to the config key, and name the binary fp-plugin-<name>.
package example

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
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
	_ capability.HTTPHandler  = Plugin{}
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

// ServeHTTP implements capability.HTTPHandler with one demo and test
// route: POST /count reads the request body as it arrives and answers its
// size, {"bytes": n, "lines": m} (a last line without a newline counts).
// Sent as application/x-ndjson, a body of any size passes: the host
// streams it here, and this route holds one 32 KiB piece at a time. A body
// cut short answers 400 naming the read error.
func (Plugin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/count" {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "POST a body to /count", http.StatusMethodNotAllowed)
		return
	}
	var size, lines int64
	last := byte('\n')
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Body.Read(buf)
		if n > 0 {
			size += int64(n)
			lines += int64(bytes.Count(buf[:n], []byte{'\n'}))
			last = buf[n-1]
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "reading the body: " + err.Error()})
			return
		}
	}
	if last != '\n' {
		lines++
	}
	writeJSON(w, http.StatusOK, map[string]int64{"bytes": size, "lines": lines})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func strictJSON(b json.RawMessage, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	return d.Decode(v)
}
