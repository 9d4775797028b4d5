-- The floor model's cycle: claim 50 under the topic's lock (each row
-- updated to running), then ack them (each row updated to done).
BEGIN;
SELECT pg_advisory_xact_lock(hashtext('t'));
WITH lim AS (SELECT lim AS l FROM lease_model.topics WHERE name = 't'),
cnt AS (SELECT count(*)::int AS n FROM lease_model.q WHERE topic = 't' AND state = 'running'),
k AS (SELECT LEAST(50, GREATEST(l - (SELECT n FROM cnt), 0)) AS k FROM lim),
picked AS (SELECT id FROM lease_model.q WHERE topic = 't' AND state = 'queued' AND available_at <= now()
	ORDER BY available_at, id LIMIT (SELECT k FROM k) FOR UPDATE SKIP LOCKED)
UPDATE lease_model.q m SET state = 'running', attempts = m.attempts + 1, claimed_by = 'w', claimed_at = now(),
	claim_token = nextval('lease_model.tok')
WHERE m.id = ANY (ARRAY(SELECT id FROM picked)) RETURNING m.id, m.claim_token, m.task, m.payload;
COMMIT;
UPDATE lease_model.q SET state = 'done', finished_at = now() WHERE topic = 't' AND state = 'running';
