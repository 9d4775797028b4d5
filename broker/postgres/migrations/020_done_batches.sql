-- 020: plain successes leave tw_messages in batches.
--
-- An ack that ends messages with plain success reports (no schedule, no
-- logs, no error, the result it stores: the common case) used to update
-- each row to done: a new row version and four index entries a message
-- (primary key, tw_messages_topic_idle, tw_messages_report,
-- tw_messages_report_task). It now deletes the rows (a delete writes no
-- row version and no index entry) and inserts one row into tw_done per
-- batch, topic and task, holding the messages as they would have been
-- once done, with their reports: a few index entries for 50 to 100
-- messages. In a burn-down of 100,000 tasks with reports this wrote about
-- 40% less WAL and ran about 1.25 times as fast (docs/architecture.md).
--
-- A message whose unique key it keeps (unique_key set) stays in
-- tw_messages: tw_messages_unique must see it. So does every other
-- outcome (failures, dead letters, cancellations, a report that is not
-- plain).
--
-- The readers of finished messages read both: GetMessage, ListMessages,
-- Cancel, Requeue, the reports (GetReport, ListReports, the view
-- tw_reports) and the purges. tw_messages_all is a view of every message
-- for operators' own SQL: a query of tw_messages no longer sees these
-- done messages.
--
-- The type of a batch's elements is its own: a later migration that needs
-- another column adds a new type and column rather than altering it (a
-- type used by a table's column cannot be altered).
CREATE TYPE tw_done_message AS (
    id                  bigint,
    payload             jsonb,
    headers             jsonb,
    attempts            integer,
    max_attempts        integer,
    claimed_by          text,
    claimed_at          timestamptz,
    available_at        timestamptz,
    created_at          timestamptz,
    last_error          text,
    result              jsonb,
    suspect             boolean,
    waiting_since       timestamptz,
    cancel_requested_at timestamptz,
    priority            integer,
    orphaned            integer,
    report_id           bigint,
    report_attempt      integer,
    report_worker       text,
    report_started_at   timestamptz,
    report_ended_at     timestamptz,
    report_duration     float8,
    report_progress     float8
);

CREATE TABLE tw_done (
    topic       text        NOT NULL,
    task        text        NOT NULL,
    finished_at timestamptz NOT NULL,
    -- ids: the range of the messages' ids; max_id its last (upper(ids) - 1).
    ids         int8range   NOT NULL,
    max_id      bigint      NOT NULL,
    -- reports: the range of the report ids the batch still holds, NULL
    -- when none (purged); max_report its last; first_ended the earliest
    -- end among them (PurgeReports).
    reports     int8range,
    max_report  bigint,
    first_ended timestamptz,
    messages    tw_done_message[] NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);

-- A message or a report by id, and the batches a page boundary cuts.
CREATE INDEX tw_done_ids ON tw_done USING gist (ids);
CREATE INDEX tw_done_reports ON tw_done USING gist (reports) WHERE reports IS NOT NULL;
-- Listings newest first: every message, a topic's, a task's.
CREATE INDEX tw_done_max_id ON tw_done (max_id);
CREATE INDEX tw_done_topic ON tw_done (topic, max_id);
CREATE INDEX tw_done_task ON tw_done (task, max_id);
-- Reports newest first: every report, a task's.
CREATE INDEX tw_done_max_report ON tw_done (max_report) WHERE reports IS NOT NULL;
CREATE INDEX tw_done_task_report ON tw_done (task, max_report) WHERE reports IS NOT NULL;

-- Every message: tw_messages and the batches' messages.
CREATE VIEW tw_messages_all AS
    SELECT id, topic, task, payload, headers, state, attempts, max_attempts, claimed_by, claimed_at,
        available_at, created_at, finished_at, last_error, result, suspect, waiting_since,
        cancel_requested_at, priority, unique_key, orphaned, report_id, report_attempt, report_worker,
        report_started_at, report_ended_at, report_duration, report_progress
    FROM tw_messages
    UNION ALL
    SELECT x.id, d.topic, d.task, x.payload, x.headers, 'done', x.attempts, x.max_attempts, x.claimed_by,
        x.claimed_at, x.available_at, x.created_at, d.finished_at, x.last_error, x.result, x.suspect,
        x.waiting_since, x.cancel_requested_at, x.priority, NULL, x.orphaned, x.report_id, x.report_attempt,
        x.report_worker, x.report_started_at, x.report_ended_at, x.report_duration, x.report_progress
    FROM tw_done d, unnest(d.messages) x;

CREATE OR REPLACE VIEW tw_reports AS
    SELECT id, message_id, task, topic, schedule, attempt, worker, status, started_at, ended_at,
        duration_seconds, error, result, progress, logs, report_key
    FROM tw_report_rows
    UNION ALL
    SELECT report_id, id, task, topic, NULL::text, report_attempt, coalesce(report_worker, claimed_by),
        'success'::text, report_started_at, report_ended_at, report_duration, ''::text, result, report_progress,
        '[]'::jsonb, NULL::text
    FROM tw_messages_all
    WHERE report_id IS NOT NULL;
