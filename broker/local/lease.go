package local

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// TryLease acquires or renews lease name for holder for ttl from now (the
// machine's clock); see broker.Leaser. The holder of an unexpired lease
// renews it at its term; anyone takes a missing lease at term 1 and an
// expired one at the next term. The IMMEDIATE transaction serialises
// contenders across processes.
func (b *Broker) TryLease(ctx context.Context, name, holder string, ttl time.Duration) (broker.Lease, bool, error) {
	if name == "" || holder == "" {
		return broker.Lease{}, false, broker.Invalid("lease name and holder must not be empty")
	}
	var l broker.Lease
	err := b.write(ctx, "try lease", func(tx *txn, now time.Time) error {
		var cur broker.Lease
		var expires int64
		err := tx.QueryRow(`SELECT holder, term, expires_at FROM tw_leases WHERE name = ?`, name).
			Scan(&cur.Holder, &cur.Term, &expires)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			l = broker.Lease{Name: name, Holder: holder, Term: 1}
		case err != nil:
			return err
		case expires > ns(now) && cur.Holder != holder:
			// Held by someone else: left as it is.
			l = broker.Lease{Name: name, Holder: cur.Holder, Term: cur.Term, ExpiresAt: fromNS(expires)}
			return nil
		case expires > ns(now):
			l = broker.Lease{Name: name, Holder: holder, Term: cur.Term}
		default:
			l = broker.Lease{Name: name, Holder: holder, Term: cur.Term + 1}
		}
		until := addNS(now, ttl)
		l.ExpiresAt = fromNS(until)
		_, err = tx.Exec(`INSERT INTO tw_leases (name, holder, term, expires_at) VALUES (?1, ?2, ?3, ?4)
			ON CONFLICT (name) DO UPDATE SET holder = ?2, term = ?3, expires_at = ?4`, name, holder, l.Term, until)
		return err
	})
	if err != nil {
		return broker.Lease{}, false, err
	}
	return l, l.Holder == holder, nil
}

// ReleaseLease gives lease name up if holder holds it at term (it expires
// now, so a standby takes it at once); otherwise it does nothing.
func (b *Broker) ReleaseLease(ctx context.Context, name, holder string, term int64) error {
	return b.write(ctx, "release lease", func(tx *txn, now time.Time) error {
		_, err := tx.Exec(`UPDATE tw_leases SET expires_at = ?1
			WHERE name = ?2 AND holder = ?3 AND term = ?4 AND expires_at > ?1`, ns(now), name, holder, term)
		return err
	})
}

// checkFence makes the rest of tx a leader-only write: it goes ahead only
// while f.Holder holds f's lease at f.Term, unexpired
// (broker.ErrNotLeader otherwise). The transaction holds the write lock,
// so no takeover can commit before it does.
func checkFence(tx *txn, f *broker.Fence, now time.Time) error {
	if f == nil {
		return nil
	}
	var one int
	err := tx.QueryRow(`SELECT 1 FROM tw_leases WHERE name = ? AND holder = ? AND term = ? AND expires_at > ?`,
		f.Name, f.Holder, f.Term, ns(now)).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return broker.ErrNotLeader
	}
	return err
}
