package postgres

import (
	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/sqlstore"
)

// acquireLockSQL takes lock $1 for holder $2 under the claim ($3, $4). It
// holds what holds the message under the claim FOR SHARE while it
// inserts: the claim row that holds it (claims.go), or the message's row
// made running under the token. A concurrent ack, nack or reclaim of that
// claim locks the same row first, so it waits for this and then releases
// the new lock too (or, going first, makes this claim check fail). It
// answers: does the claim hold its message, was the lock inserted, and
// was it already held under this claim.
var acquireLockSQL = `
	WITH r AS (
		SELECT id, token FROM tw_messages
		WHERE id = $3 AND token::text = $4
		FOR SHARE
	), h AS (
		` + claimHolding("$3::bigint AS id, $4::uuid AS token", "$3::bigint", "$4::text") + `
		FOR SHARE
	), m AS (
		SELECT id, token FROM r UNION ALL SELECT id, token FROM h
	), ins AS (
		INSERT INTO tw_locks (name, holder, message_id, token, acquired_at)
		SELECT $1, $2, m.id, m.token, now() FROM m LIMIT 1
		ON CONFLICT (name) DO NOTHING
		RETURNING 1
	)
	SELECT EXISTS (SELECT 1 FROM m), EXISTS (SELECT 1 FROM ins),
		coalesce((SELECT l.message_id = $3 AND l.token::text = $4 FROM tw_locks l WHERE l.name = $1), false)`

// AcquireLock takes lock name for the claim c in one statement
// (acquireLockSQL): held says whether c holds its message, ok whether c
// holds the lock now (taken now, or already held under c).
func (dialect) AcquireLock(c sqlstore.Conn, name, holder string, cl broker.Claim) (held, ok bool, err error) {
	var inserted, mine bool
	if err := c.QueryRow(acquireLockSQL, name, holder, cl.ID, cl.Token).Scan(&held, &inserted, &mine); err != nil {
		return false, false, err
	}
	return held, inserted || mine, nil
}
