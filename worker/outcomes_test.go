package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// TestUnstorableOutcomesDoNotStopThePool: a task whose result holds a NUL
// character (which PostgreSQL's jsonb refuses) fails with a clear error
// instead of being acked, a task whose error text holds one fails with the
// text cleaned, and the pool goes on with the messages behind them. Before,
// the refused ack went back to the queue and was retried with every claim
// for ever: the worker stopped claiming while it went on heartbeating.
func TestUnstorableOutcomesDoNotStopThePool(t *testing.T) {
	for name, newBroker := range testBrokers(t) {
		t.Run(name, func(t *testing.T) {
			b := newBroker(t)
			reg := NewRegistry()
			reg.MustRegister(Task{Name: "nul-result", MaxAttempts: 1, Handler: func(context.Context, *TaskContext) (any, error) {
				return map[string]string{"s": "a\x00b"}, nil
			}})
			reg.MustRegister(Task{Name: "nul-error", MaxAttempts: 1, Handler: func(context.Context, *TaskContext) (any, error) {
				return nil, errors.New("bad \x00 byte \xff")
			}})
			reg.MustRegister(Task{Name: "big-result", MaxAttempts: 1, Handler: func(context.Context, *TaskContext) (any, error) {
				return strings.Repeat("a", broker.MaxResultSize), nil // two quotes more than the limit
			}})
			reg.MustRegister(Task{Name: "big-raw-result", MaxAttempts: 1, Handler: func(context.Context, *TaskContext) (any, error) {
				return json.RawMessage(`"` + strings.Repeat("a", broker.MaxResultSize) + `"`), nil
			}})
			reg.MustRegister(Task{Name: "ok", Handler: func(context.Context, *TaskContext) (any, error) { return "fine", nil }})
			startPool(t, b, reg, Options{})
			bad := submit(t, b, "nul-result", `{}`)
			badErr := submit(t, b, "nul-error", `{}`)
			big := submit(t, b, "big-result", `{}`)
			bigRaw := submit(t, b, "big-raw-result", `{}`)
			var good []int64
			for range 20 {
				good = append(good, submit(t, b, "ok", `{}`))
			}
			for _, id := range good {
				waitState(t, b, id, broker.StateDone)
			}
			if m := waitState(t, b, bad, broker.StateDead); !strings.Contains(m.LastError, "cannot be stored") {
				t.Errorf("message with a NUL in its result: last error %q, want it to say the result cannot be stored", m.LastError)
			}
			if m := waitState(t, b, badErr, broker.StateDead); m.LastError != "bad \uFFFD byte \uFFFD" {
				t.Errorf("message whose error holds a NUL: last error %q", m.LastError)
			}
			for _, id := range []int64{big, bigRaw} {
				if m := waitState(t, b, id, broker.StateDead); !strings.Contains(m.LastError, "the limit is 1048576") {
					t.Errorf("message %d with a result over the limit: last error %q, want it to name the limit", id, m.LastError)
				}
			}
		})
	}
}

// lostAckAnswers commits the first Ack (or AckAndClaim) that carries
// outcomes, then answers with an error, as when the connection breaks
// after the commit.
type lostAckAnswers struct {
	broker.Broker
	lose atomic.Int32
	lost atomic.Int32 // outcomes whose answer was lost
}

func (l *lostAckAnswers) Ack(ctx context.Context, outcomes []broker.Outcome) ([]error, error) {
	errs, err := l.Broker.Ack(ctx, outcomes)
	if err == nil && len(outcomes) > 0 && l.lose.Add(-1) >= 0 {
		l.lost.Add(int32(len(outcomes)))
		return nil, errors.New("read tcp 127.0.0.1:5432: connection reset by peer")
	}
	return errs, err
}

type lostAckAnswersAC struct {
	*lostAckAnswers
	ac broker.AckClaimer
}

func (l lostAckAnswersAC) AckAndClaim(ctx context.Context, outcomes []broker.Outcome, req broker.ClaimRequest) ([]error, []broker.Message, error) {
	errs, msgs, err := l.ac.AckAndClaim(ctx, outcomes, req)
	if err == nil && len(outcomes) > 0 && l.lose.Add(-1) >= 0 {
		l.lost.Add(int32(len(outcomes)))
		return nil, nil, errors.New("read tcp 127.0.0.1:5432: connection reset by peer")
	}
	return errs, msgs, err
}

// TestAckWhoseAnswerWasLostIsDone: the pool's acks commit but their answer
// is lost; written again, they are refused as stale, and the pool finds
// that its own ack went through: the attempts are done, not lost. (The
// messages the same call claimed are strays, which the stray check takes
// back.)
func TestAckWhoseAnswerWasLostIsDone(t *testing.T) {
	for name, newBroker := range testBrokers(t) {
		t.Run(name, func(t *testing.T) {
			inner := newBroker(t)
			la := &lostAckAnswers{Broker: inner}
			la.lose.Store(1)
			var b broker.Broker = la
			if ac, ok := inner.(broker.AckClaimer); ok {
				b = lostAckAnswersAC{lostAckAnswers: la, ac: ac}
			}
			reg := NewRegistry()
			reg.MustRegister(Task{Name: "x", Handler: func(context.Context, *TaskContext) (any, error) { return "ok", nil }})
			rec := newRecorder()
			startPool(t, b, reg, Options{Observer: rec, StrayCheckInterval: 20 * time.Millisecond, StrayAfter: time.Second})
			var ids []int64
			for range 30 {
				ids = append(ids, submit(t, b, "x", `{}`))
			}
			for _, id := range ids {
				waitState(t, b, id, broker.StateDone)
			}
			if la.lost.Load() == 0 {
				t.Fatal("no ack's answer was lost: the test tested nothing")
			}
			if n := rec.count(StatusLost); n != 0 {
				t.Errorf("%d attempts recorded as lost after %d acks whose answer was lost; want none", n, la.lost.Load())
			}
		})
	}
}

// flakyReads fails the first failReads GetMessage calls, as a flaky link
// does.
type flakyReads struct {
	broker.Broker
	failReads atomic.Int32
	failed    atomic.Int32
}

func (f *flakyReads) GetMessage(ctx context.Context, id int64) (broker.Message, error) {
	if f.failReads.Add(-1) >= 0 {
		f.failed.Add(1)
		return broker.Message{}, errors.New("read tcp 127.0.0.1:5432: connection reset by peer")
	}
	return f.Broker.GetMessage(ctx, id)
}

// TestAckWhoseAnswerWasLostIsDoneOnAFlakyLink: as
// TestAckWhoseAnswerWasLostIsDone, but the first reads that check whether
// the ack went through fail too: they are tried again, and the attempts
// are still done, not lost.
func TestAckWhoseAnswerWasLostIsDoneOnAFlakyLink(t *testing.T) {
	for name, newBroker := range testBrokers(t) {
		t.Run(name, func(t *testing.T) {
			inner := newBroker(t)
			fr := &flakyReads{Broker: inner}
			fr.failReads.Store(2)
			la := &lostAckAnswers{Broker: fr}
			la.lose.Store(1)
			var b broker.Broker = la
			if ac, ok := inner.(broker.AckClaimer); ok {
				b = lostAckAnswersAC{lostAckAnswers: la, ac: ac}
			}
			reg := NewRegistry()
			reg.MustRegister(Task{Name: "x", Handler: func(context.Context, *TaskContext) (any, error) { return "ok", nil }})
			rec := newRecorder()
			startPool(t, b, reg, Options{Observer: rec, StrayCheckInterval: 20 * time.Millisecond, StrayAfter: time.Second})
			var ids []int64
			for range 30 {
				ids = append(ids, submit(t, inner, "x", `{}`))
			}
			for _, id := range ids {
				waitState(t, inner, id, broker.StateDone)
			}
			if la.lost.Load() == 0 || fr.failed.Load() == 0 {
				t.Fatalf("%d ack answers lost, %d reads failed: the test tested nothing", la.lost.Load(), fr.failed.Load())
			}
			if n := rec.count(StatusLost); n != 0 {
				t.Errorf("%d attempts recorded as lost after %d acks whose answer was lost and %d failed reads; want none",
					n, la.lost.Load(), fr.failed.Load())
			}
		})
	}
}

// TestResultThePostgreSQLBrokerRefusesFailsTheAttempt: a result CheckJSON
// lets through but PostgreSQL refuses (a number out of jsonb's range)
// fails its attempt for good with the reason, and the pool goes on. Left
// running, the message would be taken back and run again for ever.
func TestResultThePostgreSQLBrokerRefusesFailsTheAttempt(t *testing.T) {
	b := pgBroker(t)
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "huge", MaxAttempts: 3, Handler: func(context.Context, *TaskContext) (any, error) {
		return json.RawMessage(`1e1000000`), nil
	}})
	reg.MustRegister(Task{Name: "ok", Handler: func(context.Context, *TaskContext) (any, error) { return "fine", nil }})
	var runs atomic.Int32
	reg.MustRegister(Task{Name: "huge-counted", MaxAttempts: 3, Handler: func(context.Context, *TaskContext) (any, error) {
		runs.Add(1)
		return json.RawMessage(`[1e1000000]`), nil
	}})
	startPool(t, b, reg, Options{StrayCheckInterval: 20 * time.Millisecond, StrayAfter: 300 * time.Millisecond})
	bad := submit(t, b, "huge", `{}`)
	var good []int64
	for range 10 {
		good = append(good, submit(t, b, "ok", `{}`))
	}
	counted := submit(t, b, "huge-counted", `{}`)
	for _, id := range good {
		waitState(t, b, id, broker.StateDone)
	}
	for _, id := range []int64{bad, counted} {
		if m := waitState(t, b, id, broker.StateDead); !strings.Contains(m.LastError, "cannot be stored") {
			t.Errorf("message %d: last error %q, want it to say the result cannot be stored", id, m.LastError)
		}
	}
	time.Sleep(time.Second) // long enough for the stray check to take a message left running back
	if n := runs.Load(); n != 1 {
		t.Errorf("the task whose result is refused ran %d times, want 1", n)
	}
}

type panickyResult struct{}

func (panickyResult) MarshalJSON() ([]byte, error) { panic("cannot encode") }

// TestPanicsOutsideTheHandlerFailTheAttempt: a panic in the task's code
// that runs outside its handler (the result's MarshalJSON, the lock key,
// the backoff) fails the attempt with a clear error instead of ending the
// worker process, and the pool goes on with the messages behind it.
func TestPanicsOutsideTheHandlerFailTheAttempt(t *testing.T) {
	b := testBrokers(t)["memory"](t)
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "panic-result", MaxAttempts: 3, Handler: func(context.Context, *TaskContext) (any, error) {
		return panickyResult{}, nil
	}})
	reg.MustRegister(Task{Name: "panic-lock", LockKey: func(json.RawMessage) string { panic("no key") },
		Handler: func(context.Context, *TaskContext) (any, error) { return "ran", nil }})
	reg.MustRegister(Task{Name: "panic-backoff", MaxAttempts: 3, Backoff: func(int) time.Duration { panic("no backoff") },
		Handler: func(context.Context, *TaskContext) (any, error) { return nil, errors.New("try again") }})
	reg.MustRegister(Task{Name: "ok", Handler: func(context.Context, *TaskContext) (any, error) { return "fine", nil }})
	startPool(t, b, reg, Options{})
	ids := map[string]int64{}
	for _, task := range []string{"panic-result", "panic-lock", "panic-backoff"} {
		ids[task] = submit(t, b, task, `{}`)
	}
	var good []int64
	for range 10 {
		good = append(good, submit(t, b, "ok", `{}`))
	}
	for _, id := range good {
		waitState(t, b, id, broker.StateDone)
	}
	for task, id := range ids {
		m := waitState(t, b, id, broker.StateDead)
		if !strings.Contains(m.LastError, "panic in the task's code outside its handler") || m.Attempts != 1 {
			t.Errorf("%s: attempts %d, last error %q; want one attempt, failed for good, naming the panic", task, m.Attempts, m.LastError)
		}
	}
}

// hangingAcks is a broker whose outcome writes never answer: each waits
// for its context to end, as with a database that stopped answering
// without closing the connection.
type hangingAcks struct {
	broker.Broker
	calls atomic.Int32
}

func (h *hangingAcks) Ack(ctx context.Context, _ []broker.Outcome) ([]error, error) {
	h.calls.Add(1)
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestStopIsBoundedWhenWritesHang: with outcome writes that never answer,
// Stop returns: within a few seconds of its deadline, and without one
// after its own flush bound. Before, the acks the dispatcher held at stop
// were retried for ever, and a Stop without a deadline never returned.
func TestStopIsBoundedWhenWritesHang(t *testing.T) {
	for _, withDeadline := range []bool{true, false} {
		t.Run(fmt.Sprintf("deadline=%v", withDeadline), func(t *testing.T) {
			h := &hangingAcks{Broker: testBrokers(t)["memory"](t)}
			reg := NewRegistry()
			reg.MustRegister(Task{Name: "ok", Handler: func(context.Context, *TaskContext) (any, error) { return "fine", nil }})
			p := NewPool(h, reg, Options{Logger: testLogger(t), ClaimIdleInterval: 5 * time.Millisecond})
			if err := p.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			for range 5 {
				submit(t, h, "ok", `{}`)
			}
			deadline := time.Now().Add(5 * time.Second)
			for h.calls.Load() == 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if h.calls.Load() == 0 {
				t.Fatal("no outcome write was tried")
			}
			ctx, limit := context.Background(), flushTimeout+lastTryTimeout+5*time.Second
			if withDeadline {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, 3*time.Second)
				defer cancel()
				limit = 3*time.Second + lastTryTimeout + 3*time.Second
			}
			done := make(chan time.Duration, 1)
			start := time.Now()
			go func() {
				_ = p.Stop(ctx)
				done <- time.Since(start)
			}()
			select {
			case took := <-done:
				t.Logf("Stop returned after %s", took.Round(time.Millisecond))
				if took > limit {
					t.Errorf("Stop took %s, want at most %s", took.Round(time.Millisecond), limit)
				}
			case <-time.After(limit + 30*time.Second):
				t.Fatalf("Stop has not returned after %s", limit+30*time.Second)
			}
		})
	}
}

// TestRetryAfterSpacesTheRetry: a handler that fails with RetryAfter is
// retried no sooner than it asked, even when the task's backoff is shorter.
func TestRetryAfterSpacesTheRetry(t *testing.T) {
	b := testBrokers(t)["memory"](t)
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "later", MaxAttempts: 2, Backoff: func(int) time.Duration { return 0 },
		Handler: func(context.Context, *TaskContext) (any, error) {
			return nil, RetryAfter(errors.New("service restarting"), time.Hour)
		}})
	startPool(t, b, reg, Options{})
	before := time.Now()
	id := submit(t, b, "later", `{}`)
	m := waitState(t, b, id, broker.StateQueued)
	for m.Attempts == 0 {
		time.Sleep(10 * time.Millisecond)
		m = waitState(t, b, id, broker.StateQueued)
	}
	if m.LastError != "service restarting" || m.AvailableAt.Before(before.Add(time.Hour)) {
		t.Fatalf("after a failure asking for an hour: last error %q, available at %s (in %s); want an hour from now",
			m.LastError, m.AvailableAt, time.Until(m.AvailableAt).Round(time.Second))
	}
}
