package sqlstore

import (
	"context"
	"errors"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// TryLease acquires or renews lease name for holder for ttl from now, by
// the broker's clock; see broker.Leaser. It returns the lease as it
// stands and whether holder holds it.
func (s *Store) TryLease(ctx context.Context, name, holder string, ttl time.Duration) (broker.Lease, bool, error) {
	if name == "" || holder == "" {
		return broker.Lease{}, false, broker.Invalid("lease name and holder must not be empty")
	}
	l, err := s.d.TryLease(ctx, name, holder, ttl)
	if err != nil {
		return broker.Lease{}, false, err
	}
	return l, l.Holder == holder, nil
}

// ReleaseLease gives lease name up if holder holds it at term (it expires
// now, so a standby takes it at once); otherwise it does nothing.
func (s *Store) ReleaseLease(ctx context.Context, name, holder string, term int64) error {
	return s.d.Write(ctx, "release lease", func(c Conn) error {
		_, err := c.Exec(s.q.ReleaseLease, name, holder, term, Now)
		return err
	})
}

// CheckFence makes the rest of c's transaction a leader-only write: it
// goes ahead only while f.Holder holds f's lease at f.Term, unexpired
// (broker.ErrNotLeader otherwise). The dialect's statement (q.Fence) keeps
// a takeover from committing before the transaction does. A nil f checks
// nothing.
func CheckFence(c Conn, q *Queries, f *broker.Fence) error {
	if f == nil {
		return nil
	}
	var one int
	err := c.QueryRow(q.Fence, f.Name, f.Holder, f.Term, Now).Scan(&one)
	if errors.Is(err, ErrNoRows) {
		return broker.ErrNotLeader
	}
	return err
}
