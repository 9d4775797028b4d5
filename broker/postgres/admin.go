package postgres

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
)

// ---- workers ----

// RegisterWorker records w, replacing a worker with the same id; its
// StartedAt and HeartbeatAt are the database's now(). In the same
// transaction it purges the rows of workers whose heartbeat is older than
// Options.WorkerTTL (bookkeeping: liveness is LiveAfter).
func (b *Broker) RegisterWorker(ctx context.Context, w broker.WorkerInfo) error {
	if w.ID == "" {
		return broker.Invalid("worker id is empty")
	}
	roles, topics, tasks := w.Roles, w.Topics, w.Tasks
	if roles == nil {
		roles = []string{}
	}
	if topics == nil {
		topics = []string{}
	}
	if tasks == nil {
		tasks = []string{}
	}
	return b.run(ctx, "register worker", func(c *pgx.Conn) error {
		batch := &pgx.Batch{}
		batch.Queue(`
			INSERT INTO tw_workers (id, host, pid, roles, topics, capacity, tasks, started_at, heartbeat_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, now(), now())
			ON CONFLICT (id) DO UPDATE SET
				host = excluded.host, pid = excluded.pid, roles = excluded.roles, topics = excluded.topics,
				capacity = excluded.capacity, tasks = excluded.tasks,
				started_at = CASE WHEN tw_workers.host = excluded.host AND tw_workers.pid = excluded.pid
					THEN tw_workers.started_at ELSE now() END,
				heartbeat_at = now()`,
			w.ID, w.Host, w.PID, roles, topics, w.Capacity, tasks)
		batch.Queue(`DELETE FROM tw_workers WHERE heartbeat_at < now() - $1::bigint * interval '1 microsecond' AND id <> $2`,
			micros(b.workerTTL), w.ID)
		return c.SendBatch(ctx, batch).Close()
	})
}

// Heartbeat stamps the worker's heartbeat with the database's now();
// broker.ErrNotFound when its row is gone (never registered, unregistered
// or purged): the worker must register again.
func (b *Broker) Heartbeat(ctx context.Context, workerID string) error {
	return b.run(ctx, "heartbeat", func(c *pgx.Conn) error {
		tag, err := c.Exec(ctx, `UPDATE tw_workers SET heartbeat_at = now() WHERE id = $1`, workerID)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("worker %q: %w", workerID, broker.ErrNotFound)
		}
		return nil
	})
}

// UnregisterWorker forgets the worker; an unknown id is not an error.
func (b *Broker) UnregisterWorker(ctx context.Context, workerID string) error {
	return b.run(ctx, "unregister worker", func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, `DELETE FROM tw_workers WHERE id = $1`, workerID)
		return err
	})
}

// RunningClaims returns the claims of the messages running under
// workerID, by message id.
func (b *Broker) RunningClaims(ctx context.Context, workerID string) ([]broker.Claim, error) {
	var out []broker.Claim
	err := b.run(ctx, "running claims", func(c *pgx.Conn) error {
		rows, err := c.Query(ctx, `SELECT id, token::text FROM tw_messages
			WHERE state = 'running' AND claimed_by = $1 ORDER BY id`, workerID)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, pgx.RowToStructByPos[broker.Claim])
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Workers lists every registered worker (live or not) by id, with Running
// counted from the running messages it claimed.
func (b *Broker) Workers(ctx context.Context) ([]broker.WorkerInfo, error) {
	var out []broker.WorkerInfo
	err := b.run(ctx, "workers", func(c *pgx.Conn) error {
		out = []broker.WorkerInfo{}
		rows, err := c.Query(ctx, `
			SELECT w.id, w.host, w.pid, w.roles, w.topics, w.capacity, w.tasks, w.started_at, w.heartbeat_at,
				(SELECT count(*) FROM tw_messages m WHERE m.claimed_by = w.id AND m.state = 'running')
			FROM tw_workers w
			ORDER BY w.id`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var w broker.WorkerInfo
			if err := rows.Scan(&w.ID, &w.Host, &w.PID, &w.Roles, &w.Topics, &w.Capacity, &w.Tasks,
				&w.StartedAt, &w.HeartbeatAt, &w.Running); err != nil {
				return err
			}
			out = append(out, w)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ---- topics ----

// SetTopic applies patch to the topic's config, creating it with the
// defaults when missing, and returns the result.
func (b *Broker) SetTopic(ctx context.Context, name string, patch broker.TopicPatch) (broker.TopicConfig, error) {
	if err := broker.ValidateTopicName(name); err != nil {
		return broker.TopicConfig{}, err
	}
	if err := broker.ValidatePatch(patch); err != nil {
		return broker.TopicConfig{}, err
	}
	var cfg broker.TopicConfig
	err := b.run(ctx, "set topic", func(c *pgx.Conn) error {
		return c.QueryRow(ctx, `
			INSERT INTO tw_topics AS t (name, concurrency_limit, dead_letter_enabled, paused)
			VALUES ($1, coalesce($2::int, 0), coalesce($3::bool, true), coalesce($4::bool, false))
			ON CONFLICT (name) DO UPDATE SET
				concurrency_limit = coalesce($2::int, t.concurrency_limit),
				dead_letter_enabled = coalesce($3::bool, t.dead_letter_enabled),
				paused = coalesce($4::bool, t.paused)
			RETURNING name, concurrency_limit, dead_letter_enabled, paused`,
			name, patch.ConcurrencyLimit, patch.DeadLetterEnabled, patch.Paused).
			Scan(&cfg.Name, &cfg.ConcurrencyLimit, &cfg.DeadLetterEnabled, &cfg.Paused)
	})
	if err != nil {
		return broker.TopicConfig{}, err
	}
	return cfg, nil
}

// Topics lists the topic configs by name.
func (b *Broker) Topics(ctx context.Context) ([]broker.TopicConfig, error) {
	var out []broker.TopicConfig
	err := b.run(ctx, "topics", func(c *pgx.Conn) error {
		out = []broker.TopicConfig{}
		rows, err := c.Query(ctx, `SELECT name, concurrency_limit, dead_letter_enabled, paused FROM tw_topics ORDER BY name`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var t broker.TopicConfig
			if err := rows.Scan(&t.Name, &t.ConcurrencyLimit, &t.DeadLetterEnabled, &t.Paused); err != nil {
				return err
			}
			out = append(out, t)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Drain pauses the topic (creating its config when missing): Claim hands
// out nothing more from it while running messages finish.
func (b *Broker) Drain(ctx context.Context, topic string) error {
	paused := true
	_, err := b.SetTopic(ctx, topic, broker.TopicPatch{Paused: &paused})
	return err
}

// Stats counts per topic and overall in one round trip, every count from
// an index (the partial queued, running and dead indexes). Workers, Beats
// and Subscribers count live workers only (heartbeat fresher than
// LiveAfter, by database time).
func (b *Broker) Stats(ctx context.Context) (broker.Stats, error) {
	var st broker.Stats
	err := b.run(ctx, "stats", func(c *pgx.Conn) error {
		st = broker.Stats{Topics: []broker.TopicStats{}}
		live := micros(b.liveAfter)
		batch := &pgx.Batch{}
		batch.Queue(`
			SELECT
				(SELECT count(*) FROM tw_workers
					WHERE heartbeat_at > now() - $1::bigint * interval '1 microsecond'),
				(SELECT count(*) FROM tw_workers
					WHERE heartbeat_at > now() - $1::bigint * interval '1 microsecond' AND 'beat' = ANY (roles)),
				(SELECT count(*) FROM tw_locks)`, live)
		batch.Queue(`
			WITH live AS (
				SELECT topics FROM tw_workers WHERE heartbeat_at > now() - $1::bigint * interval '1 microsecond'
			)
			SELECT t.name, t.concurrency_limit, t.dead_letter_enabled, t.paused,
				(SELECT count(*) FROM tw_messages m WHERE m.topic = t.name AND m.state = 'queued'),
				r.n,
				r.age_us,
				(SELECT count(*) FROM tw_messages m WHERE m.topic = t.name AND m.state = 'dead'),
				(SELECT count(*) FROM live w WHERE t.name = ANY (w.topics) OR '*' = ANY (w.topics))
			FROM tw_topics t
			CROSS JOIN LATERAL (
				SELECT count(*) AS n,
					coalesce(greatest(0, (extract(epoch FROM now() - min(m.claimed_at)) * 1000000)::bigint), 0) AS age_us
				FROM tw_messages m WHERE m.topic = t.name AND m.state = 'running'
			) r
			ORDER BY t.name`, live)
		br := c.SendBatch(ctx, batch)
		if err := br.QueryRow().Scan(&st.Workers, &st.Beats, &st.Locks); err != nil {
			br.Close()
			return err
		}
		rows, err := br.Query()
		if err != nil {
			br.Close()
			return err
		}
		for rows.Next() {
			var (
				ts    broker.TopicStats
				ageUS int64
			)
			if err := rows.Scan(&ts.Name, &ts.ConcurrencyLimit, &ts.DeadLetterEnabled, &ts.Paused,
				&ts.Queued, &ts.Running, &ageUS, &ts.DeadLetter, &ts.Subscribers); err != nil {
				rows.Close()
				br.Close()
				return err
			}
			ts.OldestClaimAge = time.Duration(ageUS) * time.Microsecond
			st.Topics = append(st.Topics, ts)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			br.Close()
			return err
		}
		return br.Close()
	})
	if err != nil {
		return broker.Stats{}, err
	}
	return st, nil
}

// ---- locks ----

// acquireLockSQL takes lock $1 for holder $2 under the claim ($3, $4). It
// holds the claim's message row FOR SHARE while it inserts, so a
// concurrent ack, nack or reclaim of that claim waits for it and then
// releases the new lock too (or, going first, makes this claim check fail).
// It answers: does the claim hold its message, was the lock inserted, and
// was it already held under this claim.
const acquireLockSQL = `
	WITH m AS (
		SELECT id, token FROM tw_messages
		WHERE id = $3 AND token::text = $4
		FOR SHARE
	), ins AS (
		INSERT INTO tw_locks (name, holder, message_id, token, acquired_at)
		SELECT $1, $2, m.id, m.token, now() FROM m
		ON CONFLICT (name) DO NOTHING
		RETURNING 1
	)
	SELECT EXISTS (SELECT 1 FROM m), EXISTS (SELECT 1 FROM ins),
		coalesce((SELECT l.message_id = $3 AND l.token::text = $4 FROM tw_locks l WHERE l.name = $1), false)`

// AcquireLock takes lock name for the running claim c: true when it is
// taken now or was already held under c, false when another claim holds
// it. A claim that does not hold its message is broker.ErrClaimLost.
func (b *Broker) AcquireLock(ctx context.Context, name, holder string, c broker.Claim) (bool, error) {
	if name == "" {
		return false, broker.Invalid("lock name is empty")
	}
	var ok bool
	err := b.run(ctx, "acquire lock", func(conn *pgx.Conn) error {
		var held, inserted, mine bool
		if err := conn.QueryRow(ctx, acquireLockSQL, name, holder, c.ID, c.Token).Scan(&held, &inserted, &mine); err != nil {
			return err
		}
		if !held {
			return broker.ErrClaimLost
		}
		ok = inserted || mine
		return nil
	})
	return ok, err
}

// ReleaseLock releases lock name if it is held under claim c; otherwise
// (held by another claim, or not held at all) broker.ErrClaimLost.
func (b *Broker) ReleaseLock(ctx context.Context, name string, c broker.Claim) error {
	if name == "" {
		return broker.Invalid("lock name is empty")
	}
	return b.run(ctx, "release lock", func(conn *pgx.Conn) error {
		tag, err := conn.Exec(ctx, `DELETE FROM tw_locks WHERE name = $1 AND message_id = $2 AND token::text = $3`,
			name, c.ID, c.Token)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return broker.ErrClaimLost
		}
		return nil
	})
}

// ForceReleaseLock deletes lock name whoever holds it; false when it was
// not held.
func (b *Broker) ForceReleaseLock(ctx context.Context, name string) (bool, error) {
	if name == "" {
		return false, broker.Invalid("lock name is empty")
	}
	var released bool
	err := b.run(ctx, "force release lock", func(conn *pgx.Conn) error {
		tag, err := conn.Exec(ctx, `DELETE FROM tw_locks WHERE name = $1`, name)
		released = err == nil && tag.RowsAffected() > 0
		return err
	})
	return released, err
}

// Locks lists the held locks by name.
func (b *Broker) Locks(ctx context.Context) ([]broker.Lock, error) {
	var out []broker.Lock
	err := b.run(ctx, "locks", func(c *pgx.Conn) error {
		out = []broker.Lock{}
		rows, err := c.Query(ctx, `SELECT name, holder, message_id, acquired_at FROM tw_locks ORDER BY name`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var l broker.Lock
			if err := rows.Scan(&l.Name, &l.Holder, &l.MessageID, &l.AcquiredAt); err != nil {
				return err
			}
			out = append(out, l)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ---- orphan reclaim ----

// LiveWorkers returns the ids of the workers whose heartbeat is fresher
// than after, by database time, sorted.
func (b *Broker) LiveWorkers(ctx context.Context, after time.Duration) ([]string, error) {
	if after < 0 {
		return nil, broker.Invalid("liveness window is negative")
	}
	var out []string
	err := b.run(ctx, "live workers", func(c *pgx.Conn) error {
		out = []string{}
		rows, err := c.Query(ctx, `
			SELECT id FROM tw_workers
			WHERE heartbeat_at > now() - $1::bigint * interval '1 microsecond'
			ORDER BY id`, micros(after))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				return err
			}
			out = append(out, id)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// reclaimSQL requeues (or, once the message has been orphaned $3 times
// counting this one, when $3 > 0, dead-letters) the running messages claimed at least $2 µs ago by workers
// not in $1. Rows are locked in id order first (as Ack does), so a
// concurrent ack either lands before (and the row is no longer running) or
// waits and then finds its token gone.
const reclaimSQL = `
	WITH orphan AS (
		SELECT id FROM tw_messages
		WHERE state = 'running'
			AND claimed_at <= now() - $2::bigint * interval '1 microsecond'
			AND NOT (claimed_by = ANY ($1::text[]))
		ORDER BY id
		FOR UPDATE
	)
	UPDATE tw_messages m SET
		state = CASE WHEN $3::int > 0 AND m.orphaned + 1 >= $3::int THEN 'dead' ELSE 'queued' END,
		claimed_by = CASE WHEN $3::int > 0 AND m.orphaned + 1 >= $3::int THEN m.claimed_by END,
		claimed_at = CASE WHEN $3::int > 0 AND m.orphaned + 1 >= $3::int THEN m.claimed_at END,
		finished_at = CASE WHEN $3::int > 0 AND m.orphaned + 1 >= $3::int THEN now() END,
		available_at = CASE WHEN $3::int > 0 AND m.orphaned + 1 >= $3::int THEN m.available_at ELSE now() END,
		token = NULL,
		orphaned = m.orphaned + 1,
		last_error = CASE WHEN $3::int > 0 AND m.orphaned + 1 >= $3::int
			THEN format('orphaned: worker %s stopped heartbeating; dead-lettered after its claim was orphaned %s times (orphan max %s)',
				m.claimed_by, m.orphaned + 1, $3::int)
			ELSE format('orphaned: worker %s stopped heartbeating; requeued by the reaper', m.claimed_by) END
	WHERE m.id = ANY (ARRAY (SELECT id FROM orphan))
	RETURNING m.id, m.state`

// reclaimLocksSQL deletes the locks whose holder is not in $1 and that were
// acquired at least $2 µs ago, and the locks held under claims that no
// longer hold their message (those the reclaim just ended). It runs after
// reclaimSQL in the same transaction and sees its changes.
const reclaimLocksSQL = `
	DELETE FROM tw_locks l
	WHERE (NOT (l.holder = ANY ($1::text[])) AND l.acquired_at <= now() - $2::bigint * interval '1 microsecond')
		OR NOT EXISTS (
			SELECT 1 FROM tw_messages m
			WHERE m.id = l.message_id AND m.token = l.token)
	RETURNING l.name`

// withinGraceSQL counts what the grace protected in this pass: running
// messages of claimers not in $1 and locks of holders not in $1, younger
// than $2 µs.
const withinGraceSQL = `
	SELECT
		(SELECT count(*) FROM tw_messages
			WHERE state = 'running' AND claimed_at > now() - $2::bigint * interval '1 microsecond'
				AND NOT (claimed_by = ANY ($1::text[])))
		+ (SELECT count(*) FROM tw_locks
			WHERE acquired_at > now() - $2::bigint * interval '1 microsecond'
				AND NOT (holder = ANY ($1::text[])))`

// ReclaimOrphans, in one transaction: running messages whose claimer is
// not in req.Live and that were claimed at least req.Grace ago go back to
// queued (claim fields and token cleared, available now) or, once their
// attempts reached req.MaxAttempts (when positive), to dead; their last
// error says why. Locks whose holder is not in req.Live, acquired at least
// req.Grace ago, are deleted, and so are the locks held under the claims
// just reclaimed. Times are database time. WithinGrace counts the
// orphan candidates (messages and locks) the grace kept.
//
// With req.Fence the pass is a leader-only write: the lease row is locked
// first and the pass goes ahead only while Fence.Holder holds it at
// Fence.Term, unexpired (broker.ErrNotLeader otherwise, nothing changed).
//
// An empty req.Live is refused with broker.ErrInvalid (fail closed: the
// caller is alive, so an empty live set means the liveness signal is
// broken), as are a negative Grace or MaxAttempts. MaxAttempts 0 means no
// bound (always requeue).
func (b *Broker) ReclaimOrphans(ctx context.Context, req broker.ReclaimRequest) (broker.ReclaimResult, error) {
	if len(req.Live) == 0 {
		return broker.ReclaimResult{}, broker.Invalid("the live-worker set is empty; reclaiming nothing (fail closed)")
	}
	if req.Grace < 0 {
		return broker.ReclaimResult{}, broker.Invalid("grace is negative")
	}
	if req.MaxAttempts < 0 {
		return broker.ReclaimResult{}, broker.Invalid("max attempts is negative")
	}
	live := slices.Clone(req.Live)
	var res broker.ReclaimResult
	err := b.run(ctx, "reclaim orphans", func(c *pgx.Conn) error {
		res = broker.ReclaimResult{}
		return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			if err := checkFence(ctx, tx, req.Fence); err != nil {
				return err
			}
			batch := &pgx.Batch{}
			batch.Queue(reclaimSQL, live, micros(req.Grace), req.MaxAttempts)
			batch.Queue(reclaimLocksSQL, live, micros(req.Grace))
			batch.Queue(withinGraceSQL, live, micros(req.Grace))
			br := tx.SendBatch(ctx, batch)
			defer br.Close()
			rows, err := br.Query()
			if err != nil {
				return err
			}
			for rows.Next() {
				var (
					id    int64
					state string
				)
				if err := rows.Scan(&id, &state); err != nil {
					rows.Close()
					return err
				}
				res.IDs = append(res.IDs, id)
				if state == broker.StateDead {
					res.DeadLettered++
				} else {
					res.Reclaimed++
				}
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			tag, err := br.Exec()
			if err != nil {
				return err
			}
			res.LocksReleased = int(tag.RowsAffected())
			if err := br.QueryRow().Scan(&res.WithinGrace); err != nil {
				return err
			}
			return br.Close()
		})
	})
	if err != nil {
		return broker.ReclaimResult{}, err
	}
	sort.Slice(res.IDs, func(i, j int) bool { return res.IDs[i] < res.IDs[j] })
	if res.Reclaimed+res.DeadLettered+res.LocksReleased > 0 {
		b.log.Info("reclaimed orphans", "reclaimed", res.Reclaimed, "dead_lettered", res.DeadLettered,
			"locks_released", res.LocksReleased)
	}
	return res, nil
}

// ExpireWorker sets the worker's heartbeat a century back, so it leaves the
// live set at once (its row stays until the WorkerTTL purge);
// broker.ErrNotFound when there is no such worker.
func (b *Broker) ExpireWorker(ctx context.Context, workerID string) error {
	return b.run(ctx, "expire worker", func(c *pgx.Conn) error {
		tag, err := c.Exec(ctx, `UPDATE tw_workers SET heartbeat_at = now() - interval '100 years' WHERE id = $1`, workerID)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("worker %q: %w", workerID, broker.ErrNotFound)
		}
		return nil
	})
}
