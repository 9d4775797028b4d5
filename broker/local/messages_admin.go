package local

import (
	"context"
	"errors"
	"strings"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/sqlstore"
)

// ListMessagesSQL is ListMessages's statement for f (checked) and limit.
func (dialect) ListMessagesSQL(f broker.MessageFilter, limit int) (string, []any) {
	w := queries.NewFilter()
	if f.State != "" {
		w.Add("state = ?", f.State)
	}
	w.MessageFilter(f)
	return w.Select(msgCols, "tw_messages", limit)
}

// ListReportsSQL is ListReports's statement for f (checked) and limit.
func (dialect) ListReportsSQL(f broker.ReportFilter, limit int) (string, []any) {
	w := queries.NewFilter()
	w.ReportFilter(f, sqlstore.TableReportColumns)
	return w.Select(reportCols, "tw_reports", limit)
}

// Requeue puts message id back in the queue, available now, if it is dead
// or failed; otherwise it reports the state it found ("" for no message).
func (dialect) Requeue(c sqlstore.Conn, id int64) (string, bool, error) {
	var state string
	err := c.QueryRow(`SELECT state FROM tw_messages WHERE id = ?`, id).Scan(&state)
	if errors.Is(err, sqlstore.ErrNoRows) {
		return "", false, nil
	}
	if err != nil || (state != broker.StateDead && state != broker.StateFailed) {
		return state, false, err
	}
	_, err = c.Exec(`UPDATE tw_messages
		SET state = 'queued', claimed_by = NULL, claimed_at = NULL, token = NULL,
			finished_at = NULL, available_at = ?2, cancel_requested_at = NULL
		WHERE id = ?1`, id, sqlstore.Now)
	if err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed: tw_messages.unique_key") {
		return "", false, broker.Invalid("message %d is not requeued: another task holds its unique key now", id)
	}
	return state, err == nil, err
}

// Purge deletes the topic's queued messages and, when deadLetters is set,
// its dead ones, in one IMMEDIATE transaction.
func (d dialect) Purge(ctx context.Context, topic string, deadLetters bool) (broker.PurgeResult, error) {
	var res broker.PurgeResult
	err := d.Write(ctx, "purge", func(c sqlstore.Conn) error {
		var err error
		res = broker.PurgeResult{}
		if res.Queued, err = deleted(c.Exec(`DELETE FROM tw_messages WHERE topic = ? AND state = 'queued'`, topic)); err != nil || !deadLetters {
			return err
		}
		res.DeadLetter, err = deleted(c.Exec(`DELETE FROM tw_messages WHERE topic = ? AND state = 'dead'`, topic))
		return err
	})
	if err != nil {
		return broker.PurgeResult{}, err
	}
	return res, nil
}

func deleted(n int64, err error) (int, error) { return int(n), err }

// InsertMessage queues the validated req in c's transaction, as Submit
// does (a duplicate returns the holder's id and a *broker.DuplicateError).
func (dialect) InsertMessage(c sqlstore.Conn, req broker.SubmitRequest) (int64, error) {
	cn := c.(*conn)
	s, err := insertMessage(cn.tx, req, cn.now)
	if err == nil && s.Duplicate {
		err = &broker.DuplicateError{ID: s.ID, Key: req.UniqueKey}
	}
	return s.ID, err
}
