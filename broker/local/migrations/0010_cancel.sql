-- Cancellation: a new terminal state, cancelled, and the time a cancel of
-- a running message was first requested (unix nanoseconds; NULL when none
-- was).
ALTER TABLE tw_messages ADD COLUMN cancel_requested_at INTEGER;

-- The state's CHECK constraint admits the new state. SQLite cannot alter
-- a constraint, so the table's stored definition is edited in place, the
-- way SQLite documents for loosening a constraint: every row already
-- passes the wider one. RESET reloads this connection's schema; the index
-- change below moves the schema version on, so other connections reload
-- theirs.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
SET sql = replace(sql,
    'CHECK (state IN (''queued'', ''running'', ''done'', ''failed'', ''dead''))',
    'CHECK (state IN (''queued'', ''running'', ''done'', ''failed'', ''dead'', ''cancelled''))')
WHERE type = 'table' AND name = 'tw_messages';
PRAGMA writable_schema = RESET;

-- Finished messages past Retain are dropped oldest first: cancelled ones
-- are finished too.
DROP INDEX tw_messages_finished;
CREATE INDEX tw_messages_finished ON tw_messages (finished_at, id) WHERE state IN ('done', 'failed', 'dead', 'cancelled');
