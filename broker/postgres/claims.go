package postgres

import (
	"encoding/binary"
	"encoding/hex"
	"strings"
)

// This file owns the claim rows of tw_claims (migration 023): what makes a
// queued message running, how its token is made and read, and the SQL
// every outcome, reader and the reaper use to see a held message.
//
// A claim inserts one row into tw_claims for the messages it takes and
// leaves their rows queued. A message is held (running) while a claim row
// holds its id; its row's columns then read as the claim has them
// (liveCols): state running, the claim's worker and time, its attempt
// counted, its token (claimToken).
//
// An outcome first takes its messages out of their claim rows (takeCTEs),
// in the same statement that then writes the messages' rows, and only
// those it took: the UPDATE of a claim row waits for any other writer of
// that row (another outcome of the same claim, the reaper taking it back,
// which deletes it) and then reads the row as that writer left it, so an
// outcome and a take-back never both apply. Nothing else writes a held
// message's row but a cancel request, which sets cancel_requested_at
// alone.

// claimToken is the SQL expression of the token (text) of message id held
// by the claim row c: a uuid whose first 16 hex digits are the row's id
// and whose last 16 are the row's random key XOR the message's id. The
// tokens of a claim's messages differ from each other and from those of
// every other claim of the same messages; the key, which only the claim's
// worker is given, fences them (parseClaimToken, takeCTEs).
func claimToken(c, id string) string {
	return `(lpad(to_hex(` + c + `.id), 16, '0') || lpad(to_hex(` + c + `.key # ` + id + `), 16, '0'))::uuid::text`
}

// formatClaimToken is the token claimToken makes, of the claim row cid
// whose key XOR the message's id is key: the claim's statement returns the
// two halves, and the token is formatted here rather than in SQL, in the
// part of the claim that holds the topic's lock.
func formatClaimToken(cid, key int64) string {
	var raw [16]byte
	binary.BigEndian.PutUint64(raw[:8], uint64(cid))
	binary.BigEndian.PutUint64(raw[8:], uint64(key))
	var b [36]byte
	hex.Encode(b[0:8], raw[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], raw[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], raw[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], raw[8:10])
	b[23] = '-'
	hex.Encode(b[24:36], raw[10:16])
	return string(b[:])
}

// claimKeySQL draws a claim row's key: the first 64 bits of a random
// (version 4) uuid, 60 of them random.
const claimKeySQL = `('x' || substr(replace(gen_random_uuid()::text, '-', ''), 1, 16))::bit(64)::bigint`

// parseClaimToken returns the claim row id and the key half of tok, a
// token claimToken made. When tok is no uuid, cid is 0, which no claim
// row has; a uuid that is not such a token (the token of a row made
// running by a claim of an earlier version or by the rabbitmq broker's
// state store) gives halves that match no claim row's id and key.
func parseClaimToken(tok string) (cid, key int64) {
	if len(tok) != 36 {
		return 0, 0
	}
	raw, err := hex.DecodeString(strings.ReplaceAll(tok, "-", ""))
	if err != nil || len(raw) != 16 {
		return 0, 0
	}
	return int64(binary.BigEndian.Uint64(raw[:8])), int64(binary.BigEndian.Uint64(raw[8:]))
}

// claimArgs are the claim row ids and keys of toks (parseClaimToken), for
// takeCTEs.
func claimArgs(toks []string) (cids, keys []int64) {
	cids, keys = make([]int64, len(toks)), make([]int64, len(toks))
	for i, t := range toks {
		cids[i], keys[i] = parseClaimToken(t)
	}
	return cids, keys
}

// claimOf and keyOf are the SQL expressions of the claim row id and the
// key half of the token tok (a text expression), as parseClaimToken
// reads them; claimOf is NULL when tok is no uuid. For the statements
// that read tokens from the database (locks).
func claimOf(tok string) string {
	return `(CASE WHEN ` + tok + ` ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
		THEN ('x' || substr(replace(` + tok + `, '-', ''), 1, 16))::bit(64)::bigint END)`
}

func keyOf(tok string) string {
	return `('x' || substr(replace(` + tok + `, '-', ''), 17, 16))::bit(64)::bigint`
}

// takeCTEs is the first CTE of a statement that ends the attempts of
// the messages ids (a bigint[] expression) under the tokens whose claim
// row ids and keys are cids and keys (claimArgs): t takes, from each
// claim row named, the messages it holds under their tokens (its key
// XOR the message's id is the token's key: the outcomes of a claim whose
// keys disagree with its row's are grouped apart, and match no row), and
// returns the rows with what they took (took), their workers and times.
// The statement that follows joins t as h on each outcome (hJoin) and
// writes the rows of the messages t took (and of rows running under their
// own token) and no other. A claim row left empty stays, with no id,
// for the next claim of its topic to reuse (claimStatement). The claim
// rows are locked in id order first,
// as the reaper locks them (lockDeadClaimsSQL): two outcomes in flight
// that name the same claim rows wait for each other, never deadlock.
func takeCTEs(ids, cids, keys string) string { return takeCTEsAnd(ids, cids, keys, "") }

// takeCTEsAnd is takeCTEs with cond (when not empty) one more condition
// on each claim row t takes from.
func takeCTEsAnd(ids, cids, keys, cond string) string {
	if cond != "" {
		cond = " AND " + cond
	}
	return `t AS (
		UPDATE tw_claims c
		SET took = ARRAY (SELECT x FROM unnest(c.ids) x WHERE x = ANY (g.want)),
			ids = ARRAY (SELECT x FROM unnest(c.ids) x WHERE x <> ALL (g.want))
		FROM (SELECT u.cid, u.key # u.id AS ckey, array_agg(u.id) AS want
			FROM unnest(` + ids + `::bigint[], ` + cids + `::bigint[], ` + keys + `::bigint[]) AS u(id, cid, key)
			WHERE u.cid > 0 GROUP BY 1, 2) g
		WHERE c.id = ANY (ARRAY (SELECT l.id FROM tw_claims l WHERE l.id = ANY (` + cids + `::bigint[]) ORDER BY l.id FOR UPDATE))
			AND c.id = g.cid AND c.key = g.ckey` + cond + `
		RETURNING c.id, c.key, c.worker, c.claimed_at, c.took
	)`
}

// heldBy is the condition that the row m is held under the token tok (a
// text expression) by the claim row takeCTEs took it from (h, LEFT JOINed
// on the outcome: hJoin), or, for a row made running by a claim of
// an earlier version or by the rabbitmq broker's state store, by the
// row's own token.
func heldBy(tok string) string {
	return `(m.token::text = ` + tok + ` OR (m.token IS NULL AND m.state = 'queued' AND h.id IS NOT NULL))`
}

// hJoin is the join of t (takeCTEs) as h with the outcome v (its columns
// id, and cid and ckey: claimArgs): the claim row the outcome's token
// names, when it took the outcome's message under that token.
func hJoin(v string) string {
	return `t h ON h.id = ` + v + `.cid AND (h.key # ` + v + `.id) = ` + v + `.ckey AND ` + v + `.id = ANY (h.took)`
}

// The columns of an outcome's row m (heldBy): for a message a claim row
// held (h), its claim's worker and time, which a claim of an earlier
// version wrote into the row at the claim, and the attempt counted, which
// it counted at the claim.
const (
	heldAttempts  = `m.attempts + (h.id IS NOT NULL)::int`
	heldClaimedBy = `coalesce(h.worker, m.claimed_by)`
	heldClaimedAt = `coalesce(h.claimed_at, m.claimed_at)`
)

// heldSet is the SET list of an outcome's statement that writes the held
// columns into the row m.
const heldSet = `attempts = ` + heldAttempts + `, claimed_by = ` + heldClaimedBy + `, claimed_at = ` + heldClaimedAt

// notRunAttempts is the attempts of the row m whose attempt did not run
// (a Nack with NotRun): a claim of an earlier version counted it at the
// claim and gives it back; a claim row's attempt is counted at its
// outcome, so none is.
const notRunAttempts = `CASE WHEN h.id IS NOT NULL THEN m.attempts ELSE greatest(m.attempts - 1, 0) END`

// heldIDs is a subquery of the ids of the messages of topic (an
// expression) that claim rows hold.
func heldIDs(topic string) string {
	return `(SELECT unnest(h.ids) FROM tw_claims h WHERE h.topic = ` + topic + `)`
}

// heldCount is an expression counting the messages of topic (an
// expression) that claim rows hold.
func heldCount(topic string) string {
	return `(SELECT coalesce(sum(cardinality(h.ids)), 0) FROM tw_claims h WHERE h.topic = ` + topic + `)`
}

// liveFrom is a FROM item of tw_messages m, each row with the claim row
// that holds it, if any (c_worker and c_claimed_at, NULL otherwise), for
// liveCols. Conditions on it name tw_messages' own columns.
const liveFrom = `tw_messages m LEFT JOIN LATERAL ` + liveClaim

// liveClaim is the LATERAL item of liveFrom, for a FROM item m of
// tw_messages rows.
const liveClaim = `(
		SELECT c.worker AS c_worker, c.claimed_at AS c_claimed_at FROM tw_claims c
		WHERE m.token IS NULL AND m.state = 'queued' AND c.topic = m.topic AND m.id = ANY (c.ids)
		LIMIT 1) c ON true`

// liveCols are msgCols of liveFrom: a message a claim row holds reads as
// running, with the claim's worker and time and its attempt counted.
const liveCols = `m.id, m.topic, m.task, m.payload::text, m.headers::text,
	CASE WHEN c_worker IS NOT NULL THEN 'running' ELSE m.state END, m.attempts + (c_worker IS NOT NULL)::int, m.max_attempts,
	coalesce(c_worker, m.claimed_by), coalesce(c_claimed_at, m.claimed_at), m.available_at, m.created_at, m.finished_at,
	m.last_error, m.result::text, m.suspect, m.waiting_since,
	m.cancel_requested_at, m.priority, m.unique_key`

// The conditions on a row of tw_messages that a claim row holds it, and
// that it is queued and not held.
const (
	heldRow   = `(id = ANY (ARRAY (SELECT unnest(h.ids) FROM tw_claims h)) AND state = 'queued' AND token IS NULL)`
	queuedRow = `(state = 'queued' AND id NOT IN (SELECT unnest(h.ids) FROM tw_claims h))`
)

// The statements that read what a worker, a topic or a claim holds read
// both forms of running through these: the claim rows, and the rows made
// running by a claim of an earlier version or by the rabbitmq broker's
// state store.

// claimHolding is a query of cols of the claim row c that holds message
// id under the token tok (expressions; tok a text).
func claimHolding(cols, id, tok string) string {
	return `SELECT ` + cols + ` FROM tw_claims c
		WHERE c.id = ` + claimOf(tok) + ` AND ` + id + ` = ANY (c.ids) AND (c.key # ` + id + `) = ` + keyOf(tok)
}

// lockHeld is the condition that the lock l is held under a claim that
// still holds its message.
var lockHeld = `(EXISTS (
			SELECT 1 FROM tw_messages m
			WHERE m.id = l.message_id AND m.token = l.token)
		OR EXISTS (` + claimHolding("1", "l.message_id", "l.token::text") + `))`

// workerHolds is a query of the messages worker (an expression) holds, as
// (id, token), in id order; cond, when not empty, is a condition on each
// message's row m.
func workerHolds(worker, cond string) string {
	rows, claims, id, where := `m.state = 'running' AND m.claimed_by = `+worker, `tw_claims c, unnest(c.ids) x`, `x`, `c.worker = `+worker
	if cond != "" {
		rows, claims, id, where = rows+` AND `+cond, `tw_claims c JOIN tw_messages m ON m.id = ANY (c.ids)`, `m.id`, where+` AND `+cond
	}
	return `SELECT m.id, m.token::text FROM tw_messages m WHERE ` + rows + `
			UNION ALL
			SELECT ` + id + `, ` + claimToken("c", id) + ` FROM ` + claims + ` WHERE ` + where + `
			ORDER BY 1`
}

// workerRunning is an expression counting the messages worker (an
// expression) holds.
func workerRunning(worker string) string {
	return `((SELECT count(*) FROM tw_messages m WHERE m.claimed_by = ` + worker + ` AND m.state = 'running')
		+ (SELECT coalesce(sum(cardinality(c.ids)), 0) FROM tw_claims c WHERE c.worker = ` + worker + `))`
}

// topicRunning is a LATERAL item of the messages of topic (an expression)
// that run: n counts them, held counts those claim rows hold (their rows
// are queued, and tw_topic_counts counts them so), and age_us is the age
// of the oldest claim, in microseconds (0 when none).
func topicRunning(topic string) string {
	age := func(at string) string {
		return `coalesce(greatest(0, (extract(epoch FROM now() - min(` + at + `)) * 1000000)::bigint), 0)`
	}
	return `LATERAL (
				SELECT r.n + h.n AS n, h.n AS held, greatest(r.age_us, h.age_us) AS age_us
				FROM (SELECT count(*) AS n, ` + age("m.claimed_at") + ` AS age_us
					FROM tw_messages m WHERE m.topic = ` + topic + ` AND m.state = 'running') r,
				(SELECT coalesce(sum(cardinality(c.ids)), 0) AS n, ` + age("c.claimed_at") + ` AS age_us
					FROM tw_claims c WHERE c.topic = ` + topic + ` AND c.ids <> '{}') h
			)`
}
