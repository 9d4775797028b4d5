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
	"os"
	"sync"
	"sync/atomic"
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

// productLease is a lease as the model's workers and ack writers see it.
type productLease struct {
	id    int64
	token string
	ids   []int64
	st    []time.Time
	en    []time.Time
	dur   []float64
	left  atomic.Int64
}

func runProduct(dsn string, n, workers, maxClaim, writers int) error {
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, `SET client_min_messages = warning; DROP SCHEMA IF EXISTS `+productSchema+` CASCADE`); err != nil {
		return err
	}
	defer func() {
		if _, err := admin.Exec(context.Background(), `DROP SCHEMA `+productSchema+` CASCADE`); err != nil {
			fmt.Fprintln(os.Stderr, "pipeline: dropping the schema:", err)
		}
	}()
	b, err := postgres.New(ctx, postgres.Options{DSN: dsn, Schema: productSchema})
	if err != nil {
		return err
	}
	reqs := make([]broker.SubmitRequest, 0, 1000)
	for i := 0; i < n; i += len(reqs) {
		reqs = reqs[:0]
		for j := i; j < min(n, i+1000); j++ {
			reqs = append(reqs, broker.SubmitRequest{Topic: "t", Task: "noop", Payload: json.RawMessage(`{"n": 1}`)})
		}
		if _, err := b.SubmitMany(ctx, reqs); err != nil {
			b.Close()
			return fmt.Errorf("submit: %w", err)
		}
	}
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
	conns := make([]*pgx.Conn, 1+writers)
	for i := range conns {
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			return err
		}
		cfg.RuntimeParams["search_path"] = productSchema
		cfg.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
		if conns[i], err = pgx.ConnectConfig(ctx, cfg); err != nil {
			return err
		}
		defer conns[i].Close(context.Background())
	}

	type job struct {
		l *productLease
		i int
	}
	jobs := make(chan job, workers)
	finished := make(chan *productLease, workers)
	wake := make(chan struct{}, 1)
	var acked, claims, ackWrites, inflight atomic.Int64
	done := make(chan struct{})
	var doneOnce sync.Once
	errc := make(chan error, 1+writers)

	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for j := range jobs {
				inflight.Add(-1)
				j.l.st[j.i] = time.Now()
				j.l.en[j.i] = time.Now()
				j.l.dur[j.i] = j.l.en[j.i].Sub(j.l.st[j.i]).Seconds()
				if j.l.left.Add(-1) == 0 {
					finished <- j.l
				}
			}
		})
	}
	var writing sync.WaitGroup
	for i := range writers {
		conn := conns[1+i]
		writing.Go(func() {
			for l := range finished {
				tag, err := conn.Exec(ctx, productAckSQL, l.id, l.token, l.ids, l.st, l.en, l.dur)
				if err != nil {
					errc <- fmt.Errorf("ack: %w", err)
					return
				}
				if tag.RowsAffected() == 0 {
					errc <- fmt.Errorf("ack of lease %d wrote no batch", l.id)
					return
				}
				ackWrites.Add(1)
				if acked.Add(int64(len(l.ids))) >= int64(n) {
					doneOnce.Do(func() { close(done) })
				}
				select {
				case wake <- struct{}{}:
				default:
				}
			}
		})
	}

	start := time.Now()
	claimErr := make(chan error, 1)
	go func() {
		defer close(jobs)
		conn := conns[0]
		var (
			prio  = -1 << 31
			at    = time.Time{}
			after int64
		)
		for {
			select {
			case <-done:
				claimErr <- nil
				return
			default:
			}
			want := min(maxClaim, workers-int(inflight.Load()))
			l := &productLease{}
			if want > 0 {
				batch := &pgx.Batch{}
				batch.Queue(`SELECT 1 FROM tw_topics WHERE name = 't' FOR UPDATE`)
				batch.Queue(productClaimSQL, "t", want, prio, at, after)
				br := conn.SendBatch(ctx, batch)
				err := func() error {
					if _, err := br.Exec(); err != nil {
						return err
					}
					rows, err := br.Query()
					if err != nil {
						return err
					}
					defer rows.Close()
					for rows.Next() {
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
						prio, at, after = -pri, availableAt, id
					}
					return rows.Err()
				}()
				if cerr := br.Close(); err == nil {
					err = cerr
				}
				if err != nil {
					claimErr <- err
					return
				}
				claims.Add(1)
			}
			if len(l.ids) == 0 {
				select {
				case <-wake:
				case <-time.After(2 * time.Millisecond):
				case <-done:
				}
				continue
			}
			l.st = make([]time.Time, len(l.ids))
			l.en = make([]time.Time, len(l.ids))
			l.dur = make([]float64, len(l.ids))
			l.left.Store(int64(len(l.ids)))
			inflight.Add(int64(len(l.ids)))
			for i := range l.ids {
				jobs <- job{l, i}
			}
		}
	}()

	select {
	case <-done:
	case err := <-errc:
		return err
	case err := <-claimErr:
		if err != nil {
			return fmt.Errorf("claim: %w", err)
		}
	}
	elapsed := time.Since(start)
	if err := <-claimErr; err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	wg.Wait()
	close(finished)
	writing.Wait()
	var left int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM tw_messages`).Scan(&left); err != nil {
		return err
	}
	var reports int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM tw_reports`).Scan(&reports); err != nil {
		return err
	}
	fmt.Printf("lease product   %d messages in %.3fs  %.0f jobs/s  (%d claims, %d ack writes; %d left in tw_messages, %d reports; %d workers, limit %d, claims of at most %d, %d ack writers)\n",
		n, elapsed.Seconds(), float64(n)/elapsed.Seconds(), claims.Load(), ackWrites.Load(), left, reports, workers, workers, maxClaim, writers)
	return nil
}
