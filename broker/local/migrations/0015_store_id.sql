-- The store's identity: one random id, made once, here. Every process
-- that opens this file reads the same one. The rabbitmq broker stamps it
-- on what it publishes and marks its prefix with it, so that a message
-- published by another store (whose ids name that store's rows, not this
-- one's) is never taken for one of this store's, and two stores are not
-- started on one prefix. A copy of the file carries the id with it.
CREATE TABLE IF NOT EXISTS tw_store (
    one        INTEGER NOT NULL PRIMARY KEY CHECK (one = 1),
    id         TEXT    NOT NULL,
    created_at INTEGER NOT NULL
);
INSERT OR IGNORE INTO tw_store (one, id, created_at)
VALUES (1, lower(hex(randomblob(8))), CAST((julianday('now') - 2440587.5) * 86400000000000.0 AS INTEGER));
