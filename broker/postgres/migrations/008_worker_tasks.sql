-- 008: the tasks a worker can run, so that a worker that claims a message
-- of a task it does not know can tell whether a live worker elsewhere
-- knows it (then the message waits for that one) or none does (then the
-- message fails as unknown).
ALTER TABLE tw_workers ADD COLUMN IF NOT EXISTS tasks text[] NOT NULL DEFAULT '{}';
