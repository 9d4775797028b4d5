-- 012: priorities, unique keys and run-at times.
--
-- priority: higher is claimed first (-100..100, default 0). The claim walks
-- tw_messages_queued in (-priority, available_at, id) order; the column is
-- negated so that the claim's floor (claim.go) is one row comparison that
-- bounds the index scan.
--
-- unique_key, unique_states: a message holds its key while its state is
-- one of its unique states. tw_messages_unique makes two such messages
-- impossible, so concurrent submits of one key, from any process, store
-- one message: the others' INSERT ... ON CONFLICT DO NOTHING finds the
-- holder's entry and waits for its transaction. The index follows state
-- changes by itself.
--
-- tw_unique_keys: each key's latest message and its creation time, for
-- unique_for_seconds ("a task with this key created less than N seconds
-- ago, whatever its state"). The submit's upsert of the row decides, under
-- the row's lock.
ALTER TABLE tw_messages
    ADD COLUMN IF NOT EXISTS priority integer NOT NULL DEFAULT 0 CHECK (priority BETWEEN -100 AND 100),
    ADD COLUMN IF NOT EXISTS unique_key text,
    ADD COLUMN IF NOT EXISTS unique_states text[];

CREATE UNIQUE INDEX IF NOT EXISTS tw_messages_unique ON tw_messages (unique_key)
    WHERE unique_key IS NOT NULL AND state = ANY (unique_states);

CREATE TABLE IF NOT EXISTS tw_unique_keys (
    key        text        PRIMARY KEY,
    message_id bigint      NOT NULL,
    created_at timestamptz NOT NULL
);

-- The claim's index, by priority first.
DROP INDEX IF EXISTS tw_messages_queued;
CREATE INDEX tw_messages_queued ON tw_messages (topic, (-priority), available_at, id) WHERE state = 'queued';

-- A schedule's unique key: its fires submit with it.
ALTER TABLE tw_schedules ADD COLUMN IF NOT EXISTS unique_key text;
