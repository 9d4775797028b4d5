package sqlstore

import (
	"context"
	"errors"

	"github.com/taskhost/taskhost/broker"
)

// CancelAnnouncer is implemented by the dialects whose store announces a
// cancel request to the other processes (broker.CancelNotifier):
// AnnounceCancel runs within the transaction that requested it, so the
// announcement goes out when it commits.
type CancelAnnouncer interface {
	AnnounceCancel(c Conn, id int64) error
}

// Cancel cancels message id in one transaction: a queued message ends
// cancelled at once, a running one has its cancel requested (once) and is
// announced (CancelAnnouncer); a finished one is returned unchanged with an
// error wrapping broker.ErrFinished. See broker.Canceller.
func (s *Store) Cancel(ctx context.Context, id int64) (broker.Message, error) {
	var (
		m     broker.Message
		state string // as found
	)
	err := s.d.Tx(ctx, "cancel", func(c Conn) error {
		err := c.QueryRow(s.q.CancelLock, id).Scan(&state)
		if errors.Is(err, ErrNoRows) {
			// A message can leave its table as it ends (the PostgreSQL
			// store's batches of done messages, read by GetMessage): the
			// statement that waited for its row lock saw it go, and the
			// next one, in a snapshot of its own, sees where it went.
			var got broker.Message
			got, err = s.d.ScanMessage(c.QueryRow(s.q.GetMessage, id))
			state = got.State
		}
		if err != nil {
			return notFound(err, "message %d", id)
		}
		switch state {
		case broker.StateQueued:
			if s.q.CancelQueuedOneLock != "" {
				if _, err := c.Exec(s.q.CancelQueuedOneLock, id); err != nil {
					return err
				}
			}
			if _, err := c.Exec(s.q.CancelQueuedOne, id, broker.CancelledError, Now); err != nil {
				return err
			}
		case broker.StateRunning:
			if _, err := c.Exec(s.q.RequestCancel, id, Now); err != nil {
				return err
			}
			if a, ok := s.d.(CancelAnnouncer); ok {
				if err := a.AnnounceCancel(c, id); err != nil {
					return err
				}
			}
		}
		m, err = s.d.ScanMessage(c.QueryRow(s.q.GetMessage, id))
		return err
	})
	if err != nil {
		return broker.Message{}, err
	}
	if broker.Finished(state) {
		return m, broker.FinishedError(m)
	}
	return m, nil
}

// CancelQueued cancels the queued messages f selects, in one statement,
// and counts them; see broker.Canceller.
func (s *Store) CancelQueued(ctx context.Context, f broker.CancelFilter) (int, error) {
	if err := broker.ValidateCancelFilter(f); err != nil {
		return 0, err
	}
	w := s.q.NewFilter()
	if f.Topic != "" {
		w.Add("topic = ?", f.Topic)
	}
	if f.Task != "" {
		w.Add("task = ?", f.Task)
	}
	args := append(w.Args(), broker.CancelledError, Now)
	q := s.q.CancelQueued(w.Where(), len(w.Args())+1)
	var n int64
	run := func(c Conn) error {
		var err error
		n, err = c.Exec(q, args...)
		return err
	}
	var err error
	if s.q.CancelQueuedLock == nil {
		err = s.d.Write(ctx, "cancel queued", run)
	} else {
		lock := s.q.CancelQueuedLock(w.Where())
		err = s.d.Tx(ctx, "cancel queued", func(c Conn) error {
			if _, err := c.Exec(lock, w.Args()...); err != nil {
				return err
			}
			return run(c)
		})
	}
	if err != nil {
		return 0, err
	}
	return int(n), nil
}

// CancelRequests returns the claims running under workerID whose cancel
// was requested, by message id.
func (s *Store) CancelRequests(ctx context.Context, workerID string) ([]broker.Claim, error) {
	return list(ctx, s, "cancel requests", func(r Row) (broker.Claim, error) {
		var cl broker.Claim
		err := r.Scan(&cl.ID, &cl.Token)
		return cl, err
	}, s.q.CancelRequests, workerID)
}

// cancelledNotRequeued is the error of Requeue of a cancelled message.
func cancelledNotRequeued(id int64) error {
	return broker.Invalid("message %d is cancelled: a cancelled task is not requeued; submit it again", id)
}
