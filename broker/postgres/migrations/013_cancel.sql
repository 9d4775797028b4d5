-- 013: cancellation. A new terminal state, cancelled, and the time a
-- cancel of a running message was first requested (NULL when none was).
ALTER TABLE tw_messages ADD COLUMN IF NOT EXISTS cancel_requested_at timestamptz;

-- The state's CHECK admits the new state. Every row passes the old,
-- narrower constraint, so the wider one is added NOT VALID: no scan of the
-- table under its exclusive lock; new and updated rows are checked.
ALTER TABLE tw_messages DROP CONSTRAINT IF EXISTS tw_messages_state_check;
ALTER TABLE tw_messages ADD CONSTRAINT tw_messages_state_check
    CHECK (state IN ('queued', 'running', 'done', 'failed', 'dead', 'cancelled')) NOT VALID;

-- ListMessages of the cancelled state, newest first, as tw_messages_failed
-- serves failed and dead.
CREATE INDEX IF NOT EXISTS tw_messages_cancelled ON tw_messages (id) WHERE state = 'cancelled';
