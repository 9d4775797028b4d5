package local

import (
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/taskhost/taskhost/broker"
)

// msgCols are the columns scanMessage reads, in its order.
const msgCols = `id, topic, task, payload, headers, state, attempts, max_attempts,
	claimed_by, claimed_at, token, available_at, created_at, finished_at, last_error, result,
	suspect, waiting_since,
	cancel_requested_at, priority, unique_key`

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
		waitingSince              sql.NullInt64
		cancelRequestedAt         sql.NullInt64
		uniqueKey                 sql.NullString
		availableAt, createdAt    int64
	)
	err := s.Scan(&m.ID, &m.Topic, &m.Task, &payload, &headers, &m.State, &m.Attempts, &m.MaxAttempts,
		&claimedBy, &claimedAt, &token, &availableAt, &createdAt, &finishedAt, &m.LastError, &result,
		&m.Suspect, &waitingSince,
		&cancelRequestedAt, &m.Priority, &uniqueKey)
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
	m.ClaimedBy, m.UniqueKey = claimedBy.String, uniqueKey.String
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
	if waitingSince.Valid {
		t := fromNS(waitingSince.Int64)
		m.WaitingSince = &t
	}
	if cancelRequestedAt.Valid {
		t := fromNS(cancelRequestedAt.Int64)
		m.CancelRequestedAt = &t
	}
	if result.Valid {
		m.Result = json.RawMessage(result.String)
	}
	return m, nil
}
