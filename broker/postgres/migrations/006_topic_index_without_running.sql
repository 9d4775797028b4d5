-- 006: the topic listing index leaves running messages out.
--
-- tw_messages_topic_id (topic, id) took an entry at submit, claim and ack.
-- The claim's entry is the costly one: the claim runs under the topic's
-- lock, so its cost per row bounds how fast one topic can go. The index
-- now holds the messages that are not running; ListMessages finds a
-- topic's running messages in tw_messages_running (there are at most as
-- many as the topic's workers) and merges the two.
CREATE INDEX IF NOT EXISTS tw_messages_topic_idle ON tw_messages (topic, id) WHERE state <> 'running';
DROP INDEX IF EXISTS tw_messages_topic_id;
