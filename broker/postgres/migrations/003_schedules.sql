-- 003: schedules, the slots they fired, and task reports
-- (broker.ScheduleStore).

-- A schedule fires every interval_seconds or on a cron expression: exactly
-- one of the two is set. last_attempt, last_success and expected_next_run
-- are its run state.
CREATE TABLE tw_schedules (
    name              text        PRIMARY KEY,
    task              text        NOT NULL,
    topic             text        NOT NULL,
    payload           jsonb       NOT NULL DEFAULT '{}',
    interval_seconds  integer     CHECK (interval_seconds > 0),
    cron              text        CHECK (cron <> ''),
    enabled           boolean     NOT NULL DEFAULT true,
    missed_policy     text        NOT NULL DEFAULT 'skip',
    source            text        NOT NULL DEFAULT 'api',
    last_attempt      timestamptz,
    last_success      timestamptz,
    expected_next_run timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT tw_schedules_interval_xor_cron CHECK ((interval_seconds IS NULL) <> (cron IS NULL))
);

-- One row per fired slot: the primary key is what makes a slot fire at
-- most once, across processes and leader changes. message_id is the
-- message it submitted (NULL for none); not a foreign key, messages may be
-- purged. A schedule's fires go with it.
CREATE TABLE tw_schedule_fires (
    name       text        NOT NULL REFERENCES tw_schedules (name) ON DELETE CASCADE,
    slot       timestamptz NOT NULL,
    fired_at   timestamptz NOT NULL DEFAULT now(),
    message_id bigint,
    PRIMARY KEY (name, slot)
);

-- One row per attempt of a message, as the task reported it. message_id
-- and schedule are not foreign keys: reports outlive both.
CREATE TABLE tw_reports (
    id               bigserial        PRIMARY KEY,
    message_id       bigint           NOT NULL,
    task             text             NOT NULL,
    topic            text             NOT NULL,
    schedule         text,
    attempt          integer          NOT NULL DEFAULT 0,
    worker           text             NOT NULL DEFAULT '',
    status           text             NOT NULL,
    started_at       timestamptz      NOT NULL,
    ended_at         timestamptz      NOT NULL,
    duration_seconds double precision NOT NULL DEFAULT 0,
    error            text             NOT NULL DEFAULT '',
    result           jsonb,
    progress         double precision NOT NULL DEFAULT 0,
    logs             jsonb            NOT NULL DEFAULT '[]'
);

-- ListReports newest first by message, task, schedule or status; the purge
-- by end time.
CREATE INDEX tw_reports_message ON tw_reports (message_id, id);
CREATE INDEX tw_reports_task ON tw_reports (task, id);
CREATE INDEX tw_reports_schedule ON tw_reports (schedule, id) WHERE schedule IS NOT NULL;
CREATE INDEX tw_reports_status ON tw_reports (status, id);
CREATE INDEX tw_reports_ended ON tw_reports (ended_at);
