package local

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// Submit validates req and queues it; see package broker's
// documentation. A duplicate returns the holder's id and a
// *broker.DuplicateError.
func (b *Broker) Submit(ctx context.Context, req broker.SubmitRequest) (int64, error) {
	if err := broker.ValidateSubmit(req, b.opts.MaxPayload); err != nil {
		return 0, err
	}
	var s broker.Submitted
	err := b.write(ctx, "submit", func(tx *txn, now time.Time) error {
		var err error
		s, err = insertMessage(tx, req, now)
		return err
	})
	if err != nil {
		return 0, err
	}
	if s.Duplicate {
		return s.ID, &broker.DuplicateError{ID: s.ID, Key: req.UniqueKey}
	}
	return s.ID, nil
}

var _ broker.BatchSubmitter = (*Broker)(nil)

// SubmitMany queues reqs in one transaction (one commit for them all), or
// none of them when one is invalid.
func (b *Broker) SubmitMany(ctx context.Context, reqs []broker.SubmitRequest) ([]int64, error) {
	out, err := b.SubmitBatch(ctx, reqs)
	return broker.IDs(out), err
}

// SubmitBatch is SubmitMany saying which requests were duplicates.
func (b *Broker) SubmitBatch(ctx context.Context, reqs []broker.SubmitRequest) ([]broker.Submitted, error) {
	return b.submitBatch(ctx, reqs, nil)
}

// submitBatch is SubmitBatch; then, when not nil, runs in its transaction
// once the messages are stored (SubmitOutbox).
func (b *Broker) submitBatch(ctx context.Context, reqs []broker.SubmitRequest, then func(tx *txn, now time.Time, out []broker.Submitted) error) ([]broker.Submitted, error) {
	if err := broker.ValidateSubmitMany(reqs, b.opts.MaxPayload); err != nil {
		return nil, err
	}
	out := make([]broker.Submitted, len(reqs))
	if len(reqs) == 0 {
		leave, err := b.enter(ctx)
		if err != nil {
			return nil, err
		}
		leave()
		return out, nil
	}
	first := broker.FirstOfKey(reqs)
	err := b.write(ctx, "submit many", func(tx *txn, now time.Time) error {
		for i, req := range reqs {
			if first[i] >= 0 {
				out[i] = broker.Submitted{ID: out[first[i]].ID, Duplicate: true}
				continue
			}
			s, err := insertMessage(tx, req, now)
			if err != nil {
				return err
			}
			out[i] = s
		}
		if then != nil {
			return then(tx, now, out)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// insertMessage queues the validated req in tx, creating its topic's row
// when missing, and returns its id, or the id of the message holding its
// unique key (Duplicate set; nothing stored): Submit's write, which
// FireSchedule shares.
//
// The unique index tw_messages_unique decides a key held in the states
// (the INSERT does nothing on a conflict), and the key's row in
// tw_unique_keys the window: its upsert takes the row only when its latest
// message is older than the window, and otherwise the message just
// inserted is deleted again.
func insertMessage(tx *txn, req broker.SubmitRequest, now time.Time) (broker.Submitted, error) {
	payload := "{}"
	if len(req.Payload) > 0 {
		payload = string(req.Payload)
	}
	var headers sql.NullString
	if len(req.Headers) > 0 {
		h, err := json.Marshal(req.Headers)
		if err != nil {
			return broker.Submitted{}, broker.Invalid("headers: %v", err)
		}
		headers = sql.NullString{String: string(h), Valid: true}
	}
	if _, err := tx.Exec(`INSERT INTO tw_topics (name) VALUES (?) ON CONFLICT (name) DO NOTHING`, req.Topic); err != nil {
		return broker.Submitted{}, err
	}
	var (
		key, states sql.NullString
		id          int64
	)
	if req.UniqueKey != "" {
		key = sql.NullString{String: req.UniqueKey, Valid: true}
		states = sql.NullString{String: "," + strings.Join(broker.UniqueStates(req), ",") + ",", Valid: true}
	}
	err := tx.QueryRow(`INSERT INTO tw_messages
		(topic, task, payload, headers, state, max_attempts, available_at, created_at, priority, unique_key, unique_states)
		VALUES (?, ?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?)
		ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND instr(unique_states, ',' || state || ',') > 0 DO NOTHING
		RETURNING id`,
		req.Topic, req.Task, payload, headers, req.MaxAttempts, ns(req.AvailableAt(now)), ns(now),
		req.Priority, key, states).Scan(&id)
	if req.UniqueKey == "" || err != nil && !errors.Is(err, sql.ErrNoRows) {
		return broker.Submitted{ID: id}, err
	}
	if err != nil { // no row: the key is held
		var holder int64
		err := tx.QueryRow(`SELECT id FROM tw_messages
			WHERE unique_key = ? AND unique_key IS NOT NULL AND instr(unique_states, ',' || state || ',') > 0`,
			req.UniqueKey).Scan(&holder)
		return broker.Submitted{ID: holder, Duplicate: true}, err
	}
	var window sql.NullInt64
	if req.UniqueFor > 0 {
		window = sql.NullInt64{Int64: ns(now.Add(-req.UniqueFor)), Valid: true}
	}
	var took int
	err = tx.QueryRow(`INSERT INTO tw_unique_keys (key, message_id, created_at) VALUES (?1, ?2, ?3)
		ON CONFLICT (key) DO UPDATE SET message_id = excluded.message_id, created_at = excluded.created_at
		WHERE ?4 IS NULL OR tw_unique_keys.created_at <= ?4
		RETURNING 1`, req.UniqueKey, id, ns(now), window).Scan(&took)
	if err == nil {
		return broker.Submitted{ID: id}, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return broker.Submitted{}, err
	}
	// The window holds: undo the insert.
	if _, err := tx.Exec(`DELETE FROM tw_messages WHERE id = ?`, id); err != nil {
		return broker.Submitted{}, err
	}
	var holder int64
	err = tx.QueryRow(`SELECT message_id FROM tw_unique_keys WHERE key = ?`, req.UniqueKey).Scan(&holder)
	return broker.Submitted{ID: holder, Duplicate: true}, err
}
