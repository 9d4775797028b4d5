package local

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// TestScheduleNextFireMigration: migration 0007 gives the schedules of a
// store made before it their next_fire_at: a fired one its expected next
// run, a never-fired one the start of the second of its updated_at, and
// the due index finds them.
func TestScheduleNextFireMigration(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "taskhost.db")
	b, err := Open(ctx, Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := b.PutSchedule(ctx, broker.Schedule{Name: "fresh", Task: "t", Topic: "q", IntervalSeconds: 60, Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.PutSchedule(ctx, broker.Schedule{Name: "fired", Task: "t", Topic: "q", IntervalSeconds: 60, Enabled: true}); err != nil {
		t.Fatal(err)
	}
	next := time.Now().UTC().Truncate(time.Second).Add(time.Hour)
	if _, err := b.FireSchedule(ctx, broker.FireRequest{Name: "fired", Slot: next.Add(-time.Hour), Next: next}); err != nil {
		t.Fatal(err)
	}
	// Back to the schema before 0007.
	execSQL(t, b, `DROP INDEX tw_schedules_due`)
	execSQL(t, b, `ALTER TABLE tw_schedules DROP COLUMN next_fire_at`)
	execSQL(t, b, `DELETE FROM tw_schema_migrations WHERE version = 7`)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = openTest(t, Options{Path: path})
	first := fresh.UpdatedAt.Truncate(time.Second)
	for name, want := range map[string]time.Time{"fresh": first, "fired": next} {
		s, err := b.GetSchedule(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if s.NextFireAt == nil || !s.NextFireAt.Equal(want) {
			t.Errorf("%s: next_fire_at %v after the migration, want %s", name, s.NextFireAt, want)
		}
	}
	due, err := b.DueSchedules(ctx, broker.DueFilter{At: next})
	if err != nil || len(due) != 2 || due[0].Name != "fresh" || due[1].Name != "fired" {
		t.Fatalf("due after the migration = %v, %v; want fresh then fired", scheduleNamesOf(due), err)
	}
}

func scheduleNamesOf(ss []broker.Schedule) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.Name)
	}
	return out
}
