-- 022: a message or a report by id, for operators' own SQL, through the
-- indexes.
--
-- tw_messages_all and tw_reports (migrations 019 and 020) hold every
-- message and every report. A done message's id, or its report's, is known
-- only once its batch is unnested: the planner cannot turn a condition on
-- it into one on the batch's range (tw_done_ids, tw_done_reports), so
-- filtering a view by id reads every batch. tw_message(id) and
-- tw_report(id) return what filtering the views by id returns, with the
-- condition on the range that lets them read one row or one batch.
--
-- The bodies name the tables with this schema: a function's body is
-- resolved with the caller's search_path, which may lead to another
-- schema's tables. Plain SQL with no SET clause, the planner inlines them
-- into the query that calls them.
DO $migration$
BEGIN
    EXECUTE format($create$
        CREATE OR REPLACE FUNCTION %1$I.tw_message(p_id bigint) RETURNS SETOF %1$I.tw_messages_all
        LANGUAGE sql STABLE AS $body$
            SELECT id, topic, task, payload, headers, state, attempts, max_attempts, claimed_by, claimed_at,
                available_at, created_at, finished_at, last_error, result, suspect, waiting_since,
                cancel_requested_at, priority, unique_key, orphaned, report_id, report_attempt, report_worker,
                report_started_at, report_ended_at, report_duration, report_progress
            FROM %1$I.tw_messages
            WHERE id = p_id
            UNION ALL
            SELECT x.id, d.topic, d.task, x.payload, x.headers, 'done', x.attempts, x.max_attempts, x.claimed_by,
                x.claimed_at, x.available_at, x.created_at, d.finished_at, x.last_error, x.result, x.suspect,
                x.waiting_since, x.cancel_requested_at, x.priority, NULL, x.orphaned, x.report_id, x.report_attempt,
                x.report_worker, x.report_started_at, x.report_ended_at, x.report_duration, x.report_progress
            FROM %1$I.tw_done d, unnest(d.messages) x
            WHERE d.ids @> p_id AND x.id = p_id
        $body$
    $create$, current_schema());

    EXECUTE format($create$
        CREATE OR REPLACE FUNCTION %1$I.tw_report(p_id bigint) RETURNS SETOF %1$I.tw_reports
        LANGUAGE sql STABLE AS $body$
            SELECT id, message_id, task, topic, schedule, attempt, worker, status, started_at, ended_at,
                duration_seconds, error, result, progress, logs, report_key
            FROM %1$I.tw_report_rows
            WHERE id = p_id
            UNION ALL
            SELECT report_id, id, task, topic, NULL::text, report_attempt, coalesce(report_worker, claimed_by),
                'success'::text, report_started_at, report_ended_at, report_duration, ''::text, result,
                report_progress, '[]'::jsonb, NULL::text
            FROM %1$I.tw_messages
            WHERE report_id = p_id
            UNION ALL
            SELECT x.report_id, x.id, d.task, d.topic, NULL::text, x.report_attempt,
                coalesce(x.report_worker, x.claimed_by), 'success'::text, x.report_started_at, x.report_ended_at,
                x.report_duration, ''::text, x.result, x.report_progress, '[]'::jsonb, NULL::text
            FROM %1$I.tw_done d, unnest(d.messages) x
            WHERE d.reports @> p_id AND x.report_id = p_id
        $body$
    $create$, current_schema());
END
$migration$;
