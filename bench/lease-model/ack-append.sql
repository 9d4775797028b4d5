-- The append-only lease ack: records the range done and deletes the
-- lease, leaving the rows to a later bulk delete (not measured).
BEGIN;
WITH l AS (DELETE FROM lease_model.leases WHERE topic = 't' AND lo = :lo RETURNING lo, hi)
INSERT INTO lease_model.done SELECT 't', lo, hi, now() FROM l;
UPDATE lease_model.topics SET running = running - :n WHERE name = 't';
COMMIT;
