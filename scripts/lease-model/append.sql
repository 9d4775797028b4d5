-- The lease cycle with an append-only ack: claimed as in lease.sql; the
-- ack records the range done and deletes the lease, leaving the rows
-- to a later bulk delete (not measured).
BEGIN;
SELECT cursor, lim - running AS room FROM lease_model.topics WHERE name = 't' FOR UPDATE \gset
WITH picked AS (SELECT id, task, payload FROM lease_model.q2 WHERE topic = 't' AND id > :cursor AND available_at <= now()
	ORDER BY id LIMIT LEAST(50, :room)),
l AS (INSERT INTO lease_model.leases SELECT 't', min(id), max(id), count(*), nextval('lease_model.tok'), 'w', now()
	FROM picked RETURNING lo, hi, n)
SELECT (SELECT lo FROM l) AS lo, (SELECT hi FROM l) AS hi, (SELECT n FROM l) AS n,
	(SELECT count(*) FROM (SELECT id, task, payload::text FROM picked) p) AS rows \gset
UPDATE lease_model.topics SET cursor = :hi, running = running + :n WHERE name = 't';
COMMIT;
BEGIN;
WITH l AS (DELETE FROM lease_model.leases WHERE topic = 't' AND lo = :lo RETURNING lo, hi)
INSERT INTO lease_model.done SELECT 't', lo, hi, now() FROM l;
UPDATE lease_model.topics SET running = running - :n WHERE name = 't';
COMMIT;
