package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/sqlstore"
)

// The schedule store lives in tw_schedules, tw_schedule_fires and the
// reports (migrations/003_schedules.sql): the view tw_reports of the
// success reports kept in their messages' rows and of tw_report_rows
// (migrations/019_success_report_in_message_row.sql); package sqlstore holds its
// rules and queries holds the statements. Times are database time (now())
// and stored at microsecond resolution, so a slot is compared to the
// microsecond.

// reportCTEs returns the CTEs that store reports given as arrays, one
// element per report ($first message ids ... $first+14 keys, $first+15 the
// ordinals of the outcomes they ride on), keeping only the elements that
// satisfy keep (a condition on x.ref and on CTEs named before): u, the
// reports kept, each with an id taken from the sequence before the insert
// (so each is known to belong to its element whatever order the rows are
// written in), and held, for a keyed report, the id of the report of the
// same attempt kept in its message's row, if any; r, the insert into tw_report_rows, which returns
// the ids it stored; and s, the move of LastSuccess. A report whose key is
// stored already in tw_report_rows, or whose attempt's report its
// message's row keeps, is not inserted (ON CONFLICT DO NOTHING, held). A NULL end is now() and a NULL start
// the end. For each schedule named by a success report, the schedule's
// last_success moves up to the latest end among them (a schedule that no
// longer exists is not an error); the rows are locked beforehand by
// lockSchedulesSQL.
func reportCTEs(first int, keep string) string {
	return `u AS MATERIALIZED (
		SELECT nextval('tw_reports_id_seq') AS id, x.ord, x.mid, x.task, x.topic,
			x.sched, x.att, x.worker, x.status, coalesce(x.st, x.en, now()) AS st, coalesce(x.en, now()) AS en,
			x.dur, x.err, x.res, x.prog, x.logs, x.key,
			coalesce((SELECT m.report_id FROM tw_messages m
				WHERE x.key IS NOT NULL AND m.id = x.mid AND m.report_attempt = x.att),
				(SELECT e.report_id FROM tw_done d, unnest(d.messages) e
				WHERE x.key IS NOT NULL AND d.ids @> x.mid AND e.id = x.mid AND e.report_attempt = x.att)) AS held
		FROM ` + reportUnnest(first, "x") + `
		WHERE ` + keep + `
		ORDER BY x.ord
	), r AS (
		INSERT INTO tw_report_rows (id, message_id, task, topic, schedule, attempt, worker, status,
			started_at, ended_at, duration_seconds, error, result, progress, logs, report_key)
		SELECT id, mid, task, topic, sched, att, worker, status, st, en, dur, err, res::jsonb, prog, logs::jsonb, key
		FROM u WHERE held IS NULL ORDER BY ord
		ON CONFLICT (report_key) DO NOTHING
		RETURNING id
	), s AS (
		UPDATE tw_schedules SET last_success = greatest(tw_schedules.last_success, w.en)
		FROM (SELECT sched, max(en) AS en FROM u
			WHERE status = 'success' AND sched IS NOT NULL GROUP BY sched) w
		WHERE tw_schedules.name = w.sched
	)`
}

// reportParams is how many arrays reportCTEs reads (reportArgs.arrays).
const reportParams = 16

// reportUnnest is the FROM item of reports given as the arrays of
// reportCTEs from $first, as alias with the columns reportArrayCols and
// ord, the element's ordinal.
func reportUnnest(first int, alias string) string {
	return `unnest(` + reportArrays(first) + `)
			WITH ORDINALITY AS ` + alias + `(` + reportArrayCols + `, ord)`
}

// reportArrayCols names the arrays of reportCTEs, in order.
const reportArrayCols = `mid, task, topic, sched, att, worker, status, st, en, dur, err, res, prog, logs, key, ref`

// reportArrays is the parameter list of the arrays of reportCTEs from
// $first, with their types.
func reportArrays(first int) string {
	types := []string{"bigint", "text", "text", "text", "int", "text", "text",
		"timestamptz", "timestamptz", "float8", "text", "text", "float8", "text", "text", "int"}
	params := make([]string, len(types))
	for i, t := range types {
		params[i] = "$" + strconv.Itoa(first+i) + "::" + t + "[]"
	}
	return strings.Join(params, ", ")
}

// addReportsSQL stores every report of its arrays (reportCTEs) and
// returns their ids in the arrays' order: a report whose key is stored
// already gets the stored row's id; that row was committed before the
// statement began, or its id is NULL (a concurrent insert of the same
// key), which AddReports turns into an error to retry. The keys are
// distinct: AddReports sends a key repeated within a batch once.
var addReportsSQL = `WITH ` + reportCTEs(1, "true") + `
	SELECT coalesce(r.id, e.id, u.held) FROM u
		LEFT JOIN r ON r.id = u.id
		LEFT JOIN tw_report_rows e ON u.key IS NOT NULL AND e.report_key = u.key
	ORDER BY u.ord`

// lockSchedulesSQL locks the schedules named in $1 in name order, before
// a statement of reportCTEs updates them, so that writers storing reports
// of the same schedules at once take their row locks in one order and
// never deadlock.
const lockSchedulesSQL = `SELECT 1 FROM tw_schedules WHERE name = ANY ($1::text[]) ORDER BY name FOR NO KEY UPDATE`

// lockHoldersSQL waits for the acks under way of the messages $1, before
// AddReports stores keyed reports of them: such an ack may keep the
// report of the same attempt in its message's row, which the unique index
// of tw_report_rows does not see. After the wait the statement that
// follows reads the committed row (held in reportCTEs). The ids are
// sorted, as an ack locks its rows.
const lockHoldersSQL = `SELECT 1 FROM tw_messages WHERE id = ANY ($1::bigint[]) ORDER BY id FOR SHARE`

// reportArgs are reports as the arrays of reportCTEs, and the schedules
// to lock first (lockSchedulesSQL).
type reportArgs struct {
	arrays []any
	locks  []string // the schedules of success reports, sorted, once each
}

// newReportArgs arranges validated reports for reportCTEs; refs are the
// ordinals of the outcomes they ride on (nil: none).
func newReportArgs(rs []broker.Report, refs []int32) (reportArgs, error) {
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
		keys    = make([]*string, n)
		locks   []string
	)
	if refs == nil {
		refs = make([]int32, n)
	}
	for i, r := range rs {
		logs[i] = "[]"
		if len(r.Logs) > 0 {
			lines := make([]string, len(r.Logs))
			for k, l := range r.Logs {
				lines[k] = broker.CleanText(l)
			}
			js, err := json.Marshal(lines)
			if err != nil {
				return reportArgs{}, broker.Invalid("report of message %d: logs: %v", r.MessageID, err)
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
		if r.Key != "" {
			keys[i] = &r.Key
		}
		starts[i], ends[i] = nullTime(r.StartedAt), nullTime(r.EndedAt)
		mids[i], tasks[i], topics[i], atts[i], workers[i], stats[i] = r.MessageID, r.Task, r.Topic, int32(r.Attempt), r.Worker, r.Status
		durs[i], errs[i], progs[i] = r.Duration, broker.CleanText(r.Error), r.Progress
	}
	sort.Strings(locks)
	return reportArgs{
		arrays: []any{mids, tasks, topics, scheds, atts, workers, stats, starts, ends, durs, errs, results, progs, logs, keys, refs},
		locks:  slices.Compact(locks),
	}, nil
}

// queueLocks adds the lock of the reports' schedules to batch, when
// there are any; readLocks reads its answer.
func (a reportArgs) queueLocks(batch *pgx.Batch) {
	if len(a.locks) > 0 {
		batch.Queue(lockSchedulesSQL, a.locks)
	}
}

func (a reportArgs) readLocks(br pgx.BatchResults) error {
	if len(a.locks) == 0 {
		return nil
	}
	_, err := br.Exec()
	return err
}

// AddReports stores the validated reports in one statement (and one
// transaction), addReportsSQL, returning their ids in the order of rs.
func (d dialect) AddReports(ctx context.Context, all []broker.Report) ([]int64, error) {
	// A key repeated within the batch is sent once: at[i] is the element
	// that stands for all[i].
	rs, at := all, []int(nil)
	if hasDupKeys(all) {
		rs, at = nil, make([]int, len(all))
		first := map[string]int{}
		for i, r := range all {
			if k, ok := first[r.Key]; ok && r.Key != "" {
				at[i] = k
				continue
			}
			if r.Key != "" {
				first[r.Key] = len(rs)
			}
			at[i] = len(rs)
			rs = append(rs, r)
		}
	}
	n := len(rs)
	ra, err := newReportArgs(rs, nil)
	if err != nil {
		return nil, err
	}
	var ids []int64
	var holders []int64
	for _, r := range rs {
		if r.Key != "" {
			holders = append(holders, r.MessageID)
		}
	}
	slices.Sort(holders)
	holders = slices.Compact(holders)
	err = d.b.run(ctx, "add reports", func(c *pgx.Conn) error {
		batch := &pgx.Batch{}
		ra.queueLocks(batch)
		if len(holders) > 0 {
			batch.Queue(lockHoldersSQL, holders)
		}
		batch.Queue(addReportsSQL, ra.arrays...)
		br := c.SendBatch(ctx, batch)
		if err := ra.readLocks(br); err != nil {
			br.Close()
			return err
		}
		if len(holders) > 0 {
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
		got, err := pgx.CollectRows(rows, pgx.RowTo[*int64])
		if err != nil {
			br.Close()
			return err
		}
		if len(got) != n {
			br.Close()
			return fmt.Errorf("add reports: %d ids back for %d reports", len(got), n)
		}
		ids = make([]int64, n)
		for i, id := range got {
			if id == nil {
				br.Close()
				return fmt.Errorf("add reports: report %d (message %d) was being stored at the same time; try again", i+1, rs[i].MessageID)
			}
			ids[i] = *id
		}
		return br.Close()
	})
	if err != nil {
		return nil, err
	}
	if at != nil {
		out := make([]int64, len(all))
		for i, k := range at {
			out[i] = ids[k]
		}
		ids = out
	}
	return ids, nil
}

// hasDupKeys reports whether a key is repeated among rs.
func hasDupKeys(rs []broker.Report) bool {
	seen := make(map[string]bool, len(rs))
	for _, r := range rs {
		if r.Key == "" {
			continue
		}
		if seen[r.Key] {
			return true
		}
		seen[r.Key] = true
	}
	return false
}

// ListReportsSQL is ListReports's statement for f (checked) and limit:
// the reports of tw_report_rows and those kept in the rows of tw_messages
// (migration 019), each newest first through its own index, merged. (The
// view tw_reports reads both too, but PostgreSQL cannot walk its second
// branch in index order: a branch of a UNION ALL with a WHERE clause is
// planned apart, and sorts.) A filter on a status other than success or
// on a schedule leaves the second branch empty without reading it.
func (dialect) ListReportsSQL(f broker.ReportFilter, limit int) (string, []any) {
	rows := queries.NewFilter()
	rows.ReportFilter(f, sqlstore.TableReportColumns)
	held := rows.Next()
	held.AddLiteral("report_id IS NOT NULL")
	held.ReportFilter(f, heldReportColumns)
	lim := held.Limit(limit)
	where := ""
	if w := rows.Where(); w != "" {
		where = ` WHERE ` + w
	}
	q := `(SELECT ` + reportCols + ` FROM tw_report_rows` + where + ` ORDER BY id DESC LIMIT ` + lim + `)
		UNION ALL
		(SELECT ` + reportCols + ` FROM (SELECT ` + heldReportSelect + ` FROM tw_messages
			WHERE ` + held.Where() + ` ORDER BY report_id DESC LIMIT ` + lim + `) h)`
	if (f.Status != "" && f.Status != broker.ReportSuccess) || f.Schedule != "" {
		return q + ` ORDER BY id DESC LIMIT ` + lim, held.Args()
	}
	// The reports of the batches (migration 020): plain successes, with
	// no schedule.
	batch := held.Next()
	batch.AddLiteral("reports IS NOT NULL")
	if f.Task != "" {
		batch.Add("task = ?", f.Task)
	}
	if f.MessageID != 0 {
		batch.Add("ids @> ?::bigint", f.MessageID)
	}
	before := ""
	if f.Before > 0 {
		before = batch.Limit(int(f.Before))
	}
	elem := batch.Next()
	elem.AddLiteral("x.report_id IS NOT NULL")
	if f.MessageID != 0 {
		elem.Add("x.id = ?", f.MessageID)
	}
	if before != "" {
		elem.AddLiteral("x.report_id < " + before)
	}
	// A message is in one batch, which the GiST index finds among the
	// few whose ranges hold its id; otherwise the batches are read newest
	// first (doneBatches).
	batches := `(SELECT * FROM tw_done WHERE ` + batch.Where() + `) d`
	if f.MessageID == 0 {
		batches = doneBatches([]string{batch.Where()}, "max_report", "reports", before, lim)
	}
	return q + `
		UNION ALL
		(SELECT ` + reportCols + ` FROM (SELECT ` + heldReportSelect + ` FROM ` +
		doneRows(batches, elem.Where(), "b") + `
			ORDER BY report_id DESC LIMIT ` + lim + `) h)
		ORDER BY id DESC LIMIT ` + lim, elem.Args()
}

// PurgeReports deletes the reports that ended before the cutoff and
// returns how many (after an error, with the count of those deleted
// before it): the rows of tw_report_rows, then the reports kept in their
// messages' rows, cleared in transactions of at most purgeChunk.
func (d dialect) PurgeReports(ctx context.Context, before time.Time) (int, error) {
	var total int
	err := d.b.run(ctx, "purge reports", func(c *pgx.Conn) error {
		tag, err := c.Exec(ctx, `DELETE FROM tw_report_rows WHERE ended_at < $1`, before)
		total = int(tag.RowsAffected())
		return err
	})
	for err == nil {
		var n int64
		err = d.b.run(ctx, "purge reports", func(c *pgx.Conn) error {
			tag, err := c.Exec(ctx, clearHeldReportsSQL, before, purgeChunk)
			n = tag.RowsAffected()
			return err
		})
		total += int(n)
		if n < purgeChunk {
			break
		}
	}
	for err == nil {
		var n, batches int64
		err = d.b.run(ctx, "purge reports", func(c *pgx.Conn) error {
			return c.QueryRow(ctx, clearDoneReportsSQL, before, purgeBatches).Scan(&n, &batches)
		})
		total += int(n)
		if batches < purgeBatches {
			break
		}
	}
	return total, err
}

// nullTime is t for a query argument, NULL when it is zero.
func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
