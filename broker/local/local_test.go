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

func TestDurable(t *testing.T) {
	brokertest.RunDurable(t, func(t *testing.T) brokertest.Store {
		path := filepath.Join(t.TempDir(), "data", "taskhost.db")
		b := openTest(t, Options{Path: path})
		age := func(q string) func(t *testing.T, key any, d time.Duration) {
			return func(t *testing.T, key any, d time.Duration) {
				t.Helper()
				execSQL(t, b, q, int64(d), key)
			}
		}
		claim := age(`UPDATE tw_messages SET claimed_at = claimed_at - ? WHERE id = ?`)
		lock := age(`UPDATE tw_locks SET acquired_at = acquired_at - ? WHERE name = ?`)
		heartbeat := age(`UPDATE tw_workers SET heartbeat_at = heartbeat_at - ? WHERE id = ?`)
		return brokertest.Store{
			Broker:       b,
			Another:      func(t *testing.T) brokertest.Durable { return openTest(t, Options{Path: path}) },
			AgeClaim:     func(t *testing.T, id int64, d time.Duration) { claim(t, id, d) },
			AgeLock:      func(t *testing.T, name string, d time.Duration) { lock(t, name, d) },
			AgeHeartbeat: func(t *testing.T, id string, d time.Duration) { heartbeat(t, id, d) },
			ExpireLeases: func(t *testing.T) { execSQL(t, b, `UPDATE tw_leases SET expires_at = 0`) },
		}
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
		want := make([]int, len(ms))
		for i, m := range ms {
			want[i] = m.version
		}
		if !slices.Equal(versions, want) {
			t.Fatalf("round %d: applied versions %v, want %v once each", round, versions, want)
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
