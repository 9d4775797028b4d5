-- 0001: the data model of ARCHITECTURE.md ("Data model"), as the local
-- SQLite store keeps it. Times are INTEGER unix nanoseconds from the
-- machine's wall clock (see the package documentation: one machine, one
-- clock). JSON documents (payload, result, headers, roles, topics) are TEXT.

CREATE TABLE tw_topics (
    name                TEXT    NOT NULL PRIMARY KEY,
    concurrency_limit   INTEGER NOT NULL DEFAULT 0 CHECK (concurrency_limit >= 0),
    dead_letter_enabled INTEGER NOT NULL DEFAULT 1 CHECK (dead_letter_enabled IN (0, 1)),
    paused              INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1))
);

-- AUTOINCREMENT: ids are never reused, even after the newest messages were
-- purged, so an id names one message for the life of the file.
CREATE TABLE tw_messages (
    id           INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    topic        TEXT    NOT NULL REFERENCES tw_topics (name),
    task         TEXT    NOT NULL,
    payload      TEXT    NOT NULL,
    headers      TEXT,
    state        TEXT    NOT NULL CHECK (state IN ('queued', 'running', 'done', 'failed', 'dead')),
    attempts     INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL DEFAULT 0,
    claimed_by   TEXT,
    claimed_at   INTEGER,
    token        TEXT,
    available_at INTEGER NOT NULL,
    created_at   INTEGER NOT NULL,
    finished_at  INTEGER,
    last_error   TEXT    NOT NULL DEFAULT '',
    result       TEXT,
    -- A running row always carries its claim; no other row has a token.
    CHECK ((state = 'running') = (token IS NOT NULL)),
    CHECK (state <> 'running' OR (claimed_by IS NOT NULL AND claimed_at IS NOT NULL))
);

-- Claim: the oldest available queued row of a topic.
CREATE INDEX tw_messages_claim ON tw_messages (topic, available_at, id) WHERE state = 'queued';
-- A topic's rows in a state: the concurrency gate (its running rows),
-- per-topic counts, purges, listing by state and topic newest first, the
-- reaper's scan of running rows.
CREATE INDEX tw_messages_state ON tw_messages (state, topic, id);
-- Listing by topic newest first.
CREATE INDEX tw_messages_topic ON tw_messages (topic, id);
-- Retention: finished rows in the order they finished.
CREATE INDEX tw_messages_finished ON tw_messages (finished_at, id) WHERE state IN ('done', 'failed', 'dead');

CREATE TABLE tw_workers (
    id           TEXT    NOT NULL PRIMARY KEY,
    host         TEXT    NOT NULL DEFAULT '',
    pid          INTEGER NOT NULL DEFAULT 0,
    roles        TEXT    NOT NULL DEFAULT 'null',
    topics       TEXT    NOT NULL DEFAULT 'null',
    capacity     INTEGER NOT NULL DEFAULT 0,
    started_at   INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL
);

CREATE INDEX tw_workers_heartbeat ON tw_workers (heartbeat_at);

-- A lock is held under one claim (message id + that attempt's token) and
-- goes when the claim ends.
CREATE TABLE tw_locks (
    name        TEXT    NOT NULL PRIMARY KEY,
    holder      TEXT    NOT NULL,
    message_id  INTEGER NOT NULL REFERENCES tw_messages (id) ON DELETE CASCADE,
    token       TEXT    NOT NULL,
    acquired_at INTEGER NOT NULL
);

CREATE INDEX tw_locks_message ON tw_locks (message_id, token);
