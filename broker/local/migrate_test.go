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
	for _, table := range []string{"tw_reports", "tw_schedule_fires", "tw_schedules", "tw_leases"} {
		execSQL(t, b, `DROP TABLE `+table)
	}
	execSQL(t, b, `ALTER TABLE tw_messages DROP COLUMN orphaned`)
	execSQL(t, b, `ALTER TABLE tw_workers DROP COLUMN tasks`)
	execSQL(t, b, `DELETE FROM tw_schema_migrations WHERE version > 1`)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = openTest(t, Options{Path: path})
	if _, held, err := b.TryLease(ctx, "x", "y", time.Minute); err != nil || !held {
		t.Fatalf("TryLease after the upgrade = %v, %v", held, err)
	}
	mustState(t, b, id, broker.StateQueued)
	ms, _ := loadMigrations()
	var n int
	if err := b.reader.QueryRow(`SELECT count(*) FROM tw_schema_migrations`).Scan(&n); err != nil || n != len(ms) {
		t.Fatalf("versions recorded: %d, %v; want %d", n, err, len(ms))
	}
}
