package local

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

var benchPayload = json.RawMessage(`{"user":12345,"action":"send","to":"someone@example.com"}`)

func BenchmarkSubmit(b *testing.B) {
	br := openTest(b, Options{})
	ctx := context.Background()
	req := broker.SubmitRequest{Topic: "bench", Task: "x", Payload: benchPayload}
	b.ResetTimer()
	for b.Loop() {
		if _, err := br.Submit(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSubmitParallel: concurrent submitters in one process, queued on
// the one writer connection.
func BenchmarkSubmitParallel(b *testing.B) {
	br := openTest(b, Options{})
	ctx := context.Background()
	req := broker.SubmitRequest{Topic: "bench", Task: "x", Payload: benchPayload}
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := br.Submit(ctx, req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// seed queues n messages on topic in one transaction.
func seed(b *testing.B, br *Broker, topic string, n int) {
	b.Helper()
	err := br.write(context.Background(), "seed", func(tx *txn, now time.Time) error {
		if _, err := tx.Exec(`INSERT INTO tw_topics (name) VALUES (?) ON CONFLICT DO NOTHING`, topic); err != nil {
			return err
		}
		stmt, err := tx.Prepare(`INSERT INTO tw_messages (topic, task, payload, state, available_at, created_at)
			VALUES (?, 'x', ?, 'queued', ?, ?)`)
		if err != nil {
			return err
		}
		defer stmt.Close()
		for range n {
			if _, err := stmt.Exec(topic, string(benchPayload), ns(now), ns(now)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkClaimAck: one op claims a batch of 100 and acks it in one call.
func BenchmarkClaimAck(b *testing.B) {
	const batch = 100
	br := openTest(b, Options{})
	ctx := context.Background()
	seed(b, br, "bench", b.N*batch)
	req := broker.ClaimRequest{WorkerID: "w", Topics: []string{"bench"}, Max: batch}
	outcomes := make([]broker.Outcome, 0, batch)
	b.ResetTimer()
	for range b.N {
		msgs, err := br.Claim(ctx, req)
		if err != nil || len(msgs) != batch {
			b.Fatalf("Claim = %d, %v", len(msgs), err)
		}
		outcomes = outcomes[:0]
		for _, m := range msgs {
			outcomes = append(outcomes, broker.Outcome{Claim: m.ClaimOf()})
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

// BenchmarkClaimEmpty: an idle worker's poll of empty topics (a read, no
// write lock).
func BenchmarkClaimEmpty(b *testing.B) {
	br := openTest(b, Options{})
	ctx := context.Background()
	seed(b, br, "a", 0)
	seed(b, br, "b", 0)
	req := broker.ClaimRequest{WorkerID: "w", Topics: []string{"a", "b"}, Max: 10}
	b.ResetTimer()
	for b.Loop() {
		if msgs, err := br.Claim(ctx, req); err != nil || len(msgs) != 0 {
			b.Fatalf("Claim = %d, %v", len(msgs), err)
		}
	}
}

// BenchmarkStats: Stats (what the broker gauges, GET topics and the task
// UI's dashboard read) with a million and ten million queued messages,
// seeded once per depth (the ten million take a few minutes and a few GB
// of temporary disk). It reports the median besides the mean.
func BenchmarkStats(b *testing.B) {
	for _, q := range []struct {
		name  string
		depth int
	}{{"1M", 1_000_000}, {"10M", 10_000_000}} {
		b.Run("queued="+q.name, func(b *testing.B) {
			br := openTest(b, Options{})
			ctx := context.Background()
			start := time.Now()
			err := br.write(ctx, "seed", func(tx *txn, now time.Time) error {
				if _, err := tx.Exec(`INSERT INTO tw_topics (name) VALUES ('deep')`); err != nil {
					return err
				}
				_, err := tx.Exec(`WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
					INSERT INTO tw_messages (topic, task, payload, state, available_at, created_at)
					SELECT 'deep', 'x', '{"n":' || i || '}', 'queued', ?, ? FROM n`, q.depth, ns(now), ns(now))
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
			b.Logf("seeded %d queued messages in %v", q.depth, time.Since(start).Round(time.Millisecond))
			b.Run("stats", func(b *testing.B) {
				took := make([]time.Duration, 0, b.N)
				for range b.N {
					t0 := time.Now()
					st, err := br.Stats(ctx)
					took = append(took, time.Since(t0))
					if err != nil || len(st.Topics) != 1 || st.Topics[0].Queued != q.depth {
						b.Fatalf("Stats = %+v, %v; want topic deep with %d queued", st, err, q.depth)
					}
				}
				slices.Sort(took)
				b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "median-ms")
			})
		})
	}
}
