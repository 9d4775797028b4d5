package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/sqlstore"
)

// Submit validates req and queues it, creating the topic's row (unlimited,
// dead-lettering, not paused) when it is missing. An empty payload is
// stored as {}.
func (b *Broker) Submit(ctx context.Context, req broker.SubmitRequest) (int64, error) {
	if err := broker.ValidateSubmit(req, b.maxPayload); err != nil {
		return 0, err
	}
	payload, headers, err := submitFields(req)
	if err != nil {
		return 0, err
	}
	var id int64
	err = b.run(ctx, "submit", func(c *pgx.Conn) error {
		return c.QueryRow(ctx, insertMessageSQL,
			req.Topic, req.Task, payload, headers, req.MaxAttempts, micros(req.Delay)).Scan(&id)
	})
	return id, err
}

// submitFields returns the payload ({} when empty) and headers (NULL when
// none) of req as the JSON text the insert statements take.
func submitFields(req broker.SubmitRequest) (string, *string, error) {
	payload := "{}"
	if len(req.Payload) > 0 {
		payload = string(req.Payload)
	}
	if len(req.Headers) == 0 {
		return payload, nil, nil
	}
	h, err := json.Marshal(req.Headers)
	if err != nil {
		return "", nil, broker.Invalid("headers: %v", err)
	}
	s := string(h)
	return payload, &s, nil
}

var _ broker.BatchSubmitter = (*Broker)(nil)

// maxSubmitMany bounds one SubmitMany statement; longer calls are sent as
// several statements of that many rows, still in one transaction.
const maxSubmitMany = 5000

// submitManySQL queues the rows of the arrays $1 topics, $2 tasks, $3
// payload texts, $4 header texts (NULL for none), $5 max attempts and $6
// delays in µs, creating missing topics (in name order, so concurrent
// calls cannot deadlock on them). Each row draws its id from the sequence
// in the CTE, next to its ordinal, so the answer pairs them without
// relying on the order rows are inserted or returned in.
const submitManySQL = `
	WITH u AS MATERIALIZED (
		SELECT nextval('tw_messages_id_seq') AS id, x.*
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int[], $6::bigint[])
			WITH ORDINALITY AS x(topic, task, payload, headers, max_attempts, delay_us, ord)
	), topics AS (
		INSERT INTO tw_topics (name)
		SELECT DISTINCT topic FROM u ORDER BY 1
		ON CONFLICT (name) DO NOTHING
	), ins AS (
		INSERT INTO tw_messages (id, topic, task, payload, headers, max_attempts, available_at, created_at)
		SELECT id, topic, task, payload::jsonb, headers::jsonb, max_attempts,
			now() + delay_us * interval '1 microsecond', now()
		FROM u
		RETURNING 1
	)
	SELECT u.ord, u.id, (SELECT count(*) FROM ins) FROM u`

// SubmitMany validates every request, then queues them all in one
// transaction and returns their ids in the order of reqs (see
// broker.BatchSubmitter). Each message is stored as Submit stores it.
func (b *Broker) SubmitMany(ctx context.Context, reqs []broker.SubmitRequest) ([]int64, error) {
	n := len(reqs)
	topics, tasks, payloads := make([]string, n), make([]string, n), make([]string, n)
	headers, attempts, delays := make([]*string, n), make([]int32, n), make([]int64, n)
	if err := broker.ValidateSubmitMany(reqs, b.maxPayload); err != nil {
		return nil, err
	}
	for i, req := range reqs {
		p, h, err := submitFields(req)
		if err != nil {
			return nil, fmt.Errorf("request %d: %w", i, err)
		}
		topics[i], tasks[i], payloads[i], headers[i] = req.Topic, req.Task, p, h
		attempts[i], delays[i] = int32(min(req.MaxAttempts, math.MaxInt32)), micros(req.Delay)
	}
	ids := make([]int64, n)
	if n == 0 {
		if b.closed.Load() {
			return nil, broker.ErrClosed
		}
		return ids, ctx.Err()
	}
	err := b.run(ctx, "submit many", func(c *pgx.Conn) error {
		batch := &pgx.Batch{}
		for from := 0; from < n; from += maxSubmitMany {
			to := min(from+maxSubmitMany, n)
			batch.Queue(submitManySQL, topics[from:to], tasks[from:to], payloads[from:to],
				headers[from:to], attempts[from:to], delays[from:to])
		}
		br := c.SendBatch(ctx, batch)
		for from := 0; from < n; from += maxSubmitMany {
			want := min(maxSubmitMany, n-from)
			rows, err := br.Query()
			if err != nil {
				br.Close()
				return err
			}
			got := 0
			for rows.Next() {
				var ord, id, inserted int64
				if err := rows.Scan(&ord, &id, &inserted); err != nil {
					rows.Close()
					br.Close()
					return err
				}
				if ord < 1 || ord > int64(want) || inserted != int64(want) {
					rows.Close()
					br.Close()
					return fmt.Errorf("submit many: row %d of %d, %d inserted", ord, want, inserted)
				}
				ids[from+int(ord)-1] = id
				got++
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				br.Close()
				return err
			}
			if got != want {
				br.Close()
				return fmt.Errorf("submit many: %d ids back for %d messages", got, want)
			}
		}
		return br.Close()
	})
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// insertMessageSQL is Submit's statement (messages.go): queue one message,
// creating its topic's row when missing. $1 topic, $2 task, $3 payload
// text, $4 headers text or NULL, $5 max attempts, $6 delay µs.
const insertMessageSQL = `
	WITH topic AS (
		INSERT INTO tw_topics (name) VALUES ($1) ON CONFLICT (name) DO NOTHING
	)
	INSERT INTO tw_messages (topic, task, payload, headers, max_attempts, available_at, created_at)
	VALUES ($1, $2, $3::text::jsonb, $4::text::jsonb, $5,
		now() + $6::bigint * interval '1 microsecond', now())
	RETURNING id`

// InsertMessage queues the validated req in c's transaction, as Submit
// does, and returns its id.
func (dialect) InsertMessage(c sqlstore.Conn, req broker.SubmitRequest) (int64, error) {
	payload := "{}"
	if len(req.Payload) > 0 {
		payload = string(req.Payload)
	}
	var headers *string
	if len(req.Headers) > 0 {
		h, err := json.Marshal(req.Headers)
		if err != nil {
			return 0, broker.Invalid("headers: %v", err)
		}
		s := string(h)
		headers = &s
	}
	var id int64
	err := c.QueryRow(insertMessageSQL,
		req.Topic, req.Task, payload, headers, req.MaxAttempts, micros(req.Delay)).Scan(&id)
	return id, err
}
