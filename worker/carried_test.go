package worker

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/memory"
)

// losingBroker loses the claim of the first attempt of each message of
// task "lose.me" just before its ack is written: it requeues the message
// under the attempt's claim first, as a reaper would, so the ack finds its
// claim stale.
type losingBroker struct {
	broker.Broker
	lost sync.Map // message id: its first attempt was lost
}

func (b *losingBroker) Ack(ctx context.Context, outcomes []broker.Outcome) ([]error, error) {
	for _, o := range outcomes {
		m, err := b.GetMessage(ctx, o.Claim.ID)
		if err != nil || m.Task != "lose.me" {
			continue
		}
		if _, done := b.lost.LoadOrStore(m.ID, true); !done {
			if err := b.Nack(ctx, broker.NackRequest{Claim: o.Claim, Requeue: true, Error: "taken back"}); err != nil {
				return nil, err
			}
		}
	}
	return b.Broker.Ack(ctx, outcomes)
}

// countingWriter is a ReportWriter that counts the reports handed to it,
// by status.
type countingWriter struct {
	*ReportWriter
	mu   sync.Mutex
	seen map[string]int
}

func (w *countingWriter) Report(r broker.Report) {
	w.mu.Lock()
	w.seen[r.Status]++
	w.mu.Unlock()
	w.ReportWriter.Report(r)
}

// TestReportsRideOnOutcomes: with a ReportWriter into the pool's own
// broker, each attempt's report is stored by the broker with its outcome
// (success, failed, timeout, cancelled, snoozed), and only a lost
// attempt's goes through the writer, on each broker.
func TestReportsRideOnOutcomes(t *testing.T) {
	for name, open := range everyBroker(t) {
		t.Run(name, func(t *testing.T) {
			b := &losingBroker{Broker: open(t)}
			var (
				calls   sync.Map
				dropped atomic.Int64
			)
			reg := outcomeTasks(&calls)
			reg.MustRegister(Task{Name: "ok", Handler: func(context.Context, *TaskContext) (any, error) { return "fine", nil }})
			reg.MustRegister(Task{Name: "lose.me", Handler: func(context.Context, *TaskContext) (any, error) { return nil, nil }})
			reg.MustRegister(Task{Name: "slow", MaxAttempts: 1, Timeout: time.Millisecond, Handler: func(ctx context.Context, _ *TaskContext) (any, error) {
				<-ctx.Done()
				return nil, ctx.Err()
			}})
			reg.MustRegister(Task{Name: "quits", Handler: func(context.Context, *TaskContext) (any, error) { return nil, CancelTask("not wanted") }})
			w := &countingWriter{ReportWriter: NewReportWriter(b, testLogger(t), func(n int) { dropped.Add(int64(n)) }), seen: map[string]int{}}
			p := startPool(t, b, reg, Options{Reporter: w})
			if !p.out.carry {
				t.Fatal("the pool does not give reports to the broker with their outcomes")
			}

			cases := []struct {
				task, state string
				reports     []string // sorted: a lost report is written later than others
			}{
				{"ok", broker.StateDone, []string{broker.ReportSuccess}},
				{"snoozer", broker.StateDone, []string{broker.ReportSnoozed, broker.ReportSnoozed, broker.ReportSuccess}},
				{"permanent", broker.StateDead, []string{broker.ReportFailed}},
				{"slow", broker.StateDead, []string{broker.ReportTimeout}},
				{"quits", broker.StateCancelled, []string{broker.ReportCancelled}},
				{"lose.me", broker.StateDone, []string{broker.ReportLost, broker.ReportSuccess}},
			}
			ids := make([]int64, len(cases))
			for i, c := range cases {
				ids[i] = submit(t, b, c.task, `{}`)
			}
			for i, c := range cases {
				waitState(t, b, ids[i], c.state)
				var got []string
				eventually(t, c.task+"'s reports", func() bool {
					rs, err := b.ListReports(context.Background(), broker.ReportFilter{MessageID: ids[i]})
					if err != nil {
						t.Fatal(err)
					}
					got = got[:0]
					for _, r := range rs {
						got = append(got, r.Status)
					}
					slices.Sort(got)
					return len(got) >= len(c.reports)
				})
				if strings.Join(got, ",") != strings.Join(c.reports, ",") {
					t.Errorf("%s: reports %v, want %v", c.task, got, c.reports)
				}
			}
			w.mu.Lock()
			seen := fmt.Sprint(w.seen)
			w.mu.Unlock()
			if seen != fmt.Sprintf("map[%s:1]", broker.ReportLost) {
				t.Errorf("the writer was handed %s; want the one lost report only", seen)
			}
			if dropped.Load() != 0 {
				t.Errorf("%d reports dropped", dropped.Load())
			}
		})
	}
}

// keyWatch records, per message, whether its outcome came marked keyed.
type keyWatch struct {
	broker.Broker
	keyed sync.Map // message id: Outcome.Keyed
}

func (b *keyWatch) Ack(ctx context.Context, outcomes []broker.Outcome) ([]error, error) {
	for _, o := range outcomes {
		b.keyed.Store(o.Claim.ID, o.Keyed)
	}
	return b.Broker.Ack(ctx, outcomes)
}

// TestOutcomesSayWhichMessagesAreKeyed: the pool marks the outcome of a
// message with a unique key (Outcome.Keyed), and only those, so the
// PostgreSQL broker locks such an ack's rows in id order.
func TestOutcomesSayWhichMessagesAreKeyed(t *testing.T) {
	b := &keyWatch{Broker: memory.New()}
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "ok", Handler: func(context.Context, *TaskContext) (any, error) { return nil, nil }})
	startPool(t, b, reg, Options{})
	keyed, err := b.Submit(context.Background(), broker.SubmitRequest{Topic: broker.DefaultTopic, Task: "ok", UniqueKey: "one"})
	if err != nil {
		t.Fatal(err)
	}
	plain := submit(t, b, "ok", `{}`)
	for id, want := range map[int64]bool{keyed: true, plain: false} {
		waitState(t, b, id, broker.StateDone)
		got, ok := b.keyed.Load(id)
		if !ok || got != want {
			t.Errorf("message %d: acked %v with Keyed %v, want %v", id, ok, got, want)
		}
	}
}
