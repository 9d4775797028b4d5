-- 009: a message's state that the worker used to read back out of its last
-- error gets columns of its own, so the error text is for people only.
-- suspect: the last claim ended with its worker dead (reclaimed by the
-- reaper), and nothing has run it to an end since. waiting_since: when the
-- message began to wait for a live worker that runs its task.
ALTER TABLE tw_messages
    ADD COLUMN IF NOT EXISTS suspect boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS waiting_since timestamptz;

-- Carry over what the error text of unfinished messages says.
UPDATE tw_messages SET suspect = true
WHERE state IN ('queued', 'running') AND last_error LIKE 'orphaned:%';

UPDATE tw_messages
SET waiting_since = substring(last_error from
        'no live worker runs task .* since ([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z); requeued to wait')::timestamptz
WHERE state IN ('queued', 'running')
    AND last_error ~ 'no live worker runs task .* since [0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z; requeued to wait';
