package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/worker"
)

// benchObserver counts finished attempts and records when each message
// finished. It implements worker.Observer and worker.MessageObserver.
type benchObserver struct {
	want     int64
	finished atomic.Int64
	notDone  atomic.Int64
	all      chan struct{}
	once     sync.Once

	record bool
	mu     sync.Mutex
	at     map[int64]time.Time
}

func newBenchObserver(want int, record bool) *benchObserver {
	o := &benchObserver{want: int64(want), all: make(chan struct{}), record: record}
	if record {
		o.at = make(map[int64]time.Time, want)
	}
	return o
}

func (o *benchObserver) TaskStarted(string) {}

func (o *benchObserver) TaskFinished(string, string, string, time.Duration) {}

func (o *benchObserver) MessageFinished(id int64, _, _, status string) {
	now := time.Now()
	if status != worker.StatusDone {
		o.notDone.Add(1)
	}
	if o.record {
		o.mu.Lock()
		o.at[id] = now
		o.mu.Unlock()
	}
	if o.finished.Add(1) == o.want {
		o.once.Do(func() { close(o.all) })
	}
}

// countingBroker counts the pool's Claim and Ack calls and what they
// carried, for the phase reports.
type countingBroker struct {
	broker.Broker
	claims, claimed, acks, acked atomic.Int64
	claimNanos                   atomic.Int64 // time spent in claim calls
}

func (c *countingBroker) Claim(ctx context.Context, req broker.ClaimRequest) ([]broker.Message, error) {
	start := time.Now()
	msgs, err := c.Broker.Claim(ctx, req)
	c.claimNanos.Add(int64(time.Since(start)))
	c.claims.Add(1)
	c.claimed.Add(int64(len(msgs)))
	return msgs, err
}

func (c *countingBroker) Ack(ctx context.Context, outcomes []broker.Outcome) ([]error, error) {
	c.acks.Add(1)
	c.acked.Add(int64(len(outcomes)))
	return c.Broker.Ack(ctx, outcomes)
}

// countingAckClaimer is a countingBroker over a broker.AckClaimer, so
// the pool still finds the interface.
type countingAckClaimer struct {
	*countingBroker
	ac broker.AckClaimer
}

func (c countingAckClaimer) AckAndClaim(ctx context.Context, outcomes []broker.Outcome, req broker.ClaimRequest) ([]error, []broker.Message, error) {
	start := time.Now()
	errs, msgs, err := c.ac.AckAndClaim(ctx, outcomes, req)
	c.claimNanos.Add(int64(time.Since(start)))
	c.claims.Add(1)
	c.claimed.Add(int64(len(msgs)))
	if len(outcomes) > 0 {
		c.acks.Add(1)
		c.acked.Add(int64(len(outcomes)))
	}
	return errs, msgs, err
}

func (c *countingBroker) String() string {
	per := func(n, calls int64) float64 {
		if calls == 0 {
			return 0
		}
		return float64(n) / float64(calls)
	}
	return fmt.Sprintf("%d claims (%.1f messages, %.2f ms each), %d ack writes (%.1f each)",
		c.claims.Load(), per(c.claimed.Load(), c.claims.Load()), per(c.claimNanos.Load(), c.claims.Load())/1e6,
		c.acks.Load(), per(c.acked.Load(), c.acks.Load()))
}

func (bn *bench) newPool(topic string, obs worker.Observer) *worker.Pool {
	reg := worker.NewRegistry()
	reg.MustRegister(worker.Task{
		Name:    benchTask,
		Topic:   topic,
		Handler: func(context.Context, *worker.TaskContext) (any, error) { return nil, nil },
	})
	bn.calls = &countingBroker{Broker: bn.b}
	var b broker.Broker = bn.calls
	if ac, ok := bn.b.(broker.AckClaimer); ok {
		b = countingAckClaimer{countingBroker: bn.calls, ac: ac}
	}
	opts := worker.Options{
		Concurrency: bn.cfg.workers,
		Observer:    obs,
		Logger:      bn.log.Named("pool"),
	}
	bn.reports = nil
	bn.dropped.Store(0)
	if !bn.cfg.poolOnly {
		// As the tasks_worker plugin stores them (runtime.go): into the
		// pool's own broker, so that a pool that can give each report to
		// the broker with its outcome does.
		bn.reports = worker.NewReportWriter(b, bn.log.Named("reports"), func(n int) { bn.dropped.Add(int64(n)) })
		opts.Reporter = bn.reports
	}
	return worker.NewPool(b, reg, opts)
}

// stopPool stops p and then the report writer, if any, once it stored
// what it holds; reports it dropped are an error.
func (bn *bench) stopPool(p *worker.Pool) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := p.Stop(ctx)
	if bn.reports != nil {
		bn.reports.Close(context.Background())
		bn.reports = nil
		if d := bn.dropped.Load(); d > 0 && err == nil {
			err = fmt.Errorf("%d task reports were not stored", d)
		}
	}
	return err
}
