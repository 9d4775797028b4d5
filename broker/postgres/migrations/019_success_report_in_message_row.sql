-- 019: a success report kept in its message's row.
--
-- An ack with a success report used to insert a row into tw_reports beside
-- the message's update: a heap tuple and five index entries per message,
-- as much database time as the ack itself. The common report (success, no
-- schedule, no logs, the result the ack stores, the message's task and
-- topic) now goes into the row the ack updates anyway, in the columns
-- below, with two index entries (tw_messages_report for listing and ids,
-- tw_messages_report_task for a task's). Every other report still goes to
-- the table, renamed tw_report_rows. Report ids come from one sequence for
-- both.
--
-- tw_reports is now a view of both, so what reads reports (the store, and
-- operators' own SQL) reads them as before. A message purged while it
-- still holds its report moves the report to tw_report_rows first, with
-- its id; purging reports clears the columns. A report kept in a row has
-- no key column: a keyed report stored later for the same message and
-- attempt (a lost report of an attempt whose ack committed) is known by
-- them. report_worker is NULL when the worker is the claim's (claimed_by).
--
-- Upgrading: the new columns cost nothing, but each of the two indexes
-- reads tw_messages whole while writes to it wait (purge finished
-- messages first on a large table to make that short).
DO $$
BEGIN
	IF to_regclass(quote_ident(current_schema()) || '.tw_report_rows') IS NULL THEN
		ALTER TABLE tw_reports RENAME TO tw_report_rows;
	END IF;
END
$$;

ALTER TABLE tw_messages
	ADD COLUMN IF NOT EXISTS report_id bigint,
	ADD COLUMN IF NOT EXISTS report_attempt int,
	ADD COLUMN IF NOT EXISTS report_worker text,
	ADD COLUMN IF NOT EXISTS report_started_at timestamptz,
	ADD COLUMN IF NOT EXISTS report_ended_at timestamptz,
	ADD COLUMN IF NOT EXISTS report_duration float8,
	ADD COLUMN IF NOT EXISTS report_progress float8;

CREATE INDEX IF NOT EXISTS tw_messages_report ON tw_messages (report_id) WHERE report_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS tw_messages_report_task ON tw_messages (task, report_id) WHERE report_id IS NOT NULL;

CREATE OR REPLACE VIEW tw_reports AS
	SELECT id, message_id, task, topic, schedule, attempt, worker, status, started_at, ended_at,
		duration_seconds, error, result, progress, logs, report_key
	FROM tw_report_rows
	UNION ALL
	SELECT report_id, id, task, topic, NULL::text, report_attempt, coalesce(report_worker, claimed_by),
		'success'::text, report_started_at, report_ended_at, report_duration, ''::text, result, report_progress,
		'[]'::jsonb, NULL::text
	FROM tw_messages
	WHERE report_id IS NOT NULL;
