// Command pipeline runs the lease model (see ../run.sh) as a pool runs it:
// one claimer, a number of workers that run no-op tasks, and ack writers
// in parallel, on one topic with a concurrency limit. It is a model, not
// the product: it times a burn-down of -n messages and prints jobs/s,
// claims and ack writes, so that it can be measured beside the floor
// model in the same hour.
//
// A claim takes the topic's row FOR UPDATE, counts the room the live
// leases leave under the limit, reads the next messages past the topic's
// cursor and writes one lease row for them (the messages' rows are read,
// not written). A lease is acked once all its messages ran: one of the ack
// writers deletes its range of messages and the lease and records the
// range done, and the claimer is woken. Left out, as in ../run.sh:
// failures and retries inside a lease, priorities and delays, the reaper.
// With -product it runs on the product's own tables (product.go).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
)

const setupSQL = `
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS lease_pipeline CASCADE;
CREATE SCHEMA lease_pipeline;
SET search_path = lease_pipeline;
CREATE TABLE q (id bigint PRIMARY KEY, topic text NOT NULL, task text NOT NULL, payload jsonb NOT NULL,
	available_at timestamptz NOT NULL DEFAULT now(), created_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX q_topic ON q (topic, id);
CREATE TABLE topics (name text PRIMARY KEY, lim int NOT NULL, cursor bigint NOT NULL DEFAULT 0);
CREATE TABLE leases (topic text, lo bigint, hi bigint, n int, token bigint, worker text, at timestamptz,
	PRIMARY KEY (topic, lo));
CREATE SEQUENCE tok;
CREATE TABLE done (topic text, lo bigint, hi bigint, at timestamptz);`

// claimSQL leases up to $2 messages of topic $1 past the cursor, within
// the room the live leases leave, and returns them; it runs after the
// topic's row is locked, so its snapshot sees every earlier claim.
const claimSQL = `
WITH room AS (
	SELECT least($2::int, t.lim - coalesce((SELECT sum(n) FROM lease_pipeline.leases l WHERE l.topic = $1), 0))::int AS k,
		t.cursor
	FROM lease_pipeline.topics t WHERE t.name = $1
), picked AS (
	SELECT q.id, q.task, q.payload FROM lease_pipeline.q q, room
	WHERE q.topic = $1 AND q.id > room.cursor AND q.available_at <= now()
	ORDER BY q.id LIMIT (SELECT greatest(k, 0) FROM room)
), l AS (
	INSERT INTO lease_pipeline.leases
	SELECT $1, min(id), max(id), count(*), nextval('lease_pipeline.tok'), 'w', now() FROM picked HAVING count(*) > 0
	RETURNING hi
), c AS (
	UPDATE lease_pipeline.topics SET cursor = (SELECT hi FROM l) WHERE name = $1 AND EXISTS (SELECT 1 FROM l)
)
SELECT id, task, payload::text FROM picked`

const ackSQL = `
WITH d AS (DELETE FROM lease_pipeline.q WHERE id BETWEEN $2 AND $3 RETURNING id),
l AS (DELETE FROM lease_pipeline.leases WHERE topic = $1 AND lo = $2)
INSERT INTO lease_pipeline.done SELECT $1, min(id), max(id), now() FROM d`

// rangeLease is a lease of the model's own tables: a range of ids.
type rangeLease struct{ lo, hi int64 }

func (l rangeLease) size() int { return int(l.hi - l.lo + 1) }
func (rangeLease) run(int)     {}
func (l rangeLease) ack(ctx context.Context, conn *pgx.Conn) error {
	_, err := conn.Exec(ctx, ackSQL, "t", l.lo, l.hi)
	return err
}

// claimRange leases a range of the model's own tables.
func claimRange(ctx context.Context, conn *pgx.Conn, want int) (lease, error) {
	var got []int64
	err := lockAndClaim(ctx, conn, `SELECT 1 FROM lease_pipeline.topics WHERE name = 't' FOR UPDATE`, claimSQL,
		[]any{"t", want}, func(rows pgx.Rows) error {
			var id int64
			var task, payload string
			err := rows.Scan(&id, &task, &payload)
			got = append(got, id)
			return err
		})
	if err != nil || len(got) == 0 {
		return nil, err
	}
	return rangeLease{got[0], got[len(got)-1]}, nil
}

func main() {
	dsn := flag.String("dsn", "postgres:///hostbench?host=/var/run/postgresql&user=root", "the database (the model makes and drops the schema lease_pipeline there)")
	n := flag.Int("n", 50000, "messages in the burn-down")
	workers := flag.Int("workers", 100, "workers, and the topic's concurrency limit")
	maxClaim := flag.Int("claim", 100, "most messages a claim leases (the limit: a claim leases every free slot)")
	writers := flag.Int("writers", 4, "ack writers")
	product := flag.Bool("product", false, "on the product's tables, with a success report a message (product.go)")
	brokered := flag.Bool("broker", false, "through the product's PostgreSQL broker: its Claim and Ack, with carried success reports (brokered.go)")
	flag.Parse()
	run := run
	switch {
	case *brokered:
		run = runBroker
	case *product:
		run = runProduct
	}
	if err := run(*dsn, *n, *workers, *maxClaim, *writers); err != nil {
		fmt.Fprintln(os.Stderr, "pipeline:", err)
		os.Exit(1)
	}
}

func run(dsn string, n, workers, maxClaim, writers int) error {
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, setupSQL); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	defer dropOnExit(admin, "lease_pipeline")
	for _, sql := range []string{
		`INSERT INTO lease_pipeline.topics VALUES ('t', ` + fmt.Sprint(workers) + `)`,
		`INSERT INTO lease_pipeline.q (id, topic, task, payload) SELECT i, 't', 'noop', '{"n": 1}' FROM generate_series(1, ` + fmt.Sprint(n) + `) i`,
		`VACUUM ANALYZE lease_pipeline.q`,
		`CHECKPOINT`,
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			return fmt.Errorf("seed: %w", err)
		}
	}
	conns, err := connect(ctx, dsn, 1+writers, nil)
	if err != nil {
		return err
	}
	defer closeAll(conns)
	elapsed, claims, acks, err := burnDown(ctx, conns, n, workers, maxClaim, claimRange)
	if err != nil {
		return err
	}
	fmt.Printf("lease pipeline  %d messages in %.3fs  %.0f jobs/s  (%d claims, %d ack writes; %d workers, limit %d, claims of at most %d, %d ack writers)\n",
		n, elapsed.Seconds(), float64(n)/elapsed.Seconds(), claims, acks, workers, workers, maxClaim, writers)
	return nil
}
