-- The outbox of the rabbitmq broker, when this store is its state store:
-- the messages still to be published to RabbitMQ, and when (unix
-- nanoseconds). A submit adds its messages in its own transaction, due a
-- lease ahead (the submitter publishes them at once and then deletes
-- them; if it dies first, the publisher loop of any process publishes
-- them once the lease has passed); a delayed message is due when it
-- becomes available. The other brokers never write it.
CREATE TABLE IF NOT EXISTS tw_amqp_outbox (
    message_id INTEGER PRIMARY KEY,
    due_at     INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS tw_amqp_outbox_due ON tw_amqp_outbox (due_at);
