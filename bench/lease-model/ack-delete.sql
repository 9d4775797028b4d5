-- The lease ack: deletes the range and the lease, recording the range
-- done.
BEGIN;
WITH d AS (DELETE FROM lease_model.q2 WHERE id BETWEEN :lo AND :hi RETURNING id),
l AS (DELETE FROM lease_model.leases WHERE topic = 't' AND lo = :lo)
INSERT INTO lease_model.done SELECT 't', min(id), max(id), now() FROM d;
UPDATE lease_model.topics SET running = running - :n WHERE name = 't';
COMMIT;
