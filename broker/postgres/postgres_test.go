package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/brokertest"
	"github.com/taskhost/taskhost/internal/testdb"
)

func TestConformance(t *testing.T) {
	brokertest.Run(t, func(t *testing.T) broker.Broker { return newTestBroker(t, Options{}) })
}

func TestDurable(t *testing.T) {
	brokertest.RunDurable(t, func(t *testing.T) brokertest.Store {
		b := newTestBroker(t, Options{})
		c := schemaConn(t, b)
		exec := func(t *testing.T, sql string, args ...any) {
			t.Helper()
			if _, err := c.Exec(t.Context(), sql, args...); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
		}
		return brokertest.Store{
			Broker: b,
			Another: func(t *testing.T) brokertest.Durable {
				o, err := New(t.Context(), Options{DSN: testdb.DSN(), Schema: b.schema})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = o.Close() })
				return o
			},
			AgeClaim: func(t *testing.T, id int64, d time.Duration) {
				exec(t, `UPDATE tw_messages SET claimed_at = claimed_at - $1::bigint * interval '1 microsecond' WHERE id = $2`, micros(d), id)
				exec(t, `UPDATE tw_claims SET claimed_at = claimed_at - $1::bigint * interval '1 microsecond' WHERE $2 = ANY (ids)`, micros(d), id)
			},
			AgeLock: func(t *testing.T, name string, d time.Duration) {
				exec(t, `UPDATE tw_locks SET acquired_at = acquired_at - $1::bigint * interval '1 microsecond' WHERE name = $2`, micros(d), name)
			},
			AgeHeartbeat: func(t *testing.T, id string, d time.Duration) {
				exec(t, `UPDATE tw_workers SET heartbeat_at = heartbeat_at - $1::bigint * interval '1 microsecond' WHERE id = $2`, micros(d), id)
			},
			ExpireLeases: func(t *testing.T) { exec(t, `UPDATE tw_leases SET expires_at = now() - interval '1 second'`) },
		}
	})
}

func TestKind(t *testing.T) {
	b := newTestBroker(t, Options{})
	if b.Kind() != "postgres" {
		t.Fatalf("Kind = %q", b.Kind())
	}
}

// TestMigrationsConcurrentAndIdempotent starts four brokers on one fresh
// schema at once: every one must come up, each migration must be recorded
// once, and running the migrations again changes nothing.
func TestMigrationsConcurrentAndIdempotent(t *testing.T) {
	schema := freshSchema(t)
	ctx := t.Context()

	const n = 4
	var wg sync.WaitGroup
	errs := make([]error, n)
	brokers := make([]*Broker, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			brokers[i], errs[i] = New(ctx, Options{DSN: testdb.DSN(), Schema: schema})
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("New #%d: %v", i, err)
		}
		t.Cleanup(func() { _ = brokers[i].Close() })
	}

	all, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	c := connect(t)
	versions := func() []int {
		t.Helper()
		rows, err := c.Query(ctx, `SELECT version FROM `+pgx.Identifier{schema, "tw_schema_migrations"}.Sanitize()+` ORDER BY version`)
		if err != nil {
			t.Fatal(err)
		}
		vs, err := pgx.CollectRows(rows, pgx.RowTo[int])
		if err != nil {
			t.Fatal(err)
		}
		return vs
	}
	var want []int
	for _, m := range all {
		want = append(want, m.version)
	}
	if got := versions(); !slices.Equal(got, want) {
		t.Fatalf("recorded versions %v, want %v", got, want)
	}

	// The brokers share the tables.
	id, err := brokers[0].Submit(ctx, broker.SubmitRequest{Topic: "t", Task: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := brokers[3].GetMessage(ctx, id); err != nil || m.State != broker.StateQueued {
		t.Fatalf("GetMessage on another broker = %+v, %v", m, err)
	}

	// Again, by Migrate and by New: nothing changes, the data stays.
	if err := Migrate(ctx, testdb.DSN(), schema); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	b, err := New(ctx, Options{DSN: testdb.DSN(), Schema: schema})
	if err != nil {
		t.Fatalf("New again: %v", err)
	}
	defer b.Close()
	if got := versions(); !slices.Equal(got, want) {
		t.Fatalf("after re-running, versions %v, want %v", got, want)
	}
	if _, err := b.GetMessage(ctx, id); err != nil {
		t.Fatalf("message lost by re-running migrations: %v", err)
	}
}

func TestMigrateFreshSchema(t *testing.T) {
	schema := freshSchema(t)
	if err := Migrate(t.Context(), testdb.DSN(), schema); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	c := connect(t)
	var tables []string
	rows, err := c.Query(t.Context(), `SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1`, schema)
	if err != nil {
		t.Fatal(err)
	}
	tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"tw_amqp_orphans", "tw_amqp_outbox", "tw_claims", "tw_done", "tw_leases", "tw_locks", "tw_messages", "tw_messages_all", "tw_report_rows", "tw_reports", "tw_schedule_fires", "tw_schedules",
		"tw_schema_migrations", "tw_store", "tw_topic_counts", "tw_topics", "tw_unique_keys", "tw_workers"}
	if !slices.Equal(tables, want) {
		t.Fatalf("tables %v, want %v", tables, want)
	}
}

func TestNewErrors(t *testing.T) {
	ctx := t.Context()
	if _, err := New(ctx, Options{}); err == nil || !strings.Contains(err.Error(), "TASKHOST_DATABASE_URL") {
		t.Fatalf("New without a dsn: %v, want a hint at TASKHOST_DATABASE_URL", err)
	}
	if _, err := New(ctx, Options{DSN: testdb.DSN(), Schema: "bad-name; drop"}); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("New with a bad schema name: %v, want ErrInvalid", err)
	}
	// Nothing listens on port 1.
	_, err := New(ctx, Options{DSN: "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=3"})
	if err == nil {
		t.Fatal("New against a closed port succeeded")
	}
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "is PostgreSQL running? check the dsn") {
		t.Fatalf("New against a closed port: %v, want ErrUnavailable saying what to check", err)
	}
}

func TestClosed(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	checks := map[string]error{}
	_, checks["Submit"] = b.Submit(ctx, broker.SubmitRequest{Topic: "t", Task: "x"})
	_, checks["Ack"] = b.Ack(ctx, []broker.Outcome{{Claim: broker.Claim{ID: 1, Token: "x"}}})
	checks["Heartbeat"] = b.Heartbeat(ctx, "w")
	_, checks["Stats"] = b.Stats(ctx)
	_, checks["LiveWorkers"] = b.LiveWorkers(ctx, time.Minute)
	_, checks["ReclaimOrphans"] = b.ReclaimOrphans(ctx, broker.ReclaimRequest{Live: []string{"w"}})
	for name, err := range checks {
		if !errors.Is(err, broker.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
}

// TestDatabaseGone: when the broker's connections are killed, the next call
// fails with an error that keeps its cause (or succeeds on a new
// connection); it never hangs and never panics, and the broker recovers.
func TestDatabaseGone(t *testing.T) {
	schema := freshSchema(t)
	app := "tw_gone_" + schema // only this broker's connections are killed
	b, err := New(t.Context(), Options{DSN: withParam(testdb.DSN(), "application_name", app), Schema: schema, MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := t.Context()
	if _, err := b.Submit(ctx, broker.SubmitRequest{Topic: "t", Task: "x"}); err != nil {
		t.Fatal(err)
	}
	c := connect(t)
	if _, err := c.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name = $1 AND pid <> pg_backend_pid()`, app); err != nil {
		t.Fatal(err)
	}
	// The idle connections are dead now. A call that lands on one fails
	// with ErrUnavailable and the cause; the dead connection is dropped,
	// so after at most MaxConns such failures the broker is back.
	for i := range 3 {
		_, err := b.Stats(ctx)
		if err == nil {
			break
		}
		t.Logf("call %d after the kill: %v", i, err)
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("call %d after the kill: %v, want ErrUnavailable", i, err)
		}
		var pe *pgconn.PgError
		var ne net.Error
		cause := errors.As(err, &pe) || errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
		if !cause || !strings.Contains(err.Error(), "is PostgreSQL running") {
			t.Fatalf("call %d after the kill: %v, want the cause kept and a hint", i, err)
		}
	}
	if _, err := b.Stats(ctx); err != nil {
		t.Fatalf("the broker did not recover: %v", err)
	}
}

func TestWorkerPurgeAndHeartbeat(t *testing.T) {
	b := newTestBroker(t, Options{WorkerTTL: time.Hour})
	ctx := t.Context()
	for _, id := range []string{"old", "young"} {
		if err := b.RegisterWorker(ctx, broker.WorkerInfo{ID: id, Roles: []string{broker.RoleWorker}}); err != nil {
			t.Fatal(err)
		}
	}
	c := schemaConn(t, b)
	if _, err := c.Exec(ctx, `UPDATE tw_workers SET heartbeat_at = now() - interval '2 hours' WHERE id = 'old'`); err != nil {
		t.Fatal(err)
	}
	if err := b.RegisterWorker(ctx, broker.WorkerInfo{ID: "new"}); err != nil {
		t.Fatal(err)
	}
	ws, err := b.Workers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, w := range ws {
		ids = append(ids, w.ID)
	}
	if !slices.Equal(ids, []string{"new", "young"}) {
		t.Fatalf("workers after the purge %v, want [new young]", ids)
	}
	if err := b.Heartbeat(ctx, "old"); !errors.Is(err, broker.ErrNotFound) {
		t.Fatalf("Heartbeat of a purged worker: %v, want ErrNotFound", err)
	}
	// Re-registering brings it back.
	if err := b.RegisterWorker(ctx, broker.WorkerInfo{ID: "old"}); err != nil {
		t.Fatal(err)
	}
	if err := b.Heartbeat(ctx, "old"); err != nil {
		t.Fatalf("Heartbeat after re-registering: %v", err)
	}
}

func TestLiveAfterOption(t *testing.T) {
	b := newTestBroker(t, Options{LiveAfter: time.Minute})
	ctx := t.Context()
	for _, id := range []string{"a", "b"} {
		if err := b.RegisterWorker(ctx, broker.WorkerInfo{ID: id, Roles: []string{broker.RoleBeat}, Topics: []string{"*"}}); err != nil {
			t.Fatal(err)
		}
	}
	c := schemaConn(t, b)
	if _, err := c.Exec(ctx, `UPDATE tw_workers SET heartbeat_at = now() - interval '90 seconds' WHERE id = 'b'`); err != nil {
		t.Fatal(err)
	}
	st, err := b.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Workers != 1 || st.Beats != 1 {
		t.Fatalf("Stats workers %d beats %d, want 1 and 1 (b's heartbeat is stale)", st.Workers, st.Beats)
	}
}

// claimAs claims exactly one message of topic for worker.
func claimAs(t *testing.T, b *Broker, worker, topic string) broker.Message {
	t.Helper()
	msgs, err := b.Claim(t.Context(), broker.ClaimRequest{WorkerID: worker, Topics: []string{topic}, Max: 1})
	if err != nil || len(msgs) != 1 {
		t.Fatalf("Claim(%s, %s) = %v, %v; want one message", worker, topic, msgs, err)
	}
	return msgs[0]
}

// TestReclaimClearsToken: a reclaimed message keeps no token (the CHECK
// constraint ties a token to the running state).
func TestReclaimClearsToken(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	c := schemaConn(t, b)
	if _, err := b.Submit(ctx, broker.SubmitRequest{Topic: "o", Task: "x"}); err != nil {
		t.Fatal(err)
	}
	old := claimAs(t, b, "dead", "o")
	if _, err := c.Exec(ctx, `UPDATE tw_claims SET claimed_at = now() - interval '10 minutes'`); err != nil {
		t.Fatal(err)
	}
	res, err := b.ReclaimOrphans(ctx, broker.ReclaimRequest{Live: []string{"alive"}, Grace: time.Minute})
	if err != nil || res.Reclaimed != 1 {
		t.Fatalf("ReclaimOrphans = %+v, %v; want 1 reclaimed", res, err)
	}
	var tok *string
	if err := c.QueryRow(ctx, `SELECT token::text FROM tw_messages WHERE id = $1`, old.ID).Scan(&tok); err != nil || tok != nil {
		t.Fatalf("token after reclaim = %v, %v; want NULL", tok, err)
	}
}

// TestReclaimRacesAck: acks of the orphaned claims racing a reclaim pass
// either win (done) or lose (ErrClaimLost, requeued), never both.
func TestReclaimRacesAck(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	c := schemaConn(t, b)
	if err := b.RegisterWorker(ctx, broker.WorkerInfo{ID: "reaper"}); err != nil {
		t.Fatal(err)
	}
	const n = 200
	if _, err := c.Exec(ctx, `INSERT INTO tw_topics (name) VALUES ('r')`); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, `INSERT INTO tw_messages (topic, task) SELECT 'r', 'x' FROM generate_series(1, $1)`, n); err != nil {
		t.Fatal(err)
	}
	msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "ghost", Topics: []string{"r"}, Max: n})
	if err != nil || len(msgs) != n {
		t.Fatalf("claimed %d, %v", len(msgs), err)
	}
	var outcomes []broker.Outcome
	for _, m := range msgs {
		outcomes = append(outcomes, broker.Outcome{Claim: m.ClaimOf()})
	}
	var (
		wg   sync.WaitGroup
		errs []error
		res  broker.ReclaimResult
		aErr error
		rErr error
	)
	wg.Add(2)
	go func() { defer wg.Done(); errs, aErr = b.Ack(ctx, outcomes) }()
	go func() {
		defer wg.Done()
		res, rErr = b.ReclaimOrphans(ctx, broker.ReclaimRequest{Live: []string{"reaper"}, MaxAttempts: 5})
	}()
	wg.Wait()
	if aErr != nil || rErr != nil {
		t.Fatalf("Ack: %v; ReclaimOrphans: %v", aErr, rErr)
	}
	acked := 0
	for _, e := range errs {
		if e == nil {
			acked++
		}
	}
	if acked+res.Reclaimed != n {
		t.Fatalf("%d acked + %d reclaimed, want %d in all", acked, res.Reclaimed, n)
	}
	var done, queued int
	if err := c.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'done'), count(*) FILTER (WHERE state = 'queued') FROM tw_messages_all`).
		Scan(&done, &queued); err != nil {
		t.Fatal(err)
	}
	if done != acked || queued != res.Reclaimed {
		t.Fatalf("database: %d done, %d queued; the calls said %d acked, %d reclaimed", done, queued, acked, res.Reclaimed)
	}
}

// TestLockRacesAck: a lock acquired under a claim while that claim is
// being acked is either refused or released by the ack; it never outlives
// the claim.
func TestLockRacesAck(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	for i := range 50 {
		if _, err := b.Submit(ctx, broker.SubmitRequest{Topic: "l", Task: "x"}); err != nil {
			t.Fatal(err)
		}
		m := claimAs(t, b, "w", "l")
		var wg sync.WaitGroup
		var lerr error
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, lerr = b.AcquireLock(ctx, fmt.Sprintf("lock-%d", i), "w", m.ClaimOf())
		}()
		go func() {
			defer wg.Done()
			if errs, err := b.Ack(ctx, []broker.Outcome{{Claim: m.ClaimOf()}}); err != nil || errs[0] != nil {
				t.Errorf("Ack: %v %v", errs, err)
			}
		}()
		wg.Wait()
		if lerr != nil && !errors.Is(lerr, broker.ErrClaimLost) {
			t.Fatalf("AcquireLock: %v", lerr)
		}
		if ls, err := b.Locks(ctx); err != nil || len(ls) != 0 {
			t.Fatalf("round %d: locks after the ack %+v, %v; want none", i, ls, err)
		}
	}
}

// TestClaimPlansUseIndexes: the claim statement walks the partial queued
// index, with custom and generic plans alike (a seq scan here would make
// every claim read the whole table).
func TestClaimPlansUseIndexes(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	c := schemaConn(t, b)
	for _, sql := range []string{
		`INSERT INTO tw_topics (name, concurrency_limit) VALUES ('big', 0), ('small', 5)`,
		`INSERT INTO tw_messages (topic, task, state) SELECT CASE WHEN i % 10 = 0 THEN 'small' ELSE 'big' END, 'x',
			CASE WHEN i % 3 = 0 THEN 'done' ELSE 'queued' END FROM generate_series(1, 50000) i`,
		`ANALYZE tw_messages`,
		`PREPARE claim_stmt(text, int, text) AS ` + claimSQL,
		`PREPARE claim_from_stmt(text, int, text, timestamptz, bigint, int) AS ` + claimFromSQL,
	} {
		if _, err := c.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		if _, err := c.Exec(ctx, `SET plan_cache_mode = `+mode); err != nil {
			t.Fatal(err)
		}
		for _, run := range []string{"claim_stmt('big', 10, 'w')", "claim_stmt('small', 10, 'w')",
			"claim_from_stmt('big', 10, 'w', now() - interval '1 hour', 100, 0)", "claim_from_stmt('small', 10, 'w', now() - interval '1 hour', 100, 0)"} {
			plan := explain(t, c, `EXECUTE `+run)
			if testing.Verbose() {
				t.Logf("%s, %s:\n%s", mode, run, plan)
			}
			if strings.Contains(plan, "Seq Scan on tw_messages") || !strings.Contains(plan, "tw_messages_queued") || strings.Contains(plan, "Sort") {
				t.Errorf("%s, %s: the claim plan does not walk tw_messages_queued in its order:\n%s", mode, run, plan)
			}
			if n := strings.Count(plan, "tw_messages_running_token"); n > 1 {
				t.Errorf("%s, %s: the claim plan counts the topic's running messages %d times:\n%s", mode, run, n, plan)
			}
		}
	}
}

// explain returns the plan of sql, with args, on c.
func explain(t *testing.T, c *pgx.Conn, sql string, args ...any) string {
	t.Helper()
	rows, err := c.Query(t.Context(), `EXPLAIN `+sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

func ptr[T any](v T) *T { return &v }

// Guard the contract the reaper package relies on.
var _ = func() broker.OrphanReclaimer { return (*Broker)(nil) }

func TestStatsOneRoundTripShape(t *testing.T) {
	// Stats on an empty broker: no topics, zero counts, a non-nil slice.
	b := newTestBroker(t, Options{})
	st, err := b.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Topics == nil || len(st.Topics) != 0 || st.Workers != 0 || st.Locks != 0 {
		t.Fatalf("empty Stats = %+v", st)
	}
}

// withParam adds a connection parameter to a URL or key=value dsn.
func withParam(dsn, key, value string) string {
	if strings.Contains(dsn, "://") {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		return dsn + sep + key + "=" + value
	}
	return dsn + " " + key + "=" + value
}

// TestContextCancelsWait: a claim stuck behind the topic lock returns when
// its context ends, and the broker carries on.
func TestContextCancelsWait(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	if _, err := b.SetTopic(ctx, "slow", broker.TopicPatch{ConcurrencyLimit: ptr(1)}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Submit(ctx, broker.SubmitRequest{Topic: "slow", Task: "x"}); err != nil {
		t.Fatal(err)
	}
	c := schemaConn(t, b)
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM tw_topics WHERE name = 'slow' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = b.Claim(short, broker.ClaimRequest{WorkerID: "w", Topics: []string{"slow"}, Max: 1})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Claim behind a held topic lock: %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Claim took %v to notice its context", d)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if m := claimAs(t, b, "w", "slow"); m.Attempts != 1 {
		t.Fatalf("claim after the wait = %+v", m)
	}
}

func TestPayloadHeadersAndMaxPayload(t *testing.T) {
	b := newTestBroker(t, Options{MaxPayload: 64})
	ctx := t.Context()
	payload := `{"a": [1, 2, {"b": null}], "s": "h\u00e9llo \"quoted\""}`
	id, err := b.Submit(ctx, broker.SubmitRequest{Topic: "p", Task: "x", Payload: []byte(payload),
		Headers: map[string]string{"trace": "t-1", "empty": ""}, MaxAttempts: 7, Delay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	m, err := b.GetMessage(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var got, want any
	if err := json.Unmarshal(m.Payload, &got); err != nil {
		t.Fatal(err)
	}
	_ = json.Unmarshal([]byte(payload), &want)
	if fmt.Sprint(got) != fmt.Sprint(want) || m.Headers["trace"] != "t-1" || len(m.Headers) != 2 || m.MaxAttempts != 7 {
		t.Fatalf("stored message = %+v (payload %s)", m, m.Payload)
	}
	if d := m.AvailableAt.Sub(m.CreatedAt); d < 59*time.Minute || d > 61*time.Minute {
		t.Fatalf("delay stored as %v, want 1h", d)
	}
	big := `{"s":"` + strings.Repeat("x", 64) + `"}`
	if _, err := b.Submit(ctx, broker.SubmitRequest{Topic: "p", Task: "x", Payload: []byte(big)}); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("payload over MaxPayload: %v, want ErrInvalid", err)
	}
	if _, err := b.LiveWorkers(ctx, -time.Second); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("LiveWorkers(negative): %v, want ErrInvalid", err)
	}
	if _, err := b.ReclaimOrphans(ctx, broker.ReclaimRequest{Live: []string{"w"}, Grace: -time.Second}); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("ReclaimOrphans(negative grace): %v, want ErrInvalid", err)
	}
}
