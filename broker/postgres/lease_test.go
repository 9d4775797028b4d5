package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/internal/testdb"
)

// TestFencedPassHoldsTheLease: while a fenced pass holds the lease row, a
// takeover waits for it (the rest of the fence's rules are in
// brokertest.RunDurable).
func TestFencedPassHoldsTheLease(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	c := schemaConn(t, b)
	l, held, err := b.TryLease(ctx, "beat", "beat", time.Minute)
	if err != nil || !held {
		t.Fatalf("TryLease = %v, %v", held, err)
	}
	fence := &broker.Fence{Name: "beat", Holder: "beat", Term: l.Term}
	// Hold the lease row in a transaction as the pass does and watch a
	// takeover block.
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkFence(ctx, tx, fence); err != nil {
		t.Fatal(err)
	}
	other := schemaConn(t, b)
	done := make(chan error, 1)
	go func() {
		_, err := other.Exec(ctx, `UPDATE tw_leases SET holder = 'usurper', term = term + 1 WHERE name = 'beat'`)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("a takeover committed while a fenced pass held the lease (err %v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestMigrationUpgrade: a database at an older version gets the pending
// migrations and keeps its data.
func TestMigrationUpgrade(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := context.Background()
	id, err := b.Submit(ctx, broker.SubmitRequest{Topic: "u", Task: "x"})
	if err != nil {
		t.Fatal(err)
	}
	c := schemaConn(t, b)
	// Roll the schema back to version 1.
	if _, err := c.Exec(ctx, `DROP FUNCTION tw_message(bigint), tw_report(bigint); DROP VIEW tw_reports; DROP VIEW tw_messages_all; DROP TABLE tw_done; DROP TYPE tw_done_message;
		DROP TABLE tw_report_rows, tw_schedule_fires, tw_schedules, tw_leases, tw_claims;
		ALTER TABLE tw_messages DROP COLUMN orphaned, DROP COLUMN suspect, DROP COLUMN waiting_since;
		DELETE FROM tw_schema_migrations WHERE version > 1`); err != nil {
		t.Fatal(err)
	}
	// Before columns of their own, a message's last error held its state.
	var orphan, waiter int64
	for _, p := range []*int64{&orphan, &waiter} {
		if *p, err = b.Submit(ctx, broker.SubmitRequest{Topic: "u", Task: "x"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Exec(ctx, `UPDATE tw_messages SET last_error = $1 WHERE id = $2`,
		`orphaned: worker w stopped heartbeating; requeued by the reaper`, orphan); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, `UPDATE tw_messages SET last_error = $1 WHERE id = $2`,
		`task "t" is not registered in worker w yet; requeued; before that, no live worker runs task "t" on topic "u since x" since 2026-11-30T10:20:30Z; requeued to wait up to 10m0s for one`, waiter); err != nil {
		t.Fatal(err)
	}
	b2, err := New(ctx, Options{DSN: testdb.DSN(), Schema: b.schema})
	if err != nil {
		t.Fatalf("New on a version-1 schema: %v", err)
	}
	defer b2.Close()
	if _, held, err := b2.TryLease(ctx, "x", "y", time.Minute); err != nil || !held {
		t.Fatalf("TryLease after the upgrade = %v, %v", held, err)
	}
	if _, err := b2.GetMessage(ctx, id); err != nil {
		t.Fatalf("message lost in the upgrade: %v", err)
	}
	since := time.Date(2026, 11, 30, 10, 20, 30, 0, time.UTC)
	// The reports table got its key column back (0008/011 on the
	// recreated table): a keyed report is stored once.
	wantReportKeyed(t, b2)
	if m, err := b2.GetMessage(ctx, orphan); err != nil || !m.Suspect || m.WaitingSince != nil {
		t.Errorf("orphaned message after the upgrade: %+v, %v; want a suspect, not waiting", m, err)
	}
	if m, err := b2.GetMessage(ctx, waiter); err != nil || m.Suspect || m.WaitingSince == nil || !m.WaitingSince.Equal(since) {
		t.Errorf("waiting message after the upgrade: %+v, %v; want waiting since %v, not a suspect", m, err, since)
	}
	all, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM tw_schema_migrations`).Scan(&n); err != nil || n != len(all) {
		t.Fatalf("versions recorded: %d, %v; want %d", n, err, len(all))
	}
}

// wantReportKeyed checks that b stores a keyed report once: the report
// key column and its unique index are in place.
func wantReportKeyed(t *testing.T, b broker.ScheduleStore) {
	t.Helper()
	r := broker.Report{MessageID: 1, Task: "t", Topic: "u", Attempt: 1, Status: broker.ReportSuccess, Key: "upgrade-key"}
	var ids []int64
	for range 2 {
		got, err := b.AddReports(context.Background(), []broker.Report{r})
		if err != nil {
			t.Fatalf("AddReports after the upgrade: %v", err)
		}
		ids = append(ids, got...)
	}
	if ids[0] != ids[1] {
		t.Fatalf("a keyed report stored twice after the upgrade: ids %v", ids)
	}
	if rs, err := b.ListReports(context.Background(), broker.ReportFilter{Task: "t"}); err != nil || len(rs) != 1 {
		t.Fatalf("reports after the upgrade: %d, %v; want 1", len(rs), err)
	}
}
