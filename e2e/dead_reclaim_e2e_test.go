package e2e

// A plugin process the host saw exit is certainly dead: its running tasks
// come back at once, under the default reaper settings, instead of after
// the fast path's silence window and the claim grace (spec 000's guards,
// which exist for a worker that only looks dead).

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/taskhost/taskhost/internal/testdb"
)

// killedWorkerBound is what the tests assert: the target is 5 s from the
// SIGKILL (the host's first restart backoff and the plugin's start
// included); a loaded machine is given room, far below the minute the
// grace alone would take.
const killedWorkerBound = 15 * time.Second

// defaultReaperConfig is a host with tasks_worker on the given broker
// lines (indented under config), every reaper and heartbeat setting left
// at its default.
func defaultReaperConfig(brokerLines string) string {
	return fmt.Sprintf(`
listen: LISTEN
plugins_dir: PLUGINS
admin_token: %s
plugins:
  tasks_worker:
    enabled: true
    config:
%s
      workers: 4
      demo_tasks: true
`, reaperToken, brokerLines)
}

// TestAKilledWorkersTasksRunAgainWithinSecondsOnPostgres: tasks_worker is
// SIGKILLed with three tasks running; the host restarts it and the new
// process reclaims the dead one's tasks at once.
func TestAKilledWorkersTasksRunAgainWithinSecondsOnPostgres(t *testing.T) {
	schema := pgSchema(t)
	testKilledWorkerRecovers(t, defaultReaperConfig(fmt.Sprintf("      broker: postgres\n      dsn: %q\n      schema: %s", testdb.DSN(), schema)))
}

// TestAKilledWorkersTasksRunAgainWithinSecondsOnLocal is the same on the
// local (SQLite) broker.
func TestAKilledWorkersTasksRunAgainWithinSecondsOnLocal(t *testing.T) {
	testKilledWorkerRecovers(t, defaultReaperConfig(fmt.Sprintf("      broker: local\n      data_dir: %q", t.TempDir())))
}

func testKilledWorkerRecovers(t *testing.T, config string) {
	h := startHost(t, config)
	before, health := h.waitWorker(t, 0)

	// The sleeps outlast the kill by far; each runs alone once reclaimed
	// (it may be what killed the worker), so they end one after another.
	const tasks, sleep = 3, 8
	var ids []string
	for range tasks {
		ids = append(ids, h.mustSubmit(t, "demo.sleep", "default", map[string]any{"seconds": sleep}))
	}
	for _, id := range ids {
		h.waitTask(t, id, 30*time.Second, "runs", func(m twTask) bool { return m.State == "running" && m.claimer() == health.WorkerID })
	}

	killed := time.Now()
	kill(t, before.PID, syscall.SIGKILL)
	// When each task was first seen no longer held by the dead worker, and
	// when the first was seen running again under another.
	reclaimed := map[string]time.Duration{}
	var runningAgain time.Duration
	deadline := killed.Add(2 * time.Minute)
	for (len(reclaimed) < tasks || runningAgain == 0) && time.Now().Before(deadline) {
		for _, id := range ids {
			m, err := h.task(id)
			if err != nil {
				continue // restarting
			}
			since := time.Since(killed)
			if _, seen := reclaimed[id]; !seen && m.claimer() != health.WorkerID {
				reclaimed[id] = since
			}
			if runningAgain == 0 && m.State == "running" && m.Attempts >= 2 {
				runningAgain = since
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	var all time.Duration
	for _, d := range reclaimed {
		all = max(all, d)
	}
	t.Logf("SIGKILL to all %d tasks reclaimed: %s; to the first running again: %s (target 5 s, asserted %s; default reaper settings)",
		len(reclaimed), all.Round(10*time.Millisecond), runningAgain.Round(10*time.Millisecond), killedWorkerBound)
	if len(reclaimed) < tasks || all > killedWorkerBound {
		t.Errorf("%d of %d tasks reclaimed, the last %s after the SIGKILL; want all within %s", len(reclaimed), tasks, all, killedWorkerBound)
	}
	if runningAgain == 0 || runningAgain > killedWorkerBound {
		t.Errorf("the first task ran again %s after the SIGKILL; want within %s", runningAgain, killedWorkerBound)
	}

	after, _ := h.waitWorker(t, before.PID)
	if after.Restarts != 1 {
		t.Errorf("restarts = %d after one SIGKILL", after.Restarts)
	}
	for _, id := range ids {
		m := h.waitTask(t, id, 2*time.Minute, "is done", func(m twTask) bool { return m.State == "done" })
		if m.Attempts != 2 || string(m.Result) != fmt.Sprintf(`{"slept_seconds":%d}`, sleep) {
			t.Errorf("task %s: attempts %d, result %s; want 2 attempts (one lost with the process, one run to the end)", id, m.Attempts, m.Result)
		}
	}
	waitFor(t, 60*time.Second, "the host log says the previous process's work was reclaimed as certainly dead", func() bool {
		return strings.Contains(h.log.String(), "reclaimed the work of this plugin's previous process")
	})
	// Nothing was refused by a guard: the dead worker was named, not
	// guessed.
	if log := h.log.String(); strings.Contains(log, "reaper failed closed") || strings.Contains(log, "reaper left orphans alone") {
		t.Errorf("a reaper guard refused part of the recovery of a worker known dead")
	}
}
