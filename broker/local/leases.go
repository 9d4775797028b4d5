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
func (d dialect) TryLease(ctx context.Context, name, holder string, ttl time.Duration) (broker.Lease, error) {
	var l broker.Lease
	err := d.b.write(ctx, "try lease", func(tx *txn, now time.Time) error {
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
		return broker.Lease{}, err
	}
	return l, nil
}
