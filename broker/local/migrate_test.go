package local

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// TestMigrationUpgrade: a file at schema version 1 gets the pending
// migrations and keeps its data.
func TestMigrationUpgrade(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "taskhost.db")
	b, err := Open(ctx, Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	id := mustSubmit(t, b, "u")
	// Roll back what the later migrations created.
	for _, trigger := range []string{"tw_topic_counts_insert", "tw_topic_counts_delete", "tw_topic_counts_leave", "tw_topic_counts_enter"} {
		execSQL(t, b, `DROP TRIGGER `+trigger)
	}
	for _, table := range []string{"tw_topic_counts", "tw_reports", "tw_schedule_fires", "tw_schedules", "tw_leases", "tw_amqp_outbox", "tw_amqp_orphans"} {
		execSQL(t, b, `DROP TABLE `+table)
	}
	execSQL(t, b, `ALTER TABLE tw_messages DROP COLUMN orphaned`)
	execSQL(t, b, `ALTER TABLE tw_workers DROP COLUMN tasks`)
	execSQL(t, b, `ALTER TABLE tw_messages DROP COLUMN suspect`)
	execSQL(t, b, `ALTER TABLE tw_messages DROP COLUMN waiting_since`)
	execSQL(t, b, `ALTER TABLE tw_messages DROP COLUMN cancel_requested_at`)
	execSQL(t, b, `DELETE FROM tw_schema_migrations WHERE version > 1`)
	// Before columns of their own, a message's last error held its state.
	orphan, waiter := mustSubmit(t, b, "u"), mustSubmit(t, b, "u")
	execSQL(t, b, `UPDATE tw_messages SET last_error = ? WHERE id = ?`,
		`orphaned: worker "w" stopped heartbeating during attempt 1; requeued by the reaper`, orphan)
	execSQL(t, b, `UPDATE tw_messages SET last_error = ? WHERE id = ?`,
		`task "t" is not registered in worker w yet; requeued; before that, no live worker runs task "t" on topic "u since x" since 2026-11-30T10:20:30Z; requeued to wait up to 10m0s for one`, waiter)
	// 0009: priorities and unique keys (after the submits, which write
	// those columns).
	execSQL(t, b, `DROP INDEX tw_messages_unique`)
	execSQL(t, b, `DROP INDEX tw_messages_claim`)
	execSQL(t, b, `CREATE INDEX tw_messages_claim ON tw_messages (topic, available_at, id) WHERE state = 'queued'`)
	execSQL(t, b, `DROP TABLE tw_unique_keys`)
	for _, col := range []string{"priority", "unique_key", "unique_states"} {
		execSQL(t, b, `ALTER TABLE tw_messages DROP COLUMN `+col)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = openTest(t, Options{Path: path})
	if _, held, err := b.TryLease(ctx, "x", "y", time.Minute); err != nil || !held {
		t.Fatalf("TryLease after the upgrade = %v, %v", held, err)
	}
	mustState(t, b, id, broker.StateQueued)
	wantCarried(t, b, id, orphan, waiter)
	// The topic counts (0016) count the messages stored before them.
	if st, err := b.Stats(ctx); err != nil || len(st.Topics) != 1 || st.Topics[0].Queued != 3 {
		t.Fatalf("Stats after the upgrade = %+v, %v; want topic u with its 3 queued messages", st, err)
	}
	// The reports table got its key column back (0008/011 on the
	// recreated table): a keyed report is stored once.
	wantReportKeyed(t, b)
	ms, _ := loadMigrations()
	var n int
	if err := b.reader.QueryRow(`SELECT count(*) FROM tw_schema_migrations`).Scan(&n); err != nil || n != len(ms) {
		t.Fatalf("versions recorded: %d, %v; want %d", n, err, len(ms))
	}
}

// wantCarried checks what the migration to state columns read out of the
// last errors that TestMigrationUpgrade wrote: plain is neither a suspect
// nor waiting, orphan a suspect, waiter waiting since 2026-11-30T10:20:30Z.
func wantCarried(t *testing.T, b broker.Broker, plain, orphan, waiter int64) {
	t.Helper()
	since := time.Date(2026, 11, 30, 10, 20, 30, 0, time.UTC)
	for _, c := range []struct {
		id      int64
		suspect bool
		waiting *time.Time
	}{{plain, false, nil}, {orphan, true, nil}, {waiter, false, &since}} {
		m, err := b.GetMessage(context.Background(), c.id)
		if err != nil {
			t.Fatal(err)
		}
		if m.Suspect != c.suspect || (m.WaitingSince == nil) != (c.waiting == nil) || (c.waiting != nil && !m.WaitingSince.Equal(*c.waiting)) {
			t.Errorf("message %d after the upgrade: suspect %t, waiting since %v; want %t, %v (last error %q)",
				c.id, m.Suspect, m.WaitingSince, c.suspect, c.waiting, m.LastError)
		}
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
