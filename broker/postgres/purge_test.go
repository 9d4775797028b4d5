package postgres

import (
	"context"
	"slices"
	"testing"
	"time"
)

// PurgeFinished deletes the done messages that finished before the cutoff
// (more than one chunk of them) and old schedule fires; queued, running,
// failed and dead messages, recent done ones and recent fires stay.
func TestPurgeFinished(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := context.Background()
	c := schemaConn(t, b)
	execAll(t, c,
		`INSERT INTO tw_topics (name) VALUES ('t')`,
		// purgeChunk + 7 old done messages, then one of each other kind.
		`INSERT INTO tw_messages (topic, task, state, finished_at)
			SELECT 't', 'x', 'done', now() - interval '10 days' FROM generate_series(1, 5007)`,
		`INSERT INTO tw_messages (topic, task, state, finished_at) VALUES
			('t', 'recent', 'done', now() - interval '1 hour'),
			('t', 'dead', 'dead', now() - interval '10 days'),
			('t', 'failed', 'failed', now() - interval '10 days')`,
		`INSERT INTO tw_messages (topic, task, state, available_at) VALUES ('t', 'queued', 'queued', now() - interval '10 days')`,
		`INSERT INTO tw_messages (topic, task, state, token, claimed_by, claimed_at)
			VALUES ('t', 'running', 'running', gen_random_uuid(), 'w', now() - interval '10 days')`,
		`INSERT INTO tw_schedules (name, task, topic, interval_seconds) VALUES ('s', 'x', 't', 60)`,
		`INSERT INTO tw_schedule_fires (name, slot, fired_at) VALUES
			('s', now() - interval '10 days', now() - interval '10 days'),
			('s', now() - interval '1 hour', now() - interval '1 hour')`,
	)
	n, err := b.PurgeFinished(ctx, time.Now().Add(-7*24*time.Hour))
	if err != nil || n != purgeChunk+7 {
		t.Fatalf("PurgeFinished = %d, %v; want %d", n, err, purgeChunk+7)
	}
	rows, err := c.Query(ctx, `SELECT task FROM tw_messages ORDER BY task`)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for rows.Next() {
		var task string
		if err := rows.Scan(&task); err != nil {
			t.Fatal(err)
		}
		left = append(left, task)
	}
	if want := []string{"dead", "failed", "queued", "recent", "running"}; !slices.Equal(left, want) {
		t.Fatalf("messages left: %v, want %v", left, want)
	}
	var fires int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM tw_schedule_fires WHERE fired_at > now() - interval '1 day'`).Scan(&fires); err != nil {
		t.Fatal(err)
	}
	var all int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM tw_schedule_fires`).Scan(&all); err != nil {
		t.Fatal(err)
	}
	if fires != 1 || all != 1 {
		t.Fatalf("schedule fires left: %d recent of %d, want the recent one only", fires, all)
	}
	if n, err := b.PurgeFinished(ctx, time.Now().Add(-7*24*time.Hour)); err != nil || n != 0 {
		t.Fatalf("PurgeFinished again = %d, %v; want 0", n, err)
	}
}

// PurgeFinished also deletes the unique keys last used longer ago than
// any window (broker.MaxDelay), and keeps the others.
func TestPurgeFinishedDeletesOldUniqueKeys(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := context.Background()
	c := schemaConn(t, b)
	execAll(t, c, `INSERT INTO tw_unique_keys (key, message_id, created_at) VALUES
		('old', 1, now() - interval '366 days'), ('new', 2, now() - interval '300 days')`)
	if _, err := b.PurgeFinished(ctx, time.Now().Add(-7*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	var keys []string
	rows, err := c.Query(ctx, `SELECT key FROM tw_unique_keys ORDER BY key`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	if !slices.Equal(keys, []string{"new"}) {
		t.Fatalf("keys after PurgeFinished: %v, want [new]", keys)
	}
}
