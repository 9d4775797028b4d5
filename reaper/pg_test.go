package reaper_test

// The reaper's fail-closed guards against the real brokers: PostgreSQL on
// a fresh schema per test, and the local SQLite broker in t.TempDir(). A
// guard that refuses must leave every message running under its token and
// every lock where it was, log an ERROR line naming itself and count one
// skip; a pass the guards let through must requeue the orphan and release
// its lock in the same pass.

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/local"
	"github.com/taskhost/taskhost/broker/postgres"
	"github.com/taskhost/taskhost/internal/testdb"
	"github.com/taskhost/taskhost/reaper"
)

// pgConnect opens a bookkeeping connection (search_path = schema when not
// empty), closed at cleanup. PostgreSQL being unreachable fails the test.
func pgConnect(tb testing.TB, schema string) *pgx.Conn {
	tb.Helper()
	return testdb.Connect(tb, schema)
}

func randomSchema() string { return testdb.SchemaName("tw_reaper_") }

func dropSchema(name string) error { return testdb.DropSchema(name) }

// freshSchema returns an unused schema name, dropped at cleanup.
func freshSchema(tb testing.TB) string {
	tb.Helper()
	return testdb.FreshSchema(tb, "tw_reaper_")
}

func openPG(tb testing.TB, schema string) *postgres.Broker {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := postgres.New(ctx, postgres.Options{DSN: testdb.DSN(), Schema: schema})
	if err != nil {
		tb.Fatalf("postgres.New: %v", err)
	}
	tb.Cleanup(func() { _ = b.Close() })
	return b
}

func openLocal(tb testing.TB, path string) *local.Broker {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := local.Open(ctx, local.Options{Path: path})
	if err != nil {
		tb.Fatalf("local.Open: %v", err)
	}
	tb.Cleanup(func() { _ = b.Close() })
	return b
}

// store is one real broker, opened twice: reaper is what the reaper under
// test uses (a test may break it), observer is a second, independent
// handle on the same data for seeding and checking.
type store struct {
	reaper   broker.Broker
	observer broker.Broker
	// breakLiveSet makes the live-worker query of reaper fail while the
	// broker stays open (it renames tw_workers away); it returns the
	// repair.
	breakLiveSet func(t *testing.T) (repair func())
}

type storeKind struct {
	name string
	open func(t *testing.T) store
}

var storeKinds = []storeKind{
	{"postgres", func(t *testing.T) store {
		schema := freshSchema(t)
		s := store{reaper: openPG(t, schema), observer: openPG(t, schema)}
		s.breakLiveSet = func(t *testing.T) func() {
			c := pgConnect(t, schema)
			if _, err := c.Exec(context.Background(), `ALTER TABLE tw_workers RENAME TO tw_workers_gone`); err != nil {
				t.Fatal(err)
			}
			return func() {
				if _, err := c.Exec(context.Background(), `ALTER TABLE tw_workers_gone RENAME TO tw_workers`); err != nil {
					t.Fatal(err)
				}
			}
		}
		return s
	}},
	{"local", func(t *testing.T) store {
		path := filepath.Join(t.TempDir(), "taskhost.db")
		s := store{reaper: openLocal(t, path), observer: openLocal(t, path)}
		s.breakLiveSet = func(t *testing.T) func() {
			// The local broker's own driver, on the same file.
			db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			if _, err := db.Exec(`ALTER TABLE tw_workers RENAME TO tw_workers_gone`); err != nil {
				t.Fatal(err)
			}
			return func() {
				if _, err := db.Exec(`ALTER TABLE tw_workers_gone RENAME TO tw_workers`); err != nil {
					t.Fatal(err)
				}
			}
		}
		return s
	}},
}

const (
	self   = "reaper-self"
	other  = "live-neighbour"
	ghost  = "dead-worker" // never registered: its heartbeat is nowhere
	topic  = "guarded"
	lockNm = "guarded-lock"
)

func register(t *testing.T, b broker.Broker, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if err := b.RegisterWorker(t.Context(), broker.WorkerInfo{ID: id, Host: "test", PID: 1, Roles: []string{broker.RoleWorker}, Topics: []string{topic}, Capacity: 1}); err != nil {
			t.Fatalf("RegisterWorker(%s): %v", id, err)
		}
	}
}

// claimAs submits one message and claims it as worker, holding lock name
// under the claim when name is not empty.
func claimAs(t *testing.T, b broker.Broker, worker, lock string) broker.Message {
	t.Helper()
	ctx := t.Context()
	id, err := b.Submit(ctx, broker.SubmitRequest{Topic: topic, Task: "demo.sleep", Payload: []byte(`{"seconds":60}`)})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: worker, Topics: []string{topic}, Max: 1})
	if err != nil || len(msgs) != 1 || msgs[0].ID != id {
		t.Fatalf("Claim as %s = %+v, %v; want message %d", worker, msgs, err, id)
	}
	if lock != "" {
		got, err := b.AcquireLock(ctx, lock, worker, msgs[0].ClaimOf())
		if err != nil || !got {
			t.Fatalf("AcquireLock(%s) = %v, %v", lock, got, err)
		}
	}
	return msgs[0]
}

type harness struct {
	r    *reaper.Reaper
	m    *reaper.Metrics
	logs *bytes.Buffer
}

func newHarness(b broker.Broker, s reaper.Settings) harness {
	var logs bytes.Buffer
	m := reaper.NewMetrics(prometheus.NewRegistry())
	log := hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Info})
	return harness{r: reaper.New(b, self, s, log, m), m: m, logs: &logs}
}

func settings(grace time.Duration, maxAttempts int) reaper.Settings {
	s := reaper.DefaultSettings()
	s.After = 30 * time.Second
	s.Grace = grace
	s.MaxAttempts = maxAttempts
	return s
}

// assertUntouched checks that m is still running under its claim, held by
// its claimer, and its lock (if any) too: the token still acks.
func assertUntouched(t *testing.T, b broker.Broker, m broker.Message, lock string) {
	t.Helper()
	ctx := t.Context()
	got, err := b.GetMessage(ctx, m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != broker.StateRunning || got.ClaimedBy != m.ClaimedBy || got.Attempts != m.Attempts {
		t.Fatalf("message %d changed under a refusing guard: state %s, claimed_by %q, attempts %d (was running, %q, %d)",
			m.ID, got.State, got.ClaimedBy, got.Attempts, m.ClaimedBy, m.Attempts)
	}
	if lock != "" {
		locks, err := b.Locks(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(locks) != 1 || locks[0].Name != lock || locks[0].Holder != m.ClaimedBy || locks[0].MessageID != m.ID {
			t.Fatalf("locks changed under a refusing guard: %+v", locks)
		}
	}
	// The claim token is the same: the original claim still acks.
	errs, err := b.Ack(ctx, []broker.Outcome{{Claim: m.ClaimOf(), Result: []byte(`{"ok":true}`)}})
	if err != nil || len(errs) != 1 || errs[0] != nil {
		t.Fatalf("ack with the original token after the refusal: %v %v; the token changed", errs, err)
	}
}

func assertRefused(t *testing.T, h harness, res reaper.Result, guard reaper.Guard) {
	t.Helper()
	if res.Reclaimed != 0 || res.DeadLettered != 0 || res.LocksReleased != 0 {
		t.Fatalf("a refusing pass reports changes: %+v", res)
	}
	if got := testutil.ToFloat64(h.m.Skipped); got != 1 {
		t.Fatalf("fastpluggy_broker_orphan_reclaim_skipped_total = %v, want 1", got)
	}
	if got := testutil.ToFloat64(h.m.Reclaimed) + testutil.ToFloat64(h.m.DeadLettered); got != 0 {
		t.Fatalf("reclaimed/dead-lettered counters = %v after a refusal", got)
	}
	var line string
	for _, l := range strings.Split(h.logs.String(), "\n") {
		if strings.Contains(l, "[ERROR]") && strings.Contains(l, "guard="+string(guard)) {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("no ERROR line naming guard %s in the log:\n%s", guard, h.logs.String())
	}
}

func TestGuardsFailClosedOnRealBrokers(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Run("live set unreadable: broker closed", func(t *testing.T) {
				s := kind.open(t)
				register(t, s.observer, self, other)
				m := claimAs(t, s.observer, ghost, lockNm)
				h := newHarness(s.reaper, settings(0, 3))
				if err := s.reaper.Close(); err != nil {
					t.Fatal(err)
				}
				res := h.r.Pass(t.Context())
				if res.Skipped != reaper.GuardLiveSetUnreadable || res.Reason == "" {
					t.Fatalf("pass on a closed broker = %+v, want refused by %s", res, reaper.GuardLiveSetUnreadable)
				}
				assertRefused(t, h, res, reaper.GuardLiveSetUnreadable)
				assertUntouched(t, s.observer, m, lockNm)
			})
			t.Run("live set unreadable: query fails", func(t *testing.T) {
				s := kind.open(t)
				register(t, s.observer, self, other)
				m := claimAs(t, s.observer, ghost, lockNm)
				h := newHarness(s.reaper, settings(0, 3))
				repair := s.breakLiveSet(t)
				res := h.r.Pass(t.Context())
				repair()
				if res.Skipped != reaper.GuardLiveSetUnreadable || !strings.Contains(res.Reason, "tw_workers") {
					t.Fatalf("pass with tw_workers missing = %+v, want refused by %s naming the failed query", res, reaper.GuardLiveSetUnreadable)
				}
				assertRefused(t, h, res, reaper.GuardLiveSetUnreadable)
				assertUntouched(t, s.observer, m, lockNm)
			})
			t.Run("live set empty: no worker registered", func(t *testing.T) {
				s := kind.open(t)
				m := claimAs(t, s.observer, ghost, lockNm)
				h := newHarness(s.reaper, settings(0, 3))
				res := h.r.Pass(t.Context())
				if res.Skipped != reaper.GuardLiveSetEmpty {
					t.Fatalf("pass with nobody registered = %+v, want refused by %s", res, reaper.GuardLiveSetEmpty)
				}
				assertRefused(t, h, res, reaper.GuardLiveSetEmpty)
				assertUntouched(t, s.observer, m, lockNm)
			})
			t.Run("caller not live: own heartbeat stale", func(t *testing.T) {
				s := kind.open(t)
				register(t, s.observer, self, other)
				if err := s.observer.(broker.OrphanReclaimer).ExpireWorker(t.Context(), self); err != nil {
					t.Fatal(err)
				}
				m := claimAs(t, s.observer, ghost, lockNm)
				h := newHarness(s.reaper, settings(0, 3))
				res := h.r.Pass(t.Context())
				if res.Skipped != reaper.GuardCallerNotLive || !strings.Contains(res.Reason, self) {
					t.Fatalf("pass by a stale caller = %+v, want refused by %s naming it", res, reaper.GuardCallerNotLive)
				}
				assertRefused(t, h, res, reaper.GuardCallerNotLive)
				assertUntouched(t, s.observer, m, lockNm)
			})
			t.Run("claim within the grace", func(t *testing.T) {
				s := kind.open(t)
				register(t, s.observer, self, other)
				m := claimAs(t, s.observer, ghost, lockNm)
				h := newHarness(s.reaper, settings(time.Hour, 3))
				res := h.r.Pass(t.Context())
				if res.Skipped != "" || res.WithinGrace != 2 {
					t.Fatalf("pass = %+v, want it to run and leave 2 orphans (the message and its lock) within the grace", res)
				}
				assertRefused(t, h, res, reaper.GuardWithinGrace)
				assertUntouched(t, s.observer, m, lockNm)
			})
			t.Run("fenced pass after the lease moved on", func(t *testing.T) {
				s := kind.open(t)
				register(t, s.observer, self, other)
				m := claimAs(t, s.observer, ghost, lockNm)
				if _, held, err := s.observer.TryLease(t.Context(), "beat", other, time.Minute); err != nil || !held {
					t.Fatalf("TryLease(other) = %v, %v", held, err)
				}
				h := newHarness(s.reaper, settings(0, 3))
				res := h.r.PassAsLeader(t.Context(), broker.Fence{Name: "beat", Holder: self, Term: 1})
				if !res.NotLeader || res.Reclaimed != 0 {
					t.Fatalf("fenced pass of a non-leader = %+v, want refused as not leader", res)
				}
				if got := testutil.ToFloat64(h.m.Reclaimed); got != 0 {
					t.Fatalf("reclaimed counter = %v after a refused fenced pass", got)
				}
				assertUntouched(t, s.observer, m, lockNm)
			})
		})
	}
}

func TestGuardsLetARealOrphanGo(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			s := kind.open(t)
			ctx := t.Context()
			register(t, s.observer, self, other)
			orphan := claimAs(t, s.observer, ghost, lockNm)
			alive := claimAs(t, s.observer, other, "live-lock")
			const grace = 200 * time.Millisecond
			time.Sleep(2 * grace) // both claims are now past the grace
			h := newHarness(s.reaper, settings(grace, 3))
			res := h.r.PassAsLeader(ctx, leaseFor(t, s.reaper))
			if res.Skipped != "" || res.Reclaimed != 1 || res.DeadLettered != 0 || res.LocksReleased != 1 || res.WithinGrace != 0 ||
				len(res.IDs) != 1 || res.IDs[0] != orphan.ID {
				t.Fatalf("pass = %+v, want message %d requeued and its lock released in the same pass", res, orphan.ID)
			}
			if got := testutil.ToFloat64(h.m.Reclaimed); got != 1 {
				t.Fatalf("fastpluggy_broker_orphans_reclaimed_total = %v, want 1", got)
			}
			if got := testutil.ToFloat64(h.m.Skipped); got != 0 {
				t.Fatalf("skipped counter = %v after a pass that ran", got)
			}
			if strings.Contains(h.logs.String(), "[ERROR]") {
				t.Fatalf("a clean pass logged an ERROR:\n%s", h.logs.String())
			}
			got, err := s.observer.GetMessage(ctx, orphan.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.State != broker.StateQueued || got.ClaimedBy != "" || got.ClaimedAt != nil || got.Attempts != 1 || !strings.Contains(got.LastError, "orphaned") {
				t.Fatalf("orphan after the pass = %+v, want queued, unclaimed, attempts 1, last error saying orphaned", got)
			}
			locks, err := s.observer.Locks(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(locks) != 1 || locks[0].Holder != other || locks[0].MessageID != alive.ID {
				t.Fatalf("locks after the pass = %+v, want only the live worker's", locks)
			}
			// The dead worker's token is void: its late ack is refused.
			errs, err := s.observer.Ack(ctx, []broker.Outcome{{Claim: orphan.ClaimOf()}})
			if err != nil || len(errs) != 1 || !errors.Is(errs[0], broker.ErrClaimLost) {
				t.Fatalf("late ack of the reclaimed claim: %v %v, want ErrClaimLost", errs, err)
			}
			// The live worker's message was not touched.
			assertUntouched(t, s.observer, alive, "")

			// The requeued message is claimable, and past the orphan
			// attempt limit the next orphaning dead-letters it.
			msgs, err := s.observer.Claim(ctx, broker.ClaimRequest{WorkerID: ghost, Topics: []string{topic}, Max: 1})
			if err != nil || len(msgs) != 1 || msgs[0].ID != orphan.ID || msgs[0].Attempts != 2 {
				t.Fatalf("re-claim = %+v, %v; want message %d at attempt 2", msgs, err, orphan.ID)
			}
			time.Sleep(2 * grace)
			h2 := newHarness(s.reaper, settings(grace, 2))
			res = h2.r.Pass(ctx)
			if res.Skipped != "" || res.DeadLettered != 1 || res.Reclaimed != 0 {
				t.Fatalf("pass at the attempt limit = %+v, want one dead-lettered", res)
			}
			if got := testutil.ToFloat64(h2.m.DeadLettered); got != 1 {
				t.Fatalf("fastpluggy_broker_orphans_dead_lettered_total = %v, want 1", got)
			}
			if got, err := s.observer.GetMessage(ctx, orphan.ID); err != nil || got.State != broker.StateDead {
				t.Fatalf("message after dead-lettering = %+v, %v; want dead", got, err)
			}
		})
	}
}

// leaseFor takes the beat lease for self and returns its fence.
func leaseFor(t *testing.T, b broker.Broker) broker.Fence {
	t.Helper()
	l, held, err := b.TryLease(t.Context(), "beat", self, time.Minute)
	if err != nil || !held {
		t.Fatalf("TryLease(self) = %+v, %v, %v", l, held, err)
	}
	return broker.Fence{Name: "beat", Holder: self, Term: l.Term}
}

// ---- benchmark ----

const (
	benchRows    = 1_000_000
	benchOrphans = 1000
)

// benchStore is the seeded schema, kept for every run of the benchmark in
// this process (seeding a million rows is not what is measured) and
// dropped by TestMain.
var benchStore struct {
	sync.Mutex
	schema string
	ids    []int64
}

func TestMain(m *testing.M) {
	code := m.Run()
	benchStore.Lock()
	schema := benchStore.schema
	benchStore.Unlock()
	if schema != "" {
		if err := dropSchema(schema); err != nil {
			fmt.Fprintf(os.Stderr, "dropping benchmark schema %s: %v\n", schema, err)
		}
	}
	os.Exit(code)
}

// seededSchema returns a schema holding benchRows messages: mostly done,
// some queued, and benchOrphans running ones claimed an hour ago by a
// worker that never heartbeats, spread over the table.
func seededSchema(b *testing.B) (string, []int64) {
	b.Helper()
	benchStore.Lock()
	defer benchStore.Unlock()
	if benchStore.schema != "" {
		return benchStore.schema, benchStore.ids
	}
	pgConnect(b, "")
	schema := randomSchema()
	br := openPG(b, schema) // runs the migrations
	_ = br
	c := pgConnect(b, schema)
	ctx := context.Background()
	start := time.Now()
	step := benchRows / benchOrphans
	if _, err := c.Exec(ctx, `
		INSERT INTO tw_messages (topic, task, payload, state, attempts, max_attempts,
			claimed_by, claimed_at, token, available_at, created_at, finished_at, result)
		SELECT 'bench', 'demo.echo', '{}'::jsonb,
			CASE WHEN g % $1 = 0 THEN 'running' WHEN g % 100 = 1 THEN 'queued' ELSE 'done' END,
			CASE WHEN g % 100 = 1 AND g % $1 <> 0 THEN 0 ELSE 1 END,
			3,
			CASE WHEN g % $1 = 0 THEN 'bench-dead-worker' WHEN g % 100 = 1 THEN NULL ELSE 'bench-old-worker' END,
			CASE WHEN g % 100 = 1 AND g % $1 <> 0 THEN NULL ELSE now() - interval '1 hour' END,
			CASE WHEN g % $1 = 0 THEN gen_random_uuid() END,
			now() - interval '2 hours', now() - interval '2 hours',
			CASE WHEN g % $1 <> 0 AND g % 100 <> 1 THEN now() - interval '30 minutes' END,
			CASE WHEN g % $1 <> 0 AND g % 100 <> 1 THEN '{}'::jsonb END
		FROM generate_series(1, $2::int) AS g`, step, benchRows); err != nil {
		b.Fatalf("seeding: %v", err)
	}
	if _, err := c.Exec(ctx, `INSERT INTO tw_topics (name) VALUES ('bench') ON CONFLICT DO NOTHING`); err != nil {
		b.Fatal(err)
	}
	if _, err := c.Exec(ctx, `VACUUM ANALYZE tw_messages`); err != nil {
		b.Fatal(err)
	}
	rows, err := c.Query(ctx, `SELECT id FROM tw_messages WHERE state = 'running' ORDER BY id`)
	if err != nil {
		b.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		b.Fatal(err)
	}
	if len(ids) != benchOrphans {
		b.Fatalf("seeded %d orphans, want %d", len(ids), benchOrphans)
	}
	b.Logf("seeded %d messages (%d orphans) in schema %s in %s", benchRows, len(ids), schema, time.Since(start).Round(time.Millisecond))
	benchStore.schema, benchStore.ids = schema, ids
	return schema, ids
}

// BenchmarkPassOver1MRowsWith1000Orphans: one reaper pass (live-set read,
// guards, reclaim transaction) over a million-row tw_messages holding a
// thousand orphans of a dead worker. Each iteration first marks the
// thousand running orphans again, outside the timer.
func BenchmarkPassOver1MRowsWith1000Orphans(b *testing.B) {
	benchPass(b, func(ctx context.Context, c *pgx.Conn, ids []int64) {
		tag, err := c.Exec(ctx, `
			UPDATE tw_messages SET state = 'running', attempts = 1, orphaned = 0, suspect = false,
				claimed_by = 'bench-dead-worker', claimed_at = now() - interval '1 hour', token = gen_random_uuid(),
				finished_at = NULL, last_error = NULL
			WHERE id = ANY ($1::bigint[])`, ids)
		if err != nil || tag.RowsAffected() != int64(len(ids)) {
			b.Fatalf("re-marking the orphans: %v (%d rows)", err, tag.RowsAffected())
		}
	})
}

// BenchmarkPassOver1MRowsWith1000ClaimRowOrphans is
// BenchmarkPassOver1MRowsWith1000Orphans with the orphans held the way a
// claim holds them now: ten claim rows (tw_claims) of a dead worker, 100
// queued messages each, rather than running rows of their own.
func BenchmarkPassOver1MRowsWith1000ClaimRowOrphans(b *testing.B) {
	benchPass(b, func(ctx context.Context, c *pgx.Conn, ids []int64) {
		tag, err := c.Exec(ctx, `
			UPDATE tw_messages SET state = 'queued', attempts = 0, orphaned = 0, suspect = false,
				claimed_by = NULL, claimed_at = NULL, token = NULL, finished_at = NULL, last_error = NULL,
				available_at = now() - interval '2 hours'
			WHERE id = ANY ($1::bigint[])`, ids)
		if err != nil || tag.RowsAffected() != int64(len(ids)) {
			b.Fatalf("re-marking the orphans: %v (%d rows)", err, tag.RowsAffected())
		}
		tag, err = c.Exec(ctx, `
			INSERT INTO tw_claims (topic, worker, claimed_at, key, ids)
			SELECT 'bench', 'bench-dead-worker', now() - interval '1 hour', 1, array_agg(x ORDER BY x)
			FROM unnest($1::bigint[]) WITH ORDINALITY AS u(x, n) GROUP BY (n - 1) / 100`, ids)
		if err != nil || tag.RowsAffected() != int64(len(ids)+99)/100 {
			b.Fatalf("claiming the orphans: %v (%d rows)", err, tag.RowsAffected())
		}
	})
}

// benchPass times reaper passes over the seeded schema (seededSchema),
// each after remark has made its benchOrphans orphans of a dead worker
// again (untimed), and checks that each pass reclaims them all.
func benchPass(b *testing.B, remark func(ctx context.Context, c *pgx.Conn, ids []int64)) {
	schema, ids := seededSchema(b)
	br := openPG(b, schema)
	c := pgConnect(b, schema)
	ctx := context.Background()
	s := reaper.DefaultSettings()
	s.After = time.Hour // the caller stays live for the whole run
	s.WorkerTTL = 2 * time.Hour
	s.MaxAttempts = 5
	if err := br.RegisterWorker(ctx, broker.WorkerInfo{ID: self, Host: "bench", PID: 1, Roles: []string{broker.RoleWorker}}); err != nil {
		b.Fatal(err)
	}
	rp := reaper.New(br, self, s, hclog.NewNullLogger(), reaper.NewMetrics(prometheus.NewRegistry()))
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		remark(ctx, c, ids)
		b.StartTimer()
		res := rp.Pass(ctx)
		if res.Skipped != "" || res.Reclaimed != benchOrphans {
			b.Fatalf("pass = %s (%+v), want %d reclaimed", res.Summary(), res, benchOrphans)
		}
	}
}

// TestACancelRequestedOrphanEndsCancelled: on every durable store, a pass
// ends an orphan whose cancel was requested cancelled, says so in its
// summary and counts it in the Cancelled counter, not as reclaimed.
func TestACancelRequestedOrphanEndsCancelled(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			s := kind.open(t)
			ctx := t.Context()
			register(t, s.observer, self, other)
			orphan := claimAs(t, s.observer, ghost, "")
			if m, err := s.observer.Cancel(ctx, orphan.ID); err != nil || m.CancelRequestedAt == nil {
				t.Fatalf("Cancel = %+v, %v", m, err)
			}
			const grace = 200 * time.Millisecond
			time.Sleep(2 * grace) // the claim is now past the grace
			h := newHarness(s.reaper, settings(grace, 3))
			h.m.Cancelled = prometheus.NewCounter(prometheus.CounterOpts{Name: "cancelled_total", Help: "test"})
			res := h.r.PassAsLeader(ctx, leaseFor(t, s.reaper))
			if res.Skipped != "" || res.Cancelled != 1 || res.Reclaimed != 0 || res.DeadLettered != 0 || len(res.IDs) != 1 {
				t.Fatalf("pass = %+v, want message %d ended cancelled", res, orphan.ID)
			}
			if !strings.Contains(res.Summary(), "ended 1 cancelled") {
				t.Fatalf("summary %q does not say it ended one cancelled", res.Summary())
			}
			if got := testutil.ToFloat64(h.m.Cancelled); got != 1 {
				t.Fatalf("cancelled counter = %v, want 1", got)
			}
			if got := testutil.ToFloat64(h.m.Reclaimed); got != 0 {
				t.Fatalf("reclaimed counter = %v, want 0", got)
			}
			got, err := s.observer.GetMessage(ctx, orphan.ID)
			if err != nil || got.State != broker.StateCancelled || !got.Suspect {
				t.Fatalf("orphan after the pass = %+v, %v; want cancelled", got, err)
			}
		})
	}
}
