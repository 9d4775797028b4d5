-- 010: the beat finds due schedules by an index instead of reading them
-- all at every tick. next_fire_at is never after a schedule's due slot:
-- its expected_next_run once it has fired; before, the start of the second
-- of updated_at, the first slot of an interval schedule and a lower bound
-- of a cron one's (the scheduler, which parses cron, moves it forward to
-- the first slot). PutSchedule and the fire maintain it.
ALTER TABLE tw_schedules ADD COLUMN IF NOT EXISTS next_fire_at timestamptz;

UPDATE tw_schedules
SET next_fire_at = COALESCE(expected_next_run, date_trunc('second', updated_at))
WHERE next_fire_at IS NULL;

-- The due schedules, oldest first: a range scan whose cost follows the
-- number due.
CREATE INDEX IF NOT EXISTS tw_schedules_due ON tw_schedules (next_fire_at, name) WHERE enabled;
