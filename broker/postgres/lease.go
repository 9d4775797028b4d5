package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
)

// tryLeaseSQL acquires or renews lease $1 for holder $2 until now() + $3
// µs: the holder of an unexpired lease renews it at its term; anyone takes
// a missing lease at term 1 and an expired one at the next term; a lease
// another holder still holds is left as it is. Concurrent callers
// serialise on the row (or on the primary key for a missing one).
const tryLeaseSQL = `
	INSERT INTO tw_leases AS l (name, holder, term, expires_at)
	VALUES ($1, $2, 1, now() + $3::bigint * interval '1 microsecond')
	ON CONFLICT (name) DO UPDATE SET
		holder = excluded.holder,
		term = CASE WHEN l.holder = excluded.holder AND l.expires_at > now() THEN l.term ELSE l.term + 1 END,
		expires_at = excluded.expires_at
	WHERE (l.holder = excluded.holder AND l.expires_at > now()) OR l.expires_at <= now()`

// TryLease acquires or renews lease name for holder for ttl from now, by
// database time; see broker.Leaser. It returns the lease as it stands and
// whether holder holds it.
func (b *Broker) TryLease(ctx context.Context, name, holder string, ttl time.Duration) (broker.Lease, bool, error) {
	if name == "" || holder == "" {
		return broker.Lease{}, false, broker.Invalid("lease name and holder must not be empty")
	}
	var l broker.Lease
	err := b.run(ctx, "try lease", func(c *pgx.Conn) error {
		batch := &pgx.Batch{}
		batch.Queue(tryLeaseSQL, name, holder, micros(ttl))
		// A statement of its own, so it reads the row as the upsert left it
		// (or as the holder that kept it has it).
		batch.Queue(`SELECT name, holder, term, expires_at FROM tw_leases WHERE name = $1`, name)
		br := c.SendBatch(ctx, batch)
		if _, err := br.Exec(); err != nil {
			br.Close()
			return err
		}
		if err := br.QueryRow().Scan(&l.Name, &l.Holder, &l.Term, &l.ExpiresAt); err != nil {
			br.Close()
			return err
		}
		return br.Close()
	})
	if err != nil {
		return broker.Lease{}, false, err
	}
	return l, l.Holder == holder, nil
}

// ReleaseLease gives lease name up if holder holds it at term (it expires
// now, so a standby takes it at once); otherwise it does nothing.
func (b *Broker) ReleaseLease(ctx context.Context, name, holder string, term int64) error {
	return b.run(ctx, "release lease", func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, `
			UPDATE tw_leases SET expires_at = now()
			WHERE name = $1 AND holder = $2 AND term = $3 AND expires_at > now()`, name, holder, term)
		return err
	})
}

// checkFence makes the rest of tx a leader-only write: it locks f's lease
// row FOR SHARE if f.Holder holds it at f.Term and it has not expired, so
// no takeover can commit before tx does; broker.ErrNotLeader otherwise.
func checkFence(ctx context.Context, tx pgx.Tx, f *broker.Fence) error {
	if f == nil {
		return nil
	}
	var one int
	err := tx.QueryRow(ctx, `
		SELECT 1 FROM tw_leases
		WHERE name = $1 AND holder = $2 AND term = $3 AND expires_at > now()
		FOR SHARE`, f.Name, f.Holder, f.Term).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return broker.ErrNotLeader
	}
	return err
}
