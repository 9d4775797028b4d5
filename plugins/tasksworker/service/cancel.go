package service

// Cancelling tasks: one by id, or the queued ones of a topic and/or task.

import (
	"context"

	"github.com/taskhost/taskhost/broker"
)

// Cancel cancels task id. A queued task ends cancelled at once and comes
// back so. A running one comes back running with its cancel requested:
// the worker that runs it stops it (this process's at once, through
// OnCancelRequested; another process's at its next heartbeat, or at once
// on postgres) and its attempt ends cancelled, unless it finishes first.
// A finished task comes back as it is with an error wrapping
// broker.ErrFinished; an unknown id is broker.ErrNotFound.
func (s *Service) Cancel(ctx context.Context, id int64) (broker.Message, error) {
	m, err := s.b.Cancel(ctx, id)
	if err != nil {
		return m, err
	}
	switch m.State {
	case broker.StateCancelled:
		s.cancelled(m.Topic, 1)
	case broker.StateRunning:
		if s.onCancelRequested != nil {
			s.onCancelRequested(id)
		}
	}
	return m, nil
}

// CancelQueued cancels the queued tasks of f's topic and/or task and
// counts them; running ones are left alone (cancel them by id). An empty
// filter is refused. Without a topic, each topic's are cancelled in turn
// (so each is counted under its topic), then any left over.
func (s *Service) CancelQueued(ctx context.Context, f broker.CancelFilter) (int, error) {
	if err := broker.ValidateCancelFilter(f); err != nil {
		return 0, err
	}
	if f.Topic != "" {
		n, err := s.b.CancelQueued(ctx, f)
		s.cancelled(f.Topic, n)
		return n, err
	}
	topics, err := s.b.Topics(ctx)
	if err != nil {
		return 0, err
	}
	total := 0
	for _, t := range topics {
		n, err := s.b.CancelQueued(ctx, broker.CancelFilter{Topic: t.Name, Task: f.Task})
		s.cancelled(t.Name, n)
		total += n
		if err != nil {
			return total, err
		}
	}
	n, err := s.b.CancelQueued(ctx, f)
	s.cancelled("", n)
	return total + n, err
}

// cancelled counts n tasks of topic ("" when unknown) that ended
// cancelled while queued.
func (s *Service) cancelled(topic string, n int) {
	if n > 0 && s.cancelledHook != nil {
		s.cancelledHook(topic, n)
	}
}
