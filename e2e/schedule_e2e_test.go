package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/taskhost/taskhost/internal/testdb"
)

// scheduleTestSchema returns a fresh schema, dropped when the test ends; it
// fails the test when PostgreSQL does not answer.
func scheduleTestSchema(t *testing.T) (string, *pgx.Conn) {
	t.Helper()
	conn := testdb.Connect(t, "")
	return testdb.FreshSchema(t, "th_sched_"), conn
}

type beatHealth struct {
	WorkerID string `json:"worker_id"`
	Beat     struct {
		Leader bool  `json:"leader"`
		Term   int64 `json:"term"`
	} `json:"beat"`
}

func health(h *hostProc) (beatHealth, bool) {
	var bh beatHealth
	resp, err := http.Get(h.base + "/plugin-pkg/tasks_worker/api/health")
	if err != nil {
		return bh, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&bh) != nil {
		return bh, false
	}
	return bh, true
}

// TestScheduleSurvivesLeaderDeath: two hosts share one PostgreSQL; the beat
// leader is SIGKILLed between two slots; the standby fires the next slots,
// and no slot fires twice: every fire has one message, and every message
// one successful report.
func TestScheduleSurvivesLeaderDeath(t *testing.T) {
	schema, conn := scheduleTestSchema(t)
	cfg := strings.NewReplacer("DSN", testdb.DSN(), "SCHEMA", schema).Replace(`
listen: LISTEN
plugins_dir: PLUGINS
restart_budget: 20
plugins:
  tasks_worker:
    enabled: true
    config:
      broker: postgres
      dsn: DSN
      schema: SCHEMA
      workers: 2
      heartbeat_interval_seconds: 0.5
      orphan_reclaim_after_seconds: 2
      orphan_claim_grace_seconds: 0.5
      orphan_reclaim_interval_seconds: 1
      beat_lease_ttl_seconds: 2
      beat_tick_seconds: 0.2
      schedules:
        - {name: failover, task: demo.echo, payload: {from: schedule}, interval_seconds: 2}
`)
	a := startHost(t, cfg)
	b := startHost(t, cfg)
	a.waitState(t, "tasks_worker", "running", 30*time.Second)
	b.waitState(t, "tasks_worker", "running", 30*time.Second)

	ctx := context.Background()
	fires := func() int {
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+schema+".tw_schedule_fires WHERE name = 'failover'").Scan(&n); err != nil {
			return -1
		}
		return n
	}
	waitFor(t, 30*time.Second, "the schedule fired twice", func() bool { return fires() >= 2 })

	var leader, standby *hostProc
	var term int64
	waitFor(t, 60*time.Second, "exactly one host leads", func() bool {
		ha, okA := health(a)
		hb, okB := health(b)
		if !okA || !okB || ha.Beat.Leader == hb.Beat.Leader {
			return false
		}
		if ha.Beat.Leader {
			leader, standby, term = a, b, ha.Beat.Term
		} else {
			leader, standby, term = b, a, hb.Beat.Term
		}
		return true
	})
	pid := leader.plugins(t)["tasks_worker"].PID
	before := fires()
	killedAt := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Either host may lead the next term: the standby, or the killed
	// worker once its host restarted it, if it wins the expired lease.
	waitFor(t, 30*time.Second, "a host leads at a later term", func() bool {
		for _, h := range []*hostProc{standby, leader} {
			if hs, ok := health(h); ok && hs.Beat.Leader && hs.Beat.Term > term {
				return true
			}
		}
		return false
	})
	waitFor(t, 30*time.Second, "the new leader fires further slots", func() bool { return fires() >= before+2 })

	// No slot fired twice, and every fire became exactly one message with
	// one successful report.
	var dupSlots, firesTotal, messages int
	if err := conn.QueryRow(ctx, `SELECT count(*) - count(DISTINCT slot), count(*), count(DISTINCT message_id)
		FROM `+schema+`.tw_schedule_fires WHERE name = 'failover'`).Scan(&dupSlots, &firesTotal, &messages); err != nil {
		t.Fatal(err)
	}
	if dupSlots != 0 || messages != firesTotal {
		t.Fatalf("%d fires, %d duplicate slots, %d distinct messages", firesTotal, dupSlots, messages)
	}
	var lateSlot time.Time
	if err := conn.QueryRow(ctx, "SELECT max(slot) FROM "+schema+".tw_schedule_fires WHERE name = 'failover'").Scan(&lateSlot); err != nil {
		t.Fatal(err)
	}
	if !lateSlot.After(killedAt) {
		t.Fatalf("latest slot %s is not after the leader's death at %s", lateSlot, killedAt)
	}
	// A slot whose message the killed worker held comes back through the
	// reaper (short settings above), so allow for a reclaim. Reports are
	// written just after the ack commits, so the one message the killed
	// worker finished in its last moments may be done without one: every
	// other fired message must be done with exactly one success report.
	killedWorker := fmt.Sprintf("%%-%d-%%", pid)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("fires without a success report: %s", scheduleFiresWithoutSuccess(t, conn, schema, "failover"))
		}
	})
	waitFor(t, 60*time.Second, "every fired message is done, with exactly one success report", func() bool {
		var old, multi, pending, unreported int
		err := conn.QueryRow(ctx, `
			SELECT count(*), count(*) FILTER (WHERE n > 1),
				count(*) FILTER (WHERE state IS DISTINCT FROM 'done' OR (n = 0 AND claimed_by NOT LIKE $1)),
				count(*) FILTER (WHERE state = 'done' AND n = 0 AND claimed_by LIKE $1)
			FROM (
				SELECT m.state, coalesce(m.claimed_by, '') AS claimed_by,
					(SELECT count(*) FROM `+schema+`.tw_reports r
						WHERE r.message_id = f.message_id AND r.status = 'success') AS n
				FROM `+schema+`.tw_schedule_fires f
				LEFT JOIN `+schema+`.tw_messages_all m ON m.id = f.message_id
				WHERE f.name = 'failover' AND f.fired_at < now() - interval '3 seconds') x`,
			killedWorker).Scan(&old, &multi, &pending, &unreported)
		if err != nil {
			t.Fatal(err)
		}
		if multi > 0 {
			t.Fatalf("%d scheduled messages have more than one success report", multi)
		}
		if unreported > 1 {
			t.Fatalf("%d messages the killed worker finished have no report; at most its last one may", unreported)
		}
		return pending == 0 && old > 0
	})
}

// scheduleFiresWithoutSuccess describes the fires of name older than 3 s
// whose message has no success report: the message's state and the
// reports it has, for a failure message.
func scheduleFiresWithoutSuccess(t *testing.T, conn *pgx.Conn, schema, name string) string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `
		SELECT f.slot, f.message_id, coalesce(m.state, '(no message)'), m.attempts, coalesce(m.claimed_by, ''),
			coalesce((SELECT string_agg(r.status || ' by ' || r.worker, ', ' ORDER BY r.id)
				FROM `+schema+`.tw_reports r WHERE r.message_id = f.message_id), '')
		FROM `+schema+`.tw_schedule_fires f
		LEFT JOIN `+schema+`.tw_messages_all m ON m.id = f.message_id
		WHERE f.name = $1 AND f.fired_at < now() - interval '3 seconds'
			AND NOT EXISTS (SELECT 1 FROM `+schema+`.tw_reports r WHERE r.message_id = f.message_id AND r.status = 'success')
		ORDER BY f.slot`, name)
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var (
			slot               time.Time
			id                 int64
			state, by, reports string
			attempts           *int
		)
		if err := rows.Scan(&slot, &id, &state, &attempts, &by, &reports); err != nil {
			return err.Error()
		}
		a := 0
		if attempts != nil {
			a = *attempts
		}
		out = append(out, fmt.Sprintf("slot %s message %d: %s, attempts %d, claimed by %q, reports [%s]",
			slot.Format(time.RFC3339Nano), id, state, a, by, reports))
	}
	return strings.Join(out, "; ")
}
