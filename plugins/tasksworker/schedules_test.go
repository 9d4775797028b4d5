package tasksworker

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/capabilitytest"
)

// waitUntil polls cond for up to d.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestSchedulesAPI(t *testing.T) {
	f := start(t, map[string]any{"beat_tick_seconds": 0.2})
	res := f.do("POST", "/api/schedules", `{"name": "every-sec", "task": "demo.echo", "payload": {"n": 1}, "interval_seconds": 1}`)
	if res.status != http.StatusCreated {
		t.Fatalf("create: %d %s", res.status, res.body)
	}
	bad := map[string]string{
		`{"name": "x", "task": "demo.echo", "cron": "61 * * * *"}`:                             `cron \"61 * * * *\" is not valid`,
		`{"name": "x", "task": "demo.echo", "cron": "* * * *"}`:                                "has 4 fields; it needs 5",
		`{"name": "x", "task": "demo.echo"}`:                                                   "give interval_seconds",
		`{"name": "x", "task": "demo.echo", "interval_seconds": 5, "cron": "* * * * *"}`:       "not both",
		`{"name": "x", "task": "demo.echo", "interval_seconds": -1}`:                           "out of range",
		`{"name": "x", "task": "no pe", "interval_seconds": 5}`:                                `task \"no pe\" can never run`,
		`{"name": "", "task": "demo.echo", "interval_seconds": 5}`:                             "name",
		`{"name": "x", "task": "demo.echo", "interval_seconds": 5, "missed_policy": "always"}`: "missed_policy",
		`{"name": "x", "task": "demo.echo", "interval_seconds": 5, "colour": "red"}`:           "unknown field",
		`{"name": "every-sec", "task": "demo.echo", "interval_seconds": 5}`:                    "exists",
	}
	for body, want := range bad {
		res := f.do("POST", "/api/schedules", body)
		if res.status/100 != 4 || !strings.Contains(string(res.body), want) {
			t.Errorf("POST %s: %d %s, want a 4xx saying %q", body, res.status, res.body, want)
		}
	}
	list := f.do("GET", "/api/schedules", "").json(t)["schedules"].([]any)
	if len(list) != 1 {
		t.Fatalf("bad requests stored schedules: %v", list)
	}
	// The beat fires it; its reports say success.
	waitUntil(t, settle, "the schedule produced two successful reports", func() bool {
		reps := f.do("GET", "/api/reports?schedule=every-sec&status=success", "").json(t)["reports"].([]any)
		return len(reps) >= 2
	})
	got := f.do("GET", "/api/schedules/every-sec", "").json(t)["schedule"].(map[string]any)
	if got["last_attempt"] == nil || got["last_success"] == nil || got["expected_next_run"] == nil {
		t.Fatalf("run state not kept: %v", got)
	}
	// Toggle off, edit to cron, delete.
	res = f.do("PUT", "/api/schedules/every-sec", `{"task": "demo.echo", "cron": "*/5 * * * *", "enabled": false}`)
	if res.status != http.StatusOK || !strings.Contains(string(res.body), `"period_seconds":300`) {
		t.Fatalf("update: %d %s", res.status, res.body)
	}
	if res := f.do("DELETE", "/api/schedules/every-sec", ""); res.status != http.StatusOK {
		t.Fatalf("delete: %d %s", res.status, res.body)
	}
	if res := f.do("GET", "/api/schedules/every-sec", ""); res.status != http.StatusNotFound {
		t.Fatalf("get deleted: %d", res.status)
	}
}

func TestConfigDeclaredSchedules(t *testing.T) {
	f := start(t, map[string]any{"schedules": []any{
		map[string]any{"name": "cfg", "task": "demo.echo", "cron": "0 9 * * 1-5"},
	}})
	s := f.do("GET", "/api/schedules/cfg", "").json(t)
	if s["schedule"].(map[string]any)["source"] != "config" || s["timing"] != "cron 0 9 * * 1-5" {
		t.Fatalf("config schedule = %v", s)
	}
	p := New(testLogger(t))
	defer p.Stop(context.Background())
	err := p.Configure(context.Background(), capability.ConfigureRequest{Host: &capabilitytest.Host{},
		Config: json.RawMessage(`{"broker": "memory", "schedules": [{"name": "bad", "task": "demo.echo", "cron": "every day"}]}`)})
	var ice *capability.InvalidConfigError
	if err == nil || !strings.Contains(err.Error(), "schedules[0]") || !strings.Contains(err.Error(), `cron "every day" has 2 fields`) {
		t.Fatalf("bad config schedule: %v (%T)", err, ice)
	}
}

// TestScheduleThatStopsProducing is the brain case: a schedule whose
// message is discarded on every tick, because its lock is held by a dead
// worker and the reaper is disabled. The beat keeps firing, so the overdue
// gauge stays near zero, while since_success / interval climbs past 3.
// With the reaper on, the lock is released, the schedule produces again
// and the ratio falls.
func TestScheduleThatStopsProducing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	cfg := map[string]any{
		"broker": "local", "data_dir": dir, "beat_tick_seconds": 0.2,
		"heartbeat_interval_seconds": 0.2, "orphan_reclaim_after_seconds": 1,
		"orphan_claim_grace_seconds": 0.1, "orphan_reclaim_interval_seconds": 0.5,
		"orphan_reclaim_enabled": false,
		"schedules": []any{
			map[string]any{"name": "brain", "task": "demo.echo", "payload": map[string]any{"lock": "L"}, "interval_seconds": 1},
			// never fails every run: it never has a since_success series.
			map[string]any{"name": "never", "task": "demo.fail", "interval_seconds": 1},
		},
	}
	f := start(t, cfg)
	ratio := func() (float64, float64, bool) {
		fams := f.scrape()
		since := value(fams, "fastpluggy_scheduled_task_since_success_seconds", "task", "demo.echo")
		interval := value(fams, "fastpluggy_scheduled_task_interval_seconds", "task", "demo.echo")
		overdue := value(fams, "fastpluggy_schedule_overdue_seconds")
		if since < 0 || interval <= 0 {
			return 0, overdue, false
		}
		return since / interval, overdue, true
	}
	waitUntil(t, settle, "the first success gives the schedule its series", func() bool {
		_, _, ok := ratio()
		return ok
	})
	// The first run of brain may succeed before any scrape could look, so
	// the rule "no success, no series" is checked on never, which has run
	// and failed by now (both are due from the start).
	waitUntil(t, settle, "never has run and failed", func() bool {
		rs, _ := f.do("GET", "/api/reports?schedule=never", "").json(t)["reports"].([]any)
		return len(rs) > 0
	})
	if v := value(f.scrape(), "fastpluggy_scheduled_task_since_success_seconds", "task", "demo.fail"); v >= 0 {
		t.Fatalf("a schedule that never succeeded has a since_success series (%v)", v)
	}

	// A worker takes lock L and dies: it never heartbeats again.
	b := f.plugin.current().broker
	ctx := context.Background()
	if err := b.RegisterWorker(ctx, broker.WorkerInfo{ID: "dead-worker", Host: "elsewhere", PID: 1, Roles: []string{broker.RoleWorker}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Submit(ctx, broker.SubmitRequest{Topic: "held", Task: "demo.sleep", Payload: json.RawMessage(`{"seconds": 0}`)}); err != nil {
		t.Fatal(err)
	}
	msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "dead-worker", Topics: []string{"held"}, Max: 1})
	if err != nil || len(msgs) != 1 {
		t.Fatalf("claim as the dead worker: %v %v", msgs, err)
	}
	if ok, err := b.AcquireLock(ctx, "L", "dead-worker", msgs[0].ClaimOf()); err != nil || !ok {
		t.Fatalf("lock as the dead worker: %v %v", ok, err)
	}

	var overdue float64
	waitUntil(t, settle, "since_success / interval climbs above 3", func() bool {
		r, o, ok := ratio()
		overdue = o
		return ok && r > 3
	})
	if overdue > 2 {
		t.Fatalf("overdue = %vs: the beat kept firing, it should stay near 0", overdue)
	}
	skipped := f.do("GET", "/api/reports?schedule=brain&status=skipped", "").json(t)["reports"].([]any)
	if len(skipped) == 0 {
		t.Fatal("no skipped reports while the lock was held")
	}

	// Turn the reaper on (same store): the lock goes, production resumes.
	cfg["orphan_reclaim_enabled"] = true
	raw, _ := json.Marshal(cfg)
	if err := f.client.Configure(ctx, capability.ConfigureRequest{Config: raw, Host: &capabilitytest.Host{}}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, settle, "the ratio falls below 3 again", func() bool {
		r, _, ok := ratio()
		return ok && r < 3
	})
	locks, err := f.plugin.current().broker.Locks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range locks {
		if l.Holder == "dead-worker" {
			t.Fatalf("the dead worker still holds %s", l.Name)
		}
	}
}

// A cron schedule that has not fired yet shows when it will: its next
// cron time (next_run), not nothing.
func TestScheduleShowsItsNextRunBeforeItFires(t *testing.T) {
	f := start(t, nil)
	if res := f.do("POST", "/api/schedules", `{"name": "at-three", "task": "demo.echo", "cron": "0 3 * * *"}`); res.status != http.StatusCreated && res.status != http.StatusOK {
		t.Fatalf("create: %d %s", res.status, res.body)
	}
	v := f.do("GET", "/api/schedules/at-three", "").json(t)
	s, _ := v["next_run"].(string)
	next, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("next_run %q: %v (view %v)", s, err, v)
	}
	if next.UTC().Hour() != 3 || next.Minute() != 0 || !next.After(time.Now()) || next.After(time.Now().Add(24*time.Hour)) {
		t.Fatalf("next_run = %s, want the next 03:00 UTC", next)
	}
	// The list shows it as the single get does; a disabled schedule has
	// none.
	if res := f.do("POST", "/api/schedules", `{"name": "off", "task": "demo.echo", "cron": "0 3 * * *", "enabled": false}`); res.status != http.StatusCreated {
		t.Fatalf("create a disabled one: %d %s", res.status, res.body)
	}
	var list struct {
		Schedules []map[string]any `json:"schedules"`
	}
	if err := json.Unmarshal(f.do("GET", "/api/schedules", "").body, &list); err != nil {
		t.Fatal(err)
	}
	got := map[string]any{}
	for _, item := range list.Schedules {
		got[item["name"].(string)] = item["next_run"]
	}
	if got["at-three"] != s || got["off"] != nil || len(got) != 2 {
		t.Fatalf("next_run in the list = %v, want at-three's %s and none for off", got, s)
	}
}

// max_payload_bytes bounds a schedule's payload as it bounds a task's:
// POST schedules answers 400 and a config schedule fails check-config,
// both saying so as a submit does.
func TestSchedulePayloadOverTheLimitIsRefused(t *testing.T) {
	f := start(t, map[string]any{"max_payload_bytes": 64})
	payload := `{"s": "` + strings.Repeat("a", 64) + `"}`
	want := "payload is 72 bytes, the limit is 64 (max_payload_bytes)"
	if res := f.do("POST", "/api/tasks", `{"task": "demo.echo", "payload": `+payload+`}`); res.status != http.StatusBadRequest || !strings.Contains(string(res.body), want) {
		t.Errorf("POST tasks: %d %s, want 400 saying %q", res.status, res.body, want)
	}
	res := f.do("POST", "/api/schedules", `{"name": "big", "task": "demo.echo", "interval_seconds": 5, "payload": `+payload+`}`)
	if res.status != http.StatusBadRequest || !strings.Contains(string(res.body), want) {
		t.Errorf("POST schedules: %d %s, want 400 saying %q", res.status, res.body, want)
	}
	if res := f.do("GET", "/api/schedules/big", ""); res.status != http.StatusNotFound {
		t.Errorf("the refused schedule: %d %s, want 404", res.status, res.body)
	}
	err := New(testLogger(t)).CheckConfig(json.RawMessage(`{"max_payload_bytes": 64, "schedules": [{"name": "big", "task": "demo.echo", "interval_seconds": 5, "payload": ` + payload + `}]}`))
	if err == nil || !strings.Contains(err.Error(), "schedules[0]") || !strings.Contains(err.Error(), want) {
		t.Errorf("check-config: %v, want an error naming schedules[0] saying %q", err, want)
	}
}
