-- Priorities, unique keys and run-at times.
--
-- priority: higher is claimed first (-100..100, default 0); the claim's
-- index orders a topic's queued messages by it first.
--
-- unique_key, unique_states (",queued,running," and so on): a message
-- holds its key while its state is one of its unique states;
-- tw_messages_unique makes two such messages impossible whatever process
-- writes, and follows state changes by itself.
--
-- tw_unique_keys: each key's latest message and its creation time (unix
-- nanoseconds), for unique_for_seconds.
ALTER TABLE tw_messages ADD COLUMN priority INTEGER NOT NULL DEFAULT 0 CHECK (priority BETWEEN -100 AND 100);
ALTER TABLE tw_messages ADD COLUMN unique_key TEXT;
ALTER TABLE tw_messages ADD COLUMN unique_states TEXT;

CREATE UNIQUE INDEX tw_messages_unique ON tw_messages (unique_key)
    WHERE unique_key IS NOT NULL AND instr(unique_states, ',' || state || ',') > 0;

CREATE TABLE tw_unique_keys (
    key        TEXT    PRIMARY KEY,
    message_id INTEGER NOT NULL,
    created_at INTEGER NOT NULL
);

DROP INDEX tw_messages_claim;
CREATE INDEX tw_messages_claim ON tw_messages (topic, priority DESC, available_at, id) WHERE state = 'queued';

-- A schedule's unique key: its fires submit with it.
ALTER TABLE tw_schedules ADD COLUMN unique_key TEXT;
