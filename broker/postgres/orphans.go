package postgres

import (
	"context"
	"slices"
	"sort"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
)

// The statements of a reclaim, of one of two kinds. A reaper pass takes
// the claims (and locks) of workers not in $1 (the live set) made at
// least $2 microseconds ago; a reclaim of dead workers (ReclaimDead) takes those of
// the workers in $1, whatever their age. newReclaimQueries builds one
// kind from its condition on a claimer column and the column of the
// claim's time (taken), and the words its last errors say of the claimer
// (why).
type reclaimQueries struct {
	// lockClaims locks, in id order, the claim rows (claims.go) to be
	// reclaimed: claims, a statement of its own after it, then reads them
	// as the outcomes that went first left them.
	lockClaims string
	// messages requeues (or, once the message has been orphaned $3 times
	// counting this one, when $3 > 0, dead-letters) the running messages
	// to be reclaimed, marking them suspect; $4 starts their last error.
	// A message whose cancel was requested ends cancelled instead. Rows
	// are locked in id order first (as Ack does), so a concurrent ack
	// either lands before (and the row is no longer running) or waits and
	// then finds its token gone.
	messages string
	// claims is messages for the messages that claim rows hold: it
	// deletes the claim rows and ends or requeues their messages as
	// messages does a running row, counting the attempt the claim made.
	claims string
	// locks deletes the locks of the claimers to be reclaimed and the
	// locks held under claims that no longer hold their message (those
	// just ended). It runs after messages in the same transaction and
	// sees its changes.
	locks string
	// withinGrace counts what the grace protected: running messages,
	// claim rows and locks of the claimers not in $1, younger than $2 microseconds.
	// Empty for a reclaim of dead workers, which asks no age.
	withinGrace string
}

var (
	orphanReclaim = newReclaimQueries(func(claimer, at string) string {
		return at + ` <= now() - $2::bigint * interval '1 microsecond' AND NOT (` + claimer + ` = ANY ($1::text[]))`
	}, "stopped heartbeating", withinGraceSQL)
	// The grace ($2) of a reclaim of dead workers is 0, and their claims
	// are taken whatever their age: the condition names it only for the
	// statements to keep one list of parameters.
	deadReclaim = newReclaimQueries(func(claimer, _ string) string {
		return claimer + ` = ANY ($1::text[]) AND $2::bigint = 0`
	}, "ended (its process exited)", "")
)

func newReclaimQueries(taken func(claimer, at string) string, why, withinGrace string) reclaimQueries {
	return reclaimQueries{
		lockClaims: `
	SELECT 1 FROM tw_claims
	WHERE ` + taken("worker", "claimed_at") + `
	ORDER BY id FOR UPDATE`,
		messages: `
	WITH orphan AS (
		SELECT id FROM tw_messages
		WHERE state = 'running' AND ` + taken("claimed_by", "claimed_at") + `
		ORDER BY id
		FOR UPDATE
	)
	UPDATE tw_messages m SET ` + reclaimSet("m.claimed_by", "m.claimed_at", why) + `, token = NULL
	WHERE m.id = ANY (ARRAY (SELECT id FROM orphan))
	RETURNING m.id, m.state, m.topic`,
		claims: `
	WITH dead AS (
		DELETE FROM tw_claims
		WHERE ` + taken("worker", "claimed_at") + `
		RETURNING worker, claimed_at, ids
	), h AS (
		SELECT x AS id, worker, claimed_at FROM dead, unnest(dead.ids) x
	)
	UPDATE tw_messages m SET ` + reclaimSet("h.worker", "h.claimed_at", why) + `, attempts = m.attempts + 1
	FROM h
	WHERE m.id = h.id AND m.state = 'queued' AND m.token IS NULL
	RETURNING m.id, m.state, m.topic`,
		locks: `
	DELETE FROM tw_locks l
	WHERE (` + taken("l.holder", "l.acquired_at") + `)
		OR NOT ` + lockHeld + `
	RETURNING l.name`,
		withinGrace: withinGrace,
	}
}

// withinGraceSQL is reclaimQueries.withinGrace of a reaper pass.
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

// What a reclaim does with a row: it ends it cancelled when its cancel
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
func reclaimSet(worker, claimedAt, why string) string {
	return `
		state = CASE WHEN ` + reclaimCancels + ` THEN 'cancelled' WHEN ` + reclaimDeadLetters + ` THEN 'dead' ELSE 'queued' END,
		claimed_by = CASE WHEN ` + reclaimEnds + ` THEN ` + worker + ` END,
		claimed_at = CASE WHEN ` + reclaimEnds + ` THEN ` + claimedAt + ` END,
		finished_at = CASE WHEN ` + reclaimEnds + ` THEN now() END,
		available_at = CASE WHEN ` + reclaimEnds + ` THEN m.available_at ELSE now() END,
		orphaned = m.orphaned + 1,
		suspect = true,
		last_error = ` + reclaimError(worker, why)
}

// reclaimError is the last error a reclaim gives a row it reclaims from
// the worker (an expression); why says what became of the worker.
func reclaimError(worker, why string) string {
	return `CASE
			WHEN ` + reclaimCancels + `
			THEN format('%s worker %s ` + why + `; cancelled by the reaper, as its cancel was requested',
				$4::text, ` + worker + `)
			WHEN ` + reclaimDeadLetters + `
			THEN format('%s worker %s ` + why + `; dead-lettered after its claim was orphaned %s times (orphan max %s)',
				$4::text, ` + worker + `, m.orphaned + 1, $3::int)
			ELSE format('%s worker %s ` + why + `; requeued by the reaper', $4::text, ` + worker + `) END`
}

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
//
// With req.Dead (sqlstore.Store.ReclaimDead) it is the same for the
// claims and locks of the workers it names, whatever their age, and
// nothing else.
func (d dialect) ReclaimOrphans(ctx context.Context, req broker.ReclaimRequest) (broker.ReclaimResult, error) {
	q, who := orphanReclaim, slices.Clone(req.Live)
	if len(req.Dead) > 0 {
		q, who = deadReclaim, slices.Clone(req.Dead)
	}
	var res broker.ReclaimResult
	var topics map[string]bool
	err := d.b.run(ctx, "reclaim orphans", func(c *pgx.Conn) error {
		res, topics = broker.ReclaimResult{}, map[string]bool{}
		return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			if err := checkFence(ctx, tx, req.Fence); err != nil {
				return err
			}
			batch := &pgx.Batch{}
			batch.Queue(q.lockClaims, who, micros(req.Grace))
			batch.Queue(q.messages, who, micros(req.Grace), req.MaxAttempts, broker.OrphanedErrorPrefix)
			batch.Queue(q.claims, who, micros(req.Grace), req.MaxAttempts, broker.OrphanedErrorPrefix)
			batch.Queue(q.locks, who, micros(req.Grace))
			if q.withinGrace != "" {
				batch.Queue(q.withinGrace, who, micros(req.Grace))
			}
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
			if q.withinGrace != "" {
				if err := br.QueryRow().Scan(&res.WithinGrace); err != nil {
					return err
				}
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
