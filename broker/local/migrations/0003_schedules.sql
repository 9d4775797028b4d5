-- 0003: schedules, the slots they fired, and task reports
-- (broker.ScheduleStore). Times are unix nanoseconds, JSON is TEXT, as
-- everywhere in this store.

-- A schedule fires every interval_seconds or on a cron expression: exactly
-- one of the two is set. last_attempt, last_success and expected_next_run
-- are its run state.
CREATE TABLE tw_schedules (
    name              TEXT    NOT NULL PRIMARY KEY,
    task              TEXT    NOT NULL,
    topic             TEXT    NOT NULL,
    payload           TEXT    NOT NULL DEFAULT '{}',
    interval_seconds  INTEGER CHECK (interval_seconds > 0),
    cron              TEXT    CHECK (cron <> ''),
    enabled           INTEGER NOT NULL DEFAULT 1 CHECK (enabled IN (0, 1)),
    missed_policy     TEXT    NOT NULL DEFAULT 'skip',
    source            TEXT    NOT NULL DEFAULT 'api',
    last_attempt      INTEGER,
    last_success      INTEGER,
    expected_next_run INTEGER,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    CHECK ((interval_seconds IS NULL) <> (cron IS NULL))
);

-- One row per fired slot: the primary key is what makes a slot fire at
-- most once. message_id is the message it submitted (NULL for none); it
-- is not a foreign key, as finished messages are dropped past the retain
-- limit. A schedule's fires go with it.
CREATE TABLE tw_schedule_fires (
    name       TEXT    NOT NULL REFERENCES tw_schedules (name) ON DELETE CASCADE,
    slot       INTEGER NOT NULL,
    fired_at   INTEGER NOT NULL,
    message_id INTEGER,
    PRIMARY KEY (name, slot)
) WITHOUT ROWID;

-- One row per attempt of a message, as the task reported it. message_id
-- and schedule are not foreign keys: reports outlive both.
CREATE TABLE tw_reports (
    id               INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    message_id       INTEGER NOT NULL,
    task             TEXT    NOT NULL,
    topic            TEXT    NOT NULL,
    schedule         TEXT,
    attempt          INTEGER NOT NULL DEFAULT 0,
    worker           TEXT    NOT NULL DEFAULT '',
    status           TEXT    NOT NULL,
    started_at       INTEGER NOT NULL,
    ended_at         INTEGER NOT NULL,
    duration_seconds REAL    NOT NULL DEFAULT 0,
    error            TEXT    NOT NULL DEFAULT '',
    result           TEXT,
    progress         REAL    NOT NULL DEFAULT 0,
    logs             TEXT    NOT NULL DEFAULT '[]'
);

-- ListReports newest first by message, task, schedule or status; the purge
-- by end time.
CREATE INDEX tw_reports_message ON tw_reports (message_id, id);
CREATE INDEX tw_reports_task ON tw_reports (task, id);
CREATE INDEX tw_reports_schedule ON tw_reports (schedule, id) WHERE schedule IS NOT NULL;
CREATE INDEX tw_reports_status ON tw_reports (status, id);
CREATE INDEX tw_reports_ended ON tw_reports (ended_at);
