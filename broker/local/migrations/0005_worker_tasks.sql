-- The tasks a worker can run (a JSON array), so that a worker that claims
-- a message of a task it does not know can tell whether a live worker
-- elsewhere knows it.
ALTER TABLE tw_workers ADD COLUMN tasks TEXT NOT NULL DEFAULT '[]';
