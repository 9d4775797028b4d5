package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/internal/testdb"
)

// topicCounts are the counts tw_topic_counts holds (summed over the
// shards) and the counts of tw_messages' rows, by topic.
type topicCounts map[string][2]int64

func keptCounts(t testing.TB, c *pgx.Conn) topicCounts {
	t.Helper()
	return readCounts(t, c, `SELECT topic, sum(queued)::bigint, sum(dead)::bigint FROM tw_topic_counts GROUP BY topic`)
}

func rowCounts(t testing.TB, c *pgx.Conn) topicCounts {
	t.Helper()
	return readCounts(t, c, `SELECT topic, count(*) FILTER (WHERE state = 'queued'), count(*) FILTER (WHERE state = 'dead')
		FROM tw_messages GROUP BY topic`)
}

func readCounts(t testing.TB, c *pgx.Conn, sql string) topicCounts {
	t.Helper()
	rows, err := c.Query(context.Background(), sql)
	if err != nil {
		t.Fatal(err)
	}
	out := topicCounts{}
	for rows.Next() {
		var topic string
		var q, d int64
		if err := rows.Scan(&topic, &q, &d); err != nil {
			t.Fatal(err)
		}
		if q != 0 || d != 0 {
			out[topic] = [2]int64{q, d}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// wantKeptCounts fails t unless tw_topic_counts holds what tw_messages'
// rows count.
func wantKeptCounts(t testing.TB, c *pgx.Conn, what string) {
	t.Helper()
	kept, rows := keptCounts(t, c), rowCounts(t, c)
	if fmt.Sprint(kept) != fmt.Sprint(rows) {
		t.Fatalf("after %s, tw_topic_counts holds %v (queued, dead by topic), tw_messages' rows count %v", what, kept, rows)
	}
}

// TestTopicCountsFollowConcurrentWriters: transactions that write one
// topic at once each take a shard, and the shards add up to the rows.
func TestTopicCountsFollowConcurrentWriters(t *testing.T) {
	b := newTestBroker(t, Options{MaxConns: 12})
	ctx := context.Background()
	c := schemaConn(t, b)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			errs <- churn(ctx, b, fmt.Sprintf("w%d", w), []string{"ta", "tb"}, 10)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	wantKeptCounts(t, c, "eight workers submitting, claiming, acking, requeueing and dead-lettering at once")
	var most int
	if err := c.QueryRow(ctx, `SELECT max(n) FROM (SELECT count(*) AS n FROM tw_topic_counts GROUP BY topic) s`).Scan(&most); err != nil {
		t.Fatal(err)
	}
	if most > 16 {
		t.Fatalf("a topic has %d shards, want at most 16", most)
	}
}

// churn submits to each topic, claims, and ends what it claimed in every
// way, rounds times.
func churn(ctx context.Context, b *Broker, worker string, topics []string, rounds int) error {
	for r := range rounds {
		reqs := make([]broker.SubmitRequest, 0, 20*len(topics))
		for _, topic := range topics {
			for i := range 20 {
				reqs = append(reqs, broker.SubmitRequest{Topic: topic, Task: "x", Payload: json.RawMessage(fmt.Sprintf(`{"r":%d,"i":%d}`, r, i))})
			}
		}
		if _, err := b.SubmitMany(ctx, reqs); err != nil {
			return err
		}
		msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: worker, Topics: topics, Max: 12})
		if err != nil {
			return err
		}
		var acks []broker.Outcome
		for i, m := range msgs {
			switch i % 4 {
			case 0, 1:
				acks = append(acks, broker.Outcome{Claim: m.ClaimOf()})
			case 2:
				err = b.Nack(ctx, broker.NackRequest{Claim: m.ClaimOf(), Requeue: true})
			case 3:
				err = b.Nack(ctx, broker.NackRequest{Claim: m.ClaimOf(), Error: "boom"})
			}
			if err != nil {
				return err
			}
		}
		if _, _, err := b.AckAndClaim(ctx, acks, broker.ClaimRequest{WorkerID: worker, Topics: topics, Max: 4}); err != nil {
			return err
		}
	}
	return nil
}

// TestTopicCountsSeeEveryWriter: the counts follow writes made outside
// the broker's own statements: an application's transaction through the
// insert statements (client/pgtx, whose search_path is another schema's),
// an operator's SQL, a TRUNCATE; a table written with the triggers off is
// counted again by tw_topic_counts_rebuild.
func TestTopicCountsSeeEveryWriter(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := context.Background()
	c := schemaConn(t, b)
	if _, err := b.SubmitMany(ctx, []broker.SubmitRequest{{Topic: "op", Task: "x"}, {Topic: "op", Task: "x"}, {Topic: "op", Task: "x"}}); err != nil {
		t.Fatal(err)
	}

	app := connect(t)
	tx, err := app.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ins.Insert(ctx, tx, broker.SubmitRequest{Topic: "app", Task: "x"}, broker.MaxPayloadSize); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ins.InsertMany(ctx, tx, []broker.SubmitRequest{{Topic: "app", Task: "x"}, {Topic: "op", Task: "x"}}, broker.MaxPayloadSize); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wantKeptCounts(t, c, "inserts in an application's transaction")

	execAll(t, c,
		`INSERT INTO tw_topics (name) VALUES ('sql') ON CONFLICT DO NOTHING`,
		`INSERT INTO tw_messages (topic, task, state, finished_at) VALUES ('sql', 'x', 'dead', now()), ('sql', 'x', 'queued', NULL)`,
		`UPDATE tw_messages SET state = 'dead', finished_at = now() WHERE id = (SELECT min(id) FROM tw_messages WHERE topic = 'op')`,
		`UPDATE tw_messages SET topic = 'sql' WHERE id = (SELECT max(id) FROM tw_messages WHERE topic = 'op' AND state = 'queued')`,
		`DELETE FROM tw_messages WHERE topic = 'app' AND id = (SELECT min(id) FROM tw_messages WHERE topic = 'app')`,
		`UPDATE tw_messages SET priority = 5 WHERE topic = 'app'`)
	wantKeptCounts(t, c, "an operator's inserts, updates of state and topic, and a delete")

	execAll(t, c, `TRUNCATE tw_messages CASCADE`)
	wantKeptCounts(t, c, "a TRUNCATE")
	if kept := keptCounts(t, c); len(kept) != 0 {
		t.Fatalf("after a TRUNCATE tw_topic_counts holds %v, want nothing", kept)
	}

	execAll(t, c, `SET session_replication_role = replica`,
		`INSERT INTO tw_messages (topic, task) VALUES ('sql', 'x'), ('sql', 'x')`,
		`SET session_replication_role = origin`)
	if kept, rows := keptCounts(t, c), rowCounts(t, c); fmt.Sprint(kept) == fmt.Sprint(rows) {
		t.Fatalf("inserts with the triggers off were counted: %v", kept)
	}
	execAll(t, c, `SELECT tw_topic_counts_rebuild()`)
	wantKeptCounts(t, c, "tw_topic_counts_rebuild")
}

// TestTopicCountsMigrationCountsWhatIsThere: the migration that brings the
// counts counts the messages already stored.
func TestTopicCountsMigrationCountsWhatIsThere(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := context.Background()
	c := schemaConn(t, b)
	if _, err := b.SubmitMany(ctx, []broker.SubmitRequest{{Topic: "m", Task: "x"}, {Topic: "m", Task: "x"}, {Topic: "n", Task: "x"}}); err != nil {
		t.Fatal(err)
	}
	m, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"m"}, Max: 1})
	if err != nil || len(m) != 1 {
		t.Fatalf("Claim = %v, %v", m, err)
	}
	if err := b.DeadLetter(ctx, m[0].ClaimOf(), "poison", nil); err != nil {
		t.Fatal(err)
	}
	execAll(t, c, `DROP FUNCTION tw_topic_counts_track(), tw_topic_counts_truncated(), tw_topic_counts_rebuild() CASCADE`,
		`DROP TABLE tw_topic_counts`,
		`INSERT INTO tw_messages (topic, task) VALUES ('n', 'x')`,
		`DELETE FROM tw_schema_migrations WHERE version = 25`)
	if err := Migrate(ctx, testdb.DSN(), b.schema); err != nil {
		t.Fatal(err)
	}
	wantKeptCounts(t, c, "the migration")
	st, err := b.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, ts := range st.Topics {
		if want := map[string][2]int{"m": {1, 1}, "n": {2, 0}}[ts.Name]; [2]int{ts.Queued, ts.DeadLetter} != want {
			t.Errorf("Stats of topic %s after the migration: queued %d, dead %d, want %v", ts.Name, ts.Queued, ts.DeadLetter, want)
		}
	}
}

// TestCountsShardTakesTheTriggersLocks: an ack's own count and the
// triggers' take the same lock for a shard, so that they never write one
// shard from two transactions at once, and the ack takes another shard
// than a transaction in flight that holds its connection's.
func TestCountsShardTakesTheTriggersLocks(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := context.Background()
	c1, c2 := schemaConn(t, b), schemaConn(t, b)
	tx, err := c1.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var held int
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid() % 16 FROM (SELECT tw_topic_counts_add('x', 1, 0)) a`).Scan(&held); err != nil {
		t.Fatal(err)
	}
	var free bool
	if err := c2.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(`+countsLock("'x'", "$1::int")+`)`, held).Scan(&free); err != nil {
		t.Fatal(err)
	}
	if free {
		t.Fatalf("the lock of shard %d of topic x, which tw_topic_counts_add holds in a transaction in flight, was free to countsLock's key", held)
	}
	var shard int
	if err := c2.QueryRow(ctx, `SELECT `+countsShard("'x'")).Scan(&shard); err != nil {
		t.Fatal(err)
	}
	if shard == held {
		t.Fatalf("countsShard took shard %d, which a transaction in flight holds", held)
	}
}
