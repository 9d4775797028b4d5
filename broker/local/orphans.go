package local

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/sqlstore"
)

// ReclaimOrphans does one checked reaper pass (see
// sqlstore.Store.ReclaimOrphans) in one IMMEDIATE transaction: the
// orphans are read, then each has its locks released and is requeued or
// dead-lettered with a reason of its own.
//
// With req.Dead (sqlstore.Store.ReclaimDead) it is the same for the
// claims and locks of the workers it names, whatever their age, and
// nothing else.
func (d dialect) ReclaimOrphans(ctx context.Context, req broker.ReclaimRequest) (broker.ReclaimResult, error) {
	// The claimers whose claims and locks are taken: those not in the
	// live set and at least the grace old, or those named dead.
	who, taken, why := req.Live, `claimed_by NOT IN (SELECT value FROM json_each(?)) AND claimed_at <= ?`, "stopped heartbeating"
	takenLock := `holder NOT IN (SELECT value FROM json_each(?)) AND acquired_at <= ?`
	dead := len(req.Dead) > 0
	if dead {
		who, taken, why = req.Dead, `claimed_by IN (SELECT value FROM json_each(?)) AND ? IS NOT NULL`, "ended (its process exited)"
		takenLock = `holder IN (SELECT value FROM json_each(?)) AND ? IS NOT NULL`
	}
	whoJSON, err := json.Marshal(who)
	if err != nil {
		return broker.ReclaimResult{}, broker.Invalid("workers: %v", err)
	}
	var res broker.ReclaimResult
	err = d.b.write(ctx, "reclaim orphans", func(tx *txn, now time.Time) error {
		res = broker.ReclaimResult{}
		if err := sqlstore.CheckFence(&conn{tx: tx, now: now}, &queries, req.Fence); err != nil {
			return err
		}
		cutoff := addNS(now, -req.Grace)
		type orphan struct {
			id       int64
			attempts int
			orphaned int
			by       string
			token    string
			cancel   bool // its cancel was requested
		}
		var orphans []orphan
		rows, err := tx.Query(`SELECT id, attempts, orphaned, claimed_by, token, cancel_requested_at IS NOT NULL FROM tw_messages
			WHERE state = 'running' AND `+taken+`
			ORDER BY id`, string(whoJSON), cutoff)
		if err != nil {
			return err
		}
		for rows.Next() {
			var o orphan
			if err := rows.Scan(&o.id, &o.attempts, &o.orphaned, &o.by, &o.token, &o.cancel); err != nil {
				rows.Close()
				return err
			}
			orphans = append(orphans, o)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}

		for _, o := range orphans {
			r, err := tx.Exec(`DELETE FROM tw_locks WHERE message_id = ? AND token = ?`, o.id, o.token)
			if err != nil {
				return err
			}
			n, err := r.RowsAffected()
			if err != nil {
				return err
			}
			res.LocksReleased += int(n)
			// Only orphanings count toward the orphan budget; error retries
			// claim too, but have their own limit.
			if _, err := tx.Exec(`UPDATE tw_messages SET orphaned = orphaned + 1 WHERE id = ?`, o.id); err != nil {
				return err
			}
			if o.cancel {
				reason := fmt.Sprintf(broker.OrphanedErrorPrefix+" worker %q %s during attempt %d; cancelled by the reaper, as its cancel was requested",
					o.by, why, o.attempts)
				if err := finish(tx, o.id, broker.StateCancelled, reason, true, now); err != nil {
					return err
				}
				res.Cancelled++
			} else if req.MaxAttempts > 0 && o.orphaned+1 >= req.MaxAttempts {
				reason := fmt.Sprintf(broker.OrphanedErrorPrefix+" worker %q %s during attempt %d; its claim was orphaned %d times (orphan max %d); dead-lettered by the reaper",
					o.by, why, o.attempts, o.orphaned+1, req.MaxAttempts)
				if err := finish(tx, o.id, broker.StateDead, reason, true, now); err != nil {
					return err
				}
				res.DeadLettered++
			} else {
				reason := fmt.Sprintf(broker.OrphanedErrorPrefix+" worker %q %s during attempt %d; requeued by the reaper", o.by, why, o.attempts)
				_, err := tx.Exec(`UPDATE tw_messages
					SET state = 'queued', claimed_by = NULL, claimed_at = NULL, token = NULL,
						available_at = ?, last_error = ?, suspect = 1
					WHERE id = ?`, ns(now), reason, o.id)
				if err != nil {
					return err
				}
				res.Reclaimed++
			}
			res.IDs = append(res.IDs, o.id)
		}

		r, err := tx.Exec(`DELETE FROM tw_locks WHERE `+takenLock, string(whoJSON), cutoff)
		if err != nil {
			return err
		}
		n, err := r.RowsAffected()
		if err != nil {
			return err
		}
		res.LocksReleased += int(n)

		if dead {
			return nil // no grace asked
		}
		// What the grace kept: claims and locks of non-live workers too
		// young to touch.
		var young, youngLocks int
		if err := tx.QueryRow(`SELECT count(*) FROM tw_messages
			WHERE state = 'running' AND claimed_at > ?
				AND claimed_by NOT IN (SELECT value FROM json_each(?))`, cutoff, string(whoJSON)).Scan(&young); err != nil {
			return err
		}
		if err := tx.QueryRow(`SELECT count(*) FROM tw_locks
			WHERE acquired_at > ? AND holder NOT IN (SELECT value FROM json_each(?))`, cutoff, string(whoJSON)).Scan(&youngLocks); err != nil {
			return err
		}
		res.WithinGrace = young + youngLocks
		return nil
	})
	if err != nil {
		return broker.ReclaimResult{}, err
	}
	if res.Reclaimed+res.DeadLettered+res.Cancelled+res.LocksReleased > 0 {
		d.b.log.Info("reclaimed orphans", "reclaimed", res.Reclaimed, "dead_lettered", res.DeadLettered, "cancelled", res.Cancelled,
			"locks_released", res.LocksReleased, "within_grace", res.WithinGrace, "ids", res.IDs)
	}
	return res, nil
}
