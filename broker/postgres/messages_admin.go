package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/sqlstore"
)

// ListMessagesSQL is ListMessages's statement for f (checked) and limit.
func (dialect) ListMessagesSQL(f broker.MessageFilter, limit int) (string, []any) {
	return listSQL(f, limit)
}

// listSQL is ListMessages's statement for f (checked) and limit: the
// messages of tw_messages and, unless the state filter excludes done, those
// of the batches (migration 020), each newest first, merged.
func listSQL(f broker.MessageFilter, limit int) (string, []any) {
	q, w := listRowsSQL(f, limit)
	if f.State != "" && f.State != broker.StateDone {
		return q, w.Args()
	}
	b := w.Next()
	if f.Topic != "" {
		b.Add("topic = ?", f.Topic)
	}
	if f.Task != "" {
		b.Add("task = ?", f.Task)
	}
	conds := []string{b.Where()}
	before, elem := "", "true"
	if f.Before > 0 {
		before = b.Limit(int(f.Before))
		elem = "x.id < " + before
	}
	lim := b.Limit(limit)
	return `SELECT * FROM ((` + q + `)
		UNION ALL
		(SELECT ` + msgCols + ` FROM ` + doneRows(doneBatches(conds, "max_id", "ids", before, lim), elem, "m") + `
			ORDER BY id DESC LIMIT ` + lim + `)) u ORDER BY id DESC LIMIT ` + lim, b.Args()
}

// listRowsSQL is the statement of the messages of tw_messages that f
// selects, newest first, at most limit, and the filter holding its
// arguments.
//
// Only the filters in use go into the SQL, so each combination gets a plan
// (and a cached statement) of its own. The state goes in as a literal (it
// is one of broker.States): the partial indexes that serve a state are usable
// only when the plan knows which state it is.
func listRowsSQL(f broker.MessageFilter, limit int) (string, *sqlstore.Filter) {
	w := queries.NewFilter()
	switch f.State {
	case "", broker.StateRunning:
	case broker.StateQueued:
		w.AddLiteral(queuedRow)
	default:
		w.AddLiteral("state = '" + f.State + "'")
	}
	w.MessageFilter(f)
	if f.State == broker.StateRunning {
		// The rows made running from tw_messages_running_token, the
		// messages claim rows hold by id, each newest first, merged.
		where, limitArg := w.Where(), w.Limit(limit)
		and := func(c string) string {
			if where == "" {
				return c
			}
			return where + " AND " + c
		}
		return `SELECT ` + liveCols + ` FROM (
			(SELECT * FROM tw_messages WHERE ` + and("state = 'running'") + ` ORDER BY id DESC LIMIT ` + limitArg + `)
			UNION ALL
			(SELECT * FROM tw_messages WHERE ` + and(heldRow) + ` ORDER BY id DESC LIMIT ` + limitArg + `)
		) AS m LEFT JOIN LATERAL ` + liveClaim + ` ORDER BY id DESC LIMIT ` + limitArg, w
	}
	if f.Topic != "" && f.State == "" {
		// A topic's messages: those not running from
		// tw_messages_topic_idle, the running ones from
		// tw_messages_running_token, each newest first, merged.
		where, limitArg := w.Where(), w.Limit(limit)
		return `SELECT ` + liveCols + ` FROM (
			(SELECT * FROM tw_messages WHERE ` + where + ` AND state <> 'running' ORDER BY id DESC LIMIT ` + limitArg + `)
			UNION ALL
			(SELECT * FROM tw_messages WHERE ` + where + ` AND state = 'running' ORDER BY id DESC LIMIT ` + limitArg + `)
		) AS m LEFT JOIN LATERAL ` + liveClaim + ` ORDER BY id DESC LIMIT ` + limitArg, w
	}
	q, _ := w.Select(liveCols, liveFrom, limit)
	return q, w
}

// Requeue puts message id back in the queue, available now, if it is dead
// or failed, in one statement, and announces it as a submit is;
// otherwise it reports the state it found ("" for no message).
func (d dialect) Requeue(c sqlstore.Conn, id int64) (string, bool, error) {
	var (
		state, topic *string
		updated      bool
	)
	err := c.QueryRow(`
		WITH u AS (
			UPDATE tw_messages
			SET state = 'queued', claimed_by = NULL, claimed_at = NULL, token = NULL,
				finished_at = NULL, available_at = now(), cancel_requested_at = NULL
			WHERE id = $1 AND state IN ('dead', 'failed')
			RETURNING topic
		)
		SELECT coalesce((SELECT state FROM tw_messages WHERE id = $1), (SELECT state FROM `+doneByID("$1", "m")+`)),
			EXISTS (SELECT 1 FROM u), (SELECT topic FROM u)`,
		id).Scan(&state, &updated, &topic)
	if isUniqueViolation(err) {
		return "", false, broker.Invalid("message %d is not requeued: another task holds its unique key now", id)
	}
	if err != nil || state == nil {
		return "", false, err
	}
	if updated && topic != nil {
		var n int64
		if err := c.QueryRow(d.b.ins.notify, payloads([]broker.SubmitRequest{{Topic: *topic}})).Scan(&n); err != nil {
			return "", false, err
		}
	}
	return *state, updated, nil
}

// Purge deletes the topic's queued messages (delayed ones too, not those
// claim rows hold: they run) and, when deadLetters is set, its dead ones,
// in one batch. It holds the topic lock while it deletes, as a claim does
// (see claimStatement), so no claim takes a message it deletes. It passes
// by the queued rows another transaction holds locked (a Cancel, which
// locks the row and then the topic): those are being cancelled.
func (d dialect) Purge(ctx context.Context, topic string, deadLetters bool) (broker.PurgeResult, error) {
	var res broker.PurgeResult
	err := d.b.run(ctx, "purge", func(c *pgx.Conn) error {
		batch := &pgx.Batch{}
		batch.Queue(serialLockSQL, topic)
		batch.Queue(`
			WITH q AS (
				DELETE FROM tw_messages WHERE id = ANY (ARRAY (
					SELECT id FROM tw_messages WHERE topic = $1 AND state = 'queued' AND id NOT IN `+heldIDs("$1")+`
						AND `+lockedTopic("$1")+`
					FOR UPDATE SKIP LOCKED))
				RETURNING 1
			), d AS (
				DELETE FROM tw_messages WHERE $2 AND topic = $1 AND state = 'dead' RETURNING 1
			)
			SELECT (SELECT count(*) FROM q), (SELECT count(*) FROM d)`, topic, deadLetters)
		br := c.SendBatch(ctx, batch)
		if _, err := br.Exec(); err != nil {
			br.Close()
			return err
		}
		if err := br.QueryRow().Scan(&res.Queued, &res.DeadLetter); err != nil {
			br.Close()
			return err
		}
		return br.Close()
	})
	return res, err
}
