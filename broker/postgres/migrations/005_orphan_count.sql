-- How many claims of a message ended with its worker dead (reclaimed by
-- the reaper). orphan_max_attempts is compared with this count, so error
-- retries (which also claim) do not use up the orphan budget.
ALTER TABLE tw_messages ADD COLUMN orphaned integer NOT NULL DEFAULT 0;
