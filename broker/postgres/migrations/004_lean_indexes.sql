-- 004: cheaper claims and acks.
--
-- Submit, claim and ack each write a new version of the message row, and
-- because the state changes (and the state is indexed) none of them can be
-- a HOT update: every index on the table that is not partial gets a new
-- entry each time. tw_messages_state_id (state, id) took three entries per
-- message, and keeping it up cost about a third of the database's work per
-- message in the claim-and-ack cycle. Its only reader was ListMessages's
-- state filter, which the partial indexes now serve: queued, running and
-- dead have theirs, failed and dead get an id-ordered one here (rows land
-- in it only when a message ends badly), and done messages, most of the
-- table, are found walking the primary key.
--
-- IF [NOT] EXISTS: a schema rolled back to an earlier version by hand runs
-- this again.
DROP INDEX IF EXISTS tw_messages_state_id;
CREATE INDEX IF NOT EXISTS tw_messages_failed ON tw_messages (id) WHERE state IN ('failed', 'dead');
