package postgres

import (
	"strings"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/sqlstore"
)

// This file owns the success reports kept in their messages' rows
// (migration 019): which reports are kept (plainReport), how an ack
// keeps them (heldReportSet, ackKeptSQL), and how reads, moves and purges
// see them as report rows.

// plainReport reports whether r, the report of an outcome whose result is
// res, says no more than its message's row says once acked: a success
// with no schedule, no logs, no error, and the outcome's result. Such a
// report can be kept in the row: ackKeptSQL when every report of a batch
// is plain, ackReportsSQL for the ones it marks.
func plainReport(r *broker.Report, res *string) bool {
	if r == nil || r.Status != broker.ReportSuccess || r.Schedule != "" || len(r.Logs) > 0 ||
		broker.CleanText(r.Error) != "" {
		return false
	}
	if len(r.Result) == 0 || res == nil {
		return len(r.Result) == 0 && res == nil
	}
	return string(r.Result) == *res
}

// keptArgs are the arrays of ackKeptSQL after the ack's own four: the
// plain reports reps, one per claim sent.
func keptArgs(reps []*broker.Report) []any {
	n := len(reps)
	var (
		tasks   = make([]string, n)
		topics  = make([]string, n)
		atts    = make([]int32, n)
		workers = make([]string, n)
		starts  = make([]*time.Time, n)
		ends    = make([]*time.Time, n)
		durs    = make([]float64, n)
		progs   = make([]float64, n)
		keys    = make([]*string, n)
	)
	for i, r := range reps {
		tasks[i], topics[i], atts[i], workers[i] = r.Task, r.Topic, int32(r.Attempt), r.Worker
		starts[i], ends[i], durs[i], progs[i] = nullTime(r.StartedAt), nullTime(r.EndedAt), r.Duration, r.Progress
		if r.Key != "" {
			keys[i] = &r.Key
		}
	}
	return []any{tasks, topics, atts, workers, starts, ends, durs, progs, keys}
}

// heldReportSet is the SET list that keeps the report of v (the columns
// of ackReportsSQL's v) in the message's row when keep holds, and leaves
// the report_ columns NULL otherwise.
func heldReportSet(keep string) string {
	cols := heldReportValues(keep)
	set := make([]string, len(cols))
	for i, c := range cols {
		set[i] = c[0] + " = " + c[1]
	}
	return strings.Join(set, ",\n\t\t")
}

// heldReportValues are the report_ columns of a message that keeps the
// report of v when keep holds, each with its value (NULL otherwise), in
// the order of the type tw_done_message (migration 020).
func heldReportValues(keep string) [][2]string {
	cols := [][2]string{
		{"report_id", "nextval('tw_reports_id_seq')"},
		{"report_attempt", "v.att"},
		// The worker, only when it is not the claim's.
		{"report_worker", "CASE WHEN v.worker IS DISTINCT FROM " + heldClaimedBy + " THEN v.worker END"},
		{"report_started_at", "coalesce(v.st, v.en, now())"},
		{"report_ended_at", "coalesce(v.en, now())"},
		{"report_duration", "v.dur"},
		{"report_progress", "v.prog"},
	}
	for i, c := range cols {
		cols[i][1] = "CASE WHEN " + keep + " THEN " + c[1] + " END"
	}
	return cols
}

// heldReportSelect is a report kept in its message's row (migration 019)
// as a row of tw_report_rows, column for column, as the view tw_reports
// reads it: what ListReportsSQL lists and moveHeldReports moves.
const heldReportSelect = `report_id AS id, id AS message_id, task, topic, NULL::text AS schedule,
	report_attempt AS attempt, coalesce(report_worker, claimed_by) AS worker, 'success'::text AS status,
	report_started_at AS started_at, report_ended_at AS ended_at, report_duration AS duration_seconds,
	''::text AS error, result, report_progress AS progress, '[]'::jsonb AS logs`

// heldReportColumns are the columns of a report kept in its message's
// row, for ListReportsSQL's filters.
var heldReportColumns = sqlstore.ReportColumns{ID: "report_id", MessageID: "id", Task: "task", Status: "'success'", Schedule: "NULL::text"}

// clearHeldReportsSQL clears up to $2 of the success reports kept in
// their messages' rows that ended before $1, oldest first.
const clearHeldReportsSQL = `
	UPDATE tw_messages SET report_id = NULL, report_attempt = NULL, report_worker = NULL,
		report_started_at = NULL, report_ended_at = NULL, report_duration = NULL, report_progress = NULL
	WHERE id = ANY (ARRAY (
		SELECT id FROM tw_messages
		WHERE report_id IS NOT NULL AND report_ended_at < $1
		ORDER BY report_id LIMIT $2))`
