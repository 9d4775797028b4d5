package memory

import (
	"context"
	"sort"

	"github.com/taskhost/taskhost/broker"
)

// AcquireLock takes lock name for the running claim c: true when it is
// taken now or was already held under c, false when another claim holds
// it. A claim that does not hold its message is broker.ErrClaimLost.
func (b *Broker) AcquireLock(ctx context.Context, name, holder string, c broker.Claim) (bool, error) {
	if name == "" {
		return false, broker.Invalid("lock name is empty")
	}
	if err := b.begin(ctx); err != nil {
		return false, err
	}
	defer b.mu.Unlock()

	if b.held(c) == nil {
		return false, broker.ErrClaimLost
	}
	if l := b.locks[name]; l != nil {
		return l.token == c.Token && l.lock.MessageID == c.ID, nil
	}
	b.locks[name] = &lockEntry{
		lock:  broker.Lock{Name: name, Holder: holder, MessageID: c.ID, AcquiredAt: b.now()},
		token: c.Token,
	}
	return true, nil
}

// ReleaseLock releases lock name if it is held under claim c; otherwise
// (held by another claim, or not held at all) broker.ErrClaimLost.
func (b *Broker) ReleaseLock(ctx context.Context, name string, c broker.Claim) error {
	if name == "" {
		return broker.Invalid("lock name is empty")
	}
	if err := b.begin(ctx); err != nil {
		return err
	}
	defer b.mu.Unlock()

	l := b.locks[name]
	if l == nil || c.Token == "" || l.token != c.Token || l.lock.MessageID != c.ID {
		return broker.ErrClaimLost
	}
	delete(b.locks, name)
	return nil
}

// ForceReleaseLock deletes lock name whoever holds it; false when it was
// not held.
func (b *Broker) ForceReleaseLock(ctx context.Context, name string) (bool, error) {
	if name == "" {
		return false, broker.Invalid("lock name is empty")
	}
	if err := b.begin(ctx); err != nil {
		return false, err
	}
	defer b.mu.Unlock()

	if b.locks[name] == nil {
		return false, nil
	}
	delete(b.locks, name)
	return true, nil
}

// Locks lists the held locks by name.
func (b *Broker) Locks(ctx context.Context) ([]broker.Lock, error) {
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()

	out := make([]broker.Lock, 0, len(b.locks))
	for _, l := range b.locks {
		out = append(out, l.lock)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
