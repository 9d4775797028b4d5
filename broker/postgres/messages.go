package postgres

import (
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/taskhost/taskhost/broker"
)

// msgCols are the columns scanMessage reads, in its order. Claim adds the
// token after them; nothing else ever reads it.
const msgCols = `id, topic, task, payload::text, headers::text, state, attempts, max_attempts,
	claimed_by, claimed_at, available_at, created_at, finished_at, last_error, result::text,
	suspect, waiting_since,
	cancel_requested_at, priority, unique_key`

// scanMessage reads one row of msgCols (and the token when tok is set),
// then any extra columns into extra.
func scanMessage(row pgx.Row, tok bool, extra ...any) (broker.Message, error) {
	var (
		m                       broker.Message
		headers                 []byte
		claimedBy, lastErr, tkn pgtype.Text
		uniqueKey               pgtype.Text
	)
	dest := append(make([]any, 0, 21+len(extra)), &m.ID, &m.Topic, &m.Task, (*[]byte)(&m.Payload), &headers, &m.State, &m.Attempts, &m.MaxAttempts,
		&claimedBy, &m.ClaimedAt, &m.AvailableAt, &m.CreatedAt, &m.FinishedAt, &lastErr, (*[]byte)(&m.Result),
		&m.Suspect, &m.WaitingSince,
		&m.CancelRequestedAt, &m.Priority, &uniqueKey)
	if tok {
		dest = append(dest, &tkn)
	}
	dest = append(dest, extra...)
	if err := row.Scan(dest...); err != nil {
		return broker.Message{}, err
	}
	if headers != nil {
		if err := json.Unmarshal(headers, &m.Headers); err != nil {
			return broker.Message{}, fmt.Errorf("message %d: headers: %w", m.ID, err)
		}
		if len(m.Headers) == 0 {
			m.Headers = nil
		}
	}
	m.ClaimedBy, m.LastError, m.Token = claimedBy.String, lastErr.String, tkn.String
	m.UniqueKey = uniqueKey.String
	return m, nil
}
