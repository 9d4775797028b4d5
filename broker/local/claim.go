package local

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/taskhost/taskhost/broker"
)

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
	topics := broker.ClaimOrder(req.Topics, b.rr.Add(1)-1)
	if len(topics) == 0 {
		leave, err := b.enter(ctx)
		if err != nil {
			return nil, err
		}
		leave()
		return nil, nil
	}

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
			ids, err := claimable(tx, topics[i], want, now)
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
			args[i] = claimArg{I: id, T: broker.NewToken()}
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
// topic, the highest priority first and then the oldest, that its concurrency limit admits now. Paused and
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
		ORDER BY priority DESC, available_at, id LIMIT ?`, topic, ns(now), want)
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
