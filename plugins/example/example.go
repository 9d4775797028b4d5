// Package example is a task plugin: the way to add tasks to taskhost
// without touching tasks_worker. It implements capability.TaskProvider;
// tasks_worker finds it through the host, registers its tasks, and runs
// them here when their messages are claimed, with the log lines and
// progress they report shown in the task's report.
//
// Its tasks show the ways an attempt can end besides success and an
// ordinary failure: a bad payload fails permanently (no retry can mend
// it), example.snooze waits for a time without using attempts,
// example.cancel_self cancels its own task, and example.sleep runs until
// it is cancelled.
//
// It also serves two HTTP routes: POST /count, a demo and test route for
// streamed uploads, and GET /running, the number of tasks running in it
// (see Plugin.ServeHTTP).
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
	"sync/atomic"
	"time"

	"github.com/taskhost/taskhost/capability"
)

// Name is the plugin's name: config key, URL segment, binary suffix.
const Name = "example"

// Plugin provides the tasks ListTasks lists.
type Plugin struct{}

// running counts the tasks running in this process (GET /running).
var running atomic.Int64

// maxSleep bounds example.sleep.
const maxSleep = 24 * time.Hour

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
		{Name: "example.snooze", Description: `Waits until {"until": "<RFC 3339 time>"}, asking to run again every {"seconds": s} (default 1) without using an attempt.`, MaxAttempts: 3},
		{Name: "example.cancel_self", Description: `Cancels its own task with {"reason": "..."}: it ends cancelled, never retried.`, MaxAttempts: 3},
		{Name: "example.sleep", Description: `Sleeps {"seconds": n} (at most a day), reporting progress; cancel it to stop it early.`, MaxAttempts: 3},
	}, nil
}

// RunTask implements capability.TaskProvider. A payload a task cannot use
// fails permanently (capability.Permanent): retrying the same payload
// cannot succeed, so it does not use up the task's attempts.
func (Plugin) RunTask(ctx context.Context, run capability.TaskRun, ev capability.TaskEvents) (json.RawMessage, error) {
	running.Add(1)
	defer running.Add(-1)
	switch run.Task {
	case "example.greet":
		var p struct {
			Name string `json:"name"`
		}
		if err := strictJSON(run.Payload, &p); err != nil || p.Name == "" {
			return nil, capability.Permanent(fmt.Errorf(`example.greet: the payload must be {"name": "..."}`))
		}
		ev.Log("greeting " + p.Name)
		return json.Marshal(map[string]string{"greeting": "hello, " + p.Name})
	case "example.count":
		p := struct {
			To     int `json:"to"`
			StepMS int `json:"step_ms"`
		}{StepMS: 100}
		if err := strictJSON(run.Payload, &p); err != nil || p.To < 1 || p.To > 1000 || p.StepMS < 0 || p.StepMS > 10000 {
			return nil, capability.Permanent(fmt.Errorf(`example.count: the payload must be {"to": n, "step_ms": m} with 1 <= n <= 1000 and 0 <= m <= 10000`))
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
	case "example.snooze":
		return snooze(run, ev)
	case "example.cancel_self":
		var p struct {
			Reason string `json:"reason"`
		}
		if err := strictJSON(run.Payload, &p); err != nil {
			return nil, capability.Permanent(fmt.Errorf(`example.cancel_self: the payload must be {"reason": "..."}`))
		}
		ev.Log("cancelling my own task: " + p.Reason)
		return nil, capability.CancelTask(p.Reason)
	case "example.sleep":
		return sleep(ctx, run, ev)
	}
	return nil, fmt.Errorf("task %q: %w", run.Task, capability.ErrNotFound)
}

// snooze runs example.snooze: done once its time has come, else asking to
// run again later. It passes on the seconds it is given as they are, so
// that a snooze out of range (negative, or more than a year) shows what
// the host does with one: it fails the attempt as an error would.
func snooze(run capability.TaskRun, ev capability.TaskEvents) (json.RawMessage, error) {
	p := struct {
		Until   time.Time `json:"until"`
		Seconds float64   `json:"seconds"`
	}{Seconds: 1}
	if err := strictJSON(run.Payload, &p); err != nil || p.Until.IsZero() {
		return nil, capability.Permanent(fmt.Errorf(`example.snooze: the payload must be {"until": "<RFC 3339 time>", "seconds": s}`))
	}
	if left := time.Until(p.Until); left > 0 {
		d := time.Duration(p.Seconds * float64(time.Second))
		if p.Seconds >= 0 {
			d = min(d, left) // not past the time itself
		}
		ev.Log(fmt.Sprintf("not yet: %s to go; running again in %s", left.Round(time.Millisecond), d))
		return nil, capability.Snooze(d)
	}
	ev.Log("the time has come")
	return json.Marshal(map[string]string{"waited_until": p.Until.Format(time.RFC3339Nano)})
}

// sleep runs example.sleep: it sleeps, reporting progress every second,
// and ends early when its task is cancelled (its context is).
func sleep(ctx context.Context, run capability.TaskRun, ev capability.TaskEvents) (json.RawMessage, error) {
	var p struct {
		Seconds float64 `json:"seconds"`
	}
	if err := strictJSON(run.Payload, &p); err != nil || p.Seconds <= 0 || p.Seconds > maxSleep.Seconds() {
		return nil, capability.Permanent(fmt.Errorf(`example.sleep: the payload must be {"seconds": n} with 0 < n <= %d`, int(maxSleep.Seconds())))
	}
	total := time.Duration(p.Seconds * float64(time.Second))
	start := time.Now()
	end := time.NewTimer(total)
	defer end.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	ev.Log(fmt.Sprintf("sleeping %s", total))
	for {
		select {
		case <-ctx.Done():
			// Cancelled (or its worker stopping): the stream is gone with
			// the context, so this attempt reports nothing more.
			return nil, ctx.Err()
		case <-tick.C:
			ev.Progress(float64(time.Since(start)) / float64(total))
		case <-end.C:
			ev.Log("slept")
			return json.Marshal(map[string]float64{"slept_seconds": p.Seconds})
		}
	}
}

// ServeHTTP implements capability.HTTPHandler with two demo and test
// routes. GET /running answers {"running": n}, the tasks running in this
// plugin now (a task cancelled while it runs leaves it). POST /count reads the request body as it arrives and answers its
// size, {"bytes": n, "lines": m} (a last line without a newline counts).
// Sent as application/x-ndjson, a body of any size passes: the host
// streams it here, and this route holds one 32 KiB piece at a time. A body
// cut short answers 400 naming the read error.
func (Plugin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/running" {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			http.Error(w, "GET /running", http.StatusMethodNotAllowed)
			return
		}
		writeJSON(w, http.StatusOK, map[string]int64{"running": running.Load()})
		return
	}
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
