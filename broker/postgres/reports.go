package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
)

// The schedule store lives in tw_schedules, tw_schedule_fires and
// tw_reports (migrations/003_schedules.sql); package sqlstore holds its
// rules and queries holds the statements. Times are database time (now())
// and stored at microsecond resolution, so a slot is compared to the
// microsecond.

// addReportsSQL inserts the reports given as arrays, one element per
// report ($1 message ids ... $14 logs), in one statement, and returns
// their ids in the arrays' order. A NULL end is now() and a NULL start the
// end. The ids are taken from the sequence before the insert, so each is
// known to belong to its element whatever order the rows are written in.
// For each schedule named by a success report, the schedule's last_success
// moves up to the latest end among them (a schedule that no longer exists
// is not an error); the rows are locked beforehand by lockSchedulesSQL.
const addReportsSQL = `
	WITH u AS MATERIALIZED (
		SELECT nextval('tw_reports_id_seq') AS id, x.ord, x.mid, x.task, x.topic,
			x.sched, x.att, x.worker, x.status, coalesce(x.st, x.en, now()) AS st, coalesce(x.en, now()) AS en,
			x.dur, x.err, x.res, x.prog, x.logs
		FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::int[], $6::text[], $7::text[],
			$8::timestamptz[], $9::timestamptz[], $10::float8[], $11::text[], $12::text[], $13::float8[], $14::text[])
			WITH ORDINALITY AS x(mid, task, topic, sched, att, worker, status, st, en, dur, err, res, prog, logs, ord)
		ORDER BY x.ord
	), r AS (
		INSERT INTO tw_reports (id, message_id, task, topic, schedule, attempt, worker, status,
			started_at, ended_at, duration_seconds, error, result, progress, logs)
		SELECT id, mid, task, topic, sched, att, worker, status, st, en, dur, err, res::jsonb, prog, logs::jsonb
		FROM u ORDER BY ord
	), s AS (
		UPDATE tw_schedules SET last_success = greatest(tw_schedules.last_success, w.en)
		FROM (SELECT sched, max(en) AS en FROM u
			WHERE status = 'success' AND sched IS NOT NULL GROUP BY sched) w
		WHERE tw_schedules.name = w.sched
	)
	SELECT id FROM u ORDER BY ord`

// lockSchedulesSQL locks the schedules named in $1 in name order, before
// addReportsSQL updates them, so that writers storing reports of the same
// schedules at once take their row locks in one order and never deadlock.
const lockSchedulesSQL = `SELECT 1 FROM tw_schedules WHERE name = ANY ($1::text[]) ORDER BY name FOR NO KEY UPDATE`

// AddReports stores the validated reports in one statement (and one
// transaction), addReportsSQL, returning their ids in the order of rs.
func (d dialect) AddReports(ctx context.Context, rs []broker.Report) ([]int64, error) {
	var (
		n       = len(rs)
		mids    = make([]int64, n)
		tasks   = make([]string, n)
		topics  = make([]string, n)
		scheds  = make([]*string, n)
		atts    = make([]int32, n)
		workers = make([]string, n)
		stats   = make([]string, n)
		starts  = make([]*time.Time, n)
		ends    = make([]*time.Time, n)
		durs    = make([]float64, n)
		errs    = make([]string, n)
		results = make([]*string, n)
		progs   = make([]float64, n)
		logs    = make([]string, n)
		locks   []string // the schedules of success reports, sorted, once each
	)
	for i, r := range rs {
		logs[i] = "[]"
		if len(r.Logs) > 0 {
			lines := make([]string, len(r.Logs))
			for k, l := range r.Logs {
				lines[k] = broker.CleanText(l)
			}
			js, err := json.Marshal(lines)
			if err != nil {
				return nil, broker.Invalid("report of message %d: logs: %v", r.MessageID, err)
			}
			logs[i] = string(js)
		}
		if r.Schedule != "" {
			scheds[i] = &r.Schedule
			if r.Status == broker.ReportSuccess {
				locks = append(locks, r.Schedule)
			}
		}
		if len(r.Result) > 0 {
			s := string(r.Result)
			results[i] = &s
		}
		starts[i], ends[i] = nullTime(r.StartedAt), nullTime(r.EndedAt)
		mids[i], tasks[i], topics[i], atts[i], workers[i], stats[i] = r.MessageID, r.Task, r.Topic, int32(r.Attempt), r.Worker, r.Status
		durs[i], errs[i], progs[i] = r.Duration, broker.CleanText(r.Error), r.Progress
	}
	sort.Strings(locks)
	locks = slices.Compact(locks)
	var ids []int64
	err := d.b.run(ctx, "add reports", func(c *pgx.Conn) error {
		batch := &pgx.Batch{}
		if len(locks) > 0 {
			batch.Queue(lockSchedulesSQL, locks)
		}
		batch.Queue(addReportsSQL, mids, tasks, topics, scheds, atts, workers, stats,
			starts, ends, durs, errs, results, progs, logs)
		br := c.SendBatch(ctx, batch)
		if len(locks) > 0 {
			if _, err := br.Exec(); err != nil {
				br.Close()
				return err
			}
		}
		rows, err := br.Query()
		if err != nil {
			br.Close()
			return err
		}
		if ids, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
			br.Close()
			return err
		}
		if len(ids) != n {
			br.Close()
			return fmt.Errorf("add reports: %d ids back for %d reports", len(ids), n)
		}
		return br.Close()
	})
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// PurgeReports deletes the reports that ended before the cutoff and
// returns how many.
func (d dialect) PurgeReports(ctx context.Context, before time.Time) (int, error) {
	var n int64
	err := d.b.run(ctx, "purge reports", func(c *pgx.Conn) error {
		tag, err := c.Exec(ctx, `DELETE FROM tw_reports WHERE ended_at < $1`, before)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, err
	}
	return int(n), nil
}

// nullTime is t for a query argument, NULL when it is zero.
func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
