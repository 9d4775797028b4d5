-- The lease cycle: claim the next 50 ids past the topic's cursor as one
-- lease row (the messages' rows are read, not written), then ack them by
-- deleting the range and the lease, recording the range done.
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
WITH d AS (DELETE FROM lease_model.q2 WHERE id BETWEEN :lo AND :hi RETURNING id),
l AS (DELETE FROM lease_model.leases WHERE topic = 't' AND lo = :lo)
INSERT INTO lease_model.done SELECT 't', min(id), max(id), now() FROM d;
UPDATE lease_model.topics SET running = running - :n WHERE name = 't';
COMMIT;
