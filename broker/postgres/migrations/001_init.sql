-- 001: the broker's tables. Run by the migration runner (migrate.go) in one
-- transaction under an advisory lock; never edit an applied migration, add
-- the next number instead.

-- Topic settings. A row exists for every topic a message was ever submitted
-- to (Submit creates it): Claim locks it to serialise a limited topic's
-- count-then-claim.
CREATE TABLE tw_topics (
    name                text    PRIMARY KEY,
    concurrency_limit   integer NOT NULL DEFAULT 0 CHECK (concurrency_limit >= 0),
    dead_letter_enabled boolean NOT NULL DEFAULT true,
    paused              boolean NOT NULL DEFAULT false
);

CREATE TABLE tw_messages (
    id           bigserial   PRIMARY KEY,
    topic        text        NOT NULL,
    task         text        NOT NULL,
    payload      jsonb       NOT NULL DEFAULT '{}',
    headers      jsonb,
    state        text        NOT NULL DEFAULT 'queued'
                 CHECK (state IN ('queued', 'running', 'done', 'failed', 'dead')),
    attempts     integer     NOT NULL DEFAULT 0,
    max_attempts integer     NOT NULL DEFAULT 0,
    claimed_by   text,
    claimed_at   timestamptz,
    -- The claim token of the current attempt: set by Claim, cleared when
    -- the attempt ends. Every write for a claim names it.
    token        uuid,
    available_at timestamptz NOT NULL DEFAULT now(),
    created_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    last_error   text,
    result       jsonb,
    -- A token exists exactly while the message is running, so "token = x"
    -- alone says "running under claim x": the claim-checked writes find
    -- their row by primary key and never by a state index whose
    -- statistics may be stale.
    CONSTRAINT tw_messages_token_iff_running CHECK ((state = 'running') = (token IS NOT NULL))
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);

-- Claim: the oldest available queued rows of a topic.
CREATE INDEX tw_messages_queued ON tw_messages (topic, available_at, id) WHERE state = 'queued';
-- The concurrency gate (count of a topic's running rows) and the oldest
-- claim age.
CREATE INDEX tw_messages_running ON tw_messages (topic, claimed_at) WHERE state = 'running';
-- Workers' running counts and the reaper.
CREATE INDEX tw_messages_running_by ON tw_messages (claimed_by) WHERE state = 'running';
-- Dead-letter counts and purges per topic.
CREATE INDEX tw_messages_dead ON tw_messages (topic, id) WHERE state = 'dead';
-- ListMessages: newest first by state, or by topic.
CREATE INDEX tw_messages_state_id ON tw_messages (state, id);
CREATE INDEX tw_messages_topic_id ON tw_messages (topic, id);

CREATE TABLE tw_workers (
    id           text        PRIMARY KEY,
    host         text        NOT NULL DEFAULT '',
    pid          integer     NOT NULL DEFAULT 0,
    roles        text[]      NOT NULL DEFAULT '{}',
    topics       text[]      NOT NULL DEFAULT '{}',
    capacity     integer     NOT NULL DEFAULT 0,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX tw_workers_heartbeat ON tw_workers (heartbeat_at);

-- Named locks, held under a claim (message id and token).
CREATE TABLE tw_locks (
    name        text        PRIMARY KEY,
    holder      text        NOT NULL,
    message_id  bigint      NOT NULL,
    token       uuid        NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX tw_locks_message ON tw_locks (message_id);
