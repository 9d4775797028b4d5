package local

import (
	"context"
	"database/sql"
	"encoding/json"
	"time"

	"github.com/taskhost/taskhost/broker"
)

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
