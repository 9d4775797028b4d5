package worker

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// blocker is a task that runs until its context is cancelled (then
// returns its error) or, when its payload says so, returns success once
// the test lets it. It records the cause of its context's end.
type blocker struct {
	started chan int64 // each run's message id
	cause   chan error // what ended each run's context
	release chan struct{}
	calls   atomic.Int32
}

func newBlocker() *blocker {
	return &blocker{started: make(chan int64, 16), cause: make(chan error, 16), release: make(chan struct{})}
}

func (bl *blocker) register(reg *Registry) {
	reg.MustRegister(Task{Name: "block", MaxAttempts: 3, Backoff: fastBackoff, Handler: func(ctx context.Context, tc *TaskContext) (any, error) {
		bl.calls.Add(1)
		bl.started <- tc.MessageID
		if string(tc.Payload) == `"ignore"` {
			// Finishes its work whatever happens to ctx: the ack wins.
			<-ctx.Done()
			bl.cause <- context.Cause(ctx)
			<-bl.release
			return "finished anyway", nil
		}
		tc.Logf("waiting to be cancelled")
		<-ctx.Done()
		bl.cause <- context.Cause(ctx)
		return nil, ctx.Err()
	}})
}

func (bl *blocker) waitStarted(t *testing.T, id int64) {
	t.Helper()
	select {
	case got := <-bl.started:
		if got != id {
			t.Fatalf("message %d started, want %d", got, id)
		}
	case <-time.After(waitDeadline):
		t.Fatalf("message %d never started", id)
	}
}

func (bl *blocker) waitCause(t *testing.T) error {
	t.Helper()
	select {
	case err := <-bl.cause:
		return err
	case <-time.After(waitDeadline):
		t.Fatal("the handler's context was never cancelled")
		return nil
	}
}

// TestCancelRunning: a running attempt cancelled in process ends
// cancelled, in one attempt of the three allowed, with a report saying so;
// a handler that returns success all the same is done.
func TestCancelRunning(t *testing.T) {
	for name, open := range everyBroker(t) {
		t.Run(name, func(t *testing.T) {
			b := open(t)
			reg, bl := NewRegistry(), newBlocker()
			bl.register(reg)
			rec, reps := newRecorder(), &reportLog{}
			p := startPool(t, b, reg, Options{Observer: rec, Reporter: reps, HeartbeatInterval: time.Hour})

			if p.CancelRunning(12345) {
				t.Error("CancelRunning of a message the pool does not hold answered true")
			}
			id := submit(t, b, "block", `{}`)
			bl.waitStarted(t, id)
			if !p.CancelRunning(id) {
				t.Fatal("CancelRunning of a running message answered false")
			}
			if cause := bl.waitCause(t); !errors.Is(cause, ErrCancelRequested) {
				t.Errorf("the handler's context ended with %v, want ErrCancelRequested", cause)
			}
			m := waitState(t, b, id, broker.StateCancelled)
			if m.Attempts != 1 || m.LastError != cancelledWhileRunning || bl.calls.Load() != 1 {
				t.Errorf("cancelled: attempts %d, last error %q, runs %d", m.Attempts, m.LastError, bl.calls.Load())
			}
			eventually(t, "the cancelled attempt's report", func() bool { return len(reps.statuses(id)) == 1 })
			if st := reps.statuses(id)[0]; st != broker.ReportCancelled {
				t.Errorf("report status %s, want %s", st, broker.ReportCancelled)
			}
			eventually(t, "a cancelled attempt observed", func() bool { return rec.count(StatusCancelled) == 1 })

			// The handler returns success after the cancel: the ack wins.
			id = submit(t, b, "block", `"ignore"`)
			bl.waitStarted(t, id)
			if _, err := b.Cancel(context.Background(), id); err != nil {
				t.Fatal(err)
			}
			p.CancelRunning(id)
			bl.waitCause(t)
			bl.release <- struct{}{}
			if m := waitState(t, b, id, broker.StateDone); !strings.Contains(string(m.Result), "finished anyway") {
				t.Errorf("result %s", m.Result)
			}
		})
	}
}

// TestCancelReachesThePoolThroughTheBroker: a cancel asked of the broker
// (as another process does) reaches the pool running the message: at its
// next heartbeat's poll, and on PostgreSQL at once by the broker's notice
// (the heartbeat is an hour there, so only the notice can do it).
func TestCancelReachesThePoolThroughTheBroker(t *testing.T) {
	for name, open := range everyBroker(t) {
		t.Run(name, func(t *testing.T) {
			b := open(t)
			beat := 20 * time.Millisecond
			if _, ok := b.(broker.CancelNotifier); ok {
				beat = time.Hour
			}
			reg, bl := NewRegistry(), newBlocker()
			bl.register(reg)
			p := startPool(t, b, reg, Options{HeartbeatInterval: beat})
			if beat == time.Hour {
				// A notice sent before the pool listens reaches no one.
				eventually(t, "the pool listens for notices", func() bool { return p.disp.notices != nil && p.disp.notices.Listening() })
			}
			id := submit(t, b, "block", `{}`)
			bl.waitStarted(t, id)
			m, err := b.Cancel(context.Background(), id)
			if err != nil || m.State != broker.StateRunning || m.CancelRequestedAt == nil {
				t.Fatalf("cancel of a running message: %+v, %v", m, err)
			}
			if cause := bl.waitCause(t); !errors.Is(cause, ErrCancelRequested) {
				t.Errorf("the handler's context ended with %v, want ErrCancelRequested", cause)
			}
			if m := waitState(t, b, id, broker.StateCancelled); m.Attempts != 1 || bl.calls.Load() != 1 {
				t.Errorf("cancelled: attempts %d, runs %d; want 1 and 1", m.Attempts, bl.calls.Load())
			}
		})
	}
}

// TestCancelTask: a handler that cancels its own task ends it cancelled,
// not retried, with its reason.
func TestCancelTask(t *testing.T) {
	for name, open := range everyBroker(t) {
		t.Run(name, func(t *testing.T) {
			b := open(t)
			reg := NewRegistry()
			var calls atomic.Int32
			reg.MustRegister(Task{Name: "quit", MaxAttempts: 3, Handler: func(context.Context, *TaskContext) (any, error) {
				calls.Add(1)
				return nil, CancelTask("the order was withdrawn")
			}})
			reps := &reportLog{}
			startPool(t, b, reg, Options{Reporter: reps})
			id := submit(t, b, "quit", `{}`)
			m := waitState(t, b, id, broker.StateCancelled)
			if m.Attempts != 1 || calls.Load() != 1 || m.LastError != "the order was withdrawn" {
				t.Errorf("self-cancelled: attempts %d, runs %d, last error %q", m.Attempts, calls.Load(), m.LastError)
			}
			eventually(t, "its report", func() bool { return len(reps.statuses(id)) == 1 })
			if st := reps.statuses(id)[0]; st != broker.ReportCancelled {
				t.Errorf("report status %s", st)
			}
		})
	}
}

// lockGate holds AcquireLock until the test opens it.
type lockGate struct {
	broker.Broker
	entered chan struct{}
	open    chan struct{}
}

func (g *lockGate) AcquireLock(ctx context.Context, name, holder string, c broker.Claim) (bool, error) {
	g.entered <- struct{}{}
	<-g.open
	return g.Broker.AcquireLock(ctx, name, holder, c)
}

// TestCancelBeforeTheHandlerStarts: a cancel of a message the pool holds
// but has not started (it waits for its lock) ends it cancelled without
// running it, with a cancelled report of the attempt its claim counted.
func TestCancelBeforeTheHandlerStarts(t *testing.T) {
	b := &lockGate{Broker: testBrokers(t)["memory"](t), entered: make(chan struct{}, 1), open: make(chan struct{})}
	reg := NewRegistry()
	var calls atomic.Int32
	reg.MustRegister(Task{Name: "locked", NonConcurrent: true, Handler: func(context.Context, *TaskContext) (any, error) {
		calls.Add(1)
		return nil, nil
	}})
	rec, reps := newRecorder(), &reportLog{}
	p := startPool(t, b, reg, Options{Observer: rec, Reporter: reps, HeartbeatInterval: time.Hour})
	id := submit(t, b, "locked", `{}`)
	select {
	case <-b.entered:
	case <-time.After(waitDeadline):
		t.Fatal("the message was never claimed")
	}
	if !p.CancelRunning(id) {
		t.Fatal("CancelRunning of a held message answered false")
	}
	close(b.open)
	m := waitState(t, b, id, broker.StateCancelled)
	if calls.Load() != 0 || m.LastError != cancelledBeforeRun {
		t.Errorf("runs %d, last error %q; want no run", calls.Load(), m.LastError)
	}
	eventually(t, "a cancelled attempt observed", func() bool { return rec.count(StatusCancelled) == 1 })
	// The claim counted an attempt: it has its report, as every attempt a
	// message counts does.
	eventually(t, "the cancelled attempt's report", func() bool { return len(reps.statuses(id)) == 1 })
	if st := reps.statuses(id); m.Attempts != 1 || len(st) != 1 || st[0] != broker.ReportCancelled {
		t.Errorf("attempts %d, reports %v; want the one attempt reported %s", m.Attempts, st, broker.ReportCancelled)
	}
}
