package main

// The lease model on the product's tables (-product): the broker's own
// schema, migrated by postgres.New and filled by SubmitMany, with a table
// of leases beside it. A claim leases whole messages from tw_messages'
// queued index without writing their rows; an ack fences on the lease's
// token, moves the messages into a done batch of tw_done with a success
// report each, as the product's ack does (ackKeptSQL), and deletes the
// lease. Left out: what ../run.sh leaves out, and the readers, which would
// have to see a leased message as running.

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/postgres"
)

const productSchema = "lease_product"

const productLeasesSQL = `CREATE TABLE lease_model_leases (id bigserial PRIMARY KEY, topic text NOT NULL, ids bigint[] NOT NULL,
	n int NOT NULL, token uuid NOT NULL, worker text NOT NULL, at timestamptz NOT NULL);
CREATE INDEX lease_model_leases_topic ON lease_model_leases (topic)`

// productClaimSQL runs after the topic's row is locked: it leases up to $2
// messages of topic $1 past the floor ($3 -priority, $4 available_at, $5
// id), within the room the topic's live leases leave under its limit, and
// returns them with the lease's id and token.
const productClaimSQL = `
WITH room AS (
	SELECT least($2::int, t.concurrency_limit - coalesce((SELECT sum(n) FROM lease_model_leases l WHERE l.topic = $1), 0))::int AS k
	FROM tw_topics t WHERE t.name = $1
), picked AS (
	SELECT q.id, q.task, q.payload::text AS payload, q.headers::text AS headers, q.attempts, q.max_attempts,
		q.available_at, q.created_at, q.priority
	FROM tw_messages q
	WHERE q.topic = $1 AND q.state = 'queued' AND q.available_at <= now()
		AND (-q.priority, q.available_at, q.id) > ($3::int, $4::timestamptz, $5::bigint)
	ORDER BY -q.priority, q.available_at, q.id
	LIMIT (SELECT greatest(k, 0) FROM room)
), l AS (
	INSERT INTO lease_model_leases (topic, ids, n, token, worker, at)
	SELECT $1, array_agg(id), count(*), gen_random_uuid(), 'w', statement_timestamp() FROM picked HAVING count(*) > 0
	RETURNING id, token
)
SELECT p.*, (SELECT id FROM l), (SELECT token::text FROM l) FROM picked p`

// productAckSQL acks lease $1 under token $2: its messages $3 (with their
// attempts' starts $4, ends $5 and durations $6) leave tw_messages into
// done batches, each with its success report, as ackKeptSQL moves them.
const productAckSQL = `
WITH l AS (
	DELETE FROM lease_model_leases WHERE id = $1 AND token = $2::uuid RETURNING ids, worker, at
), a AS (
	DELETE FROM tw_messages m
	USING l, unnest($3::bigint[], $4::timestamptz[], $5::timestamptz[], $6::float8[]) AS v(id, st, en, dur)
	WHERE m.id = ANY (l.ids) AND m.id = v.id AND m.unique_key IS NULL
	RETURNING m.topic AS mtopic, m.task AS mtask, ROW(m.id, m.payload, m.headers, m.attempts + 1, m.max_attempts,
		l.worker, l.at, m.available_at, m.created_at, m.last_error, NULL::jsonb, m.suspect, m.waiting_since,
		m.cancel_requested_at, m.priority, m.orphaned, nextval('tw_reports_id_seq'), m.attempts + 1, NULL::text,
		v.st, v.en, v.dur, NULL::float8)::tw_done_message AS x
)
INSERT INTO tw_done (topic, task, finished_at, ids, max_id, reports, max_report, first_ended, messages)
SELECT mtopic, mtask, now(), int8range(min((x).id), max((x).id), '[]'), max((x).id),
	int8range(min((x).report_id), max((x).report_id), '[]'), max((x).report_id), min((x).report_ended_at), array_agg(x)
FROM a GROUP BY mtopic, mtask, (x).id / 4096`

// productLease is a lease of the product's tables, with its messages'
// reports.
type productLease struct {
	id    int64
	token string
	ids   []int64
	st    []time.Time
	en    []time.Time
	dur   []float64
}

func (l *productLease) size() int { return len(l.ids) }

func (l *productLease) run(i int) {
	l.st[i] = time.Now()
	l.en[i] = time.Now()
	l.dur[i] = l.en[i].Sub(l.st[i]).Seconds()
}

func (l *productLease) ack(ctx context.Context, conn *pgx.Conn) error {
	tag, err := conn.Exec(ctx, productAckSQL, l.id, l.token, l.ids, l.st, l.en, l.dur)
	if err == nil && tag.RowsAffected() == 0 {
		err = fmt.Errorf("lease %d wrote no batch", l.id)
	}
	return err
}

// productClaimer leases messages of the product's tables past its floor,
// the key of the last message it took.
type productClaimer struct {
	prio  int
	at    time.Time
	after int64
}

func (c *productClaimer) claim(ctx context.Context, conn *pgx.Conn, want int) (lease, error) {
	l := &productLease{}
	err := lockAndClaim(ctx, conn, `SELECT 1 FROM tw_topics WHERE name = 't' FOR UPDATE`, productClaimSQL,
		[]any{"t", want, c.prio, c.at, c.after}, func(rows pgx.Rows) error {
			var (
				id, leaseID                int64
				task, payload, token       string
				headers                    *string
				attempts, maxAttempts, pri int
				availableAt, createdAt     time.Time
			)
			if err := rows.Scan(&id, &task, &payload, &headers, &attempts, &maxAttempts, &availableAt, &createdAt, &pri,
				&leaseID, &token); err != nil {
				return err
			}
			l.id, l.token = leaseID, token
			l.ids = append(l.ids, id)
			c.prio, c.at, c.after = -pri, availableAt, id
			return nil
		})
	if err != nil || len(l.ids) == 0 {
		return nil, err
	}
	l.st = make([]time.Time, len(l.ids))
	l.en = make([]time.Time, len(l.ids))
	l.dur = make([]float64, len(l.ids))
	return l, nil
}

// productQueue connects admin to dsn, makes schema afresh and opens the
// product's PostgreSQL broker on it (maxConns connections, 0 for its
// default) with n no-op tasks queued on topic t. The caller closes admin and
// b, and drops the schema with dropOnExit.
func productQueue(ctx context.Context, dsn, schema string, n int, maxConns int32) (*pgx.Conn, *postgres.Broker, error) {
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, nil, err
	}
	if _, err := admin.Exec(ctx, `SET client_min_messages = warning; DROP SCHEMA IF EXISTS `+schema+` CASCADE`); err != nil {
		admin.Close(context.Background())
		return nil, nil, err
	}
	b, err := postgres.New(ctx, postgres.Options{DSN: dsn, Schema: schema, MaxConns: maxConns})
	if err == nil {
		reqs := make([]broker.SubmitRequest, 0, 1000)
		for i := 0; i < n && err == nil; i += len(reqs) {
			reqs = reqs[:0]
			for range min(n-i, 1000) {
				reqs = append(reqs, broker.SubmitRequest{Topic: "t", Task: "noop", Payload: json.RawMessage(`{"n": 1}`)})
			}
			if _, err = b.SubmitMany(ctx, reqs); err != nil {
				b.Close()
				err = fmt.Errorf("submit: %w", err)
			}
		}
	}
	if err != nil {
		dropOnExit(admin, schema)
		admin.Close(context.Background())
		return nil, nil, err
	}
	return admin, b, nil
}

func runProduct(dsn string, n, workers, maxClaim, writers int) error {
	ctx := context.Background()
	admin, b, err := productQueue(ctx, dsn, productSchema, n, 0)
	if err != nil {
		return err
	}
	defer admin.Close(context.Background())
	defer dropOnExit(admin, productSchema)
	b.Close()
	for _, sql := range []string{
		`SET search_path = ` + productSchema,
		productLeasesSQL,
		`UPDATE tw_topics SET concurrency_limit = ` + fmt.Sprint(workers) + ` WHERE name = 't'`,
		`VACUUM ANALYZE tw_messages`,
		`CHECKPOINT`,
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
	}
	conns, err := connect(ctx, dsn, 1+writers, map[string]string{"search_path": productSchema, "plan_cache_mode": "force_generic_plan"})
	if err != nil {
		return err
	}
	defer closeAll(conns)
	c := &productClaimer{prio: -1 << 31}
	elapsed, claims, acks, err := burnDown(ctx, conns, n, workers, maxClaim, c.claim)
	if err != nil {
		return err
	}
	var left, reports int
	if err := admin.QueryRow(ctx, `SELECT (SELECT count(*) FROM tw_messages), (SELECT count(*) FROM tw_reports)`).Scan(&left, &reports); err != nil {
		return err
	}
	if left != 0 || reports != n {
		return fmt.Errorf("after the burn-down %d messages are left in tw_messages and %d reports are stored, want 0 and %d", left, reports, n)
	}
	fmt.Printf("lease product   %d messages in %.3fs  %.0f jobs/s  (%d claims, %d ack writes; %d left in tw_messages, %d reports; %d workers, limit %d, claims of at most %d, %d ack writers)\n",
		n, elapsed.Seconds(), float64(n)/elapsed.Seconds(), claims, acks, left, reports, workers, workers, maxClaim, writers)
	return nil
}
