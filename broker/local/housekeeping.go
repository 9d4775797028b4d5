package local

import (
	"context"
	"time"

	"github.com/taskhost/taskhost/broker"
)

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

// housekeep deletes workers silent for longer than WorkerTTL, the unique
// keys last used longer ago than any window, and the oldest finished
// messages past Retain.
func (b *Broker) housekeep(ctx context.Context) error {
	if err := b.purgeWorkers(ctx); err != nil {
		return err
	}
	if err := b.purgeUniqueKeys(ctx); err != nil {
		return err
	}
	return b.trimFinished(ctx)
}

// purgeUniqueKeys deletes the rows of tw_unique_keys older than
// broker.MaxDelay, the longest window (unique_for_seconds) they serve, a
// chunk per transaction.
func (b *Broker) purgeUniqueKeys(ctx context.Context) error {
	for {
		var n int64
		err := b.write(ctx, "housekeeping", func(tx *txn, now time.Time) error {
			r, err := tx.Exec(`DELETE FROM tw_unique_keys WHERE key IN (
				SELECT key FROM tw_unique_keys WHERE created_at < ? LIMIT ?)`, addNS(now, -broker.MaxDelay), retainChunk)
			if err != nil {
				return err
			}
			n, err = r.RowsAffected()
			return err
		})
		if err != nil || n < retainChunk {
			return err
		}
	}
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
				WHERE state IN ('done', 'failed', 'dead', 'cancelled')`).Scan(&finished); err != nil {
				return err
			}
			excess := min(finished-int64(b.opts.Retain), retainChunk)
			if excess <= 0 {
				return nil
			}
			r, err := tx.Exec(`DELETE FROM tw_messages WHERE id IN (
				SELECT id FROM tw_messages INDEXED BY tw_messages_finished
				WHERE state IN ('done', 'failed', 'dead', 'cancelled')
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
