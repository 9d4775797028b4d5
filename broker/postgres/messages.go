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
	return newMessageScanner(tok, extra...).scan(row)
}

// messageScanner reads rows of msgCols, as scanMessage does, into one set
// of variables: a claim reads its rows with one, rather than with a new
// set and a new list of them per row.
type messageScanner struct {
	m                       broker.Message
	headers                 []byte
	claimedBy, lastErr, tkn pgtype.Text
	uniqueKey               pgtype.Text
	dest                    []any
}

func newMessageScanner(tok bool, extra ...any) *messageScanner {
	s := &messageScanner{}
	m := &s.m
	s.dest = append(make([]any, 0, 21+len(extra)), &m.ID, &m.Topic, &m.Task, (*[]byte)(&m.Payload), &s.headers, &m.State, &m.Attempts, &m.MaxAttempts,
		&s.claimedBy, &m.ClaimedAt, &m.AvailableAt, &m.CreatedAt, &m.FinishedAt, &s.lastErr, (*[]byte)(&m.Result),
		&m.Suspect, &m.WaitingSince,
		&m.CancelRequestedAt, &m.Priority, &s.uniqueKey)
	if tok {
		s.dest = append(s.dest, &s.tkn)
	}
	s.dest = append(s.dest, extra...)
	return s
}

// scan reads row. Every variable starts again from its zero value, so
// nothing of the row before can carry over; what pgx scans (strings,
// bytes, times) it allocates anew, and the headers' map is made here, so
// messages share nothing.
func (s *messageScanner) scan(row pgx.Row) (broker.Message, error) {
	s.m, s.headers = broker.Message{}, nil
	s.claimedBy, s.lastErr, s.tkn, s.uniqueKey = pgtype.Text{}, pgtype.Text{}, pgtype.Text{}, pgtype.Text{}
	if err := row.Scan(s.dest...); err != nil {
		return broker.Message{}, err
	}
	m := s.m
	if s.headers != nil {
		if err := json.Unmarshal(s.headers, &m.Headers); err != nil {
			return broker.Message{}, fmt.Errorf("message %d: headers: %w", m.ID, err)
		}
		if len(m.Headers) == 0 {
			m.Headers = nil
		}
	}
	m.ClaimedBy, m.LastError, m.Token = s.claimedBy.String, s.lastErr.String, s.tkn.String
	m.UniqueKey = s.uniqueKey.String
	return m, nil
}
