package postgres

import (
	"strings"
)

// This file owns the batches of done messages (migration 020): how an ack
// of plain successes moves its messages out of tw_messages into tw_done
// (ackKeptSQL), and the FROM items through which the readers of finished
// messages and of reports see a batch's messages as rows.
//
// A batch is one row of tw_done per ack, topic, task and block of ids
// (doneBlock): the messages as
// they are once done, each with its kept report, in an array of
// tw_done_message, with the ranges of their ids and report ids. A
// listing newest first reads the batches in the order of their last id
// (max_id, max_report): each batch read gives at least its last id to
// the page, so the first n batches hold the page's n newest ids but for
// those of a batch that a page boundary ("before") cuts, which the GiST
// index on the range finds (doneBatches).

// keptArrays is the FROM item of ackKeptSQL's arrays, as v.
var keptArrays = `unnest($1::bigint[], $2::text[], $3::text[], $4::int[], $5::text[], $6::text[], $7::int[], $8::text[],
			$9::timestamptz[], $10::timestamptz[], $11::float8[], $12::float8[], $13::text[], $14::bigint[], $15::bigint[])
		AS v(id, tok, ares, ord, task, topic, att, worker, st, en, dur, prog, key, cid, ckey) LEFT JOIN ` + hJoin("v")

// keptMatch is the condition of ackKeptSQL on the message m of claim v
// (and the claim row it was taken from, h: takeCTEs).
var keptMatch = `m.id = ANY ($1::bigint[]) AND m.id = v.id AND ` + heldBy("v.tok")

// keepReport is the condition under which a message keeps its plain
// report: the report names its task and topic.
const keepReport = `v.task = m.task AND v.topic = m.topic`

// doneMessageRow is the tw_done_message of message m acked with the plain
// report v and the result v.ares.
func doneMessageRow() string {
	vals := []string{"m.id", "m.payload", "m.headers", heldAttempts, "m.max_attempts", heldClaimedBy,
		heldClaimedAt, "m.available_at", "m.created_at", "m.last_error", "v.ares::jsonb", "m.suspect",
		"m.waiting_since", "m.cancel_requested_at", "m.priority", "m.orphaned"}
	for _, c := range heldReportValues(keepReport) {
		vals = append(vals, c[1])
	}
	return `ROW(` + strings.Join(vals, ", ") + `)::tw_done_message`
}

// doneBlock bounds the id range of a batch: an ack's messages are grouped
// by blocks of this many ids too, so a message acked far from the others
// (a retry of an old one) does not widen its batch's range over every
// batch acked meanwhile, which a page boundary would then cut (see
// doneBatches).
const doneBlock = "4096"

// ackKeptSQL is ackReportsSQL for the common batch, in which every claim
// carries a plain success report (plainReport): only the columns a
// message keeps of its report are sent, 13 arrays instead of 20. The
// messages leave tw_messages (a): each batch, topic and task becomes one
// row of tw_done (b), the messages with their reports kept (and per block
// of ids: doneBlock). A message whose unique key it keeps stays in
// tw_messages, updated to done with its report in its row (k; it looks
// up only the claims a did not delete, usually none, and nothing at all
// when a deleted them all; such rows are locked after the others, out of
// id order, so a call that acks keyed messages locks them all in id
// order first: lockInIDOrderSQL). A report that names another task or
// topic than its message's is stored in tw_report_rows (r) from what a
// and k return.
var ackKeptSQL = `WITH ` + ackTakeCTEs("$1", "$14", "$15") + `, a AS (
	DELETE FROM tw_messages m
	USING ` + keptArrays + `
	WHERE ` + keptMatch + ` AND m.unique_key IS NULL
	RETURNING v.*, m.topic AS mtopic, m.task AS mtask, ` + keepReport + ` AS held, h.id IS NOT NULL AS taken, ` + doneMessageRow() + ` AS x
), b AS (
	INSERT INTO tw_done (topic, task, finished_at, ids, max_id, reports, max_report, first_ended, messages)
	SELECT mtopic, mtask, now(), int8range(min((x).id), max((x).id), '[]'), max((x).id),
		CASE WHEN count((x).report_id) > 0 THEN int8range(min((x).report_id), max((x).report_id), '[]') END,
		max((x).report_id), min((x).report_ended_at), array_agg(x)
	FROM a GROUP BY mtopic, mtask, (x).id / ` + doneBlock + `
), k AS (
	UPDATE tw_messages m
	SET state = 'done', finished_at = now(), result = v.ares::jsonb, token = NULL, ` + heldSet + `,
		` + heldReportSet(keepReport) + `
	FROM ` + keptArrays + `
	WHERE (SELECT count(*) FROM a) < cardinality($1::bigint[])
		AND m.id = ANY (ARRAY (SELECT i FROM unnest($1::bigint[]) i EXCEPT ALL SELECT id FROM a))
		AND m.id = v.id AND ` + heldBy("v.tok") + ` AND m.unique_key IS NOT NULL
	RETURNING v.*, m.topic AS mtopic, m.report_id IS NOT NULL AS held, h.id IS NOT NULL AS taken
), o AS (
	SELECT id, tok, ares, ord, task, topic, att, worker, st, en, dur, prog, key, mtopic, held, taken FROM a
	UNION ALL
	SELECT id, tok, ares, ord, task, topic, att, worker, st, en, dur, prog, key, mtopic, held, taken FROM k
), ended AS (
	SELECT mtopic AS topic, taken FROM o
), ` + ackCounts("ended") + `, r AS (
	INSERT INTO tw_report_rows (id, message_id, task, topic, attempt, worker, status,
		started_at, ended_at, duration_seconds, result, progress, report_key)
	SELECT nextval('tw_reports_id_seq'), id, task, topic, att, worker, 'success',
		coalesce(st, en, now()), coalesce(en, now()), dur, ares::jsonb, prog, key
	FROM o WHERE NOT held ORDER BY ord
	ON CONFLICT (report_key) DO NOTHING
)
	SELECT ord, mtopic FROM o`

// doneCols are the columns of tw_messages that the readers of messages
// and reports read (msgCols, heldReportSelect), for a batch d's message x.
const doneCols = `x.id, d.topic, d.task, x.payload, x.headers, 'done'::text AS state, x.attempts, x.max_attempts,
	x.claimed_by, x.claimed_at, x.available_at, x.created_at, d.finished_at, x.last_error, x.result,
	x.suspect, x.waiting_since, x.cancel_requested_at, x.priority, NULL::text AS unique_key,
	x.report_id, x.report_attempt, x.report_worker, x.report_started_at, x.report_ended_at,
	x.report_duration, x.report_progress`

// doneRows is a FROM item, as alias, of the messages of the batches
// batches (a FROM item of tw_done rows, as d) that satisfy where (a
// condition on x, the message, and d), with doneCols.
func doneRows(batches, where, alias string) string {
	return `(SELECT ` + doneCols + ` FROM ` + batches + `, unnest(d.messages) x WHERE ` + where + `) ` + alias
}

// doneByID is a FROM item, as alias, of the message of the batches whose
// id is the expression id (none or one).
func doneByID(id, alias string) string {
	return doneRows("tw_done d", "d.ids @> "+id+"::bigint AND x.id = "+id, alias)
}

// getMessageSQL reads message $1 from tw_messages or its batch: one
// statement, so one snapshot sees it in one of the two whenever it is
// acked.
var getMessageSQL = `SELECT ` + liveCols + ` FROM ` + liveFrom + ` WHERE m.id = $1
	UNION ALL
	SELECT ` + msgCols + ` FROM ` + doneByID("$1", "m") + `
	LIMIT 1`

// doneBatches is a FROM item, as d, of the batches that satisfy conds
// (conditions on tw_done's columns; empty ones are left out) and that a
// listing newest first by last (max_id or max_report), at most limit,
// below before (a placeholder, or "" for the first page) needs: the limit
// batches with the newest last below before, each of which gives the page
// at least its last, and, with before, the batches whose range rng (ids
// or reports) before cuts, found through the range's GiST index. What
// other batches hold is older than all of those lasts.
func doneBatches(conds []string, last, rng, before, limit string) string {
	var keep []string
	for _, c := range conds {
		if c != "" {
			keep = append(keep, c)
		}
	}
	where := func(more ...string) string {
		all := append(append([]string(nil), keep...), more...)
		if len(all) == 0 {
			return "true"
		}
		return strings.Join(all, " AND ")
	}
	if before == "" {
		return `(SELECT * FROM tw_done WHERE ` + where() + ` ORDER BY ` + last + ` DESC LIMIT ` + limit + `) d`
	}
	return `((SELECT * FROM tw_done WHERE ` + where(last+" < "+before) + ` ORDER BY ` + last + ` DESC LIMIT ` + limit + `)
		UNION ALL
		(SELECT * FROM tw_done WHERE ` + where(rng+" @> "+before+"::bigint", "lower("+rng+") < "+before) + `)) d`
}

// getReportSQL reads report $1 from where it is: tw_report_rows, its
// message's row, or its message's batch (the view tw_reports reads all
// three, but cannot look a batch's report up by its id).
var getReportSQL = `SELECT ` + reportCols + ` FROM tw_report_rows WHERE id = $1
	UNION ALL
	SELECT ` + reportCols + ` FROM (SELECT ` + heldReportSelect + ` FROM tw_messages WHERE report_id = $1) h
	UNION ALL
	SELECT ` + reportCols + ` FROM (SELECT ` + heldReportSelect + ` FROM ` +
	doneRows("tw_done d", "d.reports @> $1::bigint AND x.report_id = $1", "m") + `) b
	LIMIT 1`

// purgeBatches bounds the batches one transaction of PurgeFinished or
// PurgeReports changes: about purgeChunk messages.
const purgeBatches = purgeChunk / 50

// purgeDoneSQL deletes up to $2 of the batches that finished before $1,
// oldest first, and returns how many messages and batches it deleted. The
// reports they still hold move to tw_report_rows, with their ids: reports
// have a retention of their own (PurgeReports). (A batch's messages
// finished together.)
var purgeDoneSQL = `
	WITH d AS (
		DELETE FROM tw_done WHERE ctid = ANY (ARRAY (
			SELECT ctid FROM tw_done WHERE finished_at < $1 ORDER BY max_id LIMIT $2))
		RETURNING *
	), moved AS (` + moveHeldReports(doneRows("d", "x.report_id IS NOT NULL", "m")) + `)
	SELECT coalesce(sum(cardinality(messages)), 0), count(*) FROM d`

// clearDoneReportsSQL clears the reports that ended before $1 from up to
// $2 of the batches that hold one, oldest first, and returns how many
// reports and batches it changed. A batch keeps its messages; its report
// range, last report and first end follow what it still holds.
var clearDoneReportsSQL = `
	WITH c AS (
		SELECT ctid AS t FROM tw_done WHERE reports IS NOT NULL AND first_ended < $1 ORDER BY max_report LIMIT $2
	), n AS (
		SELECT c.t,
			array_agg(CASE WHEN e.report_id IS NOT NULL AND e.report_ended_at < $1
				THEN jsonb_populate_record(e, '{"report_id": null, "report_attempt": null, "report_worker": null,
					"report_started_at": null, "report_ended_at": null, "report_duration": null,
					"report_progress": null}') ELSE e END) AS msgs,
			count(*) FILTER (WHERE e.report_id IS NOT NULL AND e.report_ended_at < $1) AS cleared,
			min(e.report_id) FILTER (WHERE e.report_id IS NOT NULL AND e.report_ended_at >= $1) AS lo,
			max(e.report_id) FILTER (WHERE e.report_id IS NOT NULL AND e.report_ended_at >= $1) AS hi,
			min(e.report_ended_at) FILTER (WHERE e.report_id IS NOT NULL AND e.report_ended_at >= $1) AS fe
		FROM c JOIN tw_done d ON d.ctid = c.t, unnest(d.messages) e
		GROUP BY c.t
	), u AS (
		UPDATE tw_done d
		SET messages = n.msgs, reports = CASE WHEN n.lo IS NOT NULL THEN int8range(n.lo, n.hi, '[]') END,
			max_report = n.hi, first_ended = n.fe
		FROM n WHERE d.ctid = n.t
		RETURNING n.cleared
	)
	SELECT coalesce(sum(cleared), 0), count(*) FROM u`
