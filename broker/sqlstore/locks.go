package sqlstore

import (
	"context"

	"github.com/taskhost/taskhost/broker"
)

// AcquireLock takes lock name for the running claim c: true when it is
// taken now or was already held under c, false when another claim holds
// it. A claim that does not hold its message is broker.ErrClaimLost.
func (s *Store) AcquireLock(ctx context.Context, name, holder string, cl broker.Claim) (bool, error) {
	if name == "" {
		return false, broker.Invalid("lock name is empty")
	}
	var ok bool
	err := s.d.Write(ctx, "acquire lock", func(c Conn) error {
		held, mine, err := s.d.AcquireLock(c, name, holder, cl)
		if err != nil {
			return err
		}
		if !held {
			return broker.ErrClaimLost
		}
		ok = mine
		return nil
	})
	if err != nil {
		return false, err
	}
	return ok, nil
}

// ReleaseLock releases lock name if it is held under claim c; otherwise
// (held by another claim, or not held at all) broker.ErrClaimLost.
func (s *Store) ReleaseLock(ctx context.Context, name string, cl broker.Claim) error {
	if name == "" {
		return broker.Invalid("lock name is empty")
	}
	return s.d.Write(ctx, "release lock", func(c Conn) error {
		n, err := c.Exec(s.q.ReleaseLock, name, cl.ID, cl.Token)
		if err != nil {
			return err
		}
		if n == 0 {
			return broker.ErrClaimLost
		}
		return nil
	})
}

// ForceReleaseLock deletes lock name whoever holds it; false when it was
// not held.
func (s *Store) ForceReleaseLock(ctx context.Context, name string) (bool, error) {
	if name == "" {
		return false, broker.Invalid("lock name is empty")
	}
	var released bool
	err := s.d.Write(ctx, "force release lock", func(c Conn) error {
		n, err := c.Exec(s.q.ForceReleaseLock, name)
		released = n > 0
		return err
	})
	if err != nil {
		return false, err
	}
	return released, nil
}

// Locks lists the held locks by name.
func (s *Store) Locks(ctx context.Context) ([]broker.Lock, error) {
	return list(ctx, s, "locks", func(r Row) (broker.Lock, error) {
		var l broker.Lock
		err := r.Scan(&l.Name, &l.Holder, &l.MessageID, s.d.Time(&l.AcquiredAt))
		return l, err
	}, s.q.Locks)
}
