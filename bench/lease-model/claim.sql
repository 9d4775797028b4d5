-- The lease claim: the next 50 ids past the topic's cursor as one lease
-- row (the messages' rows are read, not written). run.sh follows it with
-- one of the acks (ack-delete.sql, ack-append.sql) in one pgbench script.
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
