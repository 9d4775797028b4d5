// Package example is a task plugin: the way to add tasks to taskhost
// without touching tasks_worker. It implements capability.TaskProvider;
// tasks_worker finds it through the host, registers its tasks, and runs
// them here when their messages are claimed, with the log lines and
// progress they report shown in the task's report.
//
// Its tasks show the ways an attempt can end besides success and an
// ordinary failure: a bad payload fails permanently (no retry can mend
// it), example.snooze waits for a time without using attempts,
// example.cancel_self cancels its own task, example.sleep runs until it
// is cancelled, and example.retry_later fails asking for its retry to wait.
// example.fanout submits tasks from inside a task (capability.Submit),
// each recorded with it as their parent. example.noop does nothing (for
// measuring what a task of a plugin costs), and example.stubborn ignores
// its cancellation (to show that its slot stays held until it returns).
//
// It also serves two HTTP routes: POST /count, a demo and test route for
// streamed uploads, and GET /running, the number of tasks running in it
// and the most that ran at once (see Plugin.ServeHTTP).
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

// running counts the tasks running in this process, and most the most
// that ran at once since the start or the last DELETE /running.
var running, most atomic.Int64

// started counts a task that starts running.
func started() {
	n := running.Add(1)
	for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
	}
}

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
		{Name: "example.retry_later", Description: `Fails its first attempt asking for the retry to wait {"seconds": s} (default 1), then succeeds.`, MaxAttempts: 3},
		{Name: "example.fanout", Description: `Submits {"count": n} (at most 100) example.greet tasks, each with this one as its parent, and returns their ids.`, MaxAttempts: 3},
		{Name: "example.noop", Description: "Does nothing: what a task of a plugin costs beyond its work.", MaxAttempts: 3},
		{Name: "example.stubborn", Description: `Sleeps {"seconds": n} (at most a minute) ignoring its cancellation and its timeout of 1 s: its slot stays held until it returns.`, MaxAttempts: 2, Timeout: time.Second},
	}, nil
}

// RunTask implements capability.TaskProvider. A payload a task cannot use
// fails permanently (capability.Permanent): retrying the same payload
// cannot succeed, so it does not use up the task's attempts.
func (Plugin) RunTask(ctx context.Context, run capability.TaskRun, ev capability.TaskEvents) (json.RawMessage, error) {
	started()
	defer running.Add(-1)
	switch run.Task {
	case "example.noop":
		return nil, nil
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
	case "example.retry_later":
		p := struct {
			Seconds float64 `json:"seconds"`
		}{Seconds: 1}
		if err := strictJSON(run.Payload, &p); err != nil || p.Seconds < 0 || p.Seconds > 3600 {
			return nil, capability.Permanent(fmt.Errorf(`example.retry_later: the payload must be {"seconds": s} with 0 <= s <= 3600`))
		}
		if run.Attempt < 2 {
			ev.Log(fmt.Sprintf("not this time; the retry waits %gs", p.Seconds))
			return nil, capability.RetryAfter(fmt.Errorf("the service is busy"), time.Duration(p.Seconds*float64(time.Second)))
		}
		return json.Marshal(map[string]int{"succeeded_at_attempt": run.Attempt})
	case "example.fanout":
		return fanout(ctx, run, ev)
	case "example.stubborn":
		var p struct {
			Seconds float64 `json:"seconds"`
		}
		if err := strictJSON(run.Payload, &p); err != nil || p.Seconds <= 0 || p.Seconds > 60 {
			return nil, capability.Permanent(fmt.Errorf(`example.stubborn: the payload must be {"seconds": n} with 0 < n <= 60`))
		}
		time.Sleep(time.Duration(p.Seconds * float64(time.Second))) // deaf to ctx, on purpose
		return json.Marshal(map[string]float64{"slept_seconds": p.Seconds})
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

// fanout runs example.fanout: it submits its children from its own
// context, so that each records it as its parent.
func fanout(ctx context.Context, run capability.TaskRun, ev capability.TaskEvents) (json.RawMessage, error) {
	var p struct {
		Count int `json:"count"`
	}
	if err := strictJSON(run.Payload, &p); err != nil || p.Count < 1 || p.Count > 100 {
		return nil, capability.Permanent(fmt.Errorf(`example.fanout: the payload must be {"count": n} with 1 <= n <= 100`))
	}
	children := make([]capability.TaskSubmission, p.Count)
	for i := range children {
		children[i] = capability.TaskSubmission{Task: "example.greet", Payload: json.RawMessage(fmt.Sprintf(`{"name":"child %d of %s"}`, i+1, run.MessageID))}
	}
	got, err := capability.Submit(ctx, children...)
	if err != nil {
		return nil, fmt.Errorf("submit the children: %w", err)
	}
	ids := make([]string, len(got))
	for i, g := range got {
		ids[i] = g.ID
	}
	ev.Log(fmt.Sprintf("submitted %d children", len(ids)))
	return json.Marshal(map[string][]string{"children": ids})
}

// ServeHTTP implements capability.HTTPHandler with two demo and test
// routes. GET /running answers {"running": n, "most": m}, the tasks
// running in this plugin now (a task cancelled while it runs leaves it once
// it returns) and the most that ran at once; DELETE /running starts that
// count again. POST /count reads the request body as it arrives and answers its
// size, {"bytes": n, "lines": m} (a last line without a newline counts).
// Sent as application/x-ndjson, a body of any size passes: the host
// streams it here, and this route holds one 32 KiB piece at a time. A body
// cut short answers 400 naming the read error.
func (Plugin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/running" {
		switch r.Method {
		case http.MethodGet:
		case http.MethodDelete:
			most.Store(running.Load())
		default:
			w.Header().Set("Allow", "GET, DELETE")
			http.Error(w, "GET or DELETE /running", http.StatusMethodNotAllowed)
			return
		}
		writeJSON(w, http.StatusOK, map[string]int64{"running": running.Load(), "most": most.Load()})
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
