package host_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func scheduleTestDSN() string {
	if dsn := os.Getenv("TEST_DATABASE_URL"); dsn != "" {
		return dsn
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// scheduleTestSchema returns a fresh schema, dropped when the test ends; it
// fails the test when PostgreSQL does not answer.
func scheduleTestSchema(t *testing.T) (string, *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, scheduleTestDSN())
	if err != nil {
		t.Fatalf("PostgreSQL is not reachable at %s (%v): start it with `pg_ctlcluster 15 main start`, or set TEST_DATABASE_URL", scheduleTestDSN(), err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "th_sched_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		_, _ = conn.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		conn.Close(context.Background())
	})
	return schema, conn
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
	cfg := strings.NewReplacer("DSN", scheduleTestDSN(), "SCHEMA", schema).Replace(`
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
	waitFor(t, 10*time.Second, "exactly one host leads", func() bool {
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
	// reaper (short settings above), so allow for a reclaim.
	waitFor(t, 60*time.Second, "every fired message has exactly one success report", func() bool {
		var multi, reported int
		err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE n > 1), count(*) FROM (
			SELECT f.message_id, count(r.id) AS n FROM `+schema+`.tw_schedule_fires f
			LEFT JOIN `+schema+`.tw_reports r ON r.message_id = f.message_id AND r.status = 'success'
			WHERE f.name = 'failover' AND f.fired_at < now() - interval '3 seconds'
			GROUP BY f.message_id HAVING count(r.id) > 0) x`).Scan(&multi, &reported)
		if err != nil {
			t.Fatal(err)
		}
		if multi > 0 {
			t.Fatalf("%d scheduled messages have more than one success report", multi)
		}
		var old int
		_ = conn.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.tw_schedule_fires
			WHERE name = 'failover' AND fired_at < now() - interval '3 seconds'`).Scan(&old)
		return reported == old && old > 0
	})
}
