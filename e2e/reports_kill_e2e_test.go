package e2e

// Task reports across SIGKILL: each attempt's report is written in the
// transaction of its outcome, so a worker killed at any point loses no
// report of an outcome that committed, and stores none of an outcome that
// did not.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestReportsSurviveSIGKILL submits 10,000 short tasks on PostgreSQL and
// SIGKILLs the tasks_worker process twice in the middle of the burn-down
// (the host restarts it; the restarted worker reclaims the orphans). Once
// every task is done, each has exactly one report, a success, and it is
// the report of the attempt whose ack committed: its attempt and worker
// are the done message's.
func TestReportsSurviveSIGKILL(t *testing.T) {
	const tasks, batch = 10000, 1000
	schema := pgSchema(t)
	h := startHost(t, twConfig(schema, twOpts{}))
	st, _ := h.waitWorker(t, 0)
	db := pgConn(t, schema)
	ctx := context.Background()

	// Submit through the batch endpoint, all or nothing per call; a long
	// timeout, so that a slow answer is not taken for a failure (and the
	// batch sent twice).
	slow := &http.Client{Timeout: 2 * time.Minute}
	for i := 0; i < tasks; i += batch {
		items := make([]map[string]any, batch)
		for k := range items {
			items[k] = map[string]any{"task": "demo.echo", "payload": map[string]int{"n": i + k}}
		}
		if _, err := callWith(slow, "POST", h.api("/tasks/batch"), items, nil); err != nil {
			t.Fatalf("submit tasks %d to %d: %v", i, i+batch-1, err)
		}
	}

	count := func(where string) int {
		t.Helper()
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM tw_messages_all WHERE `+where).Scan(&n); err != nil {
			t.Fatalf("count messages where %s: %v", where, err)
		}
		return n
	}
	// Kill at these counts of done tasks: both well inside the burn-down.
	for _, at := range []int{tasks / 10, tasks / 2} {
		waitFor(t, 5*time.Minute, fmt.Sprintf("%d tasks are done", at), func() bool { return count("state = 'done'") >= at })
		left := count("state IN ('queued', 'running')")
		if left == 0 {
			t.Fatalf("every task was done before the kill at %d done: the kill must come in the middle of the burn-down", at)
		}
		t.Logf("SIGKILL tasks_worker (pid %d) with %d tasks done and %d left", st.PID, count("state = 'done'"), left)
		kill(t, st.PID, syscall.SIGKILL)
		st, _ = h.waitWorker(t, st.PID)
	}
	waitFor(t, 10*time.Minute, fmt.Sprintf("all %d tasks are done", tasks), func() bool { return count("state = 'done'") == tasks })
	if n := count("true"); n != tasks {
		t.Fatalf("%d messages stored, want %d", n, tasks)
	}
	if n := count("attempts > 1"); n == 0 {
		t.Errorf("no task ran twice: no kill caught an attempt in flight")
	} else {
		t.Logf("%d tasks were run again after a kill", n)
	}

	// Every done task has exactly one report, a success, of the attempt
	// whose ack committed.
	rows, err := db.Query(ctx, `
		SELECT m.id, m.attempts, m.claimed_by,
			count(r.id), count(r.id) FILTER (WHERE r.status = 'success'),
			coalesce(string_agg(r.status || ' of attempt ' || r.attempt || ' by ' || r.worker, ', ' ORDER BY r.id), '')
		FROM tw_messages_all m LEFT JOIN tw_reports r ON r.message_id = m.id
		GROUP BY m.id, m.attempts, m.claimed_by
		HAVING count(r.id) <> 1 OR count(r.id) FILTER (WHERE r.status = 'success') <> 1
			OR bool_or(r.attempt <> m.attempts OR r.worker <> m.claimed_by)
		ORDER BY m.id`)
	if err != nil {
		t.Fatal(err)
	}
	type bad struct {
		id, attempts, reports, successes int64
		claimedBy, which                 string
	}
	wrong, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (bad, error) {
		var b bad
		err := r.Scan(&b.id, &b.attempts, &b.claimedBy, &b.reports, &b.successes, &b.which)
		return b, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(wrong) > 0 {
		var lines []string
		for _, b := range wrong[:min(len(wrong), 20)] {
			lines = append(lines, fmt.Sprintf("message %d (attempt %d, done by %s): %d reports, %d successes [%s]",
				b.id, b.attempts, b.claimedBy, b.reports, b.successes, b.which))
		}
		t.Fatalf("%d of %d done tasks do not have exactly one success report of their committed attempt:\n%s",
			len(wrong), tasks, strings.Join(lines, "\n"))
	}
	var reports int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM tw_reports`).Scan(&reports); err != nil {
		t.Fatal(err)
	}
	if reports != tasks {
		t.Fatalf("%d reports stored, want %d: one per done task", reports, tasks)
	}
}
