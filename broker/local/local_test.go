package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/brokertest"
)

// openTest opens a broker on opts.Path (a fresh file in t's temporary
// directory when empty) and closes it when t ends.
func openTest(t testing.TB, opts Options) *Broker {
	t.Helper()
	if opts.Path == "" {
		opts.Path = filepath.Join(t.TempDir(), "data", "taskhost.db")
	}
	b, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func TestConformance(t *testing.T) {
	brokertest.Run(t, func(t *testing.T) broker.Broker {
		return openTest(t, Options{})
	})
}

func mustSubmit(t testing.TB, b broker.Broker, topic string) int64 {
	t.Helper()
	id, err := b.Submit(context.Background(), broker.SubmitRequest{Topic: topic, Task: "x"})
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	return id
}

func mustClaim(t testing.TB, b broker.Broker, worker, topic string) broker.Message {
	t.Helper()
	msgs, err := b.Claim(context.Background(), broker.ClaimRequest{WorkerID: worker, Topics: []string{topic}, Max: 1})
	if err != nil || len(msgs) != 1 {
		t.Fatalf("Claim(%s) = %d messages, %v; want 1", topic, len(msgs), err)
	}
	return msgs[0]
}

func mustState(t testing.TB, b broker.Broker, id int64, state string) broker.Message {
	t.Helper()
	m, err := b.GetMessage(context.Background(), id)
	if err != nil {
		t.Fatalf("GetMessage(%d): %v", id, err)
	}
	if m.State != state {
		t.Fatalf("message %d is %s (%+v), want %s", id, m.State, m, state)
	}
	return m
}

// execSQL runs one statement on b's writer, for tests that move clocks.
func execSQL(t testing.TB, b *Broker, q string, args ...any) {
	t.Helper()
	if _, err := b.writer.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func TestPragmas(t *testing.T) {
	// A path that needs escaping in the file: URI.
	path := filepath.Join(t.TempDir(), "a dir #1?", "100%.db")
	b := openTest(t, Options{Path: path})
	if _, err := os.Stat(path); err != nil || b.Path() != path {
		t.Fatalf("database not at %q (Path %q): %v", path, b.Path(), err)
	}
	check := func(name string, q func(string) (string, error)) {
		want := map[string]string{"journal_mode": "wal", "synchronous": "1", "foreign_keys": "1", "busy_timeout": "10000"}
		for p, w := range want {
			got, err := q("PRAGMA " + p)
			if err != nil {
				t.Fatalf("%s: PRAGMA %s: %v", name, p, err)
			}
			if got != w {
				t.Errorf("%s: PRAGMA %s = %q, want %q", name, p, got, w)
			}
		}
	}
	check("writer", func(q string) (s string, err error) { err = b.writer.QueryRow(q).Scan(&s); return })
	check("reader", func(q string) (s string, err error) { err = b.reader.QueryRow(q).Scan(&s); return })
}

// Two Broker values on one file behave as two processes sharing a queue.
func TestTwoBrokersShareOneFile(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "shared.db")
	a := openTest(t, Options{Path: path})
	b := openTest(t, Options{Path: path})

	id := mustSubmit(t, a, "shared")
	if _, err := b.SetTopic(ctx, "shared", broker.TopicPatch{ConcurrencyLimit: ptr(1)}); err != nil {
		t.Fatal(err)
	}
	mustSubmit(t, a, "shared")
	m := mustClaim(t, b, "wb", "shared")
	if m.ID != id {
		t.Fatalf("b claimed %d, want a's first message %d", m.ID, id)
	}
	// The limit set through b holds for claims through a.
	if msgs, err := a.Claim(ctx, broker.ClaimRequest{WorkerID: "wa", Topics: []string{"shared"}, Max: 5}); err != nil || len(msgs) != 0 {
		t.Fatalf("a claimed %d past b's limit of 1 (%v)", len(msgs), err)
	}
	if ok, err := b.AcquireLock(ctx, "L", "wb", m.ClaimOf()); err != nil || !ok {
		t.Fatalf("AcquireLock = %v, %v", ok, err)
	}
	if ls, err := a.Locks(ctx); err != nil || len(ls) != 1 || ls[0].Holder != "wb" {
		t.Fatalf("a sees locks %+v, %v", ls, err)
	}
	if got := mustState(t, a, id, broker.StateRunning); got.ClaimedBy != "wb" {
		t.Fatalf("a sees claimed_by %q", got.ClaimedBy)
	}
	errs, err := a.Ack(ctx, []broker.Outcome{{Claim: m.ClaimOf(), Result: json.RawMessage(`{"by":"a"}`)}})
	if err != nil || errs[0] != nil {
		t.Fatalf("a acks b's claim: %v, %v", errs, err)
	}
	mustState(t, b, id, broker.StateDone)
	if ls, _ := b.Locks(ctx); len(ls) != 0 {
		t.Fatalf("lock survived the ack through the other broker: %+v", ls)
	}
	if err := a.RegisterWorker(ctx, broker.WorkerInfo{ID: "wa", Topics: []string{"shared"}}); err != nil {
		t.Fatal(err)
	}
	if ws, err := b.Workers(ctx); err != nil || len(ws) != 1 || ws[0].ID != "wa" {
		t.Fatalf("b sees workers %+v, %v", ws, err)
	}
	// Closing one leaves the other working.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, b, "wb", "shared")
}

func ptr[T any](v T) *T { return &v }

// Several processes opening a new file at once: each migration is applied
// exactly once and every opener ends up with the full schema.
func TestConcurrentOpenMigratesOnce(t *testing.T) {
	for round := range 5 {
		path := filepath.Join(t.TempDir(), fmt.Sprintf("new-%d", round), "taskhost.db")
		const n = 4
		brokers := make([]*Broker, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				brokers[i], errs[i] = Open(context.Background(), Options{Path: path})
			}()
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: Open %d: %v", round, i, err)
			}
			t.Cleanup(func() { _ = brokers[i].Close() })
		}
		ms, err := loadMigrations()
		if err != nil {
			t.Fatal(err)
		}
		var versions []int
		rows, err := brokers[0].reader.Query(`SELECT version FROM tw_schema_migrations ORDER BY version`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var v int
			_ = rows.Scan(&v)
			versions = append(versions, v)
		}
		rows.Close()
		if len(versions) != len(ms) || versions[0] != 1 || versions[len(versions)-1] != len(ms) {
			t.Fatalf("round %d: applied versions %v, want 1..%d once each", round, versions, len(ms))
		}
		// Every opener works on the shared schema.
		for i, b := range brokers {
			mustSubmit(t, b, fmt.Sprintf("t%d", i))
		}
		if st, err := brokers[n-1].Stats(context.Background()); err != nil || len(st.Topics) != n {
			t.Fatalf("round %d: Stats = %+v, %v", round, st, err)
		}
	}
}

func TestReopenKeepsDataAndRefusesNewerSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "taskhost.db")
	b, err := Open(ctx, Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	id := mustSubmit(t, b, "keep")
	m := mustClaim(t, b, "w", "keep")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	b = openTest(t, Options{Path: path})
	got := mustState(t, b, id, broker.StateRunning)
	if got.ClaimedBy != "w" || !got.ClaimedAt.Equal(*m.ClaimedAt) {
		t.Fatalf("after reopen %+v, want the claim of %+v", got, m)
	}
	// A later id never reuses an earlier one, even after a purge.
	id2 := mustSubmit(t, b, "keep")
	if _, err := b.Purge(ctx, "keep", false); err != nil {
		t.Fatal(err)
	}
	if id3 := mustSubmit(t, b, "keep"); id3 <= id2 {
		t.Fatalf("id %d reused after purge (previous %d)", id3, id2)
	}

	execSQL(t, b, `INSERT INTO tw_schema_migrations (version, name, applied_at) VALUES (999, '0999_future.sql', 0)`)
	if _, err := Open(ctx, Options{Path: path}); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("Open of a newer schema: %v, want a refusal", err)
	}
}

func TestClosedOrphanMethods(t *testing.T) {
	b := openTest(t, Options{})
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := b.LiveWorkers(ctx, time.Minute); !errors.Is(err, broker.ErrClosed) {
		t.Errorf("LiveWorkers: %v", err)
	}
	if _, err := b.ReclaimOrphans(ctx, broker.ReclaimRequest{Live: []string{"x"}}); !errors.Is(err, broker.ErrClosed) {
		t.Errorf("ReclaimOrphans: %v", err)
	}
	if err := b.ExpireWorker(ctx, "x"); !errors.Is(err, broker.ErrClosed) {
		t.Errorf("ExpireWorker: %v", err)
	}
	if _, err := b.Stats(ctx); !errors.Is(err, broker.ErrClosed) {
		t.Errorf("Stats: %v", err)
	}
	if _, err := b.Ack(ctx, nil); !errors.Is(err, broker.ErrClosed) {
		t.Errorf("Ack(nothing): %v", err)
	}
	if _, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w"}); !errors.Is(err, broker.ErrClosed) {
		t.Errorf("Claim(no topics): %v", err)
	}
}

func TestMaxPayload(t *testing.T) {
	b := openTest(t, Options{MaxPayload: 16})
	ctx := context.Background()
	if _, err := b.Submit(ctx, broker.SubmitRequest{Topic: "p", Task: "x", Payload: json.RawMessage(`{"a":"0123456789"}`)}); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("Submit over MaxPayload: %v, want ErrInvalid", err)
	}
	if _, err := b.Submit(ctx, broker.SubmitRequest{Topic: "p", Task: "x", Payload: json.RawMessage(`{"a":1}`)}); err != nil {
		t.Fatalf("Submit under MaxPayload: %v", err)
	}
}

func TestExpireWorker(t *testing.T) {
	ctx := context.Background()
	b := openTest(t, Options{})
	for _, id := range []string{"a", "b"} {
		if err := b.RegisterWorker(ctx, broker.WorkerInfo{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	live, err := b.LiveWorkers(ctx, time.Minute)
	if err != nil || !slices.Equal(live, []string{"a", "b"}) {
		t.Fatalf("LiveWorkers = %v, %v, want [a b]", live, err)
	}
	if err := b.ExpireWorker(ctx, "a"); err != nil {
		t.Fatalf("ExpireWorker: %v", err)
	}
	live, err = b.LiveWorkers(ctx, 365*24*time.Hour)
	if err != nil || !slices.Equal(live, []string{"b"}) {
		t.Fatalf("after ExpireWorker(a) LiveWorkers = %v, %v, want [b]", live, err)
	}
	if st, _ := b.Stats(ctx); st.Workers != 1 {
		t.Fatalf("Stats.Workers = %d, want 1", st.Workers)
	}
	if err := b.ExpireWorker(ctx, "nobody"); !errors.Is(err, broker.ErrNotFound) {
		t.Fatalf("ExpireWorker(unknown): %v, want ErrNotFound", err)
	}
	// A heartbeat brings it back.
	if err := b.Heartbeat(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if live, _ := b.LiveWorkers(ctx, time.Minute); !slices.Equal(live, []string{"a", "b"}) {
		t.Fatalf("after a heartbeat LiveWorkers = %v", live)
	}
	// LiveWorkers counts freshness by the window it is given.
	execSQL(t, b, `UPDATE tw_workers SET heartbeat_at = heartbeat_at - ? WHERE id = 'b'`, int64(2*time.Minute))
	if live, _ := b.LiveWorkers(ctx, time.Minute); !slices.Equal(live, []string{"a"}) {
		t.Fatalf("with b two minutes silent LiveWorkers(1m) = %v, want [a]", live)
	}
	if live, _ := b.LiveWorkers(ctx, 3*time.Minute); !slices.Equal(live, []string{"a", "b"}) {
		t.Fatalf("LiveWorkers(3m) = %v, want [a b]", live)
	}
}

func TestReclaimOrphans(t *testing.T) {
	ctx := context.Background()
	b := openTest(t, Options{})
	const grace = time.Minute
	age := func(table, col string, id any) {
		t.Helper()
		key := "id"
		if table == "tw_locks" {
			key = "name"
		}
		execSQL(t, b, fmt.Sprintf(`UPDATE %s SET %s = %s - ? WHERE %s = ?`, table, col, col, key), int64(2*grace), id)
	}
	for _, w := range []string{"alive", "gone"} {
		if err := b.RegisterWorker(ctx, broker.WorkerInfo{ID: w}); err != nil {
			t.Fatal(err)
		}
	}

	// old: claimed by gone long ago -> requeued.
	old := mustSubmit(t, b, "o")
	oldClaim := mustClaim(t, b, "gone", "o")
	age("tw_messages", "claimed_at", old)
	if ok, err := b.AcquireLock(ctx, "under-old", "gone", oldClaim.ClaimOf()); err != nil || !ok {
		t.Fatalf("AcquireLock = %v, %v", ok, err)
	}
	// young: claimed by gone just now -> left alone (the grace).
	young := mustSubmit(t, b, "y")
	youngClaim := mustClaim(t, b, "gone", "y")
	// mine: claimed by a live worker long ago -> left alone.
	mine := mustSubmit(t, b, "m")
	mineClaim := mustClaim(t, b, "alive", "m")
	age("tw_messages", "claimed_at", mine)
	// poison: third attempt by gone, max 3 -> dead.
	poison := mustSubmit(t, b, "p")
	for range 2 {
		c := mustClaim(t, b, "gone", "p")
		if err := b.Nack(ctx, broker.NackRequest{Claim: c.ClaimOf(), Requeue: true}); err != nil {
			t.Fatal(err)
		}
	}
	poisonClaim := mustClaim(t, b, "gone", "p")
	if poisonClaim.Attempts != 3 {
		t.Fatalf("poison attempts %d, want 3", poisonClaim.Attempts)
	}
	age("tw_messages", "claimed_at", poison)
	// Two earlier claims of it were orphaned: this is the third.
	execSQL(t, b, `UPDATE tw_messages SET orphaned = 2 WHERE id = ?`, poison)

	// Locks held by gone under the young claim: one old (released), one
	// young (kept). One held by alive, old (kept).
	for _, name := range []string{"stale", "fresh"} {
		if ok, err := b.AcquireLock(ctx, name, "gone", youngClaim.ClaimOf()); err != nil || !ok {
			t.Fatalf("AcquireLock(%s) = %v, %v", name, ok, err)
		}
	}
	age("tw_locks", "acquired_at", "stale")
	if ok, err := b.AcquireLock(ctx, "kept", "alive", mineClaim.ClaimOf()); err != nil || !ok {
		t.Fatal(ok, err)
	}
	age("tw_locks", "acquired_at", "kept")

	res, err := b.ReclaimOrphans(ctx, broker.ReclaimRequest{Live: []string{"alive"}, Grace: grace, MaxAttempts: 3})
	if err != nil {
		t.Fatalf("ReclaimOrphans: %v", err)
	}
	slices.Sort(res.IDs)
	if res.Reclaimed != 1 || res.DeadLettered != 1 || res.LocksReleased != 2 || !slices.Equal(res.IDs, []int64{old, poison}) ||
		res.WithinGrace != 2 {
		t.Fatalf("ReclaimOrphans = %+v, want 1 reclaimed (%d), 1 dead-lettered (%d), 2 locks released, 2 within grace",
			res, old, poison)
	}

	q := mustState(t, b, old, broker.StateQueued)
	if q.ClaimedBy != "" || q.ClaimedAt != nil || q.Attempts != 1 || q.LastError == "" {
		t.Fatalf("reclaimed message %+v, want claim cleared, attempts kept, a last error", q)
	}
	errs, err := b.Ack(ctx, []broker.Outcome{{Claim: oldClaim.ClaimOf()}})
	if err != nil || !errors.Is(errs[0], broker.ErrClaimLost) {
		t.Fatalf("Ack with the reclaimed token = %v, %v, want ErrClaimLost", errs, err)
	}
	if err := b.Nack(ctx, broker.NackRequest{Claim: oldClaim.ClaimOf()}); !errors.Is(err, broker.ErrClaimLost) {
		t.Fatalf("Nack with the reclaimed token: %v", err)
	}
	again := mustClaim(t, b, "alive", "o")
	if again.ID != old || again.Attempts != 2 {
		t.Fatalf("re-claim = %+v, want %d attempt 2", again, old)
	}

	mustState(t, b, young, broker.StateRunning)
	mustState(t, b, mine, broker.StateRunning)
	if d := mustState(t, b, poison, broker.StateDead); d.FinishedAt == nil || d.LastError == "" {
		t.Fatalf("dead-lettered orphan %+v, want finished_at and a reason", d)
	}
	if st, _ := b.Stats(ctx); st.Locks != 2 {
		t.Fatalf("Stats.Locks = %d, want 2 (fresh, kept)", st.Locks)
	}
	var names []string
	ls, _ := b.Locks(ctx)
	for _, l := range ls {
		names = append(names, l.Name)
	}
	if !slices.Equal(names, []string{"fresh", "kept"}) {
		t.Fatalf("locks after the pass %v, want [fresh kept]", names)
	}
	// The released lock can be taken again; its old holder cannot release it.
	if ok, err := b.AcquireLock(ctx, "stale", "alive", again.ClaimOf()); err != nil || !ok {
		t.Fatalf("re-acquire of the released lock = %v, %v", ok, err)
	}
	if err := b.ReleaseLock(ctx, "stale", youngClaim.ClaimOf()); !errors.Is(err, broker.ErrClaimLost) {
		t.Fatalf("release by the old holder: %v, want ErrClaimLost", err)
	}

	// A second pass finds nothing more; max attempts 0 means no bound.
	res, err = b.ReclaimOrphans(ctx, broker.ReclaimRequest{Live: []string{"alive"}, Grace: grace})
	if err != nil || res.Reclaimed != 0 || res.DeadLettered != 0 || res.LocksReleased != 0 {
		t.Fatalf("second pass = %+v, %v, want nothing", res, err)
	}
	if _, err := b.ReclaimOrphans(ctx, broker.ReclaimRequest{Grace: -time.Second}); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("negative grace: %v", err)
	}
}

func TestHousekeeping(t *testing.T) {
	ctx := context.Background()
	b := openTest(t, Options{Retain: 3, WorkerTTL: time.Hour})
	var ids []int64
	for range 5 {
		id := mustSubmit(t, b, "h")
		ids = append(ids, id)
		c := mustClaim(t, b, "w", "h")
		if errs, err := b.Ack(ctx, []broker.Outcome{{Claim: c.ClaimOf()}}); err != nil || errs[0] != nil {
			t.Fatal(errs, err)
		}
	}
	queued := mustSubmit(t, b, "h")
	for _, w := range []string{"fresh", "silent"} {
		if err := b.RegisterWorker(ctx, broker.WorkerInfo{ID: w}); err != nil {
			t.Fatal(err)
		}
	}
	execSQL(t, b, `UPDATE tw_workers SET heartbeat_at = heartbeat_at - ? WHERE id = 'silent'`, int64(2*time.Hour))

	if err := b.housekeep(ctx); err != nil {
		t.Fatalf("housekeep: %v", err)
	}
	for i, id := range ids {
		_, err := b.GetMessage(ctx, id)
		if i < 2 && !errors.Is(err, broker.ErrNotFound) {
			t.Errorf("finished message %d (of the 2 oldest) kept: %v", id, err)
		}
		if i >= 2 && err != nil {
			t.Errorf("finished message %d (of the newest 3) dropped: %v", id, err)
		}
	}
	mustState(t, b, queued, broker.StateQueued)
	ws, err := b.Workers(ctx)
	if err != nil || len(ws) != 1 || ws[0].ID != "fresh" {
		t.Fatalf("Workers after housekeeping = %+v, %v, want fresh only", ws, err)
	}
}

// Payloads and results keep their bytes (the JSON is not reformatted), on
// the batch ack path and on the one-by-one path (taken when an Ack names a
// message twice) alike.
func TestBytesKept(t *testing.T) {
	ctx := context.Background()
	b := openTest(t, Options{})
	payload := json.RawMessage("{ \"html\": \"<b>&amp;</b>\",\n  \"u\": \"\u00e9\\u2028\" }")
	results := []json.RawMessage{
		json.RawMessage("{ \"ok\" : true, \"s\": \"<&>\\\"\" }"),
		json.RawMessage("[1, 2,\t3]"),
		json.RawMessage("\"\\ud83d\\ude00 \u00e9\""),
	}
	for i, rs := range [][]json.RawMessage{results[:2], results} {
		topic := fmt.Sprintf("bytes-%d", i)
		var ids []int64
		for range rs {
			id, err := b.Submit(ctx, broker.SubmitRequest{Topic: topic, Task: "x", Payload: payload,
				Headers: map[string]string{"k": "v<&>"}})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{topic}, Max: len(rs)})
		if err != nil || len(msgs) != len(rs) {
			t.Fatalf("Claim = %d, %v", len(msgs), err)
		}
		var oc []broker.Outcome
		for j, m := range msgs {
			if string(m.Payload) != string(payload) || m.Headers["k"] != "v<&>" {
				t.Fatalf("claimed payload %q headers %v, want %q", m.Payload, m.Headers, payload)
			}
			oc = append(oc, broker.Outcome{Claim: m.ClaimOf(), Result: rs[j]})
		}
		if i == 1 { // the one-by-one path
			oc = append(oc, broker.Outcome{Claim: msgs[0].ClaimOf(), Result: json.RawMessage(`"second"`)})
		}
		errs, err := b.Ack(ctx, oc)
		if err != nil {
			t.Fatal(err)
		}
		if i == 1 && !errors.Is(errs[len(rs)], broker.ErrClaimLost) {
			t.Fatalf("second outcome of message %d: %v, want ErrClaimLost", msgs[0].ID, errs[len(rs)])
		}
		for j, id := range ids {
			if errs[j] != nil {
				t.Fatalf("Ack(%d): %v", id, errs[j])
			}
			m := mustState(t, b, id, broker.StateDone)
			if string(m.Result) != string(rs[j]) || string(m.Payload) != string(payload) {
				t.Errorf("message %d: result %q payload %q, want %q and %q", id, m.Result, m.Payload, rs[j], payload)
			}
		}
	}
}

// TestOpenSaysWhenTheDatabaseCannotBeWritten: a database path SQLite
// could only report as "unable to open database file" gets an error that
// names the path and what to do.
func TestOpenSaysWhenTheDatabaseCannotBeWritten(t *testing.T) {
	path := filepath.Join(t.TempDir(), "taskhost.db")
	if err := os.Mkdir(path, 0o755); err != nil { // a directory where the file should be
		t.Fatal(err)
	}
	_, err := Open(t.Context(), Options{Path: path})
	if err == nil || !strings.Contains(err.Error(), "database file "+path+" cannot be opened for writing") {
		t.Fatalf("Open over a directory: %v; want an error naming the file", err)
	}
}
