package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
)

var _ broker.FinishedPurger = (*Broker)(nil)

// purgeChunk bounds the messages one PurgeFinished transaction deletes, so
// no transaction holds many row locks or runs long.
const purgeChunk = 5000

// purgeFinishedSQL deletes up to $2 of the done and cancelled messages
// that finished before $1, oldest ids first, and returns how many. The
// success reports kept in their rows move to tw_report_rows, with their
// ids: reports have a retention of their own (PurgeReports).
var purgeFinishedSQL = `
	WITH d AS (
		DELETE FROM tw_messages WHERE id = ANY (ARRAY (
			SELECT id FROM tw_messages
			WHERE state IN ('done', 'cancelled') AND finished_at < $1
			ORDER BY id LIMIT $2))
		RETURNING id, task, topic, result, claimed_by, report_id, report_attempt, report_worker, report_started_at,
			report_ended_at, report_duration, report_progress
	), moved AS (` + moveHeldReports("d") + `)
	SELECT count(*) FROM d`

// MoveHeldReportsSQL moves the success reports kept in the rows of
// tw_messages (see migration 019) to tw_report_rows, with their ids. Run
// it before emptying tw_messages by other means than the store's purges
// (TRUNCATE, DELETE), or the reports go with the rows.
var MoveHeldReportsSQL = moveHeldReports("tw_messages")

// moveHeldReports is the INSERT into tw_report_rows of the reports kept
// in the rows of from (tw_messages, or rows of it a CTE returned with the
// report_ columns, id, task, topic, result and claimed_by).
func moveHeldReports(from string) string {
	return `
		INSERT INTO tw_report_rows (id, message_id, task, topic, schedule, attempt, worker, status, started_at,
			ended_at, duration_seconds, error, result, progress, logs)
		SELECT ` + heldReportSelect + ` FROM ` + from + ` WHERE report_id IS NOT NULL`
}

// PurgeFinished deletes the done and cancelled messages that finished
// before the cutoff, oldest ids first, in transactions of at most
// purgeChunk, then the schedule fires older than the cutoff (see
// broker.FinishedPurger), and the unique keys last used longer ago than
// any window. The messages are found walking the primary key from its
// start, where the old ones are, so each chunk reads little more than it
// deletes.
func (b *Broker) PurgeFinished(ctx context.Context, before time.Time) (int, error) {
	total := 0
	for {
		var n int64
		err := b.run(ctx, "purge finished messages", func(c *pgx.Conn) error {
			return c.QueryRow(ctx, purgeFinishedSQL, before, purgeChunk).Scan(&n)
		})
		if err != nil {
			return total, err
		}
		total += int(n)
		if n < purgeChunk {
			break
		}
	}
	for {
		var n, batches int64
		err := b.run(ctx, "purge finished messages", func(c *pgx.Conn) error {
			return c.QueryRow(ctx, purgeDoneSQL, before, purgeBatches).Scan(&n, &batches)
		})
		if err != nil {
			return total, err
		}
		total += int(n)
		if batches < purgeBatches {
			break
		}
	}
	err := b.run(ctx, "purge schedule fires", func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, `DELETE FROM tw_schedule_fires WHERE fired_at < $1`, before)
		return err
	})
	if err != nil {
		return total, err
	}
	// A unique key's row matters to windows (unique_for_seconds) of at
	// most broker.MaxDelay: older ones go.
	err = b.run(ctx, "purge unique keys", func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, `DELETE FROM tw_unique_keys WHERE created_at < now() - $1::bigint * interval '1 microsecond'`,
			micros(broker.MaxDelay))
		return err
	})
	return total, err
}
