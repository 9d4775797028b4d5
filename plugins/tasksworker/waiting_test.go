package tasksworker

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/capabilitytest"
)

// lateProvider is a host whose one task provider, plugin "images", is
// starting until up is set: then it runs and provides images.resize.
func lateProvider(up *atomic.Bool, ran *atomic.Int32) *capabilitytest.Host {
	return &capabilitytest.Host{
		ListPluginsFunc: func(context.Context, capability.Capability) ([]capability.PluginInfo, error) {
			state := "starting"
			if up.Load() {
				state = "running"
			}
			return []capability.PluginInfo{{Name: "images", State: state, Capabilities: []capability.Capability{capability.Tasks}}}, nil
		},
		ListTasksFunc: func(_ context.Context, plugin string) ([]capability.TaskSpec, error) {
			if !up.Load() || plugin != "images" {
				return nil, capability.ErrUnavailable
			}
			return []capability.TaskSpec{{Name: "images.resize", Description: "resizes", MaxAttempts: 1}}, nil
		},
		RunTaskFunc: func(_ context.Context, plugin string, run capability.TaskRun, _ capability.TaskEvents) (json.RawMessage, error) {
			ran.Add(1)
			return json.RawMessage(`{"resized":true}`), nil
		},
	}
}

// TestScheduleAndSubmitOfAProviderThatStartsLate: the config schedules a
// task of a provider plugin that starts after tasks_worker. The plugin
// starts all the same; the schedule is shown waiting (API, UI, gauge),
// nothing is stamped; a submit of the task is accepted while the provider
// starts. Once the provider runs, the submitted task completes and the
// schedule fires and succeeds, and no longer waits.
func TestScheduleAndSubmitOfAProviderThatStartsLate(t *testing.T) {
	var up atomic.Bool
	var ran atomic.Int32
	p := New(testLogger(t))
	c := capabilitytest.Start(t, p, map[string]any{
		"broker": "memory", "drain_timeout_seconds": 0, "beat_tick_seconds": 0.2,
		"schedules": []any{map[string]any{"name": "resize", "task": "images.resize", "payload": map[string]any{"w": 10}, "interval_seconds": 1}},
	}, lateProvider(&up, &ran))
	f := &fixture{t: t, plugin: p, client: c}

	view := f.do("GET", "/api/schedules/resize", "").json(t)
	s := view["schedule"].(map[string]any)
	w, _ := s["waiting"].(map[string]any)
	if s["topic"] != "default" || w == nil || !strings.Contains(w["why"].(string), `no live worker runs task "images.resize" on topic "default"`) {
		t.Fatalf("the config schedule of a task not registered yet: %v; want it on topic default, waiting, saying why", s)
	}
	list := f.do("GET", "/api/schedules", "").json(t)["schedules"].([]any)
	if len(list) != 1 || list[0].(map[string]any)["waiting"] == nil {
		t.Fatalf("the list does not show the schedule waiting: %v", list)
	}
	mustContain(t, "the schedules page", f.uiGet("/ui/schedules"), "waiting for a worker", "images.resize")
	mustContain(t, "the schedule's page", f.uiGet("/ui/schedules/resize"), "Waiting for a worker", `no live worker runs task "images.resize"`)
	waitUntil(t, settle, "the waiting gauge counts the schedule", func() bool {
		return value(f.scrape(), "fastpluggy_schedules_waiting") == 1
	})
	if fams := f.scrape(); value(fams, "fastpluggy_schedule_overdue_seconds") != 0 {
		t.Errorf("overdue = %v: a schedule waiting for a worker is not the beat's lateness", value(fams, "fastpluggy_schedule_overdue_seconds"))
	}
	if s := f.do("GET", "/api/schedules/resize", "").json(t)["schedule"].(map[string]any); s["last_attempt"] != nil {
		t.Errorf("a waiting schedule was stamped: %v", s)
	}

	// A submit while the provider starts is accepted; an unknown one
	// with a malformed name is not.
	id := f.submit(`{"task": "images.resize", "payload": {"w": 20}}`)
	if res := f.do("POST", "/api/tasks", `{"task": "images resize"}`); res.status != http.StatusBadRequest || !strings.Contains(string(res.body), "can never run") {
		t.Errorf("a malformed task name: %d %s", res.status, res.body)
	}
	if ran.Load() != 0 {
		t.Fatal("the task ran before its provider was up")
	}

	up.Store(true)
	waitUntil(t, settle, "the task submitted before its provider was up is done", func() bool {
		return f.do("GET", "/api/tasks/"+id, "").json(t)["state"] == "done"
	})
	waitUntil(t, settle, "the schedule fired and succeeded", func() bool {
		reps := f.do("GET", "/api/reports?schedule=resize&status=success", "").json(t)["reports"].([]any)
		return len(reps) > 0
	})
	s = f.do("GET", "/api/schedules/resize", "").json(t)["schedule"].(map[string]any)
	if s["waiting"] != nil || s["last_attempt"] == nil {
		t.Errorf("after the provider came: %v; want it fired and no longer waiting", s)
	}
	if v := value(f.scrape(), "fastpluggy_schedules_waiting"); v != 0 {
		t.Errorf("waiting gauge = %v, want 0", v)
	}
}

// TestCheckConfigAcceptsSchedulesOfTasksNotRegistered: check-config runs
// without the task registry: a schedule of a provider's task passes, one
// whose task no task can ever have is refused, naming it.
func TestCheckConfigAcceptsSchedulesOfTasksNotRegistered(t *testing.T) {
	p := New(testLogger(t))
	if err := p.CheckConfig(json.RawMessage(`{"schedules": [{"name": "r", "task": "images.resize", "interval_seconds": 60}]}`)); err != nil {
		t.Errorf("a schedule of a provider's task: %v", err)
	}
	err := p.CheckConfig(json.RawMessage(`{"schedules": [{"name": "r", "task": "images resize", "interval_seconds": 60}]}`))
	if err == nil || !strings.Contains(err.Error(), "schedules[0]") || !strings.Contains(err.Error(), "can never run") {
		t.Errorf("a malformed task name: %v, want an error naming schedules[0]", err)
	}
}

// TestCheckConfigChecksSchedulePayloadsAsTheStore: a schedule payload the
// store refuses at start (a NUL character, which PostgreSQL cannot
// store) is refused by check-config too, naming the schedule, instead of
// passing and then failing every start of the plugin.
func TestCheckConfigChecksSchedulePayloadsAsTheStore(t *testing.T) {
	p := New(testLogger(t))
	for _, payload := range []string{`{"a": "x\u0000y"}`, `{"a": "\udc00"}`} {
		err := p.CheckConfig(json.RawMessage(`{"broker": "local", "schedules": [{"name": "nul", "task": "demo.echo", "interval_seconds": 5, "payload": ` + payload + `}]}`))
		if err == nil || !strings.Contains(err.Error(), "schedules[0]") || !strings.Contains(err.Error(), "payload") {
			t.Errorf("payload %s: %v, want an error naming schedules[0] and its payload", payload, err)
		}
	}
}
