package local

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// Ack marks the outcomes' messages done in one transaction, each only if
// it is still running under its token (broker.ErrClaimLost in its slot
// otherwise), releasing the locks held under those claims and storing the
// reports of the outcomes it applied. A result that
// is not JSON makes the whole call fail with broker.ErrInvalid before
// anything changes.
func (b *Broker) Ack(ctx context.Context, outcomes []broker.Outcome) ([]error, error) {
	if err := broker.CheckOutcomes(outcomes); err != nil {
		return nil, err
	}
	if len(outcomes) == 0 {
		leave, err := b.enter(ctx)
		if err != nil {
			return nil, err
		}
		leave()
		return []error{}, nil
	}
	errs := make([]error, len(outcomes))
	seen := make(map[int64]bool, len(outcomes))
	type ackArg struct {
		I int64   `json:"i"`
		T string  `json:"t"`
		R *string `json:"r,omitempty"`
	}
	args := make([]ackArg, len(outcomes))
	// One message named twice takes the slow path. (Results are valid
	// UTF-8, checked above, so the JSON array carries their bytes as they
	// are.)
	oneByOne := false
	for i, o := range outcomes {
		oneByOne = oneByOne || seen[o.Claim.ID]
		seen[o.Claim.ID] = true
		args[i] = ackArg{I: o.Claim.ID, T: o.Claim.Token}
		if len(o.Result) > 0 {
			r := string(o.Result)
			args[i].R = &r
		}
	}
	js, err := json.Marshal(args)
	if err != nil {
		return nil, err
	}
	err = b.write(ctx, "ack", func(tx *txn, now time.Time) error {
		clear(errs)
		if oneByOne {
			// Of outcomes naming one message, the first that holds it
			// wins, as one at a time.
			if err := ackEach(tx, outcomes, errs, now); err != nil {
				return err
			}
			return addOutcomeReports(tx, outcomes, errs, now)
		}
		// One statement acks them all; the claims go in as a JSON array.
		rows, err := tx.Query(`UPDATE tw_messages
			SET state = 'done', finished_at = ?1, token = NULL, result = coalesce(c.value ->> 'r', tw_messages.result)
			FROM json_each(?2) AS c
			WHERE tw_messages.id = c.value ->> 'i' AND +tw_messages.state = 'running' AND tw_messages.token = c.value ->> 't'
			RETURNING id`, ns(now), string(js))
		if err != nil {
			return err
		}
		acked := make(map[int64]bool, len(outcomes))
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return err
			}
			acked[id] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for i, o := range outcomes {
			if !acked[o.Claim.ID] {
				errs[i] = broker.ErrClaimLost
			}
		}
		// Locks held under the acked claims go. A claim that was not
		// acked holds no locks: they went when it ended.
		_, err = tx.Exec(`DELETE FROM tw_locks WHERE (message_id, token) IN (
			SELECT c.value ->> 'i', c.value ->> 't' FROM json_each(?1) AS c)`, string(js))
		if err != nil {
			return err
		}
		return addOutcomeReports(tx, outcomes, errs, now)
	})
	if err != nil {
		return nil, err
	}
	return errs, nil
}

// ackEach acks outcomes one at a time.
func ackEach(tx *txn, outcomes []broker.Outcome, errs []error, now time.Time) error {
	upd, err := tx.Prepare(`UPDATE tw_messages
		SET state = 'done', finished_at = ?, token = NULL, result = coalesce(?, result)
		WHERE id = ? AND state = 'running' AND token = ?`)
	if err != nil {
		return err
	}
	for i, o := range outcomes {
		var result sql.NullString
		if len(o.Result) > 0 {
			result = sql.NullString{String: string(o.Result), Valid: true}
		}
		res, err := upd.Exec(ns(now), result, o.Claim.ID, o.Claim.Token)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			errs[i] = broker.ErrClaimLost
			continue
		}
		if _, err := tx.Exec(`DELETE FROM tw_locks WHERE message_id = ? AND token = ?`, o.Claim.ID, o.Claim.Token); err != nil {
			return err
		}
	}
	return nil
}

// heldTopic returns the topic of the message c holds (running under its
// token) and whether its cancel was requested, or broker.ErrClaimLost, and
// releases the locks held under c: the caller is ending the claim.
func heldTopic(tx *txn, c broker.Claim) (string, bool, error) {
	var (
		topic           string
		cancelRequested bool
	)
	err := tx.QueryRow(`SELECT topic, cancel_requested_at IS NOT NULL FROM tw_messages WHERE id = ? AND state = 'running' AND token = ?`,
		c.ID, c.Token).Scan(&topic, &cancelRequested)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, broker.ErrClaimLost
	}
	if err != nil {
		return "", false, err
	}
	if _, err := tx.Exec(`DELETE FROM tw_locks WHERE message_id = ? AND token = ?`, c.ID, c.Token); err != nil {
		return "", false, err
	}
	return topic, cancelRequested, nil
}

// Nack ends an attempt without success; see package broker's
// documentation.
func (b *Broker) Nack(ctx context.Context, req broker.NackRequest) error {
	if err := broker.CheckDelay(req.Delay); err != nil {
		return err
	}
	if err := broker.CheckOutcomeReport(req.Claim, req.Report); err != nil {
		return err
	}
	req.Error = broker.CleanText(req.Error)
	return b.write(ctx, "nack", func(tx *txn, now time.Time) error {
		topic, cancelRequested, err := heldTopic(tx, req.Claim)
		if err != nil {
			return err
		}
		if err := addOutcomeReport(tx, req.Report, now); err != nil {
			return err
		}
		if req.Cancel || (req.Requeue && cancelRequested) {
			reason := req.Error
			if reason == "" {
				reason = broker.CancelledError
			}
			return finish(tx, req.Claim.ID, broker.StateCancelled, reason, req.Suspect, now)
		}
		if req.Requeue {
			_, err := tx.Exec(`UPDATE tw_messages
				SET state = 'queued', claimed_by = NULL, claimed_at = NULL, token = NULL,
					finished_at = NULL, available_at = ?, last_error = ?,
					attempts = CASE WHEN ? THEN max(attempts - 1, 0) ELSE attempts END,
					suspect = ?, waiting_since = ?
				WHERE id = ?`, addNS(now, req.Delay), req.Error, req.NotRun, req.Suspect, nullNS(req.WaitingSince), req.Claim.ID)
			return err
		}
		deadLetter := true
		err = tx.QueryRow(`SELECT dead_letter_enabled FROM tw_topics WHERE name = ?`, topic).Scan(&deadLetter)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		state := broker.StateFailed
		if deadLetter {
			state = broker.StateDead
		}
		return finish(tx, req.Claim.ID, state, req.Error, req.Suspect, now)
	})
}

// finish ends a running message (whose locks are already released) in
// state, with lastError, marked suspect or not (broker.Message.Suspect).
func finish(tx *txn, id int64, state, lastError string, suspect bool, now time.Time) error {
	_, err := tx.Exec(`UPDATE tw_messages
		SET state = ?, token = NULL, finished_at = ?, last_error = ?, suspect = ?, waiting_since = NULL
		WHERE id = ?`, state, ns(now), lastError, suspect, id)
	return err
}

// DeadLetter ends an attempt dead with reason as its last error, whatever
// the topic's dead-letter setting, storing report with it.
func (b *Broker) DeadLetter(ctx context.Context, c broker.Claim, reason string, report *broker.Report) error {
	if err := broker.CheckOutcomeReport(c, report); err != nil {
		return err
	}
	reason = broker.CleanText(reason)
	return b.write(ctx, "dead letter", func(tx *txn, now time.Time) error {
		if _, _, err := heldTopic(tx, c); err != nil {
			return err
		}
		if err := addOutcomeReport(tx, report, now); err != nil {
			return err
		}
		return finish(tx, c.ID, broker.StateDead, reason, false, now)
	})
}
