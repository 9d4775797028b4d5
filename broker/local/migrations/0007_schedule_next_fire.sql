-- The beat finds due schedules by an index instead of reading them all at
-- every tick. next_fire_at (unix nanoseconds) is never after a schedule's
-- due slot: its expected_next_run once it has fired; before, the start of
-- the second of updated_at, the first slot of an interval schedule and a
-- lower bound of a cron one's (the scheduler, which parses cron, moves it
-- forward to the first slot). PutSchedule and the fire maintain it.
ALTER TABLE tw_schedules ADD COLUMN next_fire_at INTEGER;

UPDATE tw_schedules
SET next_fire_at = COALESCE(expected_next_run, updated_at / 1000000000 * 1000000000);

-- The due schedules, oldest first: a range scan whose cost follows the
-- number due.
CREATE INDEX tw_schedules_due ON tw_schedules (next_fire_at, name) WHERE enabled = 1;
