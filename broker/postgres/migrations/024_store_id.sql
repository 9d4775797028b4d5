-- 024: the store's identity: one random id, made once, here. Every
-- process that uses this schema reads the same one. The rabbitmq broker
-- stamps it on what it publishes and marks its prefix with it, so that a
-- message published by another store (whose ids name that store's rows,
-- not this schema's) is never taken for one of this store's, and two
-- stores are not started on one prefix. A dump restored elsewhere carries
-- the id with it.
CREATE TABLE IF NOT EXISTS tw_store (
    one        boolean     PRIMARY KEY DEFAULT true CHECK (one),
    id         text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO tw_store (id)
VALUES (substr(md5(random()::text || clock_timestamp()::text || pg_backend_pid()::text || txid_current()::text), 1, 16))
ON CONFLICT DO NOTHING;
