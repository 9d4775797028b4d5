package host_test

import (
	"slices"
	"strings"
	"testing"
	"time"
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

	// Snoozes until two seconds from now, a quarter of a second at a
	// time, with one attempt allowed.
	until := time.Now().Add(2 * time.Second).UTC().Format(time.RFC3339Nano)
	snoozer := h.submitJSON(t, map[string]any{"task": "example.snooze", "payload": map[string]any{"until": until, "seconds": 0.25}, "max_attempts": 1})
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
	if st := statusesOf(rs); !strings.HasPrefix(st, "snoozed,") || strings.Count(st, "snoozed") != len(rs)-1 {
		t.Errorf("example.snooze's reports: %s; want snoozed ones then a success", st)
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
