-- 007: the running-messages index keyed so that it cleans itself.
--
-- Every claim's count of a topic's running messages (the concurrency gate)
-- walks that topic's range of the running index. Keyed by (topic,
-- claimed_at), every claim appended entries at the range's tail and every
-- ack left a dead one behind; btree removes dead entries from a page only
-- when an insert would split it, and nothing inserts at the head, so the
-- range grew with every message until VACUUM ran, and so did the count.
-- The claim token is random: keyed by (topic, token), inserts land all
-- over the range, each page is cleaned of the entries earlier counts found
-- dead before it splits, and the range stays about as large as the number
-- of running messages.
--
-- tw_messages_running_by (claimed_by) took an entry at every claim for its
-- readers alone (a worker's running count, the reaper), which scan the few
-- running messages through this index as fast. It goes.
CREATE INDEX IF NOT EXISTS tw_messages_running_token ON tw_messages (topic, token) WHERE state = 'running';
DROP INDEX IF EXISTS tw_messages_running;
DROP INDEX IF EXISTS tw_messages_running_by;
