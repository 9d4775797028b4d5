package postgres

import (
	"context"
	"slices"
	"sort"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
)

// reclaimSQL requeues (or, once the message has been orphaned $3 times
// counting this one, when $3 > 0, dead-letters) the running messages
// claimed at least $2 µs ago by workers not in $1, marking them suspect;
// $4 starts their last error. A message whose cancel was requested ends
// cancelled instead. Rows are locked in id order first (as Ack does), so a
// concurrent ack either lands before (and the row is no longer running) or
// waits and then finds its token gone.
var reclaimSQL = `
	WITH orphan AS (
		SELECT id FROM tw_messages
		WHERE state = 'running'
			AND claimed_at <= now() - $2::bigint * interval '1 microsecond'
			AND NOT (claimed_by = ANY ($1::text[]))
		ORDER BY id
		FOR UPDATE
	)
	UPDATE tw_messages m SET ` + reclaimSet("m.claimed_by", "m.claimed_at") + `, token = NULL
	WHERE m.id = ANY (ARRAY (SELECT id FROM orphan))
	RETURNING m.id, m.state, m.topic`

// lockDeadClaimsSQL locks, in id order, the claim rows (claims.go) of
// workers not in $1 made at least $2 µs ago: reclaimClaimsSQL, a statement
// of its own after it, then reads them as the outcomes that went first
// left them.
const lockDeadClaimsSQL = `
	SELECT 1 FROM tw_claims
	WHERE claimed_at <= now() - $2::bigint * interval '1 microsecond' AND NOT (worker = ANY ($1::text[]))
	ORDER BY id FOR UPDATE`

// reclaimClaimsSQL is reclaimSQL for the messages that claim rows hold:
// it deletes the claim rows of workers not in $1 made at least $2 µs
// ago, and ends or requeues their messages as reclaimSQL does a running
// row, counting the attempt the claim made.
var reclaimClaimsSQL = `
	WITH dead AS (
		DELETE FROM tw_claims
		WHERE claimed_at <= now() - $2::bigint * interval '1 microsecond' AND NOT (worker = ANY ($1::text[]))
		RETURNING worker, claimed_at, ids
	), h AS (
		SELECT x AS id, worker, claimed_at FROM dead, unnest(dead.ids) x
	)
	UPDATE tw_messages m SET ` + reclaimSet("h.worker", "h.claimed_at") + `, attempts = m.attempts + 1
	FROM h
	WHERE m.id = h.id AND m.state = 'queued' AND m.token IS NULL
	RETURNING m.id, m.state, m.topic`

// What reclaimSQL does with a row: it ends it cancelled when its cancel
// was requested, dead when its orphan budget is used up, and requeues it
// otherwise. The SET reads the row as it is once locked.
const (
	reclaimCancels     = `m.cancel_requested_at IS NOT NULL`
	reclaimDeadLetters = `($3::int > 0 AND m.orphaned + 1 >= $3::int)`
	reclaimEnds        = `(` + reclaimCancels + ` OR ` + reclaimDeadLetters + `)`
)

// reclaimSet is the SET list of a reclaim of the row m from the claim of
// worker at claimedAt (expressions): cancelled, dead or queued again
// (reclaimCancels, reclaimDeadLetters), its orphaning counted, marked
// suspect, with its last error saying why.
func reclaimSet(worker, claimedAt string) string {
	return `
		state = CASE WHEN ` + reclaimCancels + ` THEN 'cancelled' WHEN ` + reclaimDeadLetters + ` THEN 'dead' ELSE 'queued' END,
		claimed_by = CASE WHEN ` + reclaimEnds + ` THEN ` + worker + ` END,
		claimed_at = CASE WHEN ` + reclaimEnds + ` THEN ` + claimedAt + ` END,
		finished_at = CASE WHEN ` + reclaimEnds + ` THEN now() END,
		available_at = CASE WHEN ` + reclaimEnds + ` THEN m.available_at ELSE now() END,
		orphaned = m.orphaned + 1,
		suspect = true,
		last_error = ` + reclaimError(worker)
}

// reclaimError is the last error reclaimSQL gives a row it reclaims from
// the worker (an expression).
func reclaimError(worker string) string {
	return `CASE
			WHEN ` + reclaimCancels + `
			THEN format('%s worker %s stopped heartbeating; cancelled by the reaper, as its cancel was requested',
				$4::text, ` + worker + `)
			WHEN ` + reclaimDeadLetters + `
			THEN format('%s worker %s stopped heartbeating; dead-lettered after its claim was orphaned %s times (orphan max %s)',
				$4::text, ` + worker + `, m.orphaned + 1, $3::int)
			ELSE format('%s worker %s stopped heartbeating; requeued by the reaper', $4::text, ` + worker + `) END`
}

// reclaimLocksSQL deletes the locks whose holder is not in $1 and that were
// acquired at least $2 µs ago, and the locks held under claims that no
// longer hold their message (those the reclaim just ended). It runs after
// reclaimSQL in the same transaction and sees its changes.
var reclaimLocksSQL = `
	DELETE FROM tw_locks l
	WHERE (NOT (l.holder = ANY ($1::text[])) AND l.acquired_at <= now() - $2::bigint * interval '1 microsecond')
		OR NOT ` + lockHeld + `
	RETURNING l.name`

// withinGraceSQL counts what the grace protected in this pass: running
// messages of claimers not in $1 and locks of holders not in $1, younger
// than $2 µs.
const withinGraceSQL = `
	SELECT
		(SELECT count(*) FROM tw_messages
			WHERE state = 'running' AND claimed_at > now() - $2::bigint * interval '1 microsecond'
				AND NOT (claimed_by = ANY ($1::text[])))
		+ (SELECT coalesce(sum(cardinality(ids)), 0) FROM tw_claims
			WHERE claimed_at > now() - $2::bigint * interval '1 microsecond' AND NOT (worker = ANY ($1::text[])))
		+ (SELECT count(*) FROM tw_locks
			WHERE acquired_at > now() - $2::bigint * interval '1 microsecond'
				AND NOT (holder = ANY ($1::text[])))`

// readReclaimed reads the rows of reclaimSQL or reclaimClaimsSQL into
// res, and their topics into topics.
func readReclaimed(br pgx.BatchResults, res *broker.ReclaimResult, topics map[string]bool) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			id           int64
			state, topic string
		)
		if err := rows.Scan(&id, &state, &topic); err != nil {
			return err
		}
		res.IDs = append(res.IDs, id)
		topics[topic] = true
		switch state {
		case broker.StateDead:
			res.DeadLettered++
		case broker.StateCancelled:
			res.Cancelled++
		default:
			res.Reclaimed++
		}
	}
	return rows.Err()
}

// ReclaimOrphans, in one transaction: running messages whose claimer is
// not in req.Live and that were claimed at least req.Grace ago go back to
// queued (claim fields and token cleared, available now) or, once their
// attempts reached req.MaxAttempts (when positive), to dead, or to
// cancelled when their cancel was requested; their last error says why.
// Locks whose holder is not in req.Live, acquired at least req.Grace ago,
// are deleted, and so are the locks held under the claims
// just reclaimed. Times are database time. WithinGrace counts the
// orphan candidates (messages and locks) the grace kept.
//
// With req.Fence the pass is a leader-only write: the lease row is locked
// first and the pass goes ahead only while Fence.Holder holds it at
// Fence.Term, unexpired (broker.ErrNotLeader otherwise, nothing changed).
// The request is checked (sqlstore.Store.ReclaimOrphans).
func (d dialect) ReclaimOrphans(ctx context.Context, req broker.ReclaimRequest) (broker.ReclaimResult, error) {
	live := slices.Clone(req.Live)
	var res broker.ReclaimResult
	var topics map[string]bool
	err := d.b.run(ctx, "reclaim orphans", func(c *pgx.Conn) error {
		res, topics = broker.ReclaimResult{}, map[string]bool{}
		return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			if err := checkFence(ctx, tx, req.Fence); err != nil {
				return err
			}
			batch := &pgx.Batch{}
			batch.Queue(lockDeadClaimsSQL, live, micros(req.Grace))
			batch.Queue(reclaimSQL, live, micros(req.Grace), req.MaxAttempts, broker.OrphanedErrorPrefix)
			batch.Queue(reclaimClaimsSQL, live, micros(req.Grace), req.MaxAttempts, broker.OrphanedErrorPrefix)
			batch.Queue(reclaimLocksSQL, live, micros(req.Grace))
			batch.Queue(withinGraceSQL, live, micros(req.Grace))
			br := tx.SendBatch(ctx, batch)
			defer br.Close()
			if _, err := br.Exec(); err != nil {
				return err
			}
			for range 2 {
				if err := readReclaimed(br, &res, topics); err != nil {
					return err
				}
			}
			tag, err := br.Exec()
			if err != nil {
				return err
			}
			res.LocksReleased = int(tag.RowsAffected())
			if err := br.QueryRow().Scan(&res.WithinGrace); err != nil {
				return err
			}
			return br.Close()
		})
	})
	if err != nil {
		return broker.ReclaimResult{}, err
	}
	sort.Slice(res.IDs, func(i, j int) bool { return res.IDs[i] < res.IDs[j] })
	// The requeued messages are claimable now, and every reclaimed one
	// freed its slot: announce their topics, so that the pools that wait
	// for announcements claim them at once rather than at their fallback
	// poll.
	if len(topics) > 0 {
		reqs := make([]broker.SubmitRequest, 0, len(topics))
		for topic := range topics {
			reqs = append(reqs, broker.SubmitRequest{Topic: topic})
		}
		d.b.announce.add(reqs)
	}
	if res.Reclaimed+res.DeadLettered+res.Cancelled+res.LocksReleased > 0 {
		d.b.log.Info("reclaimed orphans", "reclaimed", res.Reclaimed, "dead_lettered", res.DeadLettered, "cancelled", res.Cancelled,
			"locks_released", res.LocksReleased)
	}
	return res, nil
}
