package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/sqlstore"
)

// The hooks of a broker whose messages travel outside the store
// (broker/rabbitmq); see sqlstore.External. A take locks its message's
// row, and its topic's row when the topic has a concurrency limit, so that
// takes from every process count running rows race-free, as Claim does.

var _ sqlstore.External = (*Broker)(nil)

// outboxUpsert ends the statements that put messages in the outbox: an
// entry already there keeps the earlier time, and takes the new arm.
const outboxUpsert = ` ON CONFLICT (message_id) DO UPDATE SET due_at = least(tw_amqp_outbox.due_at, excluded.due_at), arm = excluded.arm`

// tx runs fn in one transaction on a pooled connection.
func (b *Broker) tx(ctx context.Context, op string, fn func(tx pgx.Tx) error) error {
	return b.run(ctx, op, func(c *pgx.Conn) error { return pgx.BeginFunc(ctx, c, fn) })
}

// SubmitOutbox: see sqlstore.External.
func (b *Broker) SubmitOutbox(ctx context.Context, reqs []broker.SubmitRequest, lease time.Duration, arm int64) ([]broker.Submitted, error) {
	var out []broker.Submitted
	err := b.tx(ctx, "submit outbox", func(tx pgx.Tx) error {
		var err error
		if out, err = b.ins.InsertBatch(ctx, tx, reqs, b.maxPayload); err != nil {
			return err
		}
		ids := make([]int64, 0, len(out))
		for _, s := range out {
			if !s.Duplicate {
				ids = append(ids, s.ID)
			}
		}
		_, err = tx.Exec(ctx, `INSERT INTO tw_amqp_outbox (message_id, due_at, arm)
			SELECT id, CASE WHEN available_at > now() THEN available_at ELSE now() + $2 * interval '1 microsecond' END, $3
			FROM tw_messages WHERE id = ANY ($1)`+outboxUpsert, ids, micros(lease), arm)
		return err
	})
	if err != nil {
		return nil, outcomeOf(err)
	}
	return out, nil
}

// OutboxAdd: see sqlstore.External.
func (b *Broker) OutboxAdd(ctx context.Context, ids []int64, delay time.Duration, arm int64) error {
	if len(ids) == 0 {
		return nil
	}
	return b.run(ctx, "outbox add", func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, `INSERT INTO tw_amqp_outbox (message_id, due_at, arm)
			SELECT id, now() + $2 * interval '1 microsecond', $3 FROM unnest($1::bigint[]) AS id`+outboxUpsert, ids, micros(delay), arm)
		return err
	})
}

// OutboxAddQueued: see sqlstore.External.
func (b *Broker) OutboxAddQueued(ctx context.Context, topic string, age time.Duration) (int, error) {
	var n int64
	err := b.run(ctx, "outbox add queued", func(c *pgx.Conn) error {
		tag, err := c.Exec(ctx, `INSERT INTO tw_amqp_outbox (message_id, due_at, arm)
			SELECT id, greatest(available_at, now()), 0 FROM tw_messages
			WHERE topic = $1 AND state = 'queued' AND created_at <= now() - $2 * interval '1 microsecond'`+outboxUpsert, topic, micros(age))
		n = tag.RowsAffected()
		return err
	})
	return int(n), err
}

// QueuedOutside: see sqlstore.External. The inner query walks the
// partial index tw_messages_queued (topic, -priority, available_at, id)
// and stops after $2 entries; the outer one tells those available since
// before the cutoff that have no outbox entry (a primary-key probe each).
func (b *Broker) QueuedOutside(ctx context.Context, topic string, age time.Duration, limit int) (ids []int64, read int, err error) {
	err = b.run(ctx, "queued outside", func(c *pgx.Conn) error {
		rows, err := c.Query(ctx, `SELECT q.id, q.available_at <= now() - $3 * interval '1 microsecond'
				AND NOT EXISTS (SELECT 1 FROM tw_amqp_outbox o WHERE o.message_id = q.id)
			FROM (SELECT id, priority, available_at FROM tw_messages
				WHERE topic = $1 AND state = 'queued'
				ORDER BY -priority, available_at, id LIMIT $2) q
			ORDER BY -q.priority, q.available_at, q.id`, topic, limit, micros(age))
		if err != nil {
			return err
		}
		ids, read = ids[:0], 0
		var (
			id      int64
			outside bool
		)
		_, err = pgx.ForEachRow(rows, []any{&id, &outside}, func() error {
			read++
			if outside {
				ids = append(ids, id)
			}
			return nil
		})
		return err
	})
	return ids, read, err
}

// outboxDueSQL takes the due entries ($1 at most) that no other process
// is taking: entries of ended or missing messages are deleted, those of
// queued messages not available yet move to when they are, the others
// move a lease ($2 microseconds) ahead, the available queued ones with
// arm $3, and are returned.
const outboxDueSQL = `
	WITH due AS (
		SELECT o.message_id FROM tw_amqp_outbox o WHERE o.due_at <= now()
		ORDER BY o.due_at, o.message_id LIMIT $1 FOR UPDATE SKIP LOCKED
	), gone AS (
		DELETE FROM tw_amqp_outbox o USING due LEFT JOIN tw_messages m ON m.id = due.message_id
		WHERE o.message_id = due.message_id AND (m.id IS NULL OR m.state NOT IN ('queued', 'running'))
	), moved AS (
		UPDATE tw_amqp_outbox o SET due_at = CASE WHEN m.state = 'queued' AND m.available_at > now()
				THEN m.available_at ELSE now() + $2 * interval '1 microsecond' END,
			arm = CASE WHEN m.state = 'queued' AND m.available_at <= now() THEN $3 ELSE o.arm END
		FROM due JOIN tw_messages m ON m.id = due.message_id
		WHERE o.message_id = due.message_id AND m.state IN ('queued', 'running')
		RETURNING o.message_id, m.state = 'queued' AND m.available_at <= now() AS ready, m.topic
	)
	SELECT message_id, topic FROM moved WHERE ready ORDER BY message_id`

// OutboxDue: see sqlstore.External.
func (b *Broker) OutboxDue(ctx context.Context, lease time.Duration, limit int, arm int64) ([]sqlstore.OutboxEntry, error) {
	var out []sqlstore.OutboxEntry
	err := b.run(ctx, "outbox due", func(c *pgx.Conn) error {
		rows, err := c.Query(ctx, outboxDueSQL, limit, micros(lease), arm)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (sqlstore.OutboxEntry, error) {
			e := sqlstore.OutboxEntry{Arm: arm}
			err := r.Scan(&e.ID, &e.Topic)
			return e, err
		})
		return err
	})
	return out, err
}

// OutboxDone: see sqlstore.External.
func (b *Broker) OutboxDone(ctx context.Context, published []sqlstore.OutboxEntry) error {
	if len(published) == 0 {
		return nil
	}
	ids := make([]int64, len(published))
	arms := make([]int64, len(published))
	for i, e := range published {
		ids[i], arms[i] = e.ID, e.Arm
	}
	return b.run(ctx, "outbox done", func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, `DELETE FROM tw_amqp_outbox o USING unnest($1::bigint[], $2::bigint[]) AS p (id, arm)
			WHERE o.message_id = p.id AND o.arm = p.arm`, ids, arms)
		return err
	})
}

// TakeMessages: see sqlstore.External and sqlstore.Take. It locks the
// deliveries' rows in one statement (in id order), decides each delivery
// in order, and makes the queued rows it takes running in one statement;
// a running row taken again from a redelivery is updated on its own. A
// message delivered twice in one batch is taken once; the other delivery
// is dropped.
func (b *Broker) TakeMessages(ctx context.Context, worker string, ds []sqlstore.Delivery) ([]sqlstore.Taken, error) {
	if worker == "" {
		return nil, broker.Invalid("worker id is empty")
	}
	var out []sqlstore.Taken
	err := b.tx(ctx, "take messages", func(tx pgx.Tx) error {
		var err error
		out, err = takeMessages(ctx, tx, worker, ds)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// takeRow is what a take reads of a delivery's row.
type takeRow struct {
	facts    sqlstore.TakeFacts
	topic    string
	by       string
	attempts int
}

func takeMessages(ctx context.Context, tx pgx.Tx, worker string, ds []sqlstore.Delivery) ([]sqlstore.Taken, error) {
	ids := make([]int64, len(ds))
	for i, d := range ds {
		ids[i] = d.ID
	}
	// The topics' settings come with the rows; a limited topic's are read
	// again under its lock (takeTopicFacts).
	rows, err := tx.Query(ctx, `SELECT m.id, m.state, m.available_at <= now(), m.topic, coalesce(m.claimed_by, ''), m.attempts,
			coalesce(t.paused, false), coalesce(t.concurrency_limit, 0)
		FROM tw_messages m LEFT JOIN tw_topics t ON t.name = m.topic
		WHERE m.id = ANY ($1) ORDER BY m.id FOR UPDATE OF m`, ids)
	if err != nil {
		return nil, err
	}
	found := make(map[int64]*takeRow, len(ds))
	topics := make(map[string]*sqlstore.TopicFacts)
	for rows.Next() {
		var (
			id int64
			r  = takeRow{facts: sqlstore.TakeFacts{Found: true}}
			tf sqlstore.TopicFacts
		)
		if err := rows.Scan(&id, &r.facts.State, &r.facts.Available, &r.topic, &r.by, &r.attempts, &tf.Paused, &tf.Limit); err != nil {
			rows.Close()
			return nil, err
		}
		found[id] = &r
		if topics[r.topic] == nil && tf.Limit <= 0 {
			topics[r.topic] = &tf
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := make([]sqlstore.Taken, len(ds))
	fresh := make(map[int64]int) // queued rows taken: their index in ds
	var freshIDs []int64
	taken := make(map[int64]bool, len(found))
	for i, d := range ds {
		r := found[d.ID]
		if r == nil {
			// A second delivery of the same message in this batch is a
			// duplicate; a message without a row is gone.
			out[i] = sqlstore.Taken{Verdict: sqlstore.Take(sqlstore.TakeFacts{Found: taken[d.ID]})}
			continue
		}
		delete(found, d.ID)
		taken[d.ID] = true
		f := r.facts
		f.Redelivered = d.Redelivered
		var tf *sqlstore.TopicFacts
		if f.State == broker.StateQueued {
			if tf, err = takeTopicFacts(ctx, tx, r.topic, topics); err != nil {
				return nil, err
			}
			f.Paused, f.Limit, f.Running = tf.Paused, tf.Limit, tf.Running
		}
		v := sqlstore.Take(f)
		switch {
		case v != sqlstore.TakeOK:
			out[i] = sqlstore.Taken{Verdict: v}
		case f.State == broker.StateRunning:
			m, err := retake(ctx, tx, worker, d.ID, r.by, r.attempts)
			if err != nil {
				return nil, err
			}
			out[i] = sqlstore.Taken{Message: m, Verdict: v}
		default:
			tf.Running++
			fresh[d.ID] = i
			freshIDs = append(freshIDs, d.ID)
		}
	}
	if len(freshIDs) == 0 {
		return out, nil
	}
	rows, err = tx.Query(ctx, `UPDATE tw_messages
		SET state = 'running', claimed_by = $2, claimed_at = statement_timestamp(), attempts = attempts + 1,
			token = `+claimTokenSQL("s.salt", "id")+`
		FROM (SELECT `+tokenSaltSQL+` AS salt) s
		WHERE id = ANY ($1) RETURNING `+msgCols+`, token::text`, freshIDs, worker)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		m, err := scanMessage(rows, true)
		if err != nil {
			return nil, err
		}
		out[fresh[m.ID]] = sqlstore.Taken{Message: m, Verdict: sqlstore.TakeOK}
	}
	return out, rows.Err()
}

// takeTopicFacts returns the facts of topic for the takes of one
// transaction, read at its first take of a queued row (an unlimited
// topic's came with the rows). A limited topic's row is locked and its
// running rows counted after the lock (a statement of its own, so that its
// snapshot sees the takes committed while this one waited), both in one
// round trip: the takes of a limited topic count its running rows one
// after the other.
func takeTopicFacts(ctx context.Context, tx pgx.Tx, topic string, topics map[string]*sqlstore.TopicFacts) (*sqlstore.TopicFacts, error) {
	if tf := topics[topic]; tf != nil {
		return tf, nil
	}
	tf := new(sqlstore.TopicFacts)
	batch := &pgx.Batch{}
	batch.Queue(`SELECT paused, concurrency_limit FROM tw_topics WHERE name = $1 FOR UPDATE`, topic)
	batch.Queue(`SELECT count(*) FROM tw_messages WHERE topic = $1 AND state = 'running'`, topic)
	br := tx.SendBatch(ctx, batch)
	err := br.QueryRow().Scan(&tf.Paused, &tf.Limit)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		br.Close()
		return nil, err
	}
	if err := br.QueryRow().Scan(&tf.Running); err != nil {
		br.Close()
		return nil, err
	}
	if err := br.Close(); err != nil {
		return nil, err
	}
	topics[topic] = tf
	return tf, nil
}

// retake makes running message id, whose holder's delivery came back,
// running under a new claim of worker: the old claim's locks are
// released and the retake logged (see TakeOrphanLog).
func retake(ctx context.Context, tx pgx.Tx, worker string, id int64, by string, attempts int) (broker.Message, error) {
	if _, err := tx.Exec(ctx, `DELETE FROM tw_locks WHERE message_id = $1`, id); err != nil {
		return broker.Message{}, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO tw_amqp_orphans (message_id, kind) VALUES ($1, 'reclaimed')`, id); err != nil {
		return broker.Message{}, err
	}
	return scanMessage(tx.QueryRow(ctx, `UPDATE tw_messages
		SET claimed_by = $2, claimed_at = statement_timestamp(), attempts = attempts + 1, token = gen_random_uuid(),
			orphaned = orphaned + 1, suspect = true, last_error = $3
		WHERE id = $1 RETURNING `+msgCols+`, token::text`, id, worker, sqlstore.RetakenError(by, attempts)), true)
}

// EndUndeliverable: see sqlstore.External.
func (b *Broker) EndUndeliverable(ctx context.Context, id int64, reason string) (bool, error) {
	var ended bool
	err := b.tx(ctx, "end undeliverable", func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE tw_messages
			SET state = 'dead', token = NULL, finished_at = now(), last_error = $2, suspect = true, waiting_since = NULL
			WHERE id = $1 AND state IN ('queued', 'running')`, id, broker.CleanText(reason))
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		ended = true
		if _, err := tx.Exec(ctx, `INSERT INTO tw_amqp_orphans (message_id, kind) VALUES ($1, 'dead_lettered')`, id); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `DELETE FROM tw_locks WHERE message_id = $1`, id)
		return err
	})
	return ended, err
}

// TakeOrphanLog: see sqlstore.External.
func (b *Broker) TakeOrphanLog(ctx context.Context) (reclaimed, deadLettered []int64, err error) {
	err = b.run(ctx, "take orphan log", func(c *pgx.Conn) error {
		rows, err := c.Query(ctx, `DELETE FROM tw_amqp_orphans RETURNING message_id, kind`)
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
	out := make(map[string]int, len(topics))
	err := b.run(ctx, "admits", func(c *pgx.Conn) error {
		rows, err := c.Query(ctx, sqlstore.AdmitsSQL(`= ANY ($1)`), topics)
		if err != nil {
			return err
		}
		defer rows.Close()
		return sqlstore.ReadAdmits(rows, out)
	})
	return out, err
}

// outboxTriggerSQL gives every message inserted into the schema from
// outside the rabbitmq broker (client/pgtx, a schedule's fire) an outbox
// entry, so that it is published too: due a few seconds after it is
// available, which leaves the broker's own submits (which write their
// entry in the same transaction and publish at once) the time to publish
// their own. The names are qualified: the inserting session's search_path
// may be anything.
func outboxTriggerSQL(schema string) []string {
	s := pgx.Identifier{schema}.Sanitize()
	return []string{`CREATE OR REPLACE FUNCTION ` + s + `.tw_amqp_outbox_add() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		INSERT INTO ` + s + `.tw_amqp_outbox (message_id, due_at)
		SELECT id, greatest(available_at, now()) + interval '5 seconds' FROM new_rows WHERE state = 'queued'
		ON CONFLICT (message_id) DO NOTHING;
		RETURN NULL;
	END $$`,
		`CREATE OR REPLACE TRIGGER tw_amqp_outbox_add AFTER INSERT ON ` + s + `.tw_messages
		REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION ` + s + `.tw_amqp_outbox_add()`,
		// A row that goes back to queued (a requeue, the reaper's reclaim)
		// gets its entry in the transaction that requeues it, due a
		// lease ahead: the broker publishes it at once and deletes the
		// entry, and if it dies first, the publisher loop publishes it.
		// An entry already there keeps its arm (the requeue's own, which
		// its holder deletes after publishing); DO UPDATE, not DO
		// NOTHING, waits for a publisher loop that is deleting the entry
		// of the message as it was (ended) and then inserts it anew.
		`CREATE OR REPLACE FUNCTION ` + s + `.tw_amqp_outbox_requeued() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		INSERT INTO ` + s + `.tw_amqp_outbox AS e (message_id, due_at)
		SELECT n.id, greatest(n.available_at, now()) + interval '15 seconds'
		FROM new_rows n JOIN old_rows o ON o.id = n.id
		WHERE n.state = 'queued' AND o.state <> 'queued'
		ON CONFLICT (message_id) DO UPDATE SET due_at = least(e.due_at, excluded.due_at);
		RETURN NULL;
	END $$`,
		`CREATE OR REPLACE TRIGGER tw_amqp_outbox_requeued AFTER UPDATE ON ` + s + `.tw_messages
		REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION ` + s + `.tw_amqp_outbox_requeued()`}
}

// outboxTriggers is how many triggers outboxTriggerSQL makes.
const outboxTriggers = 2

// EnableOutbox makes the schema the state store of a rabbitmq broker: a
// message inserted by anything else than the broker's Submit (the
// transactional enqueue of client/pgtx, above all) gets an outbox entry
// and is published, where it would otherwise wait in the table forever;
// so does a message that goes back to queued, in the transaction that
// requeues it (a crash after that commit loses no message).
// The plain postgres broker never calls it, and pays nothing for it.
func (b *Broker) EnableOutbox(ctx context.Context) error {
	return b.tx(ctx, "enable outbox", func(tx pgx.Tx) error {
		// Brokers opening at once take turns (concurrent CREATE OR
		// REPLACE fails), and the first one's trigger serves the others.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('taskhost amqp outbox ' || $1))`, b.schema); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
			JOIN pg_namespace s ON s.oid = c.relnamespace
			WHERE s.nspname = $1 AND c.relname = 'tw_messages'
				AND t.tgname IN ('tw_amqp_outbox_add', 'tw_amqp_outbox_requeued')`, b.schema).Scan(&n); err != nil {
			return err
		}
		if n == outboxTriggers {
			return nil
		}
		for _, q := range outboxTriggerSQL(b.schema) {
			if _, err := tx.Exec(ctx, q); err != nil {
				return err
			}
		}
		return nil
	})
}

// A token of a row made running by a take (the rabbitmq broker's state
// store) must differ from every other claim's token of the same
// message (it fences a stale claim's acks), be hard to guess, and land
// at a random place in tw_messages_running_token (migration 007: the
// index then cleans itself of the dead entries of acked messages). A
// statement that claims many rows draws one random salt (tokenSaltSQL)
// and gives each row the md5 of the salt and the row's id
// (claimTokenSQL): distinct rows get distinct tokens, two claims get
// unrelated ones, and md5's output is spread evenly. One random draw a
// statement, not one a row (gen_random_uuid() per row), because the
// claim statement runs under the topic's lock, and a draw from the
// server's strong random source costs more than the hash of a short
// string.
const tokenSaltSQL = `gen_random_uuid()::text`

// claimTokenSQL is the token of the row whose id is the expression id, in
// a statement whose salt (tokenSaltSQL, drawn once) is the expression
// salt.
func claimTokenSQL(salt, id string) string {
	return `md5(` + salt + ` || ` + id + `::text)::uuid`
}
