package local

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// msgCols are the columns scanMessage reads, in its order.
const msgCols = `id, topic, task, payload, headers, state, attempts, max_attempts,
	claimed_by, claimed_at, token, available_at, created_at, finished_at, last_error, result`

type scanner interface{ Scan(dest ...any) error }

// scanMessage reads one row of msgCols; the token is kept only when
// withToken is set (Claim), never for reads.
func scanMessage(s scanner, withToken bool) (broker.Message, error) {
	var (
		m                         broker.Message
		payload                   []byte
		headers, claimedBy, token sql.NullString
		result                    sql.NullString
		claimedAt, finishedAt     sql.NullInt64
		availableAt, createdAt    int64
	)
	err := s.Scan(&m.ID, &m.Topic, &m.Task, &payload, &headers, &m.State, &m.Attempts, &m.MaxAttempts,
		&claimedBy, &claimedAt, &token, &availableAt, &createdAt, &finishedAt, &m.LastError, &result)
	if err != nil {
		return broker.Message{}, err
	}
	m.Payload = json.RawMessage(payload)
	if headers.Valid && headers.String != "" {
		if err := json.Unmarshal([]byte(headers.String), &m.Headers); err != nil {
			return broker.Message{}, fmt.Errorf("message %d: headers: %w", m.ID, err)
		}
		if len(m.Headers) == 0 {
			m.Headers = nil
		}
	}
	m.ClaimedBy = claimedBy.String
	if claimedAt.Valid {
		t := fromNS(claimedAt.Int64)
		m.ClaimedAt = &t
	}
	if withToken {
		m.Token = token.String
	}
	m.AvailableAt = fromNS(availableAt)
	m.CreatedAt = fromNS(createdAt)
	if finishedAt.Valid {
		t := fromNS(finishedAt.Int64)
		m.FinishedAt = &t
	}
	if result.Valid {
		m.Result = json.RawMessage(result.String)
	}
	return m, nil
}

// Submit validates req and queues it; see package broker's
// documentation.
func (b *Broker) Submit(ctx context.Context, req broker.SubmitRequest) (int64, error) {
	if err := broker.ValidateSubmit(req, b.opts.MaxPayload); err != nil {
		return 0, err
	}
	var id int64
	err := b.write(ctx, "submit", func(tx *txn, now time.Time) error {
		var err error
		id, err = insertMessage(tx, req, now)
		return err
	})
	if err != nil {
		return 0, err
	}
	return id, nil
}

var _ broker.BatchSubmitter = (*Broker)(nil)

// SubmitMany queues reqs in one transaction (one commit for them all), or
// none of them when one is invalid.
func (b *Broker) SubmitMany(ctx context.Context, reqs []broker.SubmitRequest) ([]int64, error) {
	if err := broker.ValidateSubmitMany(reqs, b.opts.MaxPayload); err != nil {
		return nil, err
	}
	ids := make([]int64, len(reqs))
	if len(reqs) == 0 {
		leave, err := b.enter(ctx)
		if err != nil {
			return nil, err
		}
		leave()
		return ids, nil
	}
	err := b.write(ctx, "submit many", func(tx *txn, now time.Time) error {
		for i, req := range reqs {
			id, err := insertMessage(tx, req, now)
			if err != nil {
				return err
			}
			ids[i] = id
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// insertMessage queues the validated req in tx, creating its topic's row
// when missing, and returns its id: Submit's write, which FireSchedule
// shares.
func insertMessage(tx *txn, req broker.SubmitRequest, now time.Time) (int64, error) {
	payload := "{}"
	if len(req.Payload) > 0 {
		payload = string(req.Payload)
	}
	var headers sql.NullString
	if len(req.Headers) > 0 {
		h, err := json.Marshal(req.Headers)
		if err != nil {
			return 0, broker.Invalid("headers: %v", err)
		}
		headers = sql.NullString{String: string(h), Valid: true}
	}
	if _, err := tx.Exec(`INSERT INTO tw_topics (name) VALUES (?) ON CONFLICT (name) DO NOTHING`, req.Topic); err != nil {
		return 0, err
	}
	var id int64
	err := tx.QueryRow(`INSERT INTO tw_messages
		(topic, task, payload, headers, state, max_attempts, available_at, created_at)
		VALUES (?, ?, ?, ?, 'queued', ?, ?, ?) RETURNING id`,
		req.Topic, req.Task, payload, headers, req.MaxAttempts, addNS(now, req.Delay), ns(now)).Scan(&id)
	return id, err
}

// Claim takes up to req.Max available messages in one IMMEDIATE
// transaction; see package broker's documentation for the
// order. The write lock the transaction holds is what makes counting a
// topic's running rows and claiming queued ones race-free across
// processes.
func (b *Broker) Claim(ctx context.Context, req broker.ClaimRequest) ([]broker.Message, error) {
	if req.WorkerID == "" {
		return nil, broker.Invalid("worker id is empty")
	}
	want := max(req.Max, 1)
	var topics []string
	for _, t := range req.Topics {
		if !slices.Contains(topics, t) {
			topics = append(topics, t)
		}
	}
	if len(topics) == 0 {
		leave, err := b.enter(ctx)
		if err != nil {
			return nil, err
		}
		leave()
		return nil, nil
	}
	start := int((b.rr.Add(1) - 1) % uint64(len(topics)))

	// Peek first, in a read snapshot: an idle worker polling empty topics
	// then never takes the write lock, which every process shares. Finding
	// nothing in a snapshot is the same answer as a claim made at that
	// instant, so this changes no outcome.
	var found bool
	err := b.read(ctx, "claim", func(tx *txn, now time.Time) error {
		for _, t := range topics {
			ids, err := claimable(tx, t, 1, now)
			if err != nil || len(ids) > 0 {
				found = len(ids) > 0
				return err
			}
		}
		return nil
	})
	if err != nil || !found {
		return nil, err
	}

	var out []broker.Message
	err = b.write(ctx, "claim", func(tx *txn, now time.Time) error {
		out = nil
		// The candidates of each topic, in the rotated topic order: at
		// most what the topic's limit still admits, oldest first.
		cands := make([][]int64, 0, len(topics))
		for i := range topics {
			ids, err := claimable(tx, topics[(start+i)%len(topics)], want, now)
			if err != nil {
				return err
			}
			cands = append(cands, ids)
		}
		// Round-robin: each pass takes one message per topic.
		var order []int64
		for len(order) < want {
			progress := false
			for i := range cands {
				if len(order) >= want {
					break
				}
				if len(cands[i]) > 0 {
					order = append(order, cands[i][0])
					cands[i] = cands[i][1:]
					progress = true
				}
			}
			if !progress {
				break
			}
		}
		if len(order) == 0 {
			return nil
		}
		// One statement claims them all: the ids and their fresh tokens
		// go in as a JSON array. (The unary + keeps SQLite from driving
		// the update by the state index instead of the ids.)
		type claimArg struct {
			I int64  `json:"i"`
			T string `json:"t"`
		}
		args := make([]claimArg, len(order))
		for i, id := range order {
			args[i] = claimArg{I: id, T: newToken()}
		}
		js, err := json.Marshal(args)
		if err != nil {
			return err
		}
		rows, err := tx.Query(`UPDATE tw_messages
			SET state = 'running', claimed_by = ?1, claimed_at = ?2, attempts = attempts + 1, token = c.value ->> 't'
			FROM json_each(?3) AS c
			WHERE tw_messages.id = c.value ->> 'i' AND +tw_messages.state = 'queued'
			RETURNING `+msgCols, req.WorkerID, ns(now), string(js))
		if err != nil {
			return err
		}
		defer rows.Close()
		byID := make(map[int64]broker.Message, len(order))
		for rows.Next() {
			m, err := scanMessage(rows, true)
			if err != nil {
				return err
			}
			byID[m.ID] = m
		}
		if err := rows.Err(); err != nil {
			return err
		}
		out = make([]broker.Message, 0, len(order))
		for _, id := range order {
			m, ok := byID[id]
			if !ok {
				return fmt.Errorf("message %d was not claimed", id)
			}
			out = append(out, m)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// claimable returns the ids of up to want available queued messages of
// topic, oldest first, that its concurrency limit admits now. Paused and
// unknown topics admit none.
func claimable(tx *txn, topic string, want int, now time.Time) ([]int64, error) {
	var limit int
	var paused bool
	err := tx.QueryRow(`SELECT concurrency_limit, paused FROM tw_topics WHERE name = ?`, topic).Scan(&limit, &paused)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && paused) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if limit > 0 {
		var running int
		err := tx.QueryRow(`SELECT count(*) FROM tw_messages WHERE topic = ? AND state = 'running'`, topic).Scan(&running)
		if err != nil {
			return nil, err
		}
		want = min(want, limit-running)
	}
	if want <= 0 {
		return nil, nil
	}
	rows, err := tx.Query(`SELECT id FROM tw_messages
		WHERE topic = ? AND state = 'queued' AND available_at <= ?
		ORDER BY available_at, id LIMIT ?`, topic, ns(now), want)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// Ack marks the outcomes' messages done in one transaction, each only if
// it is still running under its token (broker.ErrClaimLost in its slot
// otherwise), releasing the locks held under those claims. A result that
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
			return ackEach(tx, outcomes, errs, now)
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
		return err
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
// token), or broker.ErrClaimLost, and releases the locks held under c: the
// caller is ending the claim.
func heldTopic(tx *txn, c broker.Claim) (string, error) {
	var topic string
	err := tx.QueryRow(`SELECT topic FROM tw_messages WHERE id = ? AND state = 'running' AND token = ?`,
		c.ID, c.Token).Scan(&topic)
	if errors.Is(err, sql.ErrNoRows) {
		return "", broker.ErrClaimLost
	}
	if err != nil {
		return "", err
	}
	if _, err := tx.Exec(`DELETE FROM tw_locks WHERE message_id = ? AND token = ?`, c.ID, c.Token); err != nil {
		return "", err
	}
	return topic, nil
}

// Nack ends an attempt without success; see package broker's
// documentation.
func (b *Broker) Nack(ctx context.Context, req broker.NackRequest) error {
	if err := broker.CheckDelay(req.Delay); err != nil {
		return err
	}
	req.Error = broker.CleanText(req.Error)
	return b.write(ctx, "nack", func(tx *txn, now time.Time) error {
		topic, err := heldTopic(tx, req.Claim)
		if err != nil {
			return err
		}
		if req.Requeue {
			_, err := tx.Exec(`UPDATE tw_messages
				SET state = 'queued', claimed_by = NULL, claimed_at = NULL, token = NULL,
					finished_at = NULL, available_at = ?, last_error = ?,
					attempts = CASE WHEN ? THEN max(attempts - 1, 0) ELSE attempts END
				WHERE id = ?`, addNS(now, req.Delay), req.Error, req.NotRun, req.Claim.ID)
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
		return finish(tx, req.Claim.ID, state, req.Error, now)
	})
}

// finish ends a running message (whose locks are already released) in
// state, with lastError.
func finish(tx *txn, id int64, state, lastError string, now time.Time) error {
	_, err := tx.Exec(`UPDATE tw_messages
		SET state = ?, token = NULL, finished_at = ?, last_error = ?
		WHERE id = ?`, state, ns(now), lastError, id)
	return err
}

// DeadLetter ends an attempt dead with reason as its last error, whatever
// the topic's dead-letter setting.
func (b *Broker) DeadLetter(ctx context.Context, c broker.Claim, reason string) error {
	reason = broker.CleanText(reason)
	return b.write(ctx, "dead letter", func(tx *txn, now time.Time) error {
		if _, err := heldTopic(tx, c); err != nil {
			return err
		}
		return finish(tx, c.ID, broker.StateDead, reason, now)
	})
}
