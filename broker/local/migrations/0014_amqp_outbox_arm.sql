-- Who armed each outbox entry last (a random number of the submit,
-- requeue or publisher lease that wrote it; 0 for no one). A publisher
-- deletes an entry after its publish only while it still carries its
-- arm: an entry armed again meanwhile (its queue was deleted, its message
-- requeued, another process leased it) stays, and is published again.
ALTER TABLE tw_amqp_outbox ADD COLUMN arm INTEGER NOT NULL DEFAULT 0;
