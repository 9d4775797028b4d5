package chaos

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestChaos builds the network and PostgreSQL once and runs the
// scenarios, each on a schema and hosts of its own.
func TestChaos(t *testing.T) {
	e := setup(t, 3)
	t.Run("a_worker_cut_off", func(t *testing.T) { scenarioWorkerCutOff(t, e) })
	t.Run("b_leader_cut_off", func(t *testing.T) { scenarioLeaderCutOff(t, e) })
	t.Run("c_postgres_restart_and_outage", func(t *testing.T) { scenarioPostgresDown(t, e) })
	t.Run("d_flaky_link", func(t *testing.T) { scenarioFlakyLink(t, e) })
}

// begin readies a scenario: every link up, the proxy passing, the hosts
// started on a fresh schema, a direct connection and the sampler.
func (e *env) begin(t *testing.T, schema string) ([]*host, *pgx.Conn, *sampler) {
	t.Helper()
	for i, l := range e.links {
		_ = run("ip", "link", "set", l.root, "up")
		e.px[i].setMode(pxPass)
	}
	t.Cleanup(func() {
		for i, l := range e.links {
			_ = run("ip", "link", "set", l.root, "up")
			e.px[i].setMode(pxPass)
		}
	})
	hs := e.startHosts(t, schema)
	c := e.dbConn(t, schema)
	s := startSampler(t, e, schema, hs)
	return hs, c, s
}

// leaderNow waits until exactly one host says it leads, and returns it.
func leaderNow(t *testing.T, hs []*host, timeout time.Duration) (int, health) {
	t.Helper()
	idx, lh := -1, health{}
	waitFor(t, timeout, "exactly one host leads the beat", func() bool {
		idx = -1
		n := 0
		for i, h := range hs {
			var hh health
			if err := h.get("/health", &hh); err != nil {
				return false
			}
			if hh.Beat.Leader {
				n++
				idx, lh = i, hh
			}
		}
		return n == 1
	})
	return idx, lh
}

// inFlight counts the messages of ids not ended yet (-1 when the
// database does not answer).
func inFlight(c *pgx.Conn, ids []int64) int {
	n, err := terminal(c, ids)
	if err != nil {
		return -1
	}
	return len(ids) - n
}

type claim struct {
	id       int64
	attempts int
}

// runningUnder lists the messages running under worker's claims.
func runningUnder(c *pgx.Conn, worker string) ([]claim, error) {
	rows, err := c.Query(context.Background(), `SELECT id, attempts FROM tw_messages WHERE state = 'running' AND claimed_by = $1
		UNION ALL
		SELECT m.id, m.attempts + 1 FROM tw_claims c JOIN tw_messages m ON m.id = ANY (c.ids) WHERE c.worker = $1
		ORDER BY 1`, worker)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (claim, error) {
		var x claim
		return x, r.Scan(&x.id, &x.attempts)
	})
}

// ---- a. a worker host cut off from PostgreSQL ----

// scenarioWorkerCutOff: a host that is not the beat leader is cut off
// (its veth down: a partition, its connections hang) while it runs tasks,
// for longer than orphan_reclaim_after_seconds. The leader's reaper
// reclaims its claims and other hosts run them; after the heal, the cut
// host's late acks are refused and recorded as lost.
func scenarioWorkerCutOff(t *testing.T, e *env) {
	hs, c, s := e.begin(t, "chaos_a")
	leader, _ := leaderNow(t, hs, 30*time.Second)
	vi := (leader + 1) % len(hs)
	victim := hs[vi]
	var vh health
	if err := victim.get("/health", &vh); err != nil {
		t.Fatal(err)
	}
	ids := submitAll(t, hs, 200, 100)

	var snap []claim
	waitFor(t, 30*time.Second, victim.name+" runs at least 3 messages", func() bool {
		var err error
		snap, err = runningUnder(c, vh.WorkerID)
		return err == nil && len(snap) >= 3
	})
	pending := inFlight(c, ids)
	cutAt := time.Now()
	e.links[vi].cut(t)
	t.Logf("%s (%s) cut off at %s holding %d claims", victim.name, vh.WorkerID, cutAt.Format("15:04:05.000"), len(snap))

	// Its claims are reclaimed: none of the snapshot runs under it any more.
	recovered := waitFor(t, 60*time.Second, "the cut host's claims are reclaimed", func() bool {
		now, err := runningUnder(c, vh.WorkerID)
		if err != nil {
			return false
		}
		for _, x := range now {
			if slices.ContainsFunc(snap, func(y claim) bool { return y.id == x.id }) {
				return false
			}
		}
		return true
	})
	// Stay cut off well past orphan_reclaim_after_seconds.
	if d := 3*reclaimAfter*time.Second - time.Since(cutAt); d > 0 {
		time.Sleep(d)
	}
	e.links[vi].heal(t)
	cutFor := time.Since(cutAt)
	t.Logf("healed after %s", cutFor.Round(10*time.Millisecond))

	waitTerminal(t, c, ids, 180*time.Second)

	// Each snapshot claim that was taken from the victim must be recorded
	// lost by it: its run finished during the cut, and its ack, sent once
	// healed, was refused.
	var missing []string
	elsewhere := 0
	waitFor(t, 60*time.Second, "the cut host records its reclaimed attempts as lost", func() bool {
		missing, elsewhere = missing[:0], 0
		for _, x := range snap {
			var claimedBy string
			var attempts int
			if err := c.QueryRow(context.Background(), `SELECT coalesce(claimed_by, ''), attempts FROM tw_messages_all WHERE id = $1`, x.id).Scan(&claimedBy, &attempts); err != nil {
				return false
			}
			if claimedBy == vh.WorkerID && attempts == x.attempts {
				continue // not reclaimed after all: its own ack counted
			}
			if claimedBy != vh.WorkerID {
				elsewhere++
			}
			var n int
			if err := c.QueryRow(context.Background(), `SELECT count(*) FROM tw_reports WHERE message_id = $1 AND attempt = $2 AND worker = $3 AND status = 'lost'`,
				x.id, x.attempts, vh.WorkerID).Scan(&n); err != nil {
				return false
			}
			if n != 1 {
				missing = append(missing, fmt.Sprintf("message %d attempt %d: %d lost reports", x.id, x.attempts, n))
			}
		}
		return len(missing) == 0
	})
	st, err := victim.worker()
	if err != nil {
		t.Fatal(err)
	}
	f := figures{scenario: "a worker cut off", recover: recovered, recoverWhat: "cut to its claims reclaimed",
		extra: []string{fmt.Sprintf("in_flight_at_cut=%d cut_for=%s reclaimed=%d run_elsewhere=%d victim_restarts=%d", pending, cutFor.Round(100*time.Millisecond), len(snap), elsewhere, st.Restarts)}}
	check(t, hs, c, ids, s, &f)
	if st.Restarts != 0 {
		t.Errorf("%s's tasks_worker was restarted %d times by its host while cut off", victim.name, st.Restarts)
	}
}

// ---- b. the beat leader cut off ----

// scenarioLeaderCutOff: the leader's link to PostgreSQL turns into a
// blackhole (the proxy forwards nothing, connections hang) for three lease
// lengths. A standby leads within the lease TTL (plus one renewal
// interval, how often a standby tries); no two hosts lead at once; after
// the heal the old leader is a standby.
func scenarioLeaderCutOff(t *testing.T, e *env) {
	hs, c, s := e.begin(t, "chaos_b")
	ids := submitAll(t, hs, 150, 100)
	li, lh := leaderNow(t, hs, 30*time.Second)
	time.Sleep(2 * time.Second) // tasks in flight everywhere
	pending := inFlight(c, ids)
	cutAt := time.Now()
	e.px[li].setMode(pxBlackhole)
	var nh health
	took := waitFor(t, 30*time.Second, "a standby leads at a later term", func() bool {
		for i, h := range hs {
			if i == li {
				continue
			}
			var hh health
			if h.get("/health", &hh) == nil && hh.Beat.Leader && hh.Beat.Term > lh.Beat.Term {
				nh = hh
				return true
			}
		}
		return false
	})
	if d := 3*leaseTTL*time.Second - time.Since(cutAt); d > 0 {
		time.Sleep(d)
	}
	e.px[li].setMode(pxPass)
	cutFor := time.Since(cutAt)
	// After the heal: one leader, and it is not the old one at its old term.
	time.Sleep(2 * time.Second)
	li2, lh2 := leaderNow(t, hs, 30*time.Second)
	waitTerminal(t, c, ids, 180*time.Second)
	f := figures{scenario: "b leader cut off", recover: took, recoverWhat: "cut to a standby leading",
		extra: []string{fmt.Sprintf("in_flight_at_cut=%d cut_for=%s term=%d->%d leader_after_heal=%s@%d", pending, cutFor.Round(100*time.Millisecond), lh.Beat.Term, nh.Beat.Term, hs[li2].name, lh2.Beat.Term)}}
	check(t, hs, c, ids, s, &f)
	if limit := time.Duration(leaseTTL)*time.Second + time.Duration(leaseTTL)*time.Second/3 + time.Second; took > limit {
		t.Errorf("a standby led %s after the cut; want within the lease TTL %ds plus a renewal (%s)", took, leaseTTL, limit)
	}
	if li2 == li && lh2.Beat.Term == lh.Beat.Term {
		t.Errorf("after the heal the old leader %s leads at its old term %d", hs[li].name, lh.Beat.Term)
	}
}

// ---- c. PostgreSQL restarted, then stopped for 60 s ----

// allHealthy reports whether every host's tasks_worker says ok.
func allHealthy(hs []*host) bool {
	for _, h := range hs {
		var hh health
		if h.get("/health", &hh) != nil || hh.Status != "ok" {
			return false
		}
	}
	return true
}

// probe submits a task and waits until it is done; how long it took.
func probe(t *testing.T, hs []*host, c *pgx.Conn, timeout time.Duration) (int64, time.Duration) {
	t.Helper()
	start := time.Now()
	var id int64
	waitFor(t, timeout, "a probe task is accepted", func() bool {
		for _, h := range hs {
			var err error
			if id, err = h.submit("demo.echo", "free", map[string]any{"probe": true}); err == nil {
				return true
			}
		}
		return false
	})
	waitTerminal(t, c, []int64{id}, timeout)
	return id, time.Since(start)
}

func scenarioPostgresDown(t *testing.T, e *env) {
	hs, c, s := e.begin(t, "chaos_c")
	ids := submitAll(t, hs, 150, 100)
	time.Sleep(2 * time.Second)

	// Restart.
	pendingRestart := inFlight(c, ids)
	restartAt := time.Now()
	e.pg.stop()
	e.pg.start(t)
	c = e.dbConn(t, "chaos_c")
	waitFor(t, 60*time.Second, "every host is healthy after the restart", func() bool { return allHealthy(hs) })
	pid, _ := probe(t, hs, c, 60*time.Second)
	ids = append(ids, pid)
	recRestart := time.Since(restartAt)

	// Stopped for 60 s.
	time.Sleep(time.Second)
	pendingStop := inFlight(c, ids)
	var accepted0 int64
	for _, px := range e.px {
		accepted0 += px.accepted.Load()
	}
	s.paused.Store(true) // each health request would try to connect too
	stopAt := time.Now()
	e.pg.stop()
	degraded := map[string]bool{}  // the plugin's /api/health said not ok
	hdegraded := map[string]bool{} // the host's /healthz said degraded
	for time.Since(stopAt) < 60*time.Second {
		for _, h := range hs {
			var hh health
			if err := h.get("/health", &hh); err != nil || hh.Status != "ok" {
				degraded[h.name] = true
			}
			var hz struct {
				Status string `json:"status"`
			}
			if h.root("/healthz", &hz) == nil && hz.Status == "degraded" {
				hdegraded[h.name] = true
			}
		}
		time.Sleep(time.Second)
	}
	var accepted1 int64
	for _, px := range e.px {
		accepted1 += px.accepted.Load()
	}
	connRate := float64(accepted1-accepted0) / time.Since(stopAt).Seconds() / float64(len(hs))
	startAt := time.Now()
	e.pg.start(t)
	s.paused.Store(false)
	c = e.dbConn(t, "chaos_c")
	healthy := waitFor(t, 90*time.Second, "every host is healthy after the outage", func() bool { return allHealthy(hs) })
	pid, _ = probe(t, hs, c, 90*time.Second)
	ids = append(ids, pid)
	recOutage := time.Since(startAt)
	waitTerminal(t, c, ids, 180*time.Second)

	var states []string
	for _, h := range hs {
		st, err := h.worker()
		if err != nil {
			t.Fatal(err)
		}
		states = append(states, fmt.Sprintf("%s:%s/restarts=%d", h.name, st.State, st.Restarts))
		if st.State == "failed" {
			t.Errorf("%s's tasks_worker is failed: it needs an operator", h.name)
		}
	}
	f := figures{scenario: "c postgres restart+60s outage", recover: recOutage, recoverWhat: "start after 60s outage to all healthy and a new task done",
		extra: []string{fmt.Sprintf("in_flight_at_restart=%d in_flight_at_stop=%d recover_restart=%s healthy_after_outage=%s connects_per_host_per_s_during_outage=%.1f plugins=%v",
			pendingRestart, pendingStop, recRestart.Round(10*time.Millisecond), healthy.Round(10*time.Millisecond), connRate, states)}}
	check(t, hs, c, ids, s, &f)
	// Each host's own connection attempts while nothing answers: its
	// heartbeat (every 0.5 s), the beat's lease (every 1 s), the claims
	// and the outcome writes (which back off to 5 s), the suite's one
	// health request a second. A worker that retried in a loop would make
	// hundreds.
	if connRate > 20 {
		t.Errorf("%.1f connection attempts per host per second while PostgreSQL was down: the workers do not back off", connRate)
	}
	for _, h := range hs {
		if !degraded[h.name] {
			t.Errorf("%s's /api/health never said anything but ok during the 60 s outage", h.name)
		}
		if !hdegraded[h.name] {
			t.Errorf("%s's /healthz never said degraded during the 60 s outage", h.name)
		}
	}
}

// ---- d. a flaky link ----

// scenarioFlakyLink: a first batch runs on a clean link; then every
// host's link to PostgreSQL turns flaky (each chunk delayed up to 20 ms,
// connections stalling for 0.5 to 2.5 s now and then and reset now and
// then) while a second, larger batch runs. Throughput drops; the
// invariants hold.
func scenarioFlakyLink(t *testing.T, e *env) {
	hs, c, s := e.begin(t, "chaos_d")
	start := time.Now()
	clean := submitAll(t, hs, 60, 40)
	waitTerminal(t, c, clean, 120*time.Second)
	cleanRate := float64(len(clean)) / time.Since(start).Seconds()

	fl := flakiness{maxDelay: 20 * time.Millisecond, stallProb: 0.004, stallMin: 500 * time.Millisecond, stallMax: 2500 * time.Millisecond,
		resetProb: 0.003, minLifeRst: 200 * time.Millisecond}
	for _, px := range e.px {
		px.flaky = fl
		px.resets.Store(0)
		px.stalls.Store(0)
		px.setMode(pxFlaky)
	}
	start = time.Now()
	flaky := submitAll(t, hs, 150, 100)
	waitTerminal(t, c, flaky, 240*time.Second)
	flakyRate := float64(len(flaky)) / time.Since(start).Seconds()
	var resets, stalls int64
	for _, px := range e.px {
		px.setMode(pxPass)
		resets += px.resets.Load()
		stalls += px.stalls.Load()
	}
	strays := 0
	for _, h := range hs {
		strays += strings.Count(tail(h.logPath, 1<<30), "requeued a message claimed for this worker that never reached it")
	}
	f := figures{scenario: "d flaky link", recover: 0, recoverWhat: "n/a",
		extra: []string{fmt.Sprintf("throughput_clean=%.1f/s throughput_flaky=%.1f/s resets=%d stalls=%d strays_requeued=%d", cleanRate, flakyRate, resets, stalls, strays)}}
	check(t, hs, c, append(clean, flaky...), s, &f)
}
