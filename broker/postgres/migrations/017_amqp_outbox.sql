-- 017: the outbox of the rabbitmq broker, when this store is its state
-- store: the messages still to be published to RabbitMQ, and when. A
-- submit adds its messages in its own transaction, due a lease ahead (the
-- submitter publishes them at once and then deletes them; if it dies
-- first, the publisher loop of any process publishes them once the lease
-- has passed); a delayed message is due when it becomes available. The
-- other brokers never write it.
CREATE TABLE IF NOT EXISTS tw_amqp_outbox (
    message_id bigint      PRIMARY KEY,
    due_at     timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS tw_amqp_outbox_due ON tw_amqp_outbox (due_at);

-- What RabbitMQ did with dead workers' messages since the last reaper
-- pass: a redelivery taken again from a dead holder ('reclaimed'), a
-- message dead-lettered at its delivery limit ('dead_lettered'). The pass
-- reports and deletes them.
CREATE TABLE IF NOT EXISTS tw_amqp_orphans (
    seq        bigserial PRIMARY KEY,
    message_id bigint    NOT NULL,
    kind       text      NOT NULL CHECK (kind IN ('reclaimed', 'dead_lettered'))
);
