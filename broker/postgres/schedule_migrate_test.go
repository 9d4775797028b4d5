package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/internal/testdb"
)

// TestScheduleNextFireMigration: migration 010 gives the schedules of a
// schema made before it their next_fire_at: a fired one its expected next
// run, a never-fired one the start of the second of its updated_at, and
// the due index finds them.
func TestScheduleNextFireMigration(t *testing.T) {
	ctx := context.Background()
	schema := freshSchema(t)
	open := func() *Broker {
		b, err := New(ctx, Options{DSN: testdb.DSN(), Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	b := open()
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
	_ = b.Close()
	// Back to the schema before 010.
	c := testdb.Connect(t, schema)
	for _, q := range []string{
		`DROP INDEX tw_schedules_due`,
		`ALTER TABLE tw_schedules DROP COLUMN next_fire_at`,
		`DELETE FROM tw_schema_migrations WHERE version = 10`,
	} {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	b = open()
	defer func() { _ = b.Close() }()
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
		t.Fatalf("due after the migration = %d schedules, %v; want fresh then fired", len(due), err)
	}
}
