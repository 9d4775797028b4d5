package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/internal/testdb"
)

// Benchmarks. Run them with
//
//	go test -run '^$' -bench . ./broker/postgres/
//
// (TEST_DATABASE_URL as for the tests). ClaimWithQueued1M seeds a million
// queued rows once per run (about half a minute), in a schema of its own
// that TestMain drops at the end.

func BenchmarkSubmit(b *testing.B) {
	br := newTestBroker(b, Options{})
	ctx := context.Background()
	payload := json.RawMessage(`{"to":"someone@example.com","n":1}`)
	b.ResetTimer()
	for range b.N {
		if _, err := br.Submit(ctx, broker.SubmitRequest{Topic: "bench", Task: "send", Payload: payload}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSubmitParallel(b *testing.B) {
	br := newTestBroker(b, Options{MaxConns: 8})
	ctx := context.Background()
	payload := json.RawMessage(`{"to":"someone@example.com","n":1}`)
	b.SetParallelism(4) // 4 x GOMAXPROCS goroutines
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := br.Submit(ctx, broker.SubmitRequest{Topic: "bench", Task: "send", Payload: payload}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkSubmitMany: one op queues 1,000 messages in one SubmitMany.
func BenchmarkSubmitMany(b *testing.B) {
	const batch = 1000
	br := newTestBroker(b, Options{})
	ctx := context.Background()
	reqs := make([]broker.SubmitRequest, batch)
	for i := range reqs {
		reqs[i] = broker.SubmitRequest{Topic: "bench", Task: "send", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
	}
	b.ResetTimer()
	for range b.N {
		if _, err := br.SubmitMany(ctx, reqs); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/msg")
}

// seed inserts n queued messages of topic straight into b's schema and
// analyzes the table.
func seed(tb testing.TB, br *Broker, topic string, n int) { seedPriorities(tb, br, topic, n, 1) }

// seedPriorities is seed with the messages spread over prios priorities
// (0, 10, 20, ... in turn).
func seedPriorities(tb testing.TB, br *Broker, topic string, n, prios int) {
	tb.Helper()
	ctx := context.Background()
	c := schemaConn(tb, br)
	for _, sql := range []string{
		`INSERT INTO tw_topics (name) VALUES ('` + topic + `') ON CONFLICT DO NOTHING`,
		fmt.Sprintf(`INSERT INTO tw_messages (topic, task, payload, available_at, priority)
			SELECT '%s', 'send', jsonb_build_object('n', i), now() - interval '1 hour' + i * interval '1 microsecond', (i %% %d) * 10
			FROM generate_series(1, %d) i`, topic, prios, n),
		`VACUUM ANALYZE tw_messages`,
	} {
		if _, err := c.Exec(ctx, sql); err != nil {
			tb.Fatalf("%s: %v", sql, err)
		}
	}
}

// benchClaimAck claims batches of batch messages and acks each batch.
func benchClaimAck(b *testing.B, limit, batch int) {
	br := newTestBroker(b, Options{})
	ctx := context.Background()
	if limit > 0 {
		if _, err := br.SetTopic(ctx, "bench", broker.TopicPatch{ConcurrencyLimit: &limit}); err != nil {
			b.Fatal(err)
		}
	}
	seed(b, br, "bench", b.N*batch)
	b.ResetTimer()
	for range b.N {
		msgs, err := br.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"bench"}, Max: batch})
		if err != nil {
			b.Fatal(err)
		}
		if len(msgs) != batch {
			b.Fatalf("claimed %d, want %d", len(msgs), batch)
		}
		outcomes := make([]broker.Outcome, len(msgs))
		for i, m := range msgs {
			outcomes[i] = broker.Outcome{Claim: m.ClaimOf()}
		}
		errs, err := br.Ack(ctx, outcomes)
		if err != nil {
			b.Fatal(err)
		}
		for _, e := range errs {
			if e != nil {
				b.Fatal(e)
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/msg")
}

// BenchmarkClaimAck: one op is a Claim of 100 and an Ack of those 100.
func BenchmarkClaimAck(b *testing.B) { benchClaimAck(b, 0, 100) }

// BenchmarkClaimAckLimited: the same on a topic with a concurrency limit
// (1000, so it never binds): the topic lock and the running count are paid.
func BenchmarkClaimAckLimited(b *testing.B) { benchClaimAck(b, 1000, 100) }

// BenchmarkClaimAckOne: one op is a Claim of 1 and an Ack of it.
func BenchmarkClaimAckOne(b *testing.B) { benchClaimAck(b, 0, 1) }

// queues holds the brokers of the deep-queue benchmarks, seeded once per
// run.
var queues struct {
	sync.Mutex
	byDepth map[[2]int]*Broker
}

func deepQueue(b *testing.B, depth int) *Broker { return deepQueuePriorities(b, depth, 1) }

// deepQueuePriorities is deepQueue over prios priorities.
func deepQueuePriorities(b *testing.B, depth, prios int) *Broker {
	queues.Lock()
	defer queues.Unlock()
	if br := queues.byDepth[[2]int{depth, prios}]; br != nil {
		return br
	}
	connect(b)
	schema := testdb.SchemaName("tw_test_")
	benchSchemas.Lock()
	benchSchemas.names = append(benchSchemas.names, schema)
	benchSchemas.Unlock()
	br, err := New(context.Background(), Options{DSN: testdb.DSN(), Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	seedPriorities(b, br, "deep", depth, prios)
	b.Logf("seeded %d queued messages over %d priorities in %v", depth, prios, time.Since(start).Round(time.Millisecond))
	if queues.byDepth == nil {
		queues.byDepth = make(map[[2]int]*Broker)
	}
	queues.byDepth[[2]int{depth, prios}] = br
	return br
}

// benchClaimWithQueued measures the latency of a Max-1 Claim on a topic
// with depth messages queued. Each claimed message is nacked back to the
// queue outside the timer, so the depth stays put.
func benchClaimWithQueued(b *testing.B, depth int) { benchClaimWithQueuedPriorities(b, depth, 1) }

// benchClaimWithQueuedPriorities is benchClaimWithQueued with the queue
// spread over prios priorities: each claim takes the highest.
func benchClaimWithQueuedPriorities(b *testing.B, depth, prios int) {
	br := deepQueuePriorities(b, depth, prios)
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		msgs, err := br.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"deep"}, Max: 1})
		if err != nil {
			b.Fatal(err)
		}
		if len(msgs) != 1 {
			b.Fatalf("claimed %d, want 1", len(msgs))
		}
		b.StopTimer()
		if err := br.Nack(ctx, broker.NackRequest{Claim: msgs[0].ClaimOf(), Requeue: true}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

func BenchmarkClaimWithQueued1k(b *testing.B) { benchClaimWithQueued(b, 1_000) }
func BenchmarkClaimWithQueued1M(b *testing.B) { benchClaimWithQueued(b, 1_000_000) }

// BenchmarkClaimWithQueued1MPriorities: a million queued over 10
// priorities; compare with BenchmarkClaimWithQueued1k (the claim stays an
// index scan: within 1.5 times).
func BenchmarkClaimWithQueued1MPriorities(b *testing.B) {
	benchClaimWithQueuedPriorities(b, 1_000_000, 10)
}

// BenchmarkStatsWithQueued1M: Stats over a topic with a million queued.
func BenchmarkStatsWithQueued1M(b *testing.B) {
	br := deepQueue(b, 1_000_000)
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		if _, err := br.Stats(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAckAndClaim: the worker pool's steady cycle on a topic with a
// limit of 2*size: one op acks the size messages claimed by the op before
// and claims size more, in one AckAndClaim. The sizes show what an
// exchange costs whatever it carries (size 1) and per message.
func BenchmarkAckAndClaim(b *testing.B) {
	for _, size := range []int{1, 10, 50, 100} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) { benchAckAndClaim(b, size, nil) })
	}
}

// benchAckAndClaim runs the cycle with half messages per op, each ack
// carrying report(m) when report is not nil.
func benchAckAndClaim(b *testing.B, half int, report func(broker.Message) *broker.Report) {
	br := newTestBroker(b, Options{})
	ctx := context.Background()
	limit := 2 * half
	if _, err := br.SetTopic(ctx, "bench", broker.TopicPatch{ConcurrencyLimit: &limit}); err != nil {
		b.Fatal(err)
	}
	seed(b, br, "bench", (b.N+2)*half)
	req := broker.ClaimRequest{WorkerID: "w", Topics: []string{"bench"}, Max: half}
	held, err := br.Claim(ctx, req)
	if err != nil || len(held) != half {
		b.Fatalf("first claim: %d, %v", len(held), err)
	}
	outcomes := make([]broker.Outcome, 0, half)
	b.ResetTimer()
	for range b.N {
		outcomes = outcomes[:0]
		for _, m := range held {
			o := broker.Outcome{Claim: m.ClaimOf()}
			if report != nil {
				o.Report = report(m)
			}
			outcomes = append(outcomes, o)
		}
		held = ackAndClaim(b, br, outcomes, req)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*half), "ns/msg")
}

// BenchmarkAckAndClaimWithReports: BenchmarkAckAndClaim/size=50 with each
// ack carrying a plain success report, as the worker's acks do (kept in
// the message's row: ackKeptSQL). The difference to size=50 is what the
// reports cost.
func BenchmarkAckAndClaimWithReports(b *testing.B) { benchAckAndClaim(b, 50, plainReportOf) }

// plainReportOf is the success report of a no-op attempt of m, keyed as
// the worker keys it.
func plainReportOf(m broker.Message) *broker.Report {
	now := time.Now()
	return &broker.Report{MessageID: m.ID, Task: m.Task, Topic: m.Topic, Attempt: m.Attempts, Worker: "w",
		Status: broker.ReportSuccess, StartedAt: now, EndedAt: now, Key: broker.ReportKey(*m.ClaimedAt, m.Token)}
}

// ackAndClaim acks outcomes and claims req.Max in one AckAndClaim, failing
// b unless every outcome applied and the claim took all it asked for.
func ackAndClaim(b *testing.B, br *Broker, outcomes []broker.Outcome, req broker.ClaimRequest) []broker.Message {
	errs, msgs, err := br.AckAndClaim(context.Background(), outcomes, req)
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range errs {
		if e != nil {
			b.Fatal(e)
		}
	}
	if len(msgs) != req.Max {
		b.Fatalf("claimed %d, want %d", len(msgs), req.Max)
	}
	return msgs
}

// BenchmarkAddReport: one task report per call, as the report writer of
// the tasks_worker plugin stores them.
func BenchmarkAddReport(b *testing.B) {
	br := newTestBroker(b, Options{})
	ctx := context.Background()
	r := benchReport()
	b.ResetTimer()
	for i := range b.N {
		r.MessageID = int64(i + 1)
		if _, err := br.AddReport(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
}

// benchReport is a success report like a no-op task's.
func benchReport() broker.Report {
	now := time.Now()
	return broker.Report{Task: "noop", Topic: "bench", Attempt: 1, Worker: "w", Status: broker.ReportSuccess,
		StartedAt: now, EndedAt: now, Progress: 1}
}

// BenchmarkAddReports: task reports stored 500 per call, as the report
// writer of the tasks_worker plugin stores a backlog; ns/op is per report.
func BenchmarkAddReports(b *testing.B) {
	br := newTestBroker(b, Options{})
	ctx := context.Background()
	const batch = 500
	rs := make([]broker.Report, batch)
	for i := range rs {
		rs[i] = benchReport()
	}
	b.ResetTimer()
	for done := 0; done < b.N; done += batch {
		n := min(batch, b.N-done)
		for i := range n {
			rs[i].MessageID = int64(done + i + 1)
		}
		if _, err := br.AddReports(ctx, rs[:n]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAckWithReportsOver1MReports: acks with their success reports,
// 50 at a time with the next claim (AckAndClaim), into a tw_reports that
// already holds a million reports, right after a checkpoint: the state of
// a store that has run for a while. The reports are keyed as the worker
// keys them (broker.ReportKey), the million before them too. Besides
// ns/msg it reports the WAL written per message (pg_current_wal_lsn before
// and after, so it counts the whole server). Seeding takes about half a
// minute.
func BenchmarkAckWithReportsOver1MReports(b *testing.B) {
	const half, held = 50, 1_000_000
	br := newTestBroker(b, Options{})
	ctx := context.Background()
	c := schemaConn(b, br)
	start := time.Now()
	n, err := c.CopyFrom(ctx, pgx.Identifier{"tw_reports"},
		[]string{"message_id", "task", "topic", "attempt", "worker", "status", "started_at", "ended_at", "report_key"},
		pgx.CopyFromSlice(held, func(i int) ([]any, error) {
			now := time.Now()
			return []any{int64(-i - 1), "send", "old", int32(1), "w", broker.ReportSuccess, now, now,
				broker.ReportKey(now, broker.NewToken())}, nil
		}))
	if err != nil || n != held {
		b.Fatalf("seed: %d reports, %v", n, err)
	}
	execAll(b, c, `VACUUM ANALYZE tw_reports`)
	b.Logf("seeded %d reports in %v", held, time.Since(start).Round(time.Millisecond))
	seed(b, br, "bench", (b.N+2)*half)
	req := broker.ClaimRequest{WorkerID: "w", Topics: []string{"bench"}, Max: half}
	msgs, err := br.Claim(ctx, req)
	if err != nil || len(msgs) != half {
		b.Fatalf("first claim: %d, %v", len(msgs), err)
	}
	execAll(b, c, `CHECKPOINT`)
	var lsn0 int64
	if err := c.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'`).Scan(&lsn0); err != nil {
		b.Fatal(err)
	}
	outcomes := make([]broker.Outcome, 0, half)
	b.ResetTimer()
	for range b.N {
		outcomes = outcomes[:0]
		for _, m := range msgs {
			outcomes = append(outcomes, broker.Outcome{Claim: m.ClaimOf(), Report: plainReportOf(m)})
		}
		msgs = ackAndClaim(b, br, outcomes, req)
	}
	b.StopTimer()
	var lsn1 int64
	if err := c.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'`).Scan(&lsn1); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*half), "ns/msg")
	b.ReportMetric(float64(lsn1-lsn0)/float64(b.N*half), "WAL-B/msg")
}
