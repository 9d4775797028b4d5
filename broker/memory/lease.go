package memory

import (
	"context"
	"time"

	"github.com/taskhost/taskhost/broker"
)

var _ broker.Leaser = (*Broker)(nil)

// TryLease implements broker.Leaser within this process.
func (b *Broker) TryLease(ctx context.Context, name, holder string, ttl time.Duration) (broker.Lease, bool, error) {
	if name == "" || holder == "" {
		return broker.Lease{}, false, broker.Invalid("lease name and holder must not be empty")
	}
	if err := b.begin(ctx); err != nil {
		return broker.Lease{}, false, err
	}
	defer b.mu.Unlock()
	if b.leases == nil {
		b.leases = map[string]*broker.Lease{}
	}
	now := b.now()
	l := b.leases[name]
	switch {
	case l == nil:
		l = &broker.Lease{Name: name, Holder: holder, Term: 1, ExpiresAt: now.Add(ttl)}
		b.leases[name] = l
	case l.Holder == holder && l.ExpiresAt.After(now):
		l.ExpiresAt = now.Add(ttl)
	case !l.ExpiresAt.After(now):
		l.Holder, l.Term, l.ExpiresAt = holder, l.Term+1, now.Add(ttl)
	}
	return *l, l.Holder == holder, nil
}

// ReleaseLease implements broker.Leaser.
func (b *Broker) ReleaseLease(ctx context.Context, name, holder string, term int64) error {
	if err := b.begin(ctx); err != nil {
		return err
	}
	defer b.mu.Unlock()
	if l := b.leases[name]; l != nil && l.Holder == holder && l.Term == term {
		l.ExpiresAt = b.now()
	}
	return nil
}
