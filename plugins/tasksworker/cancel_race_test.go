package tasksworker

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// TestCancelsRacingTheirTasksEndEndEachTaskOnce: short tasks are cancelled
// while they run, some as they end, some before they start and some after
// they ended, on the local store and on PostgreSQL. Each task ends once,
// done or cancelled, never anything else, and what it reads agrees with
// the cancel's answer, its reports and the counters: a cancel answered 200
// (it was queued) leaves it cancelled without an attempt, one answered 409
// found it done, one answered 202 (it ran) ends it either way; a done task
// has its result and one success report and no cancelled one, a cancelled
// task that ran has one cancelled report and no success; the completed
// and cancelled counters count the tasks done and cancelled.
func TestCancelsRacingTheirTasksEndEndEachTaskOnce(t *testing.T) {
	for store, cfg := range batchStores {
		t.Run(store, func(t *testing.T) {
			c := cfg(t)
			c["workers"] = 8
			f := start(t, c)
			const n, clients = 300, 8
			ids := make([]string, n)
			answers := make([]response, n)
			var wg sync.WaitGroup
			for w := range clients {
				wg.Go(func() {
					for i := w; i < n; i += clients {
						// A task of 0 to 30 ms, cancelled 0 to 50 ms after
						// its submit: the cancels meet tasks queued,
						// running, ending and ended.
						ids[i] = f.submit(fmt.Sprintf(`{"task": "demo.sleep", "payload": {"seconds": %.3f}}`, float64(rand.IntN(31))/1000))
						time.Sleep(time.Duration(rand.IntN(51)) * time.Millisecond)
						answers[i] = f.do("POST", "/api/tasks/"+ids[i]+"/cancel", "")
					}
				})
			}
			wg.Wait()

			ended := make([]map[string]any, n)
			deadline := time.Now().Add(settle)
			for i, id := range ids {
				for {
					ended[i] = f.apiJSON("/api/tasks/" + id)
					if s := ended[i]["state"]; s != "queued" && s != "running" {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("task %s is still %v %s after its cancel", id, ended[i]["state"], settle)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}

			tally := map[string]int{}
			var done, cancelled int
			for i, id := range ids {
				task, a := ended[i], answers[i]
				state, _ := task["state"].(string)
				attempts, _ := task["attempts"].(float64)
				var statuses []string
				for _, r := range f.apiJSON("/api/reports?task_id=" + id)["reports"].([]any) {
					statuses = append(statuses, r.(map[string]any)["status"].(string))
				}
				count := func(s string) int {
					k := 0
					for _, x := range statuses {
						if x == s {
							k++
						}
					}
					return k
				}
				tally[fmt.Sprintf("cancel %d, ended %s", a.status, state)]++
				wrong := func(format string, args ...any) {
					t.Errorf("task %s (cancel answered %d %s; ended %s after %v attempts, result %v, reports %v): %s",
						id, a.status, strings.TrimSpace(string(a.body)), state, attempts, task["result"], statuses, fmt.Sprintf(format, args...))
				}
				switch state {
				case "done":
					done++
					if task["result"] == nil || count("success") != 1 || count("cancelled") != 0 || len(statuses) != int(attempts) {
						wrong("a done task has its result and one success report, and no cancelled one")
					}
				case "cancelled":
					cancelled++
					if task["result"] != nil || count("success") != 0 {
						wrong("a cancelled task has no result and no success report")
					}
					if attempts > 0 && (count("cancelled") != 1 || len(statuses) != int(attempts)) {
						wrong("a cancelled task that ran has one cancelled report")
					}
				default:
					wrong("a task ends done or cancelled")
				}
				switch a.status {
				case http.StatusOK:
					if state != "cancelled" || attempts != 0 || len(statuses) != 0 {
						wrong("a cancel answered 200 cancelled it while queued: it never runs")
					}
				case http.StatusConflict:
					if a.json(t)["state"] != "done" || state != "done" {
						wrong("a cancel answered 409 found the task done")
					}
				case http.StatusAccepted:
					if a.json(t)["cancel_requested"] != true {
						wrong("a cancel answered 202 requested the cancel of a running task")
					}
				default:
					wrong("a cancel is answered 200, 202 or 409")
				}
			}
			t.Logf("%d tasks: %v", n, tally)

			f.scrapeUntil(func(fams map[string]*dto.MetricFamily) []string {
				var wrong []string
				if v := value(fams, "fastpluggy_tasks_completed_total"); v != float64(done) {
					wrong = append(wrong, fmt.Sprintf("fastpluggy_tasks_completed_total = %v, want the %d tasks done", v, done))
				}
				if v := value(fams, "fastpluggy_tasks_cancelled_total"); v != float64(cancelled) {
					wrong = append(wrong, fmt.Sprintf("fastpluggy_tasks_cancelled_total = %v, want the %d tasks cancelled", v, cancelled))
				}
				if v := value(fams, "fastpluggy_tasks_failed_total"); v != 0 {
					wrong = append(wrong, fmt.Sprintf("fastpluggy_tasks_failed_total = %v, want 0: a cancel is no failure", v))
				}
				return wrong
			})
		})
	}
}
