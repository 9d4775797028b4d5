package rabbitmq

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/local"
	"github.com/taskhost/taskhost/broker/postgres"
	"github.com/taskhost/taskhost/broker/sqlstore"
	"github.com/taskhost/taskhost/internal/testdb"
	"github.com/taskhost/taskhost/internal/testrabbit"
)

// twoHosts opens two brokers on one prefix and one state store of kind
// (one local file, or one postgres schema), as two processes would, both
// with o.
func twoHosts(t *testing.T, kind stateKind, o Options) (*Broker, *Broker) {
	t.Helper()
	o.URL, o.Prefix = testrabbit.URL(t), testrabbit.Prefix()
	var open func() StateStore
	switch kind {
	case onLocal:
		path := filepath.Join(t.TempDir(), "taskhost.db")
		open = func() StateStore {
			s, err := local.Open(t.Context(), local.Options{Path: path})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
	case onPostgres:
		schema := testdb.FreshSchema(t, "rabbit")
		open = func() StateStore {
			s, err := postgres.New(t.Context(), postgres.Options{DSN: testdb.DSN(), Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
	}
	a := o
	a.State = open()
	b := o
	b.State = open()
	return openOn(t, a), openOn(t, b)
}

// republished counts what brokers published again, by reason
// (Options.Republished).
type republished struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *republished) add(reason string, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = make(map[string]int)
	}
	r.n[reason] += n
}

func (r *republished) of(reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[reason]
}

// logBuffer is a logger's output, safe to read while brokers write it.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logBuffer) logger() hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Output: l, Level: hclog.Debug})
}

// runs counts how many times each task ran, across every runner.
type runs struct {
	mu sync.Mutex
	n  map[int64]int
}

func (r *runs) add(id int64) {
	r.mu.Lock()
	r.n[id]++
	r.mu.Unlock()
}

// ran returns how many tasks ran at least once, and those that ran more
// than once.
func (r *runs) ran() (int, []int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var twice []int64
	for id, n := range r.n {
		if n > 1 {
			twice = append(twice, id)
		}
	}
	return len(r.n), twice
}

// runners claims from topic on each broker with claimers goroutines each,
// as worker pools would, each task taking hold (its time to run) before
// its ack, until ctx ends. The returned wait waits for them.
func runners(ctx context.Context, t *testing.T, bs []*Broker, claimers int, topics []string, r *runs, hold func(m broker.Message) time.Duration) (wait func()) {
	var wg sync.WaitGroup
	for i, b := range bs {
		for j := range claimers {
			worker := fmt.Sprintf("w%d-%d", i, j)
			wg.Go(func() {
				for ctx.Err() == nil {
					ms, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: worker, Topics: topics, Max: 8})
					if err != nil || len(ms) == 0 {
						select {
						case <-ctx.Done():
						case <-time.After(50 * time.Millisecond):
						}
						continue
					}
					outs := make([]broker.Outcome, len(ms))
					for k, m := range ms {
						r.add(m.ID)
						time.Sleep(hold(m))
						outs[k] = broker.Outcome{Claim: m.ClaimOf()}
					}
					errs, err := b.Ack(context.WithoutCancel(ctx), outs)
					if err != nil {
						t.Errorf("Ack: %v", err)
						continue
					}
					for k, e := range errs {
						if e != nil {
							t.Errorf("Ack of %d: %v", ms[k].ID, e)
						}
					}
				}
			})
		}
	}
	return wg.Wait
}

// submitN submits n tasks to topic through b, in one batch.
func submitN(t *testing.T, b *Broker, topic string, n int, delay time.Duration) []int64 {
	t.Helper()
	reqs := make([]broker.SubmitRequest, n)
	for i := range reqs {
		reqs[i] = broker.SubmitRequest{Topic: topic, Task: "task", Delay: delay}
	}
	ids, err := b.SubmitMany(t.Context(), reqs)
	if err != nil {
		t.Fatalf("SubmitMany: %v", err)
	}
	return ids
}

// queuedLeft counts the tasks of ids still queued in b's state store.
func queuedLeft(t *testing.T, b *Broker, ids []int64) int {
	t.Helper()
	n := 0
	for _, id := range ids {
		m, err := b.GetMessage(t.Context(), id)
		if err != nil {
			t.Fatalf("GetMessage(%d): %v", id, err)
		}
		if m.State == broker.StateQueued {
			n++
		}
	}
	return n
}

// TestTasksOfAPurgedQueueRunOnceEach: an operator purges a topic's queue
// (rabbitmqctl purge_queue) in the middle of a burn-down on two hosts.
// The tasks whose messages went with it are still queued in the state
// store: the brokers find the queue short of them and publish them again,
// and every task ends done, each having run once. Before, the purged
// tasks stayed queued for good while both hosts said ok, until
// tasks_worker was restarted by hand.
func TestTasksOfAPurgedQueueRunOnceEach(t *testing.T) {
	for _, kind := range []stateKind{onLocal, onPostgres} {
		t.Run(string(kind), func(t *testing.T) {
			const total = 1500
			var (
				rep  republished
				logs logBuffer
			)
			o := Options{Republished: rep.add, Logger: logs.logger()}
			if kind == onPostgres {
				// Several looks republish what went missing.
				o.reconcileBatch = 300
			}
			a, b := twoHosts(t, kind, o)
			ids := submitN(t, a, "burn", total, 0)
			r := &runs{n: make(map[int64]int)}
			ctx, stop := context.WithCancel(t.Context())
			wait := runners(ctx, t, []*Broker{a, b}, 4, []string{"burn"}, r, func(broker.Message) time.Duration { return 5 * time.Millisecond })
			defer func() {
				stop()
				wait()
			}()
			eventually(t, time.Minute, "a fifth of the tasks ran", func() bool {
				n, _ := r.ran()
				return n >= total/5
			})
			purged, err := channel(t).QueuePurge(a.names.topic("burn"), false)
			if err != nil {
				t.Fatal(err)
			}
			if purged == 0 {
				t.Fatal("the purge took no message: the burn-down was over before it")
			}
			// What went missing: the tasks still queued once the deliveries
			// on their way to a take at the purge have been taken, well
			// before the reconcile may act. The purge's count can be higher:
			// it also takes duplicate pointers, which a submit whose publish
			// outlasts its outbox entry's due time leaves.
			time.Sleep(5 * time.Second)
			missing := queuedLeft(t, a, ids)
			t.Logf("purged %d messages; %d tasks left without one", purged, missing)
			if missing == 0 {
				t.Fatal("the purge left no task without a message: the burn-down was over before it")
			}
			// The gauge says how many are missing until they are back.
			var sawMissing atomic.Int64
			watchCtx, unwatch := context.WithCancel(t.Context())
			defer unwatch()
			go func() {
				for watchCtx.Err() == nil {
					sawMissing.Store(max(sawMissing.Load(), int64(a.Missing()+b.Missing())))
					time.Sleep(20 * time.Millisecond)
				}
			}()
			const within = 90 * time.Second
			deadline := time.Now().Add(within)
			for {
				n, twice := r.ran()
				if len(twice) > 0 {
					t.Fatalf("tasks %v ran more than once", twice)
				}
				if n == total {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d tasks ran within %v of a purge of %d messages; %d are still queued in the state store",
						n, total, within, purged, queuedLeft(t, a, ids))
				}
				time.Sleep(50 * time.Millisecond)
			}
			t.Logf("all %d ran %v after the purge", total, within-time.Until(deadline))
			for _, id := range ids {
				m, err := b.GetMessage(t.Context(), id)
				if err != nil || m.State != broker.StateDone || m.Attempts != 1 {
					t.Fatalf("task %d: %+v, %v; want done after one attempt", id, m, err)
				}
			}
			if got := rep.of(RepublishedMissing); got != missing {
				t.Errorf("republished %d messages as missing, want the %d tasks the purge left without one", got, missing)
			}
			unwatch()
			if n := sawMissing.Load(); n == 0 {
				t.Error("Missing() never said a message was missing")
			}
			if !strings.Contains(logs.String(), "a topic queue lacks queued tasks") {
				t.Errorf("no WARN line says the queue lacked tasks; the log:\n%s", logs.String())
			}
		})
	}
}

// TestAHealthyBurnDownRepublishesNothing: the reconcile never takes what
// its count cannot see for a loss. Two hosts burn down a deep queue
// (tasks wait in it far longer than the hold) while tasks keep being
// submitted, delayed tasks come due, deliveries stay unacked for seconds
// while their tasks run, and a topic limited to one puts the deliveries
// it cannot take back at the end of its queue; the reconcile looks as
// often as it can, with a hold of a second. It republishes nothing, and
// never says a message is missing.
func TestAHealthyBurnDownRepublishesNothing(t *testing.T) {
	var (
		rep  republished
		logs logBuffer
	)
	a, b := twoHosts(t, onPostgres, Options{Republished: rep.add, Logger: logs.logger(),
		reconcileEvery: 100 * time.Millisecond, reconcileIdle: 100 * time.Millisecond, reconcileHold: time.Second})
	one := 1
	if _, err := a.SetTopic(t.Context(), "one", broker.TopicPatch{ConcurrencyLimit: &one}); err != nil {
		t.Fatal(err)
	}
	var ids []int64
	ids = append(ids, submitN(t, a, "deep", 3000, 0)...)
	ids = append(ids, submitN(t, b, "one", 40, 0)...)
	ids = append(ids, submitN(t, a, "long", 12, 0)...)
	for _, d := range []time.Duration{2 * time.Second, 5 * time.Second, 9 * time.Second} {
		ids = append(ids, submitN(t, b, "deep", 100, d)...)
	}
	var missing atomic.Int64
	ctx, stop := context.WithCancel(t.Context())
	var trickle sync.WaitGroup
	var trickled sync.Map
	trickle.Go(func() {
		// Submits go on through the burn-down, so that publishes meet the
		// counts.
		for i := 0; ctx.Err() == nil && i < 150; i++ {
			id, err := []*Broker{a, b}[i%2].Submit(ctx, broker.SubmitRequest{Topic: "deep", Task: "task"})
			if err == nil {
				trickled.Store(id, true)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	trickle.Go(func() {
		for ctx.Err() == nil {
			missing.Store(max(missing.Load(), int64(a.Missing()+b.Missing())))
			time.Sleep(10 * time.Millisecond)
		}
	})
	r := &runs{n: make(map[int64]int)}
	wait := runners(ctx, t, []*Broker{a, b}, 3, []string{"deep", "one", "long"}, r, func(m broker.Message) time.Duration {
		switch m.Topic {
		case "long":
			return 4 * time.Second
		case "one":
			return 50 * time.Millisecond
		}
		return 10 * time.Millisecond
	})
	defer func() {
		stop()
		trickle.Wait()
		wait()
	}()
	eventually(t, 3*time.Minute, "the burn-down", func() bool {
		n, _ := r.ran()
		extra := 0
		trickled.Range(func(any, any) bool { extra++; return true })
		return n == len(ids)+extra && extra == 150
	})
	// One more look of each host after the last task.
	looks := func() int {
		a.recon.mu.Lock()
		defer a.recon.mu.Unlock()
		b.recon.mu.Lock()
		defer b.recon.mu.Unlock()
		return a.recon.looks + b.recon.looks
	}
	after := looks()
	eventually(t, 30*time.Second, "two more looks", func() bool { return looks() >= after+2 })
	if _, twice := r.ran(); len(twice) > 0 {
		t.Errorf("tasks %v ran more than once", twice)
	}
	t.Logf("%d looks at the topics", looks())
	if n := rep.of(RepublishedMissing); n != 0 {
		t.Errorf("republished %d messages as missing from a healthy burn-down; the log:\n%s", n, logs.String())
	}
	if n := missing.Load(); n != 0 {
		t.Errorf("Missing() said %d messages were missing during a healthy burn-down; the log:\n%s", n, logs.String())
	}
}

// TestQueuedOutsideReadsWhatItMayReturn: the state stores' read of a
// topic's rows that RabbitMQ should hold returns, in claim order, the
// queued rows available for the age given and without an outbox entry;
// it skips delayed rows, rows whose publish is pending, rows too young,
// running rows and other topics' rows; and it reads at most limit rows,
// the ones it skips included.
func TestQueuedOutsideReadsWhatItMayReturn(t *testing.T) {
	for _, kind := range []stateKind{onLocal, onPostgres} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			st := openState(t, kind)
			defer st.Close()
			ctx := t.Context()
			submit := func(topic string, delay time.Duration, priority int) int64 {
				t.Helper()
				out, err := st.SubmitOutbox(ctx, []broker.SubmitRequest{{Topic: topic, Task: "task", Delay: delay, Priority: priority}}, time.Minute, 7)
				if err != nil {
					t.Fatal(err)
				}
				return out[0].ID
			}
			published := func(ids ...int64) {
				t.Helper()
				es := make([]sqlstore.OutboxEntry, len(ids))
				for i, id := range ids {
					es[i] = sqlstore.OutboxEntry{ID: id, Arm: 7}
				}
				if err := st.OutboxDone(ctx, es); err != nil {
					t.Fatal(err)
				}
			}
			first := submit("t", 0, 0)
			second := submit("t", 0, 0)
			submit("t", 0, 0) // pending: its outbox entry stays
			running := submit("t", 0, 0)
			urgent := submit("t", 0, 5) // a higher priority comes first
			submit("t", time.Hour, 9)   // delayed
			other := submit("u", 0, 0)
			published(first, second, running, urgent, other)
			if _, err := st.TakeMessages(ctx, "w", []sqlstore.Delivery{{ID: running}}); err != nil {
				t.Fatal(err)
			}
			// The rows above are older than the age asked, the next one
			// younger, with room for a slow machine.
			time.Sleep(1500 * time.Millisecond)
			young := submit("t", 0, 0)
			published(young)

			ids, read, err := st.QueuedOutside(ctx, "t", time.Second, 100)
			if err != nil {
				t.Fatal(err)
			}
			if want := []int64{urgent, first, second}; !slices.Equal(ids, want) || read != 6 {
				t.Fatalf("QueuedOutside = %v, read %d; want %v (skipping the delayed, pending, running, young and other topic's rows), read 6", ids, read, want)
			}
			// The limit bounds the rows read: the delayed row of priority 9
			// and the urgent one are the first two.
			ids, read, err = st.QueuedOutside(ctx, "t", time.Second, 2)
			if err != nil {
				t.Fatal(err)
			}
			if want := []int64{urgent}; !slices.Equal(ids, want) || read != 2 {
				t.Fatalf("QueuedOutside with limit 2 = %v, read %d; want %v, read 2", ids, read, want)
			}
		})
	}
}
