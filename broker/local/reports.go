package local

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// The schedule store lives in tw_schedules, tw_schedule_fires and
// tw_reports (migrations/0003_schedules.sql); package sqlstore holds its
// rules and queries holds the statements. Every write is one IMMEDIATE
// transaction, as every other write of this broker, so a fire's
// check-and-record is serialised across processes by the write lock.

// AddReports stores the validated reports in one IMMEDIATE transaction
// (addReports).
func (d dialect) AddReports(ctx context.Context, rs []broker.Report) ([]int64, error) {
	var ids []int64
	err := d.b.write(ctx, "add report", func(tx *txn, now time.Time) error {
		var err error
		ids, err = addReports(tx, rs, now)
		return err
	})
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// addReports stores validated reports in tx, a row each (a report whose
// key is stored already is not stored again: the stored row's id stands
// for it), and returns their ids; a success report naming a schedule
// moves its last_success up to the report's end.
func addReports(tx *txn, rs []broker.Report, now time.Time) ([]int64, error) {
	ids := make([]int64, len(rs))
	for i, r := range rs {
		logs := "[]"
		if len(r.Logs) > 0 {
			js, err := json.Marshal(r.Logs)
			if err != nil {
				return nil, broker.Invalid("report of message %d: logs: %v", r.MessageID, err)
			}
			logs = string(js)
		}
		ended, started := r.EndedAt, r.StartedAt
		if ended.IsZero() {
			ended = now
		}
		if started.IsZero() {
			started = ended
		}
		schedule := sql.NullString{String: r.Schedule, Valid: r.Schedule != ""}
		result := sql.NullString{String: string(r.Result), Valid: len(r.Result) > 0}
		key := sql.NullString{String: r.Key, Valid: r.Key != ""}
		err := tx.QueryRow(`INSERT INTO tw_reports (message_id, task, topic, schedule, attempt, worker, status,
			started_at, ended_at, duration_seconds, error, result, progress, logs, report_key)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (report_key) DO NOTHING RETURNING id`,
			r.MessageID, r.Task, r.Topic, schedule, r.Attempt, r.Worker, r.Status,
			ns(started), ns(ended), r.Duration, r.Error, result, r.Progress, logs, key).Scan(&ids[i])
		if errors.Is(err, sql.ErrNoRows) && key.Valid {
			// Stored already, by an earlier call whose answer was
			// lost or earlier in this batch: its id.
			err = tx.QueryRow(`SELECT id FROM tw_reports WHERE report_key = ?`, key).Scan(&ids[i])
		}
		if err != nil {
			return nil, err
		}
		if r.Schedule == "" || r.Status != broker.ReportSuccess {
			continue
		}
		if _, err := tx.Exec(`UPDATE tw_schedules SET last_success = max(coalesce(last_success, ?1), ?1) WHERE name = ?2`,
			ns(ended), r.Schedule); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// addOutcomeReports stores, in tx, the reports of the outcomes that
// applied (errs[i] nil).
func addOutcomeReports(tx *txn, outcomes []broker.Outcome, errs []error, now time.Time) error {
	var rs []broker.Report
	for i, o := range outcomes {
		if o.Report != nil && errs[i] == nil {
			rs = append(rs, *o.Report)
		}
	}
	if len(rs) == 0 {
		return nil
	}
	_, err := addReports(tx, rs, now)
	return err
}

// addOutcomeReport stores r, the report of an outcome that applied, if
// any.
func addOutcomeReport(tx *txn, r *broker.Report, now time.Time) error {
	if r == nil {
		return nil
	}
	_, err := addReports(tx, []broker.Report{*r}, now)
	return err
}

// PurgeReports deletes the reports that ended before the cutoff and
// returns how many. It deletes in transactions of at most retainChunk
// rows, so the write lock is never held long; after an error the count of
// the chunks already deleted is returned with it.
func (d dialect) PurgeReports(ctx context.Context, before time.Time) (int, error) {
	total := 0
	for {
		var n int64
		err := d.b.write(ctx, "purge reports", func(tx *txn, _ time.Time) error {
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
