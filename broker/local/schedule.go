package local

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/taskhost/taskhost/broker"
)

var _ broker.ScheduleStore = (*Broker)(nil)

// The schedule store lives in tw_schedules, tw_schedule_fires and
// tw_reports (migrations/0003_schedules.sql). Every write is one IMMEDIATE
// transaction, as every other write of this broker, so a fire's
// check-and-record is serialised across processes by the write lock.

// schedCols are the columns scanSchedule reads, in its order.
const schedCols = `name, task, topic, payload, interval_seconds, cron, enabled, missed_policy, source,
	last_attempt, last_success, expected_next_run, created_at, updated_at`

func scanSchedule(s scanner) (broker.Schedule, error) {
	var (
		sc                     broker.Schedule
		payload                []byte
		interval               sql.NullInt64
		cron                   sql.NullString
		attempt, success, next sql.NullInt64
		createdAt, updatedAt   int64
	)
	err := s.Scan(&sc.Name, &sc.Task, &sc.Topic, &payload, &interval, &cron, &sc.Enabled, &sc.MissedPolicy, &sc.Source,
		&attempt, &success, &next, &createdAt, &updatedAt)
	if err != nil {
		return broker.Schedule{}, err
	}
	sc.Payload = json.RawMessage(payload)
	sc.IntervalSeconds = int(interval.Int64)
	sc.Cron = cron.String
	sc.LastAttempt = nullTime(attempt)
	sc.LastSuccess = nullTime(success)
	sc.ExpectedNextRun = nullTime(next)
	sc.CreatedAt = fromNS(createdAt)
	sc.UpdatedAt = fromNS(updatedAt)
	return sc, nil
}

func nullTime(v sql.NullInt64) *time.Time {
	if !v.Valid {
		return nil
	}
	t := fromNS(v.Int64)
	return &t
}

// nullNS stores t, NULL when it is zero.
func nullNS(t time.Time) sql.NullInt64 {
	if t.IsZero() {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: ns(t), Valid: true}
}

// PutSchedule validates s (see broker.NormalizeSchedule) and creates or
// replaces the schedule named s.Name in one statement. A replaced schedule
// keeps its run state (last_attempt, last_success, expected_next_run) and
// created_at, except that expected_next_run is cleared when
// interval_seconds or cron changed. updated_at (and created_at on
// creation) is now. It returns the schedule as stored.
func (b *Broker) PutSchedule(ctx context.Context, s broker.Schedule) (broker.Schedule, error) {
	s, err := broker.NormalizeSchedule(s)
	if err != nil {
		return broker.Schedule{}, err
	}
	if err := broker.CheckSchedulePayload(s, b.opts.MaxPayload); err != nil {
		return broker.Schedule{}, err
	}
	interval := sql.NullInt64{Int64: int64(s.IntervalSeconds), Valid: s.IntervalSeconds > 0}
	cron := sql.NullString{String: s.Cron, Valid: s.Cron != ""}
	var out broker.Schedule
	err = b.write(ctx, "put schedule", func(tx *txn, now time.Time) error {
		var err error
		out, err = scanSchedule(tx.QueryRow(`INSERT INTO tw_schedules
			(name, task, topic, payload, interval_seconds, cron, enabled, missed_policy, source, created_at, updated_at)
			VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10)
			ON CONFLICT (name) DO UPDATE SET
				task = excluded.task, topic = excluded.topic, payload = excluded.payload,
				interval_seconds = excluded.interval_seconds, cron = excluded.cron,
				enabled = excluded.enabled, missed_policy = excluded.missed_policy, source = excluded.source,
				expected_next_run = CASE
					WHEN tw_schedules.interval_seconds IS excluded.interval_seconds AND tw_schedules.cron IS excluded.cron
					THEN tw_schedules.expected_next_run END,
				updated_at = excluded.updated_at
			RETURNING `+schedCols,
			s.Name, s.Task, s.Topic, string(s.Payload), interval, cron, s.Enabled, s.MissedPolicy, s.Source, ns(now)))
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
	err := b.read(ctx, "get schedule", func(tx *txn, _ time.Time) error {
		var err error
		s, err = scanSchedule(tx.QueryRow(`SELECT `+schedCols+` FROM tw_schedules WHERE name = ?`, name))
		if errors.Is(err, sql.ErrNoRows) {
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
	out := []broker.Schedule{}
	err := b.read(ctx, "list schedules", func(tx *txn, _ time.Time) error {
		rows, err := tx.Query(`SELECT ` + schedCols + ` FROM tw_schedules ORDER BY name`)
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
	return b.write(ctx, "delete schedule", func(tx *txn, _ time.Time) error {
		r, err := tx.Exec(`DELETE FROM tw_schedules WHERE name = ?`, name)
		if err != nil {
			return err
		}
		if n, err := r.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return fmt.Errorf("schedule %q: %w", name, broker.ErrNotFound)
		}
		return nil
	})
}

// FireSchedule fires slot req.Slot of schedule req.Name, at most once per
// (name, slot) across every process, in one IMMEDIATE transaction:
//
//   - the request is checked first (broker.ValidateFire: a name, a slot,
//     and req.Submit as Submit would check it);
//   - with req.Fence, the lease row must be held by Fence.Holder at
//     Fence.Term and not expired (as a fenced ReclaimOrphans checks it), or
//     nothing changes and the error is broker.ErrNotLeader;
//   - the schedule must exist (broker.ErrNotFound);
//   - the (name, slot) row is inserted ON CONFLICT DO NOTHING: when it
//     already existed, the result is Fired false and nothing else changes;
//   - otherwise last_attempt becomes now and expected_next_run req.Next
//     (NULL when zero), and req.Submit, when set, is queued by Submit's
//     own code (insertMessage) with header "schedule" set to the name
//     (broker.FireSubmit); its id is recorded in the fire row and
//     returned.
//
// Slots are compared at nanosecond resolution.
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
	err := b.write(ctx, "fire schedule", func(tx *txn, now time.Time) error {
		res = broker.FireResult{}
		if err := checkFence(tx, req.Fence, now); err != nil {
			return err
		}
		var one int
		err := tx.QueryRow(`SELECT 1 FROM tw_schedules WHERE name = ?`, req.Name).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("schedule %q: %w", req.Name, broker.ErrNotFound)
		}
		if err != nil {
			return err
		}
		r, err := tx.Exec(`INSERT INTO tw_schedule_fires (name, slot, fired_at) VALUES (?, ?, ?)
			ON CONFLICT (name, slot) DO NOTHING`, req.Name, ns(req.Slot), ns(now))
		if err != nil {
			return err
		}
		if n, err := r.RowsAffected(); err != nil || n == 0 {
			return err // fired before: nothing changes
		}
		if _, err := tx.Exec(`UPDATE tw_schedules SET last_attempt = ?, expected_next_run = ? WHERE name = ?`,
			ns(now), nullNS(req.Next), req.Name); err != nil {
			return err
		}
		res.Fired = true
		if sub == nil {
			return nil
		}
		if res.MessageID, err = insertMessage(tx, *sub, now); err != nil {
			return err
		}
		_, err = tx.Exec(`UPDATE tw_schedule_fires SET message_id = ? WHERE name = ? AND slot = ?`,
			res.MessageID, req.Name, ns(req.Slot))
		return err
	})
	if err != nil {
		return broker.FireResult{}, err
	}
	return res, nil
}

// reportCols are the columns scanReport reads, in its order.
const reportCols = `id, message_id, task, topic, schedule, attempt, worker, status, started_at, ended_at,
	duration_seconds, error, result, progress, logs`

func scanReport(s scanner) (broker.Report, error) {
	var (
		r                  broker.Report
		schedule, result   sql.NullString
		logs               []byte
		startedAt, endedAt int64
	)
	err := s.Scan(&r.ID, &r.MessageID, &r.Task, &r.Topic, &schedule, &r.Attempt, &r.Worker, &r.Status,
		&startedAt, &endedAt, &r.Duration, &r.Error, &result, &r.Progress, &logs)
	if err != nil {
		return broker.Report{}, err
	}
	r.Schedule = schedule.String
	r.StartedAt = fromNS(startedAt)
	r.EndedAt = fromNS(endedAt)
	if result.Valid {
		r.Result = json.RawMessage(result.String)
	}
	if err := json.Unmarshal(logs, &r.Logs); err != nil {
		return broker.Report{}, fmt.Errorf("report %d: logs: %w", r.ID, err)
	}
	if len(r.Logs) == 0 {
		r.Logs = nil
	}
	return r, nil
}

// AddReport validates r (broker.ValidateReport) and stores it, returning
// its id. A zero EndedAt is now and a zero StartedAt is EndedAt; Logs is
// stored as a JSON array (nil as [], read back as nil). A success report
// naming a schedule (r.Schedule) also sets, in the same transaction, that
// schedule's last_success to the later of it and EndedAt; a schedule that
// no longer exists is not an error.
func (b *Broker) AddReport(ctx context.Context, r broker.Report) (int64, error) {
	return broker.OneReport(b.AddReports(ctx, []broker.Report{r}))
}

// AddReports stores reports as AddReport does, all in one transaction.
func (b *Broker) AddReports(ctx context.Context, rs []broker.Report) ([]int64, error) {
	if err := broker.ValidateReports(rs); err != nil || len(rs) == 0 {
		return nil, err
	}
	logs := make([]string, len(rs))
	for i, r := range rs {
		logs[i] = "[]"
		if len(r.Logs) > 0 {
			js, err := json.Marshal(r.Logs)
			if err != nil {
				return nil, broker.Invalid("report of message %d: logs: %v", r.MessageID, err)
			}
			logs[i] = string(js)
		}
	}
	ids := make([]int64, len(rs))
	err := b.write(ctx, "add report", func(tx *txn, now time.Time) error {
		for i, r := range rs {
			ended, started := r.EndedAt, r.StartedAt
			if ended.IsZero() {
				ended = now
			}
			if started.IsZero() {
				started = ended
			}
			schedule := sql.NullString{String: r.Schedule, Valid: r.Schedule != ""}
			result := sql.NullString{String: string(r.Result), Valid: len(r.Result) > 0}
			err := tx.QueryRow(`INSERT INTO tw_reports (message_id, task, topic, schedule, attempt, worker, status,
				started_at, ended_at, duration_seconds, error, result, progress, logs)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id`,
				r.MessageID, r.Task, r.Topic, schedule, r.Attempt, r.Worker, r.Status,
				ns(started), ns(ended), r.Duration, r.Error, result, r.Progress, logs[i]).Scan(&ids[i])
			if err != nil {
				return err
			}
			if r.Schedule == "" || r.Status != broker.ReportSuccess {
				continue
			}
			if _, err := tx.Exec(`UPDATE tw_schedules SET last_success = max(coalesce(last_success, ?1), ?1) WHERE name = ?2`,
				ns(ended), r.Schedule); err != nil {
				return err
			}
		}
		return nil
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
	var where []string
	var args []any
	add := func(cond string, arg any) {
		where = append(where, cond)
		args = append(args, arg)
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
	q += ` ORDER BY id DESC LIMIT ?`
	args = append(args, limit)

	out := []broker.Report{}
	err = b.read(ctx, "list reports", func(tx *txn, _ time.Time) error {
		rows, err := tx.Query(q, args...)
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
	err := b.read(ctx, "get report", func(tx *txn, _ time.Time) error {
		var err error
		r, err = scanReport(tx.QueryRow(`SELECT `+reportCols+` FROM tw_reports WHERE id = ?`, id))
		if errors.Is(err, sql.ErrNoRows) {
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
// returns how many. It deletes in transactions of at most retainChunk
// rows, so the write lock is never held long; after an error the count of
// the chunks already deleted is returned with it.
func (b *Broker) PurgeReports(ctx context.Context, before time.Time) (int, error) {
	total := 0
	for {
		var n int64
		err := b.write(ctx, "purge reports", func(tx *txn, _ time.Time) error {
			r, err := tx.Exec(`DELETE FROM tw_reports WHERE id IN (
				SELECT id FROM tw_reports WHERE ended_at < ? LIMIT ?)`, ns(before), retainChunk)
			if err != nil {
				return err
			}
			n, err = r.RowsAffected()
			return err
		})
		if err != nil {
			return total, err
		}
		total += int(n)
		if n < retainChunk {
			return total, nil
		}
	}
}
