package bench

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/taskhost/taskhost/broker"
)

// claimDepths are the queue depths the claim-latency phase compares.
var claimDepths = []int{1_000, 1_000_000}

// claimLatency seeds each of claimDepths queued messages in a schema of its
// own (the bench's schema for the first, "<schema>_q<depth>" for the
// others, dropped at the end unless -keep), on a topic with the bench's
// limit, and times Claim of one message, -claim-samples times per depth
// and run. The depths take turns claim by claim, so a change in the
// machine's load weighs on all of them alike.
func (bn *bench) claimLatency(ctx context.Context) ([]claimResult, error) {
	cfg := bn.cfg
	if err := bn.reset(ctx); err != nil {
		return nil, err
	}
	type queue struct {
		depth int
		b     broker.Broker
		admin *pgx.Conn
		topic string
		lat   []float64
	}
	var queues []*queue
	for i, depth := range claimDepths {
		q := &queue{depth: depth, b: bn.b, admin: bn.admin, topic: bn.topic("claim", depth)}
		if i > 0 {
			schema := fmt.Sprintf("%s_q%d", bn.schema, depth)
			b, admin, undo, err := bn.openSchema(ctx, schema)
			if err != nil {
				return nil, err
			}
			defer undo()
			q.b, q.admin = b, admin
		}
		limit := cfg.limit
		if _, err := q.b.SetTopic(ctx, q.topic, broker.TopicPatch{ConcurrencyLimit: &limit}); err != nil {
			return nil, err
		}
		start := time.Now()
		if _, err := q.admin.Exec(ctx, `
			INSERT INTO tw_messages (topic, task, payload, available_at)
			SELECT $1, $2, jsonb_build_object('seq', i), now() - interval '1 hour' + i * interval '1 microsecond'
			FROM generate_series(1, $3::int) i`, q.topic, benchTask, depth); err != nil {
			return nil, err
		}
		if _, err := q.admin.Exec(ctx, `ANALYZE tw_messages`); err != nil {
			return nil, err
		}
		fmt.Fprintf(bn.out, "  seeded %d queued messages in %.1fs (INSERT ... generate_series, ANALYZE)\n", depth, time.Since(start).Seconds())
		queues = append(queues, q)
	}
	_, _ = bn.admin.Exec(ctx, `CHECKPOINT`)
	// Warm the connections' statement caches.
	for _, q := range queues {
		for range 20 {
			if _, err := claimOnce(ctx, q.b, q.topic); err != nil {
				return nil, err
			}
		}
	}
	var out []claimResult
	for run := 1; run <= cfg.runs; run++ {
		for _, q := range queues {
			q.lat = q.lat[:0]
		}
		for i := range cfg.claimSamples {
			for j := range queues {
				q := queues[(i+j)%len(queues)]
				d, err := claimOnce(ctx, q.b, q.topic)
				if err != nil {
					return nil, fmt.Errorf("%d queued: %w", q.depth, err)
				}
				q.lat = append(q.lat, ms(d))
			}
		}
		for _, q := range queues {
			var sum float64
			for _, v := range q.lat {
				sum += v
			}
			slices.Sort(q.lat)
			cr := claimResult{Depth: q.depth, Run: run, P50: quantile(q.lat, 0.5), P95: quantile(q.lat, 0.95), P99: quantile(q.lat, 0.99), Mean: sum / float64(len(q.lat))}
			fmt.Fprintf(bn.out, "  run %d  %8d queued: claim p50 %s  p95 %s  p99 %s  mean %s ms\n", run, q.depth, fmtNum(cr.P50), fmtNum(cr.P95), fmtNum(cr.P99), fmtNum(cr.Mean))
			out = append(out, cr)
		}
	}
	return out, nil
}

// claimOnce times one Claim of one message of topic and puts the message
// back (outside the timer).
func claimOnce(ctx context.Context, b broker.Broker, topic string) (time.Duration, error) {
	start := time.Now()
	msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "bench-claimer", Topics: []string{topic}, Max: 1})
	d := time.Since(start)
	if err != nil {
		return 0, err
	}
	if len(msgs) != 1 {
		return 0, fmt.Errorf("claimed %d messages, want 1", len(msgs))
	}
	return d, b.Nack(ctx, broker.NackRequest{Claim: msgs[0].ClaimOf(), Requeue: true})
}
