-- A message's state that the worker used to read back out of its last
-- error gets columns of its own, so the error text is for people only.
-- suspect: the last claim ended with its worker dead (reclaimed by the
-- reaper), and nothing has run it to an end since. waiting_since (unix
-- nanoseconds): when the message began to wait for a live worker that
-- runs its task.
ALTER TABLE tw_messages ADD COLUMN suspect INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tw_messages ADD COLUMN waiting_since INTEGER;

-- Carry over what the error text of unfinished messages says. The wait's
-- start is the 20 characters (RFC 3339, UTC) between " since " and
-- "; requeued to wait".
UPDATE tw_messages SET suspect = 1
WHERE state IN ('queued', 'running') AND last_error LIKE 'orphaned:%';

UPDATE tw_messages
SET waiting_since = CAST(strftime('%s', substr(last_error, instr(last_error, '; requeued to wait') - 20, 20)) AS INTEGER) * 1000000000
WHERE state IN ('queued', 'running')
    AND instr(last_error, '; requeued to wait') > 27
    AND last_error LIKE '%no live worker runs task %'
    AND substr(last_error, instr(last_error, '; requeued to wait') - 27, 7) = ' since '
    AND strftime('%s', substr(last_error, instr(last_error, '; requeued to wait') - 20, 20)) IS NOT NULL;
