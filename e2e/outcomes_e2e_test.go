package e2e

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker/postgres"
	"github.com/taskhost/taskhost/internal/testdb"
)

// exampleHost starts a host on a PostgreSQL schema of its own with
// tasks_worker and the example plugin, and waits until tasks_worker runs
// the example's tasks.
func exampleHost(t *testing.T, schema string) *hostProc {
	t.Helper()
	h := startHost(t, twConfig(schema, twOpts{})+"  example:\n    enabled: true\n")
	waitFor(t, 60*time.Second, "tasks_worker registers the example's tasks", func() bool {
		var out struct {
			Workers []struct {
				Tasks []string `json:"tasks"`
			} `json:"workers"`
		}
		if _, err := call("GET", h.api("/workers"), nil, &out); err != nil {
			return false
		}
		for _, w := range out.Workers {
			if slices.Contains(w.Tasks, "example.sleep") {
				return true
			}
		}
		return false
	})
	return h
}

// submitJSON submits a task through h's API and returns its id.
func (p *hostProc) submitJSON(t *testing.T, body map[string]any) string {
	t.Helper()
	var out struct {
		ID string `json:"id"`
	}
	if _, err := call("POST", p.api("/tasks"), body, &out); err != nil {
		t.Fatalf("submit %v: %v", body, err)
	}
	return out.ID
}

type reportView struct {
	Status string   `json:"status"`
	Error  string   `json:"error"`
	Logs   []string `json:"logs"`
}

// reportsOf lists message id's reports, oldest first.
func (p *hostProc) reportsOf(t *testing.T, id string) []reportView {
	t.Helper()
	var out struct {
		Reports []reportView `json:"reports"`
	}
	if _, err := call("GET", p.api("/reports?message_id="+id), nil, &out); err != nil {
		t.Fatalf("reports of %s: %v", id, err)
	}
	slices.Reverse(out.Reports)
	return out.Reports
}

func statusesOf(rs []reportView) string {
	var s []string
	for _, r := range rs {
		s = append(s, r.Status)
	}
	return strings.Join(s, ",")
}

func finished(m twTask) bool { return m.State == "failed" || m.State == "dead" }

// TestProviderOutcomesThroughTheHost: tasks of the example plugin, run
// through the real host, snooze without using attempts, fail permanently
// on a bad payload, and a snooze out of range fails the attempt as an
// error does.
func TestProviderOutcomesThroughTheHost(t *testing.T) {
	h := exampleHost(t, pgSchema(t))

	// Snoozes until three seconds from now, a quarter of a second at a
	// time, with one attempt allowed.
	until := time.Now().Add(3 * time.Second).UTC().Format(time.RFC3339Nano)
	snoozer := h.submitJSON(t, map[string]any{"task": "example.snooze", "payload": map[string]any{"until": until, "seconds": 0.25}, "max_attempts": 1})
	// Snoozes for an hour: back in the queue, its attempt given back.
	sleeper := h.submitJSON(t, map[string]any{"task": "example.snooze",
		"payload": map[string]any{"until": time.Now().Add(2 * time.Hour).UTC().Format(time.RFC3339), "seconds": 3600}, "max_attempts": 1})
	// A bad payload: one attempt of the three the task allows.
	bad := h.submitJSON(t, map[string]any{"task": "example.greet", "payload": map[string]any{"nom": "Ada"}})
	// A snooze out of range: an error, retried, then the end.
	negative := h.submitJSON(t, map[string]any{"task": "example.snooze",
		"payload": map[string]any{"until": time.Now().Add(time.Hour).UTC().Format(time.RFC3339), "seconds": -1}, "max_attempts": 2})

	m := h.waitTask(t, snoozer, 60*time.Second, "done", func(m twTask) bool { return m.State == "done" })
	if m.Attempts != 1 || !strings.Contains(string(m.Result), "waited_until") {
		t.Errorf("example.snooze: attempts %d, result %s; want done in its one attempt", m.Attempts, m.Result)
	}
	var rs []reportView
	waitFor(t, 30*time.Second, "the snoozer's reports", func() bool {
		rs = h.reportsOf(t, snoozer)
		return len(rs) > 0 && rs[len(rs)-1].Status == "success"
	})
	// Snoozed runs, then the success (on a machine so loaded that the
	// first run came after the time, the success alone).
	if st := statusesOf(rs); strings.Count(st, "snoozed") != len(rs)-1 {
		t.Errorf("example.snooze's reports: %s; want snoozed ones then a success", st)
	}

	waitFor(t, 60*time.Second, "the hour's snooze is reported", func() bool { return statusesOf(h.reportsOf(t, sleeper)) == "snoozed" })
	m = h.waitTask(t, sleeper, 30*time.Second, "queued", func(m twTask) bool { return m.State == "queued" })
	if m.Attempts != 0 || m.Error == nil || *m.Error != "snoozed: run again in 1h0m0s" {
		t.Errorf("example.snooze for an hour: %s, %d attempts, error %v; want queued with its attempt given back", m.State, m.Attempts, m.Error)
	}

	m = h.waitTask(t, bad, 60*time.Second, "failed", finished)
	if m.Attempts != 1 || m.Error == nil || !strings.Contains(*m.Error, `the payload must be {"name": "..."}`) {
		t.Errorf("example.greet with a bad payload: %s after %d attempts, error %v; want one attempt", m.State, m.Attempts, m.Error)
	}

	m = h.waitTask(t, negative, 60*time.Second, "failed", finished)
	if m.Attempts != 2 || m.Error == nil || !strings.Contains(*m.Error, "asked to snooze for -1s, which is out of range") {
		t.Errorf("example.snooze of -1 s: %s after %d attempts, error %v; want two failed attempts saying why", m.State, m.Attempts, m.Error)
	}
	waitFor(t, 30*time.Second, "the bad snooze's reports", func() bool { return len(h.reportsOf(t, negative)) == 2 })
	if st := statusesOf(h.reportsOf(t, negative)); st != "failed,failed" {
		t.Errorf("the bad snooze's reports: %s", st)
	}
}

// exampleRunning is what the example plugin's GET /running answers: the
// tasks running in the provider's process.
func (p *hostProc) exampleRunning(t *testing.T) int {
	t.Helper()
	var out struct {
		Running int `json:"running"`
	}
	if _, err := call("GET", p.base+"/plugin-pkg/example/running", nil, &out); err != nil {
		return -1
	}
	return out.Running
}

// TestCancelAProviderTaskThroughTheHost: tasks running in the example
// plugin stop in the provider's process (their RunTask's context is
// cancelled across the plugin boundary) and end cancelled in their one
// attempt of three, whether the cancel is asked of the host that runs
// them (POST /api/tasks/{id}/cancel) or of the broker by another process;
// a task that cancels itself ends so too.
func TestCancelAProviderTaskThroughTheHost(t *testing.T) {
	schema := pgSchema(t)
	h := exampleHost(t, schema)
	b, err := postgres.New(t.Context(), postgres.Options{DSN: testdb.DSN(), Schema: schema, MaxConns: 2})
	if err != nil {
		t.Fatalf("PostgreSQL broker: %v\n%s", err, testdb.HowToStart)
	}
	defer b.Close()

	self := h.submitJSON(t, map[string]any{"task": "example.cancel_self", "payload": map[string]any{"reason": "the order was withdrawn"}})
	m := h.waitTask(t, self, 60*time.Second, "cancelled", func(m twTask) bool { return m.State == "cancelled" })
	if m.Attempts != 1 || m.Error == nil || *m.Error != "the order was withdrawn" {
		t.Errorf("example.cancel_self: %d attempts, error %v; want one attempt and its reason", m.Attempts, m.Error)
	}

	for _, how := range []string{"api", "broker"} {
		id := h.submitJSON(t, map[string]any{"task": "example.sleep", "payload": map[string]any{"seconds": 3600}})
		h.waitTask(t, id, 60*time.Second, "running", func(m twTask) bool { return m.State == "running" })
		waitFor(t, 60*time.Second, "example.sleep runs in the provider", func() bool { return h.exampleRunning(t) == 1 })
		switch how {
		case "api":
			var out struct {
				State           string `json:"state"`
				CancelRequested bool   `json:"cancel_requested"`
			}
			code, err := call("POST", h.api("/tasks/"+id+"/cancel"), nil, &out)
			if err != nil || code != 202 || out.State != "running" || !out.CancelRequested {
				t.Fatalf("cancel of the running example.sleep through the API: %d %+v, %v", code, out, err)
			}
		case "broker":
			n, _ := strconv.ParseInt(id, 10, 64)
			if m, err := b.Cancel(t.Context(), n); err != nil || m.State != "running" {
				t.Fatalf("cancel of the running example.sleep through the broker: %s, %v", m.State, err)
			}
		}
		waitFor(t, 60*time.Second, "example.sleep stops in the provider ("+how+")", func() bool { return h.exampleRunning(t) == 0 })
		m = h.waitTask(t, id, 60*time.Second, "cancelled", func(m twTask) bool { return m.State == "cancelled" })
		if m.Attempts != 1 {
			t.Errorf("the example.sleep cancelled through the %s has %d attempts, want 1", how, m.Attempts)
		}
		var rs []reportView
		waitFor(t, 30*time.Second, "the cancelled attempt's report", func() bool { rs = h.reportsOf(t, id); return len(rs) > 0 })
		if st := statusesOf(rs); st != "cancelled" {
			t.Errorf("reports of the example.sleep cancelled through the %s: %s", how, st)
		}
		// Finished: a second cancel answers 409 with its state.
		if code, err := call("POST", h.api("/tasks/"+id+"/cancel"), nil, nil); code != 409 || err == nil || !strings.Contains(err.Error(), `"state":"cancelled"`) {
			t.Errorf("cancel of the cancelled example.sleep: %d %v, want 409 naming its state", code, err)
		}
	}
}
