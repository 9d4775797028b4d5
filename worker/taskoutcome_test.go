package worker

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/local"
)

// everyBroker is testBrokers with the local (SQLite) broker too.
func everyBroker(t *testing.T) map[string]func(t *testing.T) broker.Broker {
	m := testBrokers(t)
	m["local"] = func(t *testing.T) broker.Broker {
		b, err := local.Open(context.Background(), local.Options{Path: filepath.Join(t.TempDir(), "tw.db")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	return m
}

// reportLog is a Reporter that keeps every report.
type reportLog struct {
	mu      sync.Mutex
	reports []broker.Report
}

func (l *reportLog) Report(r broker.Report) {
	l.mu.Lock()
	l.reports = append(l.reports, r)
	l.mu.Unlock()
}

// statuses lists the statuses of message id's reports, in order.
func (l *reportLog) statuses(id int64) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.reports {
		if r.MessageID == id {
			out = append(out, r.Status)
		}
	}
	return out
}

var errBadPayload = errors.New("the payload names no customer")

// outcomeTasks registers tasks that end their attempts each way a handler
// may ask for.
func outcomeTasks(calls *sync.Map) *Registry {
	count := func(tc *TaskContext) int32 {
		v, _ := calls.LoadOrStore(tc.MessageID, new(atomic.Int32))
		return v.(*atomic.Int32).Add(1)
	}
	reg := NewRegistry()
	// Snoozes twice, briefly, then succeeds: with one attempt allowed.
	reg.MustRegister(Task{Name: "snoozer", MaxAttempts: 1, Handler: func(_ context.Context, tc *TaskContext) (any, error) {
		if n := count(tc); n <= 2 {
			tc.Logf("not ready, call %d", n)
			return nil, Snooze(time.Millisecond)
		}
		return map[string]int{"attempt": tc.Attempt}, nil
	}})
	reg.MustRegister(Task{Name: "sleeper", MaxAttempts: 1, Handler: func(_ context.Context, tc *TaskContext) (any, error) {
		count(tc)
		return nil, fmt.Errorf("wrapped: %w", Snooze(time.Hour))
	}})
	reg.MustRegister(Task{Name: "bad.snooze", MaxAttempts: 2, Backoff: fastBackoff, Handler: func(_ context.Context, tc *TaskContext) (any, error) {
		count(tc)
		if tc.Attempt == 1 {
			return nil, Snooze(-time.Second)
		}
		return nil, Snooze(broker.MaxDelay + time.Second)
	}})
	reg.MustRegister(Task{Name: "permanent", MaxAttempts: 5, Backoff: fastBackoff, Handler: func(_ context.Context, tc *TaskContext) (any, error) {
		count(tc)
		return nil, Permanent(errBadPayload)
	}})
	return reg
}

func calledTimes(calls *sync.Map, id int64) int32 {
	v, ok := calls.Load(id)
	if !ok {
		return 0
	}
	return v.(*atomic.Int32).Load()
}

// TestSnoozeAndPermanent: a snooze runs the task again without using an
// attempt, a bad snooze fails the attempt as an error does, and a
// permanent failure ends the task at once, on each broker.
func TestSnoozeAndPermanent(t *testing.T) {
	for name, open := range everyBroker(t) {
		t.Run(name, func(t *testing.T) {
			b := open(t)
			var calls sync.Map
			rec, reps := newRecorder(), &reportLog{}
			startPool(t, b, outcomeTasks(&calls), Options{Observer: rec, Reporter: reps})

			// Two snoozes and a success, with one attempt allowed.
			id := submit(t, b, "snoozer", `{}`)
			m := waitState(t, b, id, broker.StateDone)
			if m.Attempts != 1 || calledTimes(&calls, id) != 3 || strings.ReplaceAll(string(m.Result), " ", "") != `{"attempt":1}` {
				t.Errorf("snoozer: attempts %d, handler calls %d, result %s; want 1, 3 and attempt 1", m.Attempts, calledTimes(&calls, id), m.Result)
			}
			eventually(t, "the snoozer's reports", func() bool { return len(reps.statuses(id)) == 3 })
			if got := strings.Join(reps.statuses(id), ","); got != "snoozed,snoozed,success" {
				t.Errorf("snoozer's reports: %s", got)
			}
			if rec.count(StatusSnoozed) != 2 {
				t.Errorf("observed %d snoozed attempts, want 2", rec.count(StatusSnoozed))
			}

			// A long snooze, wrapped: back in the queue for that long,
			// its attempt given back.
			before := time.Now()
			id = submit(t, b, "sleeper", `{}`)
			eventually(t, "the sleeper to snooze", func() bool { return calledTimes(&calls, id) == 1 && len(reps.statuses(id)) == 1 })
			m = waitState(t, b, id, broker.StateQueued)
			if m.Attempts != 0 || m.LastError != "wrapped: snoozed: run again in 1h0m0s" || m.AvailableAt.Before(before.Add(time.Hour)) {
				t.Errorf("sleeper: attempts %d, last error %q, available in %s; want 0, the snooze, an hour",
					m.Attempts, m.LastError, time.Until(m.AvailableAt).Round(time.Second))
			}

			// A snooze out of range is an error: retried, then dead.
			id = submit(t, b, "bad.snooze", `{}`)
			m = waitState(t, b, id, broker.StateDead)
			if m.Attempts != 2 || !strings.Contains(m.LastError, "asked to snooze for 8760h0m1s, which is out of range") {
				t.Errorf("bad snooze: attempts %d, last error %q", m.Attempts, m.LastError)
			}
			eventually(t, "the bad snoozes' reports", func() bool { return len(reps.statuses(id)) == 2 })
			if got := strings.Join(reps.statuses(id), ","); got != "failed,failed" {
				t.Errorf("bad snooze's reports: %s", got)
			}

			// A permanent failure: one attempt of five.
			id = submit(t, b, "permanent", `{}`)
			m = waitState(t, b, id, broker.StateDead)
			if m.Attempts != 1 || calledTimes(&calls, id) != 1 || m.LastError != errBadPayload.Error() {
				t.Errorf("permanent: attempts %d, calls %d, last error %q", m.Attempts, calledTimes(&calls, id), m.LastError)
			}
		})
	}
}

func TestOutcomeErrors(t *testing.T) {
	if err := Permanent(errBadPayload); !errors.Is(err, errBadPayload) || err.Error() != errBadPayload.Error() {
		t.Errorf("Permanent(err) = %v; want err's text, and errors.Is to find err", err)
	}
	if err := Permanent(nil); err.Error() != "task failed permanently" {
		t.Errorf("Permanent(nil) = %q", err)
	}
	if err := CancelTask(""); err.Error() != "cancelled by the task" {
		t.Errorf(`CancelTask("") = %q`, err)
	}
	if oe := outcomeOf(fmt.Errorf("x: %w", Snooze(time.Minute))); oe == nil || oe.kind != outcomeSnooze || oe.after != time.Minute {
		t.Errorf("a wrapped snooze reads as %+v", oe)
	}
	if outcomeOf(errBadPayload) != nil || outcomeOf(RetryAfter(errBadPayload, time.Second)) != nil {
		t.Error("an ordinary error reads as an outcome")
	}
	for _, d := range []time.Duration{-1, broker.MaxDelay + 1} {
		if err := checkSnooze(d); err == nil {
			t.Errorf("snooze %s accepted", d)
		}
	}
	for _, d := range []time.Duration{0, broker.MaxDelay} {
		if err := checkSnooze(d); err != nil {
			t.Errorf("snooze %s refused: %v", d, err)
		}
	}
}
