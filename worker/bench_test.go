package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/postgres"
	"github.com/taskhost/taskhost/internal/testdb"
)

// BenchmarkBurnDown: a pool of 100 handlers with the default options runs
// 10,000 queued no-op tasks of one topic with a concurrency limit of 100,
// on the PostgreSQL broker (TEST_DATABASE_URL, default the local test
// database, in a schema of its own dropped at the end). One op is one
// burn-down, timed from Start until the pool reports the last task done
// (after its ack committed).
//
//	go test -run '^$' -bench BurnDown ./worker/
func BenchmarkBurnDown(b *testing.B) {
	const (
		tasks   = 10_000
		workers = 100
	)
	dsn := testdb.DSN()
	ctx := context.Background()
	var suffix [6]byte
	_, _ = rand.Read(suffix[:])
	schema := "tw_bench_" + hex.EncodeToString(suffix[:])
	br, err := postgres.New(ctx, postgres.Options{DSN: dsn, Schema: schema})
	if err != nil {
		b.Fatalf("PostgreSQL broker (set TEST_DATABASE_URL): %v", err)
	}
	b.Cleanup(func() {
		_ = br.Close()
		if c, err := pgx.Connect(ctx, dsn); err == nil {
			_, _ = c.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
			_ = c.Close(ctx)
		}
	})

	limit := workers
	var total time.Duration
	for i := range b.N {
		b.StopTimer()
		topic := fmt.Sprintf("burn-%d", i)
		if _, err := br.SetTopic(ctx, topic, broker.TopicPatch{ConcurrencyLimit: &limit}); err != nil {
			b.Fatal(err)
		}
		reqs := make([]broker.SubmitRequest, tasks)
		for j := range reqs {
			reqs[j] = broker.SubmitRequest{Topic: topic, Task: "noop", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, j))}
		}
		if _, err := br.SubmitMany(ctx, reqs); err != nil {
			b.Fatal(err)
		}
		reg := NewRegistry()
		reg.MustRegister(Task{Name: "noop", Topic: topic, Handler: func(context.Context, *TaskContext) (any, error) { return nil, nil }})
		obs := &doneCounter{want: tasks, all: make(chan struct{})}
		p := NewPool(br, reg, Options{Concurrency: workers, Observer: obs})
		b.StartTimer()
		start := time.Now()
		if err := p.Start(ctx); err != nil {
			b.Fatal(err)
		}
		select {
		case <-obs.all:
		case <-time.After(5 * time.Minute):
			b.Fatalf("%d of %d done after 5 minutes", obs.n.Load(), tasks)
		}
		total += time.Since(start)
		b.StopTimer()
		if err := p.Stop(ctx); err != nil {
			b.Fatal(err)
		}
		if bad := obs.bad.Load(); bad > 0 {
			b.Fatalf("%d attempts did not end done", bad)
		}
	}
	b.ReportMetric(float64(b.N*tasks)/total.Seconds(), "tasks/s")
}

// doneCounter closes all when want attempts finished.
type doneCounter struct {
	want   int64
	n, bad atomic.Int64
	all    chan struct{}
}

func (d *doneCounter) TaskStarted(string) {}

func (d *doneCounter) TaskFinished(_, _, status string, _ time.Duration) {
	if status != StatusDone {
		d.bad.Add(1)
	}
	if d.n.Add(1) == d.want {
		close(d.all)
	}
}
