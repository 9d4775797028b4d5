package sqlstore

import (
	"context"
	"fmt"
	"strings"

	"github.com/taskhost/taskhost/broker"
)

// ListMessages returns the messages matching f, newest (highest id) first:
// at most f.Limit (50 when not positive, 1000 at most), with ids below
// f.Before when it is positive. An unknown state is invalid.
func (s *Store) ListMessages(ctx context.Context, f broker.MessageFilter) ([]broker.Message, error) {
	limit, err := broker.ValidateMessageFilter(f)
	if err != nil {
		return nil, err
	}
	q, args := s.d.ListMessagesSQL(f, limit)
	return list(ctx, s, "list messages", s.d.ScanMessage, q, args...)
}

// GetMessage returns the message (without its token); broker.ErrNotFound
// when there is none with that id (never stored, purged or dropped).
func (s *Store) GetMessage(ctx context.Context, id int64) (broker.Message, error) {
	return one(ctx, s, "get message", fmt.Sprintf("message %d", id), s.d.ScanMessage, s.q.GetMessage, id)
}

// Requeue puts a dead or failed message back in the queue, available now,
// keeping its attempts and last error. Any other state is
// broker.ErrInvalid; an unknown id broker.ErrNotFound.
func (s *Store) Requeue(ctx context.Context, id int64) error {
	return s.d.Write(ctx, "requeue", func(c Conn) error {
		state, requeued, err := s.d.Requeue(c, id)
		switch {
		case err != nil:
			return err
		case requeued:
			return nil
		case state == "":
			return fmt.Errorf("message %d: %w", id, broker.ErrNotFound)
		case state == broker.StateCancelled:
			return cancelledNotRequeued(id)
		default:
			return broker.Invalid("message %d is %s; only dead or failed messages can be requeued", id, state)
		}
	})
}

// Purge deletes the topic's queued messages (delayed ones too) and, when
// deadLetters is set, its dead ones. Running messages are never touched;
// an unknown topic purges nothing.
func (s *Store) Purge(ctx context.Context, topic string, deadLetters bool) (broker.PurgeResult, error) {
	if err := broker.ValidateTopicName(topic); err != nil {
		return broker.PurgeResult{}, err
	}
	return s.d.Purge(ctx, topic, deadLetters)
}

// Filter builds the WHERE clause of a listing from the filters in use, so
// that each combination gets a statement (and a plan) of its own.
type Filter struct {
	q     *Queries
	where []string
	args  []any
}

// NewFilter starts a filter for statements of q's dialect.
func (q *Queries) NewFilter() *Filter { return &Filter{q: q} }

// Add adds cond, whose one argument stands as "?", with arg.
func (f *Filter) Add(cond string, arg any) {
	f.args = append(f.args, arg)
	f.where = append(f.where, strings.ReplaceAll(cond, "?", f.q.Placeholder(len(f.args))))
}

// Next starts a filter whose arguments follow f's: for a second WHERE
// clause of the same statement. Its Args hold f's and its own.
func (f *Filter) Next() *Filter {
	return &Filter{q: f.q, args: f.args[:len(f.args):len(f.args)]}
}

// AddLiteral adds cond as it is.
func (f *Filter) AddLiteral(cond string) { f.where = append(f.where, cond) }

// Where returns the conditions joined with AND ("" when there are none).
func (f *Filter) Where() string { return strings.Join(f.where, " AND ") }

// Limit adds the limit as the last argument and returns its placeholder.
func (f *Filter) Limit(n int) string {
	f.args = append(f.args, n)
	return f.q.Placeholder(len(f.args))
}

// Args returns the arguments added.
func (f *Filter) Args() []any { return f.args }

// Select returns "SELECT cols FROM table [WHERE ...] ORDER BY id DESC
// LIMIT n" and its arguments.
func (f *Filter) Select(cols, table string, limit int) (string, []any) {
	q := `SELECT ` + cols + ` FROM ` + table
	if w := f.Where(); w != "" {
		q += ` WHERE ` + w
	}
	return q + ` ORDER BY id DESC LIMIT ` + f.Limit(limit), f.args
}

// MessageFilter adds f's conditions on topic, task and id; the state is
// the caller's (its dialect may want it as a literal, for partial
// indexes).
func (f *Filter) MessageFilter(m broker.MessageFilter) {
	if m.Topic != "" {
		f.Add("topic = ?", m.Topic)
	}
	if m.Task != "" {
		f.Add("task = ?", m.Task)
	}
	if m.Before > 0 {
		f.Add("id < ?", m.Before)
	}
}
