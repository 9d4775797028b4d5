package sqlstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// scanReport reads a row of Queries.ReportCols.
func (s *Store) scanReport(row Row) (broker.Report, error) {
	var (
		r                broker.Report
		schedule, result *string
		logs             string
	)
	err := row.Scan(&r.ID, &r.MessageID, &r.Task, &r.Topic, &schedule, &r.Attempt, &r.Worker, &r.Status,
		s.d.Time(&r.StartedAt), s.d.Time(&r.EndedAt), &r.Duration, &r.Error, &result, &r.Progress, &logs)
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

// AddReport validates r (broker.ValidateReport) and stores it, returning
// its id. A zero EndedAt is now and a zero StartedAt is EndedAt; Logs is
// stored as a JSON array (nil as [], read back as nil). A success report
// naming a schedule (r.Schedule) also sets, in the same transaction, that
// schedule's last_success to the later of it and EndedAt; a schedule that
// no longer exists is not an error.
func (s *Store) AddReport(ctx context.Context, r broker.Report) (int64, error) {
	return broker.OneReport(s.AddReports(ctx, []broker.Report{r}))
}

// AddReports stores reports as AddReport does, all in one transaction,
// returning their ids in the order of rs. A report whose key (column
// report_key, unique) is stored already, by an earlier call or earlier in
// rs, is not stored again: the stored row's id stands for it.
func (s *Store) AddReports(ctx context.Context, rs []broker.Report) ([]int64, error) {
	if err := broker.ValidateReports(rs); err != nil || len(rs) == 0 {
		return nil, err
	}
	return s.d.AddReports(ctx, rs)
}

// ListReports returns the reports matching f, newest (highest id) first:
// at most f.Limit (broker.DefaultReportLimit when not positive,
// broker.MaxReportLimit at most), with ids below f.Before when it is
// positive. An unknown status is invalid.
func (s *Store) ListReports(ctx context.Context, f broker.ReportFilter) ([]broker.Report, error) {
	limit, err := broker.ValidateReportFilter(f)
	if err != nil {
		return nil, err
	}
	q, args := s.d.ListReportsSQL(f, limit)
	return list(ctx, s, "list reports", s.scanReport, q, args...)
}

// ReportColumns names, in a source of reports, what the conditions of a
// broker.ReportFilter compare: a column, or an expression.
type ReportColumns struct{ ID, MessageID, Task, Status, Schedule string }

// TableReportColumns are a table of reports' own columns.
var TableReportColumns = ReportColumns{ID: "id", MessageID: "message_id", Task: "task", Status: "status", Schedule: "schedule"}

// ReportFilter adds the conditions of f (checked) on the columns c.
func (w *Filter) ReportFilter(f broker.ReportFilter, c ReportColumns) {
	if f.MessageID != 0 {
		w.Add(c.MessageID+" = ?", f.MessageID)
	}
	if f.Task != "" {
		w.Add(c.Task+" = ?", f.Task)
	}
	if f.Status != "" {
		// A literal (the status is one of broker.ReportStatuses): an
		// index that holds some statuses only is usable only when the
		// plan knows which status it is.
		w.AddLiteral(c.Status + " = '" + f.Status + "'")
	}
	if f.Schedule != "" {
		w.Add(c.Schedule+" = ?", f.Schedule)
	}
	if f.Before > 0 {
		w.Add(c.ID+" < ?", f.Before)
	}
}

// GetReport returns the report; broker.ErrNotFound when there is none with
// that id.
func (s *Store) GetReport(ctx context.Context, id int64) (broker.Report, error) {
	return one(ctx, s, "get report", fmt.Sprintf("report %d", id), s.scanReport, s.q.GetReport, id)
}

// PurgeReports deletes the reports that ended before the cutoff and
// returns how many (after an error, with the count of those deleted
// before it).
func (s *Store) PurgeReports(ctx context.Context, before time.Time) (int, error) {
	return s.d.PurgeReports(ctx, before)
}
