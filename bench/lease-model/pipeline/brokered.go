package main

// The lease model's pipeline over the product's broker (-broker): the
// claims and acks are the PostgreSQL broker's own Claim and Ack calls,
// with their claim rows, tokens and carried success reports, and only the
// pool around them is the model's (harness.go): one claimer, workers, and
// ack writers that ack each claim whole once all its messages ran. Beside
// the product's burn-down (bench), it tells how much of the difference is
// the pool's pipeline rather than the broker's statements.

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/postgres"
)

const brokerSchema = "lease_broker"

// brokerLease is what one Claim returned, with each message's report.
type brokerLease struct {
	b    *postgres.Broker
	msgs []broker.Message
	st   []time.Time
	en   []time.Time
}

func (l *brokerLease) size() int { return len(l.msgs) }

func (l *brokerLease) run(i int) {
	l.st[i] = time.Now()
	l.en[i] = time.Now()
}

func (l *brokerLease) ack(ctx context.Context, _ *pgx.Conn) error {
	outcomes := make([]broker.Outcome, len(l.msgs))
	for i, m := range l.msgs {
		at := l.st[i]
		if m.ClaimedAt != nil {
			at = *m.ClaimedAt
		}
		outcomes[i] = broker.Outcome{Claim: m.ClaimOf(), Report: &broker.Report{
			MessageID: m.ID, Task: m.Task, Topic: m.Topic, Attempt: max(m.Attempts, 1), Worker: "w",
			Status: broker.ReportSuccess, StartedAt: l.st[i], EndedAt: l.en[i], Duration: l.en[i].Sub(l.st[i]).Seconds(),
			Key: broker.ReportKey(at, m.Token),
		}}
	}
	errs, err := l.b.Ack(ctx, outcomes)
	if err != nil {
		return err
	}
	for i, e := range errs {
		if e != nil {
			return fmt.Errorf("message %d: %w", l.msgs[i].ID, e)
		}
	}
	return nil
}

func runBroker(dsn string, n, workers, maxClaim, writers int) error {
	ctx := context.Background()
	admin, b, err := productQueue(ctx, dsn, brokerSchema, n, int32(2+writers))
	if err != nil {
		return err
	}
	defer admin.Close(context.Background())
	defer dropOnExit(admin, brokerSchema)
	defer b.Close()
	if err := b.RegisterWorker(ctx, broker.WorkerInfo{ID: "w", Topics: []string{"t"}}); err != nil {
		return err
	}
	for _, sql := range []string{
		`UPDATE ` + brokerSchema + `.tw_topics SET concurrency_limit = ` + fmt.Sprint(workers) + ` WHERE name = 't'`,
		`VACUUM ANALYZE ` + brokerSchema + `.tw_messages`,
		`CHECKPOINT`,
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
	}
	claim := func(ctx context.Context, _ *pgx.Conn, want int) (lease, error) {
		msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"t"}, Max: want})
		if err != nil || len(msgs) == 0 {
			return nil, err
		}
		return &brokerLease{b: b, msgs: msgs, st: make([]time.Time, len(msgs)), en: make([]time.Time, len(msgs))}, nil
	}
	elapsed, claims, acks, err := burnDown(ctx, make([]*pgx.Conn, 1+writers), n, workers, maxClaim, claim)
	if err != nil {
		return err
	}
	var left, reports int
	if err := admin.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+brokerSchema+`.tw_messages), (SELECT count(*) FROM `+brokerSchema+`.tw_reports)`).Scan(&left, &reports); err != nil {
		return err
	}
	if left != 0 || reports != n {
		return fmt.Errorf("after the burn-down %d messages are left in tw_messages and %d reports are stored, want 0 and %d", left, reports, n)
	}
	fmt.Printf("lease broker    %d messages in %.3fs  %.0f jobs/s  (%d claims, %d ack writes; %d workers, limit %d, claims of at most %d, %d ack writers)\n",
		n, elapsed.Seconds(), float64(n)/elapsed.Seconds(), claims, acks, workers, workers, maxClaim, writers)
	return nil
}
