package local

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/taskhost/taskhost/broker"
)

// TestCancelMigration: a file whose state constraint predates the
// cancelled state gets it from migration 10, keeps refusing states that
// do not exist, and stays sound.
func TestCancelMigration(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "taskhost.db")
	b := openTest(t, Options{Path: path})
	queued := mustSubmit(t, b, "m")
	// Back to the schema before migration 10.
	execSQL(t, b, `PRAGMA writable_schema = ON`)
	execSQL(t, b, `UPDATE sqlite_schema SET sql = replace(sql, ', ''cancelled''))', '))') WHERE type = 'table' AND name = 'tw_messages'`)
	execSQL(t, b, `PRAGMA writable_schema = RESET`)
	execSQL(t, b, `ALTER TABLE tw_messages DROP COLUMN cancel_requested_at`)
	execSQL(t, b, `DELETE FROM tw_schema_migrations WHERE version = 10`)
	var def string
	if err := b.writer.QueryRow(`SELECT sql FROM sqlite_schema WHERE name = 'tw_messages'`).Scan(&def); err != nil || strings.Contains(def, "cancelled") {
		t.Fatalf("the rolled back table still admits cancelled (%v): %s", err, def)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	b = openTest(t, Options{Path: path})
	if m, err := b.Cancel(ctx, queued); err != nil || m.State != broker.StateCancelled {
		t.Fatalf("Cancel after the upgrade = %s, %v", m.State, err)
	}
	if _, err := b.writer.Exec(`UPDATE tw_messages SET state = 'bogus' WHERE id = ?`, queued); err == nil || !strings.Contains(err.Error(), "CHECK") {
		t.Fatalf("a state that does not exist: %v, want the CHECK constraint to refuse it", err)
	}
	var ok string
	if err := b.writer.QueryRow(`PRAGMA integrity_check`).Scan(&ok); err != nil || ok != "ok" {
		t.Fatalf("integrity_check = %q, %v", ok, err)
	}
}
