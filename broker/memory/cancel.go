package memory

import (
	"context"
	"fmt"
	"slices"
	"sort"

	"github.com/taskhost/taskhost/broker"
)

// Cancel cancels message id: a queued message ends cancelled at once, a
// running one has its cancel requested; see broker.Canceller.
func (b *Broker) Cancel(ctx context.Context, id int64) (broker.Message, error) {
	if err := b.begin(ctx); err != nil {
		return broker.Message{}, err
	}
	defer b.mu.Unlock()

	e := b.msgs[id]
	if e == nil {
		return broker.Message{}, fmt.Errorf("message %d: %w", id, broker.ErrNotFound)
	}
	now := b.now()
	switch e.m.State {
	case broker.StateQueued:
		b.dequeue(e)
		b.cancelQueued(e)
	case broker.StateRunning:
		if e.m.CancelRequestedAt == nil {
			t := now
			e.m.CancelRequestedAt = &t
		}
	default:
		m := copyMessage(&e.m)
		return m, broker.FinishedError(m)
	}
	return copyMessage(&e.m), nil
}

// cancelQueued ends e, taken out of its queue, cancelled.
func (b *Broker) cancelQueued(e *entry) {
	e.m.LastError = broker.CancelledError
	e.m.WaitingSince = nil
	b.finish(e, broker.StateCancelled, b.now())
}

// dequeue takes the queued e out of its topic's queue.
func (b *Broker) dequeue(e *entry) {
	q := b.queues[e.m.Topic]
	i := sort.Search(len(q), func(i int) bool { return !before(q[i], e) })
	if i >= len(q) || q[i] != e {
		i = slices.Index(q, e) // never: the queue is ordered by (available_at, id)
	}
	if i >= 0 {
		b.queues[e.m.Topic] = slices.Delete(q, i, i+1)
	}
}

// CancelQueued cancels the queued messages f selects and counts them.
func (b *Broker) CancelQueued(ctx context.Context, f broker.CancelFilter) (int, error) {
	if err := broker.ValidateCancelFilter(f); err != nil {
		return 0, err
	}
	if err := b.begin(ctx); err != nil {
		return 0, err
	}
	defer b.mu.Unlock()

	topics := []string{f.Topic}
	if f.Topic == "" {
		topics = topics[:0]
		for t := range b.queues {
			topics = append(topics, t)
		}
	}
	n := 0
	for _, t := range topics {
		q := b.queues[t]
		keep := q[:0]
		var cancel []*entry
		for _, e := range q {
			if f.Task == "" || e.m.Task == f.Task {
				cancel = append(cancel, e)
			} else {
				keep = append(keep, e)
			}
		}
		clear(q[len(keep):])
		if len(keep) == 0 {
			delete(b.queues, t)
		} else {
			b.queues[t] = keep
		}
		for _, e := range cancel {
			b.cancelQueued(e)
		}
		n += len(cancel)
	}
	return n, nil
}

// CancelRequests returns the claims running under workerID whose cancel
// was requested, by message id.
func (b *Broker) CancelRequests(ctx context.Context, workerID string) ([]broker.Claim, error) {
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()

	out := []broker.Claim{}
	for _, e := range b.running {
		if e.m.ClaimedBy == workerID && e.m.CancelRequestedAt != nil {
			out = append(out, e.m.ClaimOf())
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}
