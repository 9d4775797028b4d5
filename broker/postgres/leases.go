package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/sqlstore"
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
// database time (tryLeaseSQL), and returns the lease as it stands.
func (d dialect) TryLease(ctx context.Context, name, holder string, ttl time.Duration) (broker.Lease, error) {
	var l broker.Lease
	err := d.b.run(ctx, "try lease", func(c *pgx.Conn) error {
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
		return broker.Lease{}, err
	}
	return l, nil
}

// checkFence makes the rest of tx a leader-only write (see
// sqlstore.CheckFence): it locks f's lease row FOR SHARE if f.Holder holds
// it at f.Term and it has not expired, so no takeover can commit before tx
// does; broker.ErrNotLeader otherwise.
func checkFence(ctx context.Context, tx pgx.Tx, f *broker.Fence) error {
	return sqlstore.CheckFence(conn{ctx: ctx, q: tx}, &queries, f)
}
