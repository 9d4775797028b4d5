-- 025: each topic's counts of queued and dead messages, kept with the
-- writes.
--
-- Stats (the broker gauges at every scrape, GET topics, the task UI's
-- dashboard) counted a topic's queued and dead rows through their partial
-- indexes: a read whose cost grew with the queue, and with autovacuum off
-- with every dead row left behind too. It now sums a few rows here.
--
-- tw_topic_counts holds, per topic, the rows of tw_messages in state
-- queued (held ones included: a claim leaves its messages' rows queued, and
-- Stats takes the ids claim rows hold off) and in state dead, in the
-- transaction of every write that changes them, whoever makes it (the
-- broker, client/pgtx, an operator's own SQL):
--
--   - Statement triggers on tw_messages count what each statement changed,
--     from its transition tables. A TRUNCATE of tw_messages empties the
--     counts.
--   - The broker's acks, one statement each in the transaction of nearly
--     every claim, count what they end themselves, in the statement
--     (ackCounts in broker/postgres/ack.go), which costs a fraction of a
--     trigger's call, and say so: they set taskhost.topic_counts_kept to
--     the schema for the rest of their transaction, and the update and
--     delete triggers, whose WHEN reads it, are then not called. Nothing
--     after an ack in its transaction updates or deletes a message.
--
-- Each topic has up to 16 rows (shards), whose sum is its count. A
-- statement adds its change to one shard of each topic it changed
-- (tw_topic_counts_add), and holds it until its transaction ends: two
-- transactions that write the same topic at once (the two exchanges of a
-- worker pool in flight, submitters) take two shards, so that neither waits
-- for the other's commit. A transaction picks its shard with a
-- transaction-level advisory lock it tries without waiting, starting from
-- one that depends on its connection; only when all 16 are taken does it
-- wait for one. Updates of a shard are HOT (no indexed column changes), so
-- the table stays a few pages without VACUUM.
CREATE TABLE IF NOT EXISTS tw_topic_counts (
    topic  text    NOT NULL,
    shard  integer NOT NULL,
    queued bigint  NOT NULL DEFAULT 0,
    dead   bigint  NOT NULL DEFAULT 0,
    PRIMARY KEY (topic, shard)
) WITH (fillfactor = 10);

-- Names in full: the functions run in the sessions of client/pgtx too,
-- whose search_path is the application's.
DO $migration$
BEGIN
    EXECUTE format($create$
        CREATE OR REPLACE FUNCTION %1$I.tw_topic_counts_add(p_topic text, p_queued bigint, p_dead bigint) RETURNS void
        LANGUAGE plpgsql AS $body$
        BEGIN
            INSERT INTO %1$I.tw_topic_counts AS c (topic, shard, queued, dead)
            SELECT p_topic, coalesce(
                (SELECT (pg_backend_pid() + g) %% 16 FROM generate_series(0, 15) g
                    WHERE pg_try_advisory_xact_lock(hashtextextended(%2$L || p_topic, (pg_backend_pid() + g) %% 16))
                    LIMIT 1),
                (SELECT pg_backend_pid() %% 16
                    FROM pg_advisory_xact_lock(hashtextextended(%2$L || p_topic, pg_backend_pid() %% 16)))),
                p_queued, p_dead
            ON CONFLICT (topic, shard) DO UPDATE SET queued = c.queued + excluded.queued, dead = c.dead + excluded.dead;
        END
        $body$
    $create$, current_schema(), 'taskhost topic counts ' || current_schema() || ' ');

    EXECUTE format($create$
        CREATE OR REPLACE FUNCTION %1$I.tw_topic_counts_track() RETURNS trigger
        LANGUAGE plpgsql AS $body$
        BEGIN
            IF TG_OP = 'INSERT' THEN
                PERFORM %1$I.tw_topic_counts_add(n.topic, count(*) FILTER (WHERE n.state = 'queued'),
                    count(*) FILTER (WHERE n.state = 'dead'))
                FROM tw_new n WHERE n.state IN ('queued', 'dead') GROUP BY n.topic;
            ELSIF TG_OP = 'DELETE' THEN
                PERFORM %1$I.tw_topic_counts_add(o.topic, -count(*) FILTER (WHERE o.state = 'queued'),
                    -count(*) FILTER (WHERE o.state = 'dead'))
                FROM tw_old o WHERE o.state IN ('queued', 'dead') GROUP BY o.topic;
            ELSE
                PERFORM %1$I.tw_topic_counts_add(u.topic, sum(u.queued)::bigint, sum(u.dead)::bigint)
                FROM (SELECT n.topic, (n.state = 'queued')::int AS queued, (n.state = 'dead')::int AS dead FROM tw_new n
                    UNION ALL
                    SELECT o.topic, -(o.state = 'queued')::int, -(o.state = 'dead')::int FROM tw_old o) u
                GROUP BY u.topic HAVING sum(u.queued) <> 0 OR sum(u.dead) <> 0;
            END IF;
            RETURN NULL;
        END
        $body$
    $create$, current_schema());

    EXECUTE format($create$
        CREATE OR REPLACE FUNCTION %1$I.tw_topic_counts_truncated() RETURNS trigger
        LANGUAGE plpgsql AS $body$
        BEGIN
            DELETE FROM %1$I.tw_topic_counts;
            RETURN NULL;
        END
        $body$
    $create$, current_schema());

    -- tw_topic_counts_rebuild counts again from tw_messages, which it locks
    -- against writes until the transaction ends: for a table written with
    -- its triggers disabled (session_replication_role = replica, a restore
    -- with --disable-triggers). It reads every queued and dead row.
    EXECUTE format($create$
        CREATE OR REPLACE FUNCTION %1$I.tw_topic_counts_rebuild() RETURNS void
        LANGUAGE plpgsql AS $body$
        BEGIN
            LOCK TABLE %1$I.tw_messages IN SHARE MODE;
            DELETE FROM %1$I.tw_topic_counts;
            INSERT INTO %1$I.tw_topic_counts (topic, shard, queued, dead)
            SELECT m.topic, 0, count(*) FILTER (WHERE m.state = 'queued'), count(*) FILTER (WHERE m.state = 'dead')
            FROM %1$I.tw_messages m WHERE m.state IN ('queued', 'dead') GROUP BY m.topic;
        END
        $body$
    $create$, current_schema());

    -- A schema rolled back by hand to an earlier version may hold the
    -- triggers already: the migration makes them anew and counts again.
    DROP TRIGGER IF EXISTS tw_topic_counts_insert ON tw_messages;
    DROP TRIGGER IF EXISTS tw_topic_counts_update ON tw_messages;
    DROP TRIGGER IF EXISTS tw_topic_counts_delete ON tw_messages;
    DROP TRIGGER IF EXISTS tw_topic_counts_truncate ON tw_messages;
    CREATE TRIGGER tw_topic_counts_insert AFTER INSERT ON tw_messages
        REFERENCING NEW TABLE AS tw_new FOR EACH STATEMENT EXECUTE FUNCTION tw_topic_counts_track();
    EXECUTE format($create$
        CREATE TRIGGER tw_topic_counts_update AFTER UPDATE ON %1$I.tw_messages
            REFERENCING OLD TABLE AS tw_old NEW TABLE AS tw_new FOR EACH STATEMENT
            WHEN (current_setting('taskhost.topic_counts_kept', true) IS DISTINCT FROM %1$L)
            EXECUTE FUNCTION %1$I.tw_topic_counts_track()
    $create$, current_schema());
    EXECUTE format($create$
        CREATE TRIGGER tw_topic_counts_delete AFTER DELETE ON %1$I.tw_messages
            REFERENCING OLD TABLE AS tw_old FOR EACH STATEMENT
            WHEN (current_setting('taskhost.topic_counts_kept', true) IS DISTINCT FROM %1$L)
            EXECUTE FUNCTION %1$I.tw_topic_counts_track()
    $create$, current_schema());
    CREATE TRIGGER tw_topic_counts_truncate AFTER TRUNCATE ON tw_messages
        FOR EACH STATEMENT EXECUTE FUNCTION tw_topic_counts_truncated();
END
$migration$;

-- The triggers hold their lock on tw_messages until this migration
-- commits, so no write falls between them and this count.
SELECT tw_topic_counts_rebuild();
