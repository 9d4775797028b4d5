package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// copyExecutable copies the binary at from to to, executable.
func copyExecutable(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestScheduleAndSubmitOfAProviderStartingLate: the example plugin starts
// seconds after tasks_worker (its binary is a script that waits for a
// gate file, then runs the real one). The config schedules its task:
// tasks_worker starts all the same, and shows the schedule waiting for a
// worker; a submit of the task is accepted while the provider is still
// starting. Once the gate opens, the submitted task completes and the
// schedule fires and succeeds.
func TestScheduleAndSubmitOfAProviderStartingLate(t *testing.T) {
	dir := t.TempDir()
	plugins := filepath.Join(dir, "plugins")
	if err := os.Mkdir(plugins, 0o755); err != nil {
		t.Fatal(err)
	}
	copyExecutable(t, filepath.Join(pluginsDir, "fp-plugin-tasks_worker"), filepath.Join(plugins, "fp-plugin-tasks_worker"))
	real := filepath.Join(dir, "example-real")
	copyExecutable(t, filepath.Join(pluginsDir, "fp-plugin-example"), real)
	gate := filepath.Join(dir, "gate")
	script := fmt.Sprintf("#!/bin/sh\nwhile [ ! -e '%s' ]; do sleep 0.1; done\nexec '%s' \"$@\"\n", gate, real)
	if err := os.WriteFile(filepath.Join(plugins, "fp-plugin-example"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	h := startHost(t, fmt.Sprintf(`
listen: LISTEN
plugins_dir: %s
plugins:
  tasks_worker:
    enabled: true
    config:
      broker: local
      data_dir: %s
      workers: 2
      beat_tick_seconds: 0.5
      schedules:
        - {name: greet-late, task: example.greet, payload: {name: Ada}, interval_seconds: 2}
  example:
    enabled: true
`, plugins, filepath.Join(dir, "var")))
	h.waitState(t, "tasks_worker", "running", 60*time.Second)
	api := h.base + "/plugin-pkg/tasks_worker/api"

	type schedule struct {
		Topic       string     `json:"topic"`
		LastAttempt *time.Time `json:"last_attempt"`
		Waiting     *struct {
			Since *time.Time `json:"since"`
			Why   string     `json:"why"`
		} `json:"waiting"`
	}
	read := func() schedule {
		var v struct {
			Schedule schedule `json:"schedule"`
		}
		status, body := get(t, api+"/schedules/greet-late")
		if status != 200 {
			t.Fatalf("GET schedules/greet-late: %d %s", status, body)
		}
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			t.Fatal(err)
		}
		return v.Schedule
	}
	if st := h.plugins(t)["example"].State; st == "running" {
		t.Fatalf("example is %s before its gate opened", st)
	}
	s := read()
	if s.Topic != "default" || s.Waiting == nil || !strings.Contains(s.Waiting.Why, `no live worker runs task "example.greet"`) || s.LastAttempt != nil {
		t.Fatalf("the schedule before its provider is up: %+v (waiting %+v); want it on topic default, waiting and saying why, never fired", s, s.Waiting)
	}
	id := submitTask(t, h, `{"task": "example.greet", "payload": {"name": "Eve"}}`)
	if st := h.plugins(t)["example"].State; st == "running" {
		t.Fatalf("example is %s: the submit did not happen before its provider was up", st)
	}

	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	h.waitState(t, "example", "running", 60*time.Second)
	var v taskView
	waitFor(t, 60*time.Second, "the task submitted before its provider was up is done", func() bool {
		v = taskState(t, h, id)
		return v.State == "done"
	})
	if string(v.Result) != `{"greeting":"hello, Eve"}` {
		t.Errorf("result = %s", v.Result)
	}
	var reps struct {
		Reports []struct {
			Status string          `json:"status"`
			Result json.RawMessage `json:"result"`
		} `json:"reports"`
	}
	waitFor(t, 60*time.Second, "the schedule fired and its task succeeded", func() bool {
		_, body := get(t, api+"/reports?schedule=greet-late&status=success")
		return json.Unmarshal([]byte(body), &reps) == nil && len(reps.Reports) > 0
	})
	if string(reps.Reports[0].Result) != `{"greeting":"hello, Ada"}` {
		t.Errorf("the scheduled run's result = %s", reps.Reports[0].Result)
	}
	if s := read(); s.Waiting != nil || s.LastAttempt == nil {
		t.Errorf("after its provider came: %+v (waiting %+v); want fired and no longer waiting", s, s.Waiting)
	}
}
