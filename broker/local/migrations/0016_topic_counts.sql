-- 0016: each topic's counts of queued and dead messages, kept with the
-- writes.
--
-- Stats (the broker gauges at every scrape, GET topics, the task UI's
-- dashboard) counted a topic's queued and dead rows through an index: a
-- read whose cost grew with the queue. It now reads one row a topic here,
-- which triggers keep in the transaction of every write of tw_messages,
-- whoever makes it. Writes to the file are one at a time, so one row a
-- topic makes no writer wait for another.
CREATE TABLE tw_topic_counts (
    topic  TEXT    NOT NULL PRIMARY KEY,
    queued INTEGER NOT NULL DEFAULT 0,
    dead   INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

INSERT INTO tw_topic_counts (topic, queued, dead)
SELECT topic, sum(state = 'queued'), sum(state = 'dead') FROM tw_messages
WHERE state IN ('queued', 'dead') GROUP BY topic;

CREATE TRIGGER tw_topic_counts_insert AFTER INSERT ON tw_messages
WHEN new.state IN ('queued', 'dead')
BEGIN
    INSERT INTO tw_topic_counts (topic, queued, dead) VALUES (new.topic, new.state = 'queued', new.state = 'dead')
    ON CONFLICT (topic) DO UPDATE SET queued = queued + excluded.queued, dead = dead + excluded.dead;
END;

CREATE TRIGGER tw_topic_counts_delete AFTER DELETE ON tw_messages
WHEN old.state IN ('queued', 'dead')
BEGIN
    UPDATE tw_topic_counts SET queued = queued - (old.state = 'queued'), dead = dead - (old.state = 'dead')
    WHERE topic = old.topic;
END;

-- A claim (queued to running) leaves one count, a requeue (dead to queued)
-- leaves one and enters the other: two triggers, so that a change that
-- enters no count writes only the one it leaves.
CREATE TRIGGER tw_topic_counts_leave AFTER UPDATE OF state, topic ON tw_messages
WHEN old.state IN ('queued', 'dead') AND (old.state IS NOT new.state OR old.topic IS NOT new.topic)
BEGIN
    UPDATE tw_topic_counts SET queued = queued - (old.state = 'queued'), dead = dead - (old.state = 'dead')
    WHERE topic = old.topic;
END;

CREATE TRIGGER tw_topic_counts_enter AFTER UPDATE OF state, topic ON tw_messages
WHEN new.state IN ('queued', 'dead') AND (old.state IS NOT new.state OR old.topic IS NOT new.topic)
BEGIN
    INSERT INTO tw_topic_counts (topic, queued, dead) VALUES (new.topic, new.state = 'queued', new.state = 'dead')
    ON CONFLICT (topic) DO UPDATE SET queued = queued + excluded.queued, dead = dead + excluded.dead;
END;
