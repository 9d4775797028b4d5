package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
)

var _ broker.ScheduleStore = (*Broker)(nil)

// The schedule store lives in tw_schedules, tw_schedule_fires and
// tw_reports (migrations/003_schedules.sql). Times are database time
// (now()) and stored at microsecond resolution, so a slot is compared to
// the microsecond.

// schedCols are the columns scanSchedule reads, in its order.
const schedCols = `name, task, topic, payload::text, interval_seconds, cron, enabled, missed_policy, source,
	last_attempt, last_success, expected_next_run, created_at, updated_at`

func scanSchedule(row pgx.Row) (broker.Schedule, error) {
	var (
		s        broker.Schedule
		payload  string
		interval *int32
		cron     *string
	)
	err := row.Scan(&s.Name, &s.Task, &s.Topic, &payload, &interval, &cron, &s.Enabled, &s.MissedPolicy, &s.Source,
		&s.LastAttempt, &s.LastSuccess, &s.ExpectedNextRun, &s.CreatedAt, &s.UpdatedAt)
	if err != nil {
		return broker.Schedule{}, err
	}
	s.Payload = json.RawMessage(payload)
	if interval != nil {
		s.IntervalSeconds = int(*interval)
	}
	if cron != nil {
		s.Cron = *cron
	}
	return s, nil
}

// nullTime is t for a query argument, NULL when it is zero.
func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// putScheduleSQL upserts a schedule: a replaced one keeps created_at and
// its run state, except expected_next_run when the timing changed.
const putScheduleSQL = `
	INSERT INTO tw_schedules AS s
		(name, task, topic, payload, interval_seconds, cron, enabled, missed_policy, source, created_at, updated_at)
	VALUES ($1, $2, $3, $4::text::jsonb, $5::int, $6::text, $7, $8, $9, now(), now())
	ON CONFLICT (name) DO UPDATE SET
		task = excluded.task, topic = excluded.topic, payload = excluded.payload,
		interval_seconds = excluded.interval_seconds, cron = excluded.cron,
		enabled = excluded.enabled, missed_policy = excluded.missed_policy, source = excluded.source,
		expected_next_run = CASE
			WHEN s.interval_seconds IS NOT DISTINCT FROM excluded.interval_seconds
				AND s.cron IS NOT DISTINCT FROM excluded.cron
			THEN s.expected_next_run END,
		updated_at = now()
	RETURNING ` + schedCols

// PutSchedule validates s (see broker.NormalizeSchedule) and creates or
// replaces the schedule named s.Name in one statement. A replaced schedule
// keeps its run state (last_attempt, last_success, expected_next_run) and
// created_at, except that expected_next_run is cleared when
// interval_seconds or cron changed. updated_at (and created_at on
// creation) is now(). It returns the schedule as stored (the payload as
// jsonb renders it).
func (b *Broker) PutSchedule(ctx context.Context, s broker.Schedule) (broker.Schedule, error) {
	s, err := broker.NormalizeSchedule(s)
	if err != nil {
		return broker.Schedule{}, err
	}
	if err := broker.CheckSchedulePayload(s, b.maxPayload); err != nil {
		return broker.Schedule{}, err
	}
	var interval *int32
	if s.IntervalSeconds > 0 {
		v := int32(s.IntervalSeconds) // at most broker.MaxIntervalSeconds
		interval = &v
	}
	var cron *string
	if s.Cron != "" {
		cron = &s.Cron
	}
	var out broker.Schedule
	err = b.run(ctx, "put schedule", func(c *pgx.Conn) error {
		var err error
		out, err = scanSchedule(c.QueryRow(ctx, putScheduleSQL,
			s.Name, s.Task, s.Topic, string(s.Payload), interval, cron, s.Enabled, s.MissedPolicy, s.Source))
		return err
	})
	if err != nil {
		return broker.Schedule{}, err
	}
	return out, nil
}

// GetSchedule returns the schedule; broker.ErrNotFound when there is none.
func (b *Broker) GetSchedule(ctx context.Context, name string) (broker.Schedule, error) {
	var s broker.Schedule
	err := b.run(ctx, "get schedule", func(c *pgx.Conn) error {
		var err error
		s, err = scanSchedule(c.QueryRow(ctx, `SELECT `+schedCols+` FROM tw_schedules WHERE name = $1`, name))
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("schedule %q: %w", name, broker.ErrNotFound)
		}
		return err
	})
	if err != nil {
		return broker.Schedule{}, err
	}
	return s, nil
}

// ListSchedules returns every schedule, by name.
func (b *Broker) ListSchedules(ctx context.Context) ([]broker.Schedule, error) {
	var out []broker.Schedule
	err := b.run(ctx, "list schedules", func(c *pgx.Conn) error {
		out = []broker.Schedule{}
		rows, err := c.Query(ctx, `SELECT `+schedCols+` FROM tw_schedules ORDER BY name`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			s, err := scanSchedule(rows)
			if err != nil {
				return err
			}
			out = append(out, s)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// DeleteSchedule removes the schedule and (by the foreign key's cascade)
// its record of fired slots, so a schedule created again under the name
// may fire those slots again; its reports stay. broker.ErrNotFound when
// there is none.
func (b *Broker) DeleteSchedule(ctx context.Context, name string) error {
	return b.run(ctx, "delete schedule", func(c *pgx.Conn) error {
		tag, err := c.Exec(ctx, `DELETE FROM tw_schedules WHERE name = $1`, name)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("schedule %q: %w", name, broker.ErrNotFound)
		}
		return nil
	})
}

// insertMessageSQL is Submit's statement (messages.go): queue one message,
// creating its topic's row when missing. $1 topic, $2 task, $3 payload
// text, $4 headers text or NULL, $5 max attempts, $6 delay µs.
const insertMessageSQL = `
	WITH topic AS (
		INSERT INTO tw_topics (name) VALUES ($1) ON CONFLICT (name) DO NOTHING
	)
	INSERT INTO tw_messages (topic, task, payload, headers, max_attempts, available_at, created_at)
	VALUES ($1, $2, $3::text::jsonb, $4::text::jsonb, $5,
		now() + $6::bigint * interval '1 microsecond', now())
	RETURNING id`

// insertMessage queues the validated req in tx, as Submit does, and
// returns its id.
func insertMessage(ctx context.Context, tx pgx.Tx, req broker.SubmitRequest) (int64, error) {
	payload := "{}"
	if len(req.Payload) > 0 {
		payload = string(req.Payload)
	}
	var headers *string
	if len(req.Headers) > 0 {
		h, err := json.Marshal(req.Headers)
		if err != nil {
			return 0, broker.Invalid("headers: %v", err)
		}
		s := string(h)
		headers = &s
	}
	var id int64
	err := tx.QueryRow(ctx, insertMessageSQL,
		req.Topic, req.Task, payload, headers, req.MaxAttempts, micros(req.Delay)).Scan(&id)
	return id, err
}

// FireSchedule fires slot req.Slot of schedule req.Name, at most once per
// (name, slot) across every process, in one transaction:
//
//   - the request is checked first (broker.ValidateFire: a name, a slot,
//     and req.Submit as Submit would check it);
//   - with req.Fence, the lease row must be held by Fence.Holder at
//     Fence.Term and not expired, and is locked FOR SHARE so no takeover
//     commits before this transaction does (as a fenced ReclaimOrphans);
//     otherwise nothing changes and the error is broker.ErrNotLeader;
//   - the schedule row is locked (FOR NO KEY UPDATE, serialising fires of
//     one schedule, and against its deletion); a missing one is
//     broker.ErrNotFound;
//   - the (name, slot) row is inserted ON CONFLICT DO NOTHING: when it
//     already existed, the result is Fired false and nothing else changes;
//   - otherwise last_attempt becomes now() and expected_next_run req.Next
//     (NULL when zero), and req.Submit, when set, is queued as Submit
//     queues it (insertMessage) with header "schedule" set to the name
//     (broker.FireSubmit); its id is recorded in the fire row and
//     returned.
func (b *Broker) FireSchedule(ctx context.Context, req broker.FireRequest) (broker.FireResult, error) {
	if err := broker.ValidateFire(req); err != nil {
		return broker.FireResult{}, err
	}
	var sub *broker.SubmitRequest
	if req.Submit != nil {
		s := broker.FireSubmit(req)
		sub = &s
	}
	var res broker.FireResult
	err := b.run(ctx, "fire schedule", func(c *pgx.Conn) error {
		res = broker.FireResult{}
		return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			if err := checkFence(ctx, tx, req.Fence); err != nil {
				return err
			}
			var one int
			err := tx.QueryRow(ctx, `SELECT 1 FROM tw_schedules WHERE name = $1 FOR NO KEY UPDATE`, req.Name).Scan(&one)
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("schedule %q: %w", req.Name, broker.ErrNotFound)
			}
			if err != nil {
				return err
			}
			tag, err := tx.Exec(ctx, `INSERT INTO tw_schedule_fires (name, slot, fired_at) VALUES ($1, $2, now())
				ON CONFLICT (name, slot) DO NOTHING`, req.Name, req.Slot)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				return nil // fired before: nothing changes
			}
			if _, err := tx.Exec(ctx, `UPDATE tw_schedules SET last_attempt = now(), expected_next_run = $2 WHERE name = $1`,
				req.Name, nullTime(req.Next)); err != nil {
				return err
			}
			res.Fired = true
			if sub == nil {
				return nil
			}
			if res.MessageID, err = insertMessage(ctx, tx, *sub); err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `UPDATE tw_schedule_fires SET message_id = $3 WHERE name = $1 AND slot = $2`,
				req.Name, req.Slot, res.MessageID)
			return err
		})
	})
	if err != nil {
		return broker.FireResult{}, err
	}
	return res, nil
}

// reportCols are the columns scanReport reads, in its order.
const reportCols = `id, message_id, task, topic, schedule, attempt, worker, status, started_at, ended_at,
	duration_seconds, error, result::text, progress, logs::text`

func scanReport(row pgx.Row) (broker.Report, error) {
	var (
		r                broker.Report
		schedule, result *string
		logs             string
	)
	err := row.Scan(&r.ID, &r.MessageID, &r.Task, &r.Topic, &schedule, &r.Attempt, &r.Worker, &r.Status,
		&r.StartedAt, &r.EndedAt, &r.Duration, &r.Error, &result, &r.Progress, &logs)
	if err != nil {
		return broker.Report{}, err
	}
	if schedule != nil {
		r.Schedule = *schedule
	}
	if result != nil {
		r.Result = json.RawMessage(*result)
	}
	if err := json.Unmarshal([]byte(logs), &r.Logs); err != nil {
		return broker.Report{}, fmt.Errorf("report %d: logs: %w", r.ID, err)
	}
	if len(r.Logs) == 0 {
		r.Logs = nil
	}
	return r, nil
}

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

// AddReport validates r (broker.ValidateReport) and stores it, returning
// its id. A zero EndedAt is now() and a zero StartedAt is EndedAt; Logs is
// stored as a JSON array (nil as [], read back as nil). A success report
// naming a schedule (r.Schedule) also sets, in the same transaction, that
// schedule's last_success to the later of it and EndedAt; a schedule that
// no longer exists is not an error.
func (b *Broker) AddReport(ctx context.Context, r broker.Report) (int64, error) {
	return broker.OneReport(b.AddReports(ctx, []broker.Report{r}))
}

// AddReports stores reports as AddReport does, all in one statement (and
// one transaction), returning their ids in the order of rs.
func (b *Broker) AddReports(ctx context.Context, rs []broker.Report) ([]int64, error) {
	if err := broker.ValidateReports(rs); err != nil || len(rs) == 0 {
		return nil, err
	}
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
	err := b.run(ctx, "add reports", func(c *pgx.Conn) error {
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

// ListReports returns the reports matching f, newest (highest id) first:
// at most f.Limit (broker.DefaultReportLimit when not positive,
// broker.MaxReportLimit at most), with ids below f.Before when it is
// positive. An unknown status is invalid.
func (b *Broker) ListReports(ctx context.Context, f broker.ReportFilter) ([]broker.Report, error) {
	limit, err := broker.ValidateReportFilter(f)
	if err != nil {
		return nil, err
	}
	// Only the filters in use go into the SQL, so each combination gets a
	// plan (and a cached statement) of its own.
	var where []string
	var args []any
	add := func(cond string, v any) {
		args = append(args, v)
		where = append(where, strings.ReplaceAll(cond, "?", "$"+strconv.Itoa(len(args))))
	}
	if f.MessageID != 0 {
		add("message_id = ?", f.MessageID)
	}
	if f.Task != "" {
		add("task = ?", f.Task)
	}
	if f.Status != "" {
		add("status = ?", f.Status)
	}
	if f.Schedule != "" {
		add("schedule = ?", f.Schedule)
	}
	if f.Before > 0 {
		add("id < ?", f.Before)
	}
	q := `SELECT ` + reportCols + ` FROM tw_reports`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	args = append(args, limit)
	q += ` ORDER BY id DESC LIMIT $` + strconv.Itoa(len(args))

	var out []broker.Report
	err = b.run(ctx, "list reports", func(c *pgx.Conn) error {
		out = []broker.Report{}
		rows, err := c.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			r, err := scanReport(rows)
			if err != nil {
				return err
			}
			out = append(out, r)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// GetReport returns the report; broker.ErrNotFound when there is none with
// that id.
func (b *Broker) GetReport(ctx context.Context, id int64) (broker.Report, error) {
	var r broker.Report
	err := b.run(ctx, "get report", func(c *pgx.Conn) error {
		var err error
		r, err = scanReport(c.QueryRow(ctx, `SELECT `+reportCols+` FROM tw_reports WHERE id = $1`, id))
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("report %d: %w", id, broker.ErrNotFound)
		}
		return err
	})
	if err != nil {
		return broker.Report{}, err
	}
	return r, nil
}

// PurgeReports deletes the reports that ended before the cutoff and
// returns how many.
func (b *Broker) PurgeReports(ctx context.Context, before time.Time) (int, error) {
	var n int64
	err := b.run(ctx, "purge reports", func(c *pgx.Conn) error {
		tag, err := c.Exec(ctx, `DELETE FROM tw_reports WHERE ended_at < $1`, before)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, err
	}
	return int(n), nil
}

var _ broker.FinishedPurger = (*Broker)(nil)

// purgeChunk bounds the messages one PurgeFinished transaction deletes, so
// no transaction holds many row locks or runs long.
const purgeChunk = 5000

// PurgeFinished deletes the done messages that finished before the cutoff,
// oldest ids first, in transactions of at most purgeChunk, then the
// schedule fires older than the cutoff (see broker.FinishedPurger). Done
// messages are found walking the primary key from its start, where the
// old ones are, so each chunk reads little more than it deletes.
func (b *Broker) PurgeFinished(ctx context.Context, before time.Time) (int, error) {
	total := 0
	for {
		var n int64
		err := b.run(ctx, "purge finished messages", func(c *pgx.Conn) error {
			tag, err := c.Exec(ctx, `
				DELETE FROM tw_messages WHERE id = ANY (ARRAY (
					SELECT id FROM tw_messages
					WHERE state = 'done' AND finished_at < $1
					ORDER BY id LIMIT $2))`, before, purgeChunk)
			n = tag.RowsAffected()
			return err
		})
		if err != nil {
			return total, err
		}
		total += int(n)
		if n < purgeChunk {
			break
		}
	}
	err := b.run(ctx, "purge schedule fires", func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, `DELETE FROM tw_schedule_fires WHERE fired_at < $1`, before)
		return err
	})
	return total, err
}
