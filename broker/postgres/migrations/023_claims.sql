-- 023: a claim is one row of tw_claims, not a write to each message.
--
-- A claim used to update every message it took: state running, the
-- worker, the time, the attempt and a token, a new row version and two
-- index entries a message, all inside the topic's lock; the ack then wrote
-- the row again. A claim now inserts one row here for the messages it
-- takes (their ids, the worker, the time, a random key) and leaves their
-- rows as they are: queued. A message is running while a claim row holds
-- its id. Its token is made from the claim's id and key and the message's
-- id (claimToken in claims.go), so an outcome finds its claim row by the
-- token's first half and fences on the rest.
--
-- An outcome (ack, nack, dead letter) takes the id out of its claim row
-- and writes the message's row as before, counting the attempt then, in
-- one statement; the claim row goes when it holds no id. The reaper takes a
-- dead worker's claim rows back whole. Readers show a held message as
-- running, with the claim's worker, time, token and attempt.
--
-- Rows made running by the earlier claim (and by the rabbitmq broker's
-- state store, which claims deliveries) stay as they are: every reader and
-- outcome takes both.
CREATE TABLE tw_claims (
    id         bigserial   PRIMARY KEY,
    topic      text        NOT NULL,
    worker     text        NOT NULL,
    claimed_at timestamptz NOT NULL,
    key        bigint      NOT NULL,
    -- ids: the messages the claim still holds, in id order; a row left
    -- empty by an outcome is deleted in the outcome's transaction.
    ids        bigint[]    NOT NULL,
    -- took: what the last outcome took out of ids (claims.go, takeCTEs).
    took       bigint[]
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.01, autovacuum_analyze_scale_factor = 0.05);

-- The claims of a topic: its room under a limit, and the messages a claim
-- of it passes by.
CREATE INDEX tw_claims_topic ON tw_claims (topic);

-- Operators' views show a held message as the readers do: running, with
-- the claim's worker and time, its attempt counted.
CREATE OR REPLACE VIEW tw_messages_all AS
    SELECT m.id, m.topic, m.task, m.payload, m.headers,
        CASE WHEN c.worker IS NOT NULL THEN 'running' ELSE m.state END AS state,
        m.attempts + (c.worker IS NOT NULL)::int AS attempts, m.max_attempts,
        coalesce(c.worker, m.claimed_by) AS claimed_by, coalesce(c.claimed_at, m.claimed_at) AS claimed_at,
        m.available_at, m.created_at, m.finished_at, m.last_error, m.result, m.suspect, m.waiting_since,
        m.cancel_requested_at, m.priority, m.unique_key, m.orphaned, m.report_id, m.report_attempt, m.report_worker,
        m.report_started_at, m.report_ended_at, m.report_duration, m.report_progress
    FROM tw_messages m LEFT JOIN LATERAL (
        SELECT c.worker, c.claimed_at FROM tw_claims c
        WHERE m.token IS NULL AND m.state = 'queued' AND c.topic = m.topic AND m.id = ANY (c.ids)
        LIMIT 1) c ON true
    UNION ALL
    SELECT x.id, d.topic, d.task, x.payload, x.headers, 'done', x.attempts, x.max_attempts, x.claimed_by,
        x.claimed_at, x.available_at, x.created_at, d.finished_at, x.last_error, x.result, x.suspect,
        x.waiting_since, x.cancel_requested_at, x.priority, NULL, x.orphaned, x.report_id, x.report_attempt,
        x.report_worker, x.report_started_at, x.report_ended_at, x.report_duration, x.report_progress
    FROM tw_done d, unnest(d.messages) x;

DO $migration$
BEGIN
    EXECUTE format($create$
        CREATE OR REPLACE FUNCTION %1$I.tw_message(p_id bigint) RETURNS SETOF %1$I.tw_messages_all
        LANGUAGE sql STABLE AS $body$
            SELECT m.id, m.topic, m.task, m.payload, m.headers,
                CASE WHEN c.worker IS NOT NULL THEN 'running' ELSE m.state END,
                m.attempts + (c.worker IS NOT NULL)::int, m.max_attempts,
                coalesce(c.worker, m.claimed_by), coalesce(c.claimed_at, m.claimed_at),
                m.available_at, m.created_at, m.finished_at, m.last_error, m.result, m.suspect, m.waiting_since,
                m.cancel_requested_at, m.priority, m.unique_key, m.orphaned, m.report_id, m.report_attempt,
                m.report_worker, m.report_started_at, m.report_ended_at, m.report_duration, m.report_progress
            FROM %1$I.tw_messages m LEFT JOIN LATERAL (
                SELECT c.worker, c.claimed_at FROM %1$I.tw_claims c
                WHERE m.token IS NULL AND m.state = 'queued' AND c.topic = m.topic AND m.id = ANY (c.ids)
                LIMIT 1) c ON true
            WHERE m.id = p_id
            UNION ALL
            SELECT x.id, d.topic, d.task, x.payload, x.headers, 'done', x.attempts, x.max_attempts, x.claimed_by,
                x.claimed_at, x.available_at, x.created_at, d.finished_at, x.last_error, x.result, x.suspect,
                x.waiting_since, x.cancel_requested_at, x.priority, NULL, x.orphaned, x.report_id, x.report_attempt,
                x.report_worker, x.report_started_at, x.report_ended_at, x.report_duration, x.report_progress
            FROM %1$I.tw_done d, unnest(d.messages) x
            WHERE d.ids @> p_id AND x.id = p_id
        $body$
    $create$, current_schema());
END
$migration$;
