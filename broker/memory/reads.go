package memory

import (
	"context"
	"fmt"
	"slices"
	"sort"

	"github.com/taskhost/taskhost/broker"
)

// ListMessages returns the messages matching f, newest (highest id) first:
// at most f.Limit (50 when not positive, 1000 at most), with ids below
// f.Before when it is positive. An unknown state is invalid.
func (b *Broker) ListMessages(ctx context.Context, f broker.MessageFilter) ([]broker.Message, error) {
	limit, err := broker.ValidateMessageFilter(f)
	if err != nil {
		return nil, err
	}
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()

	i := len(b.ids)
	if f.Before > 0 {
		i = sort.Search(len(b.ids), func(i int) bool { return b.ids[i] >= f.Before })
	}
	out := []broker.Message{}
	for i--; i >= 0 && len(out) < limit; i-- {
		e := b.msgs[b.ids[i]]
		if e == nil ||
			(f.State != "" && e.m.State != f.State) ||
			(f.Topic != "" && e.m.Topic != f.Topic) ||
			(f.Task != "" && e.m.Task != f.Task) {
			continue
		}
		out = append(out, copyMessage(&e.m))
	}
	return out, nil
}

// GetMessage returns the message (without its token); broker.ErrNotFound
// when there is none with that id (never stored, purged or dropped past
// Retain).
func (b *Broker) GetMessage(ctx context.Context, id int64) (broker.Message, error) {
	if err := b.begin(ctx); err != nil {
		return broker.Message{}, err
	}
	defer b.mu.Unlock()

	e := b.msgs[id]
	if e == nil {
		return broker.Message{}, fmt.Errorf("message %d: %w", id, broker.ErrNotFound)
	}
	return copyMessage(&e.m), nil
}

// Requeue puts a dead or failed message back in the queue, available now,
// keeping its attempts and last error. Any other state is
// broker.ErrInvalid; an unknown id broker.ErrNotFound.
func (b *Broker) Requeue(ctx context.Context, id int64) error {
	if err := b.begin(ctx); err != nil {
		return err
	}
	defer b.mu.Unlock()

	e := b.msgs[id]
	if e == nil {
		return fmt.Errorf("message %d: %w", id, broker.ErrNotFound)
	}
	if e.m.State == broker.StateCancelled {
		return broker.Invalid("message %d is cancelled: a cancelled task is not requeued; submit it again", id)
	}
	if e.m.State != broker.StateDead && e.m.State != broker.StateFailed {
		return broker.Invalid("message %d is %s; only dead or failed messages can be requeued", id, e.m.State)
	}
	if ks := b.keys[e.m.UniqueKey]; ks != nil && e.m.UniqueKey != "" {
		if holder, ok := b.stateHolder(ks, id); ok {
			return broker.Invalid("message %d is not requeued: task %d holds its unique key %q now", id, holder, e.m.UniqueKey)
		}
	}
	b.requeue(e, b.now())
	return nil
}

// copyMessage returns a deep copy of m without its token.
func copyMessage(m *broker.Message) broker.Message {
	c := *m
	c.Token = ""
	c.Payload = slices.Clone(m.Payload)
	c.Result = slices.Clone(m.Result)
	c.Headers = cloneHeaders(m.Headers)
	if m.ClaimedAt != nil {
		t := *m.ClaimedAt
		c.ClaimedAt = &t
	}
	if m.FinishedAt != nil {
		t := *m.FinishedAt
		c.FinishedAt = &t
	}
	if m.WaitingSince != nil {
		t := *m.WaitingSince
		c.WaitingSince = &t
	}
	if m.CancelRequestedAt != nil {
		t := *m.CancelRequestedAt
		c.CancelRequestedAt = &t
	}
	return c
}

func cloneHeaders(h map[string]string) map[string]string {
	if len(h) == 0 {
		return nil
	}
	c := make(map[string]string, len(h))
	for k, v := range h {
		c[k] = v
	}
	return c
}
