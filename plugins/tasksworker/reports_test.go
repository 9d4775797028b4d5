package tasksworker

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// TestReportsCarryTheTaskIDAsTheTasksAPIDoes: a report gives task_id, the
// tasks API's id (a string), beside the deprecated message_id (the same
// value as a number), and the reports list filters by either.
func TestReportsCarryTheTaskIDAsTheTasksAPIDoes(t *testing.T) {
	f := start(t, nil)
	first := f.submit(`{"task": "demo.echo", "payload": {"n": 1}}`)
	second := f.submit(`{"task": "demo.echo", "payload": {"n": 2}}`)
	f.waitState(first, "done")
	f.waitState(second, "done")
	reports := func(query string) []any {
		t.Helper()
		res := f.do("GET", "/api/reports?"+query, "")
		if res.status != http.StatusOK {
			t.Fatalf("GET reports?%s: %d %s", query, res.status, res.body)
		}
		list, _ := res.json(t)["reports"].([]any)
		return list
	}
	// Reports are written in batches, after the task is done.
	waitUntil(t, settle, "both tasks have a report", func() bool {
		return len(reports("task=demo.echo")) == 2
	})
	n, _ := strconv.ParseInt(second, 10, 64)
	for _, query := range []string{"task_id=" + second, "message_id=" + second, "task_id=" + second + "&message_id=" + second} {
		list := reports(query)
		if len(list) != 1 {
			t.Fatalf("reports?%s = %v, want the one report of task %s", query, list, second)
		}
		rep := list[0].(map[string]any)
		if rep["task_id"] != second || rep["message_id"] != float64(n) {
			t.Errorf("reports?%s: task_id %#v, message_id %#v; want %q and %d", query, rep["task_id"], rep["message_id"], second, n)
		}
		one := f.do("GET", fmt.Sprintf("/api/reports/%v", rep["id"]), "").json(t)
		if one["task_id"] != second || one["message_id"] != float64(n) {
			t.Errorf("GET reports/%v: %v; want task_id %q and message_id %d", rep["id"], one, second, n)
		}
		// The id reads the task back in the tasks API.
		if got := f.do("GET", "/api/tasks/"+rep["task_id"].(string), "").json(t); got["id"] != second {
			t.Errorf("GET tasks/<task_id> = %v, want task %s", got, second)
		}
	}
	for query, want := range map[string]string{
		"task_id=" + first + "&message_id=" + second: "name different tasks; give task_id only",
		"task_id=abc": `task_id must be a positive whole number, got \"abc\"`,
		"task_id=0":   `task_id must be a positive whole number, got \"0\"`,
	} {
		res := f.do("GET", "/api/reports?"+query, "")
		if res.status != http.StatusBadRequest || !strings.Contains(string(res.body), want) {
			t.Errorf("reports?%s: %d %s; want 400 saying %q", query, res.status, res.body, want)
		}
	}
}
