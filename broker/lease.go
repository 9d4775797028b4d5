package broker

import (
	"context"
	"errors"
	"time"
)

// ErrNotLeader: a leader-only write was refused because the lease it named
// is no longer held at that term. The write changed nothing.
var ErrNotLeader = errors.New("not the leader: the lease is held by another term")

// Lease is a named lease as it stands: who holds it, at which term, until
// when (broker time).
type Lease struct {
	Name      string    `json:"name"`
	Holder    string    `json:"holder"`
	Term      int64     `json:"term"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Fence names the lease a leader-only write is made under. The write lands
// only if Holder still holds Name at Term, checked in the same transaction.
type Fence struct {
	Name   string
	Holder string
	Term   int64
}

// Leaser is implemented by every broker: it elects one leader (the beat)
// among every process sharing the broker.
type Leaser interface {
	// TryLease acquires or renews lease name for holder, for ttl from now
	// (broker time). The current holder renews at its term; anyone takes
	// a free or expired lease at the next term. It returns the lease as it
	// stands and whether holder holds it.
	TryLease(ctx context.Context, name, holder string, ttl time.Duration) (Lease, bool, error)
	// ReleaseLease gives the lease up if holder holds it at term, so a
	// standby can take it at once; otherwise it does nothing.
	ReleaseLease(ctx context.Context, name, holder string, term int64) error
}
