package local

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/sqlstore"
)

// The hooks of a broker whose messages travel outside the store
// (broker/rabbitmq); see sqlstore.External. Each is one IMMEDIATE
// transaction, so a take is race-free across processes as Claim is.

var _ sqlstore.External = (*Broker)(nil)

// SubmitOutbox: see sqlstore.External.
func (b *Broker) SubmitOutbox(ctx context.Context, reqs []broker.SubmitRequest, lease time.Duration, arm int64) ([]broker.Submitted, error) {
	return b.submitBatch(ctx, reqs, func(tx *txn, now time.Time, out []broker.Submitted) error {
		for i, s := range out {
			if s.Duplicate {
				continue
			}
			due := reqs[i].AvailableAt(now)
			if !due.After(now) {
				due = now.Add(lease)
			}
			if _, err := tx.Exec(`INSERT INTO tw_amqp_outbox (message_id, due_at, arm) VALUES (?, ?, ?)`+outboxUpsert, s.ID, ns(due), arm); err != nil {
				return err
			}
		}
		return nil
	})
}

// EnableOutbox makes the store the state store of a rabbitmq broker:
// every message that becomes queued (inserted, by a schedule's fire
// too, or put back by a requeue or the reaper's reclaim) gets an outbox
// entry in the transaction that makes it queued, due a lease ahead, so a
// crash right after that commit loses no message: the broker publishes it
// at once and deletes the entry, or the publisher loop publishes it. The
// plain local broker never calls it, and pays nothing for it.
func (b *Broker) EnableOutbox(ctx context.Context) error {
	return b.write(ctx, "enable outbox", func(tx *txn, _ time.Time) error {
		for _, q := range outboxTriggersSQL {
			if _, err := tx.Exec(q); err != nil {
				return err
			}
		}
		return nil
	})
}

// outboxTriggersSQL are EnableOutbox's triggers. Times are unix
// nanoseconds; SQLite's own clock stands for now.
var outboxTriggersSQL = []string{
	`CREATE TRIGGER IF NOT EXISTS tw_amqp_outbox_add AFTER INSERT ON tw_messages
	WHEN NEW.state = 'queued'
	BEGIN
		INSERT OR IGNORE INTO tw_amqp_outbox (message_id, due_at)
		VALUES (NEW.id, max(NEW.available_at, ` + sqliteNowNS + `) + 5000000000);
	END`,
	`CREATE TRIGGER IF NOT EXISTS tw_amqp_outbox_requeued AFTER UPDATE OF state ON tw_messages
	WHEN NEW.state = 'queued' AND OLD.state <> 'queued'
	BEGIN
		INSERT OR IGNORE INTO tw_amqp_outbox (message_id, due_at)
		VALUES (NEW.id, max(NEW.available_at, ` + sqliteNowNS + `) + 15000000000);
	END`,
}

// sqliteNowNS is SQLite's current time in unix nanoseconds.
const sqliteNowNS = `CAST((julianday('now') - 2440587.5) * 86400000000000.0 AS INTEGER)`

// OutboxAdd: see sqlstore.External.
func (b *Broker) OutboxAdd(ctx context.Context, ids []int64, delay time.Duration, arm int64) error {
	if len(ids) == 0 {
		return nil
	}
	js, err := json.Marshal(ids)
	if err != nil {
		return err
	}
	return b.write(ctx, "outbox add", func(tx *txn, now time.Time) error {
		_, err := tx.Exec(`INSERT INTO tw_amqp_outbox (message_id, due_at, arm) SELECT value, ?, ? FROM json_each(?) WHERE true`+outboxUpsert,
			addNS(now, delay), arm, string(js))
		return err
	})
}

// outboxUpsert ends the statements that put messages in the outbox: an
// entry already there keeps the earlier time, and takes the new arm.
const outboxUpsert = ` ON CONFLICT (message_id) DO UPDATE SET due_at = min(due_at, excluded.due_at), arm = excluded.arm`

// OutboxAddQueued: see sqlstore.External.
func (b *Broker) OutboxAddQueued(ctx context.Context, topic string, age time.Duration) (int, error) {
	var n int64
	err := b.write(ctx, "outbox add queued", func(tx *txn, now time.Time) error {
		r, err := tx.Exec(`INSERT INTO tw_amqp_outbox (message_id, due_at, arm)
			SELECT id, max(available_at, ?), 0 FROM tw_messages WHERE topic = ? AND state = 'queued' AND created_at <= ?`+outboxUpsert,
			ns(now), topic, addNS(now, -age))
		if err != nil {
			return err
		}
		n, err = r.RowsAffected()
		return err
	})
	return int(n), err
}

// QueuedOutside: see sqlstore.External. The inner query walks the
// partial index tw_messages_claim (topic, priority DESC, available_at, id)
// and stops after limit entries; the outer one tells those available
// since before the cutoff that have no outbox entry (a primary-key probe
// each).
func (b *Broker) QueuedOutside(ctx context.Context, topic string, age time.Duration, limit int) (ids []int64, read int, err error) {
	err = b.read(ctx, "queued outside", func(tx *txn, now time.Time) error {
		rows, err := tx.Query(`SELECT q.id, q.available_at <= ? AND NOT EXISTS (SELECT 1 FROM tw_amqp_outbox o WHERE o.message_id = q.id)
			FROM (SELECT id, priority, available_at FROM tw_messages
				WHERE topic = ? AND state = 'queued'
				ORDER BY priority DESC, available_at, id LIMIT ?) q
			ORDER BY q.priority DESC, q.available_at, q.id`, addNS(now, -age), topic, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		ids, read = ids[:0], 0
		for rows.Next() {
			var (
				id      int64
				outside bool
			)
			if err := rows.Scan(&id, &outside); err != nil {
				return err
			}
			read++
			if outside {
				ids = append(ids, id)
			}
		}
		return rows.Err()
	})
	return ids, read, err
}

// OutboxDue: see sqlstore.External.
func (b *Broker) OutboxDue(ctx context.Context, lease time.Duration, limit int, arm int64) ([]sqlstore.OutboxEntry, error) {
	var out []sqlstore.OutboxEntry
	err := b.write(ctx, "outbox due", func(tx *txn, now time.Time) error {
		out = nil
		rows, err := tx.Query(`SELECT o.message_id, m.state, m.topic, m.available_at FROM tw_amqp_outbox o
			LEFT JOIN tw_messages m ON m.id = o.message_id
			WHERE o.due_at <= ? ORDER BY o.due_at, o.message_id LIMIT ?`, ns(now), limit)
		if err != nil {
			return err
		}
		type entry struct {
			id           int64
			state, topic sql.NullString
			available    sql.NullInt64
		}
		var es []entry
		for rows.Next() {
			var e entry
			if err := rows.Scan(&e.id, &e.state, &e.topic, &e.available); err != nil {
				rows.Close()
				return err
			}
			es = append(es, e)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, e := range es {
			switch e.state.String {
			case broker.StateQueued, broker.StateRunning:
				// A queued message not available yet is due when it is.
				ready := e.state.String == broker.StateQueued && e.available.Int64 <= ns(now)
				due := addNS(now, lease)
				if e.state.String == broker.StateQueued && !ready {
					due = e.available.Int64
				}
				if _, err := tx.Exec(`UPDATE tw_amqp_outbox SET due_at = ?, arm = CASE WHEN ? THEN ? ELSE arm END WHERE message_id = ?`,
					due, ready, arm, e.id); err != nil {
					return err
				}
				if ready {
					out = append(out, sqlstore.OutboxEntry{ID: e.id, Topic: e.topic.String, Arm: arm})
				}
			default:
				if _, err := tx.Exec(`DELETE FROM tw_amqp_outbox WHERE message_id = ?`, e.id); err != nil {
					return err
				}
			}
		}
		return nil
	})
	return out, err
}

// OutboxDone: see sqlstore.External.
func (b *Broker) OutboxDone(ctx context.Context, published []sqlstore.OutboxEntry) error {
	if len(published) == 0 {
		return nil
	}
	pairs := make([][2]int64, len(published))
	for i, e := range published {
		pairs[i] = [2]int64{e.ID, e.Arm}
	}
	js, err := json.Marshal(pairs)
	if err != nil {
		return err
	}
	return b.write(ctx, "outbox done", func(tx *txn, _ time.Time) error {
		_, err := tx.Exec(`DELETE FROM tw_amqp_outbox WHERE (message_id, arm) IN
			(SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?))`, string(js))
		return err
	})
}

// TakeMessages: see sqlstore.External and sqlstore.Take.
func (b *Broker) TakeMessages(ctx context.Context, worker string, ds []sqlstore.Delivery) ([]sqlstore.Taken, error) {
	if worker == "" {
		return nil, broker.Invalid("worker id is empty")
	}
	var out []sqlstore.Taken
	err := b.write(ctx, "take messages", func(tx *txn, now time.Time) error {
		out = make([]sqlstore.Taken, 0, len(ds))
		topics := make(map[string]*sqlstore.TopicFacts)
		for _, d := range ds {
			t, err := takeOne(tx, now, worker, d, topics)
			if err != nil {
				return err
			}
			out = append(out, t)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// takeOne decides one delivery in tx; topics caches the facts of the
// topics met so far in the transaction.
func takeOne(tx *txn, now time.Time, worker string, d sqlstore.Delivery, topics map[string]*sqlstore.TopicFacts) (sqlstore.Taken, error) {
	f := sqlstore.TakeFacts{Found: true, Redelivered: d.Redelivered}
	var (
		topic, by string
		attempts  int
	)
	err := tx.QueryRow(`SELECT state, available_at <= ?, topic, coalesce(claimed_by, ''), attempts
		FROM tw_messages WHERE id = ?`, ns(now), d.ID).Scan(&f.State, &f.Available, &topic, &by, &attempts)
	if errors.Is(err, sql.ErrNoRows) {
		return sqlstore.Taken{Verdict: sqlstore.Take(sqlstore.TakeFacts{})}, nil
	}
	if err != nil {
		return sqlstore.Taken{}, err
	}
	var tf *sqlstore.TopicFacts
	if f.State == broker.StateQueued {
		if tf = topics[topic]; tf == nil {
			tf = new(sqlstore.TopicFacts)
			err := tx.QueryRow(`SELECT paused, concurrency_limit,
					CASE WHEN concurrency_limit > 0 THEN
						(SELECT count(*) FROM tw_messages WHERE topic = tw_topics.name AND state = 'running') ELSE 0 END
				FROM tw_topics WHERE name = ?`, topic).Scan(&tf.Paused, &tf.Limit, &tf.Running)
			if err != nil && !errors.Is(err, sql.ErrNoRows) {
				return sqlstore.Taken{}, err
			}
			topics[topic] = tf
		}
		f.Paused, f.Limit, f.Running = tf.Paused, tf.Limit, tf.Running
	}
	v := sqlstore.Take(f)
	if v != sqlstore.TakeOK {
		return sqlstore.Taken{Verdict: v}, nil
	}
	q := `UPDATE tw_messages SET state = 'running', claimed_by = ?, claimed_at = ?, attempts = attempts + 1, token = ?
		WHERE id = ? RETURNING ` + msgCols
	args := []any{worker, ns(now), broker.NewToken(), d.ID}
	if f.State == broker.StateRunning {
		if _, err := tx.Exec(`DELETE FROM tw_locks WHERE message_id = ?`, d.ID); err != nil {
			return sqlstore.Taken{}, err
		}
		if _, err := tx.Exec(`INSERT INTO tw_amqp_orphans (message_id, kind) VALUES (?, 'reclaimed')`, d.ID); err != nil {
			return sqlstore.Taken{}, err
		}
		q = `UPDATE tw_messages SET claimed_by = ?, claimed_at = ?, attempts = attempts + 1, token = ?,
			orphaned = orphaned + 1, suspect = 1, last_error = ?
			WHERE id = ? RETURNING ` + msgCols
		args = []any{worker, ns(now), broker.NewToken(), sqlstore.RetakenError(by, attempts), d.ID}
	} else {
		tf.Running++
	}
	m, err := scanMessage(tx.QueryRow(q, args...), true)
	if err != nil {
		return sqlstore.Taken{}, err
	}
	return sqlstore.Taken{Message: m, Verdict: v}, nil
}

// EndUndeliverable: see sqlstore.External.
func (b *Broker) EndUndeliverable(ctx context.Context, id int64, reason string) (bool, error) {
	var ended bool
	err := b.write(ctx, "end undeliverable", func(tx *txn, now time.Time) error {
		r, err := tx.Exec(`UPDATE tw_messages
			SET state = 'dead', token = NULL, finished_at = ?, last_error = ?, suspect = 1, waiting_since = NULL
			WHERE id = ? AND state IN ('queued', 'running')`, ns(now), broker.CleanText(reason), id)
		if err != nil {
			return err
		}
		n, err := r.RowsAffected()
		if err != nil || n == 0 {
			return err
		}
		ended = true
		if _, err := tx.Exec(`INSERT INTO tw_amqp_orphans (message_id, kind) VALUES (?, 'dead_lettered')`, id); err != nil {
			return err
		}
		_, err = tx.Exec(`DELETE FROM tw_locks WHERE message_id = ?`, id)
		return err
	})
	return ended, err
}

// TakeOrphanLog: see sqlstore.External.
func (b *Broker) TakeOrphanLog(ctx context.Context) (reclaimed, deadLettered []int64, err error) {
	err = b.write(ctx, "take orphan log", func(tx *txn, _ time.Time) error {
		rows, err := tx.Query(`DELETE FROM tw_amqp_orphans RETURNING message_id, kind`)
		if err != nil {
			return err
		}
		defer rows.Close()
		reclaimed, deadLettered, err = sqlstore.ReadOrphanLog(rows)
		return err
	})
	return reclaimed, deadLettered, err
}

// Admits: see sqlstore.External.
func (b *Broker) Admits(ctx context.Context, topics []string) (map[string]int, error) {
	js, err := json.Marshal(topics)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int, len(topics))
	err = b.read(ctx, "admits", func(tx *txn, _ time.Time) error {
		rows, err := tx.Query(sqlstore.AdmitsSQL(`IN (SELECT value FROM json_each(?))`), string(js))
		if err != nil {
			return err
		}
		defer rows.Close()
		return sqlstore.ReadAdmits(rows, out)
	})
	return out, err
}
