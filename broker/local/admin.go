package local

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// ---- workers ----

// RegisterWorker records w (replacing a worker with the same id); its
// StartedAt and HeartbeatAt are now.
func (b *Broker) RegisterWorker(ctx context.Context, w broker.WorkerInfo) error {
	if w.ID == "" {
		return broker.Invalid("worker id is empty")
	}
	roles, err := json.Marshal(w.Roles)
	if err != nil {
		return broker.Invalid("roles: %v", err)
	}
	topics, err := json.Marshal(w.Topics)
	if err != nil {
		return broker.Invalid("topics: %v", err)
	}
	tasks := w.Tasks
	if tasks == nil {
		tasks = []string{}
	}
	tasksJSON, err := json.Marshal(tasks)
	if err != nil {
		return broker.Invalid("tasks: %v", err)
	}
	return b.write(ctx, "register worker", func(tx *txn, now time.Time) error {
		_, err := tx.Exec(`INSERT INTO tw_workers
			(id, host, pid, roles, topics, capacity, tasks, started_at, heartbeat_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET host = excluded.host, pid = excluded.pid,
				roles = excluded.roles, topics = excluded.topics, capacity = excluded.capacity,
				tasks = excluded.tasks,
				started_at = CASE WHEN tw_workers.host = excluded.host AND tw_workers.pid = excluded.pid
					THEN tw_workers.started_at ELSE excluded.started_at END,
				heartbeat_at = excluded.heartbeat_at`,
			w.ID, w.Host, w.PID, string(roles), string(topics), w.Capacity, string(tasksJSON), ns(now), ns(now))
		return err
	})
}

// Heartbeat stamps the worker's HeartbeatAt; broker.ErrNotFound when it is
// not registered.
func (b *Broker) Heartbeat(ctx context.Context, workerID string) error {
	return b.write(ctx, "heartbeat", func(tx *txn, now time.Time) error {
		return updateWorker(tx, workerID, ns(now))
	})
}

// updateWorker sets the worker's heartbeat_at, or reports it not found.
func updateWorker(tx *txn, workerID string, heartbeat int64) error {
	r, err := tx.Exec(`UPDATE tw_workers SET heartbeat_at = ? WHERE id = ?`, heartbeat, workerID)
	if err != nil {
		return err
	}
	if n, err := r.RowsAffected(); err != nil {
		return err
	} else if n == 0 {
		return fmt.Errorf("worker %q: %w", workerID, broker.ErrNotFound)
	}
	return nil
}

// UnregisterWorker forgets the worker; an unknown id is not an error.
func (b *Broker) UnregisterWorker(ctx context.Context, workerID string) error {
	return b.write(ctx, "unregister worker", func(tx *txn, _ time.Time) error {
		_, err := tx.Exec(`DELETE FROM tw_workers WHERE id = ?`, workerID)
		return err
	})
}

// RunningClaims returns the claims of the messages running under
// workerID, by message id.
func (b *Broker) RunningClaims(ctx context.Context, workerID string) ([]broker.Claim, error) {
	out := []broker.Claim{}
	err := b.read(ctx, "running claims", func(tx *txn, _ time.Time) error {
		out = out[:0]
		rows, err := tx.Query(`SELECT id, token FROM tw_messages
			WHERE state = 'running' AND claimed_by = ? ORDER BY id`, workerID)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var cl broker.Claim
			if err := rows.Scan(&cl.ID, &cl.Token); err != nil {
				return err
			}
			out = append(out, cl)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Workers lists every registered worker (live or not) by id, with Running
// counted from the running messages it claimed.
func (b *Broker) Workers(ctx context.Context) ([]broker.WorkerInfo, error) {
	out := []broker.WorkerInfo{}
	err := b.read(ctx, "workers", func(tx *txn, _ time.Time) error {
		out = out[:0]
		running := map[string]int{}
		if err := countBy(tx, running, nil,
			`SELECT claimed_by, count(*), 0 FROM tw_messages WHERE state = 'running' GROUP BY claimed_by`); err != nil {
			return err
		}
		rows, err := tx.Query(`SELECT id, host, pid, roles, topics, capacity, tasks, started_at, heartbeat_at
			FROM tw_workers ORDER BY id`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var w broker.WorkerInfo
			var roles, topics, tasks string
			var started, heartbeat int64
			if err := rows.Scan(&w.ID, &w.Host, &w.PID, &roles, &topics, &w.Capacity, &tasks, &started, &heartbeat); err != nil {
				return err
			}
			if err := unmarshalWorker(&w, roles, topics); err != nil {
				return err
			}
			if err := json.Unmarshal([]byte(tasks), &w.Tasks); err != nil {
				return fmt.Errorf("worker %q: tasks: %w", w.ID, err)
			}
			w.StartedAt = fromNS(started)
			w.HeartbeatAt = fromNS(heartbeat)
			w.Running = running[w.ID]
			out = append(out, w)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func unmarshalWorker(w *broker.WorkerInfo, roles, topics string) error {
	if err := json.Unmarshal([]byte(roles), &w.Roles); err != nil {
		return fmt.Errorf("worker %q: roles: %w", w.ID, err)
	}
	if err := json.Unmarshal([]byte(topics), &w.Topics); err != nil {
		return fmt.Errorf("worker %q: topics: %w", w.ID, err)
	}
	return nil
}

// countBy runs q, which selects (key, count, min) rows, into counts and,
// when mins is not nil, mins.
func countBy(tx *txn, counts map[string]int, mins map[string]int64, q string, args ...any) error {
	rows, err := tx.Query(q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var n int
		var lo sql.NullInt64
		if err := rows.Scan(&key, &n, &lo); err != nil {
			return err
		}
		counts[key] = n
		if mins != nil && lo.Valid {
			mins[key] = lo.Int64
		}
	}
	return rows.Err()
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
	err := b.write(ctx, "set topic", func(tx *txn, _ time.Time) error {
		return tx.QueryRow(`INSERT INTO tw_topics (name, concurrency_limit, dead_letter_enabled, paused)
			VALUES (?1, coalesce(?2, 0), coalesce(?3, 1), coalesce(?4, 0))
			ON CONFLICT (name) DO UPDATE SET
				concurrency_limit = coalesce(?2, concurrency_limit),
				dead_letter_enabled = coalesce(?3, dead_letter_enabled),
				paused = coalesce(?4, paused)
			RETURNING name, concurrency_limit, dead_letter_enabled, paused`,
			name, nullInt(patch.ConcurrencyLimit), nullBool(patch.DeadLetterEnabled), nullBool(patch.Paused),
		).Scan(&cfg.Name, &cfg.ConcurrencyLimit, &cfg.DeadLetterEnabled, &cfg.Paused)
	})
	if err != nil {
		return broker.TopicConfig{}, err
	}
	return cfg, nil
}

func nullInt(p *int) sql.NullInt64 {
	if p == nil {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: int64(*p), Valid: true}
}

func nullBool(p *bool) sql.NullInt64 {
	if p == nil {
		return sql.NullInt64{}
	}
	if *p {
		return sql.NullInt64{Int64: 1, Valid: true}
	}
	return sql.NullInt64{Int64: 0, Valid: true}
}

// Topics lists the topic configs by name.
func (b *Broker) Topics(ctx context.Context) ([]broker.TopicConfig, error) {
	out := []broker.TopicConfig{}
	err := b.read(ctx, "topics", func(tx *txn, _ time.Time) error {
		var err error
		out, err = topicConfigs(tx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func topicConfigs(tx *txn) ([]broker.TopicConfig, error) {
	rows, err := tx.Query(`SELECT name, concurrency_limit, dead_letter_enabled, paused FROM tw_topics ORDER BY name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []broker.TopicConfig{}
	for rows.Next() {
		var c broker.TopicConfig
		if err := rows.Scan(&c.Name, &c.ConcurrencyLimit, &c.DeadLetterEnabled, &c.Paused); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// Drain pauses the topic (creating its config when missing): Claim hands
// out nothing more from it while running messages finish.
func (b *Broker) Drain(ctx context.Context, topic string) error {
	paused := true
	_, err := b.SetTopic(ctx, topic, broker.TopicPatch{Paused: &paused})
	return err
}

// Stats counts per topic and overall from one snapshot; see broker.Stats.
// Workers, Beats and Subscribers count live workers only (heartbeat within
// LiveAfter).
func (b *Broker) Stats(ctx context.Context) (broker.Stats, error) {
	var st broker.Stats
	err := b.read(ctx, "stats", func(tx *txn, now time.Time) error {
		cfgs, err := topicConfigs(tx)
		if err != nil {
			return err
		}
		queued, running, dead := map[string]int{}, map[string]int{}, map[string]int{}
		oldest := map[string]int64{}
		if err := countBy(tx, queued, nil,
			`SELECT topic, count(*), 0 FROM tw_messages WHERE state = 'queued' GROUP BY topic`); err != nil {
			return err
		}
		if err := countBy(tx, running, oldest,
			`SELECT topic, count(*), min(claimed_at) FROM tw_messages WHERE state = 'running' GROUP BY topic`); err != nil {
			return err
		}
		if err := countBy(tx, dead, nil,
			`SELECT topic, count(*), 0 FROM tw_messages WHERE state = 'dead' GROUP BY topic`); err != nil {
			return err
		}

		var live []broker.WorkerInfo
		rows, err := tx.Query(`SELECT id, roles, topics FROM tw_workers WHERE heartbeat_at >= ?`,
			addNS(now, -b.opts.LiveAfter))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var w broker.WorkerInfo
			var roles, topics string
			if err := rows.Scan(&w.ID, &roles, &topics); err != nil {
				return err
			}
			if err := unmarshalWorker(&w, roles, topics); err != nil {
				return err
			}
			live = append(live, w)
		}
		if err := rows.Err(); err != nil {
			return err
		}

		st = broker.Stats{Topics: make([]broker.TopicStats, 0, len(cfgs)), Workers: len(live)}
		if err := tx.QueryRow(`SELECT count(*) FROM tw_locks`).Scan(&st.Locks); err != nil {
			return err
		}
		for _, cfg := range cfgs {
			ts := broker.TopicStats{
				TopicConfig: cfg,
				Queued:      queued[cfg.Name],
				Running:     running[cfg.Name],
				DeadLetter:  dead[cfg.Name],
			}
			if o, ok := oldest[cfg.Name]; ok {
				ts.OldestClaimAge = max(now.Sub(fromNS(o)), 0)
			}
			for _, w := range live {
				if slices.Contains(w.Topics, cfg.Name) || slices.Contains(w.Topics, "*") {
					ts.Subscribers++
				}
			}
			st.Topics = append(st.Topics, ts)
		}
		for _, w := range live {
			if w.HasRole(broker.RoleBeat) {
				st.Beats++
			}
		}
		return nil
	})
	if err != nil {
		return broker.Stats{}, err
	}
	return st, nil
}

// ---- locks ----

// AcquireLock takes lock name for the running claim c: true when it is
// taken now or was already held under c, false when another claim holds
// it. A claim that does not hold its message is broker.ErrClaimLost.
func (b *Broker) AcquireLock(ctx context.Context, name, holder string, c broker.Claim) (bool, error) {
	if name == "" {
		return false, broker.Invalid("lock name is empty")
	}
	var ok bool
	err := b.write(ctx, "acquire lock", func(tx *txn, now time.Time) error {
		ok = false
		var one int
		err := tx.QueryRow(`SELECT 1 FROM tw_messages WHERE id = ? AND state = 'running' AND token = ?`,
			c.ID, c.Token).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return broker.ErrClaimLost
		}
		if err != nil {
			return err
		}
		r, err := tx.Exec(`INSERT INTO tw_locks (name, holder, message_id, token, acquired_at)
			VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING`, name, holder, c.ID, c.Token, ns(now))
		if err != nil {
			return err
		}
		if n, err := r.RowsAffected(); err != nil {
			return err
		} else if n == 1 {
			ok = true
			return nil
		}
		var id int64
		var token string
		if err := tx.QueryRow(`SELECT message_id, token FROM tw_locks WHERE name = ?`, name).Scan(&id, &token); err != nil {
			return err
		}
		ok = id == c.ID && token == c.Token
		return nil
	})
	if err != nil {
		return false, err
	}
	return ok, nil
}

// ReleaseLock releases lock name if it is held under claim c; otherwise
// (held by another claim, or not held at all) broker.ErrClaimLost.
func (b *Broker) ReleaseLock(ctx context.Context, name string, c broker.Claim) error {
	if name == "" {
		return broker.Invalid("lock name is empty")
	}
	return b.write(ctx, "release lock", func(tx *txn, _ time.Time) error {
		r, err := tx.Exec(`DELETE FROM tw_locks WHERE name = ? AND message_id = ? AND token = ?`, name, c.ID, c.Token)
		if err != nil {
			return err
		}
		if n, err := r.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
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
	var ok bool
	err := b.write(ctx, "force release lock", func(tx *txn, _ time.Time) error {
		r, err := tx.Exec(`DELETE FROM tw_locks WHERE name = ?`, name)
		if err != nil {
			return err
		}
		n, err := r.RowsAffected()
		ok = n > 0
		return err
	})
	if err != nil {
		return false, err
	}
	return ok, nil
}

// Locks lists the held locks by name.
func (b *Broker) Locks(ctx context.Context) ([]broker.Lock, error) {
	out := []broker.Lock{}
	err := b.read(ctx, "locks", func(tx *txn, _ time.Time) error {
		out = out[:0]
		rows, err := tx.Query(`SELECT name, holder, message_id, acquired_at FROM tw_locks ORDER BY name`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var l broker.Lock
			var at int64
			if err := rows.Scan(&l.Name, &l.Holder, &l.MessageID, &at); err != nil {
				return err
			}
			l.AcquiredAt = fromNS(at)
			out = append(out, l)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ---- orphans ----

// LiveWorkers returns, by id, the workers whose heartbeat is fresher than
// after by the machine's clock.
func (b *Broker) LiveWorkers(ctx context.Context, after time.Duration) ([]string, error) {
	if after < 0 {
		return nil, broker.Invalid("liveness window is negative")
	}
	out := []string{}
	err := b.read(ctx, "live workers", func(tx *txn, now time.Time) error {
		out = out[:0]
		rows, err := tx.Query(`SELECT id FROM tw_workers WHERE heartbeat_at > ? ORDER BY id`, addNS(now, -after))
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

// ReclaimOrphans does one reaper pass in one transaction; see
// broker.OrphanReclaimer. A reclaimed message's claim ends: the locks held
// under it are released (and counted) too, and its last error says who
// lost it. WithinGrace counts the orphan candidates (messages and locks)
// the grace kept.
//
// With req.Fence the pass is a leader-only write: it goes ahead only while
// Fence.Holder holds the lease at Fence.Term, unexpired
// (broker.ErrNotLeader otherwise, nothing changed).
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
	liveJSON, err := json.Marshal(req.Live)
	if err != nil {
		return broker.ReclaimResult{}, broker.Invalid("live set: %v", err)
	}
	var res broker.ReclaimResult
	err = b.write(ctx, "reclaim orphans", func(tx *txn, now time.Time) error {
		res = broker.ReclaimResult{}
		if err := checkFence(tx, req.Fence, now); err != nil {
			return err
		}
		cutoff := addNS(now, -req.Grace)
		type orphan struct {
			id       int64
			attempts int
			orphaned int
			by       string
			token    string
		}
		var orphans []orphan
		rows, err := tx.Query(`SELECT id, attempts, orphaned, claimed_by, token FROM tw_messages
			WHERE state = 'running' AND claimed_at <= ?
				AND claimed_by NOT IN (SELECT value FROM json_each(?))
			ORDER BY id`, cutoff, string(liveJSON))
		if err != nil {
			return err
		}
		for rows.Next() {
			var o orphan
			if err := rows.Scan(&o.id, &o.attempts, &o.orphaned, &o.by, &o.token); err != nil {
				rows.Close()
				return err
			}
			orphans = append(orphans, o)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}

		for _, o := range orphans {
			r, err := tx.Exec(`DELETE FROM tw_locks WHERE message_id = ? AND token = ?`, o.id, o.token)
			if err != nil {
				return err
			}
			n, err := r.RowsAffected()
			if err != nil {
				return err
			}
			res.LocksReleased += int(n)
			// Only orphanings count toward the orphan budget; error retries
			// claim too, but have their own limit.
			if _, err := tx.Exec(`UPDATE tw_messages SET orphaned = orphaned + 1 WHERE id = ?`, o.id); err != nil {
				return err
			}
			if req.MaxAttempts > 0 && o.orphaned+1 >= req.MaxAttempts {
				reason := fmt.Sprintf(broker.OrphanedErrorPrefix+" worker %q stopped heartbeating during attempt %d; its claim was orphaned %d times (orphan max %d); dead-lettered by the reaper",
					o.by, o.attempts, o.orphaned+1, req.MaxAttempts)
				if err := finish(tx, o.id, broker.StateDead, reason, now); err != nil {
					return err
				}
				res.DeadLettered++
			} else {
				reason := fmt.Sprintf(broker.OrphanedErrorPrefix+" worker %q stopped heartbeating during attempt %d; requeued by the reaper", o.by, o.attempts)
				_, err := tx.Exec(`UPDATE tw_messages
					SET state = 'queued', claimed_by = NULL, claimed_at = NULL, token = NULL,
						available_at = ?, last_error = ?
					WHERE id = ?`, ns(now), reason, o.id)
				if err != nil {
					return err
				}
				res.Reclaimed++
			}
			res.IDs = append(res.IDs, o.id)
		}

		r, err := tx.Exec(`DELETE FROM tw_locks
			WHERE acquired_at <= ? AND holder NOT IN (SELECT value FROM json_each(?))`, cutoff, string(liveJSON))
		if err != nil {
			return err
		}
		n, err := r.RowsAffected()
		if err != nil {
			return err
		}
		res.LocksReleased += int(n)

		// What the grace kept: claims and locks of non-live workers too
		// young to touch.
		var young, youngLocks int
		if err := tx.QueryRow(`SELECT count(*) FROM tw_messages
			WHERE state = 'running' AND claimed_at > ?
				AND claimed_by NOT IN (SELECT value FROM json_each(?))`, cutoff, string(liveJSON)).Scan(&young); err != nil {
			return err
		}
		if err := tx.QueryRow(`SELECT count(*) FROM tw_locks
			WHERE acquired_at > ? AND holder NOT IN (SELECT value FROM json_each(?))`, cutoff, string(liveJSON)).Scan(&youngLocks); err != nil {
			return err
		}
		res.WithinGrace = young + youngLocks
		return nil
	})
	if err != nil {
		return broker.ReclaimResult{}, err
	}
	if res.Reclaimed+res.DeadLettered+res.LocksReleased > 0 {
		b.log.Info("reclaimed orphans", "reclaimed", res.Reclaimed, "dead_lettered", res.DeadLettered,
			"locks_released", res.LocksReleased, "within_grace", res.WithinGrace, "ids", res.IDs)
	}
	return res, nil
}

// ExpireWorker sets the worker's heartbeat to the epoch, so it leaves the
// live set at once (and housekeeping deletes its row on its next pass);
// broker.ErrNotFound when it is not registered.
func (b *Broker) ExpireWorker(ctx context.Context, workerID string) error {
	return b.write(ctx, "expire worker", func(tx *txn, _ time.Time) error {
		return updateWorker(tx, workerID, 0)
	})
}

// ---- housekeeping ----

// retainChunk bounds the rows one housekeeping transaction deletes, so the
// write lock is never held long.
const retainChunk = 5000

func (b *Broker) housekeeping(ctx context.Context) {
	defer b.bg.Done()
	t := time.NewTicker(housekeepingInterval)
	defer t.Stop()
	// Open purged the silent workers; the first trim runs now.
	work := b.trimFinished
	for {
		if err := work(ctx); err != nil && ctx.Err() == nil {
			b.log.Warn("housekeeping failed", "path", b.path, "error", err)
		}
		work = b.housekeep
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// housekeep deletes workers silent for longer than WorkerTTL and the
// oldest finished messages past Retain.
func (b *Broker) housekeep(ctx context.Context) error {
	if err := b.purgeWorkers(ctx); err != nil {
		return err
	}
	return b.trimFinished(ctx)
}

// purgeWorkers deletes the workers silent for longer than WorkerTTL.
func (b *Broker) purgeWorkers(ctx context.Context) error {
	var workers int64
	err := b.write(ctx, "housekeeping", func(tx *txn, now time.Time) error {
		r, err := tx.Exec(`DELETE FROM tw_workers WHERE heartbeat_at < ?`, addNS(now, -b.opts.WorkerTTL))
		if err != nil {
			return err
		}
		workers, err = r.RowsAffected()
		return err
	})
	if err != nil {
		return err
	}
	if workers > 0 {
		b.log.Info("deleted silent workers", "count", workers, "worker_ttl", b.opts.WorkerTTL.String())
	}
	return nil
}

// trimFinished deletes the oldest finished messages past Retain, a chunk
// per transaction.
func (b *Broker) trimFinished(ctx context.Context) error {
	var dropped int64
	for {
		var n int64
		err := b.write(ctx, "housekeeping", func(tx *txn, _ time.Time) error {
			n = 0
			var finished int64
			if err := tx.QueryRow(`SELECT count(*) FROM tw_messages
				WHERE state IN ('done', 'failed', 'dead')`).Scan(&finished); err != nil {
				return err
			}
			excess := min(finished-int64(b.opts.Retain), retainChunk)
			if excess <= 0 {
				return nil
			}
			r, err := tx.Exec(`DELETE FROM tw_messages WHERE id IN (
				SELECT id FROM tw_messages INDEXED BY tw_messages_finished
				WHERE state IN ('done', 'failed', 'dead')
				ORDER BY finished_at, id LIMIT ?)`, excess)
			if err != nil {
				return err
			}
			n, err = r.RowsAffected()
			return err
		})
		if err != nil {
			return err
		}
		dropped += n
		if n < retainChunk {
			break
		}
	}
	if dropped > 0 {
		b.log.Debug("dropped finished messages past retain", "count", dropped, "retain", b.opts.Retain)
	}
	return nil
}
