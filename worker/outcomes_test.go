package worker

import (
	"context"
	"errors"
	"strings"
	"testing"

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
			reg.MustRegister(Task{Name: "ok", Handler: func(context.Context, *TaskContext) (any, error) { return "fine", nil }})
			startPool(t, b, reg, Options{})
			bad := submit(t, b, "nul-result", `{}`)
			badErr := submit(t, b, "nul-error", `{}`)
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
		})
	}
}
