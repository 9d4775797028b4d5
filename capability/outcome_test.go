package capability_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/capabilitytest"
)

var errNoCustomer = errors.New("the payload names no customer")

// outcomes is a task provider whose tasks end each way a task may.
type outcomes struct {
	lifecycleOnly
	started chan struct{} // "wait" is running
	ended   chan error    // what "wait" saw of its context
}

func (p *outcomes) ListTasks(context.Context) ([]capability.TaskSpec, error) { return nil, nil }

func (p *outcomes) RunTask(ctx context.Context, run capability.TaskRun, _ capability.TaskEvents) (json.RawMessage, error) {
	switch run.Task {
	case "snooze":
		return nil, capability.Snooze(90 * time.Second)
	case "snooze.wrapped":
		return nil, fmt.Errorf("not yet: %w", capability.Snooze(1500*time.Millisecond))
	case "snooze.negative":
		return nil, capability.Snooze(-time.Second)
	case "permanent":
		return nil, capability.Permanent(errNoCustomer)
	case "cancel":
		return nil, capability.CancelTask("the order was withdrawn")
	case "cancel.empty":
		return nil, capability.CancelTask("")
	case "wait":
		close(p.started)
		<-ctx.Done()
		p.ended <- context.Cause(ctx)
		return nil, ctx.Err()
	}
	return nil, errors.New("boom")
}

// checkOutcomes runs each task of outcomes through run and checks the
// TaskError the caller gets.
func checkOutcomes(t *testing.T, run func(task string) error) {
	t.Helper()
	for _, c := range []struct {
		task    string
		msg     string
		outcome capability.Outcome
		snooze  time.Duration
	}{
		{"snooze", "snoozed: run again in 1m30s", capability.OutcomeSnooze, 90 * time.Second},
		{"snooze.wrapped", "not yet: snoozed: run again in 1.5s", capability.OutcomeSnooze, 1500 * time.Millisecond},
		{"snooze.negative", "snoozed: run again in -1s", capability.OutcomeSnooze, -time.Second},
		{"permanent", errNoCustomer.Error(), capability.OutcomePermanent, 0},
		{"cancel", "the order was withdrawn", capability.OutcomeCancel, 0},
		{"cancel.empty", "cancelled by the task", capability.OutcomeCancel, 0},
		{"fail", "boom", capability.OutcomeError, 0},
	} {
		var te *capability.TaskError
		if err := run(c.task); !errors.As(err, &te) || te.Msg != c.msg || te.Outcome != c.outcome || te.Snooze != c.snooze {
			t.Errorf("%s: %#v (%v); want %q, %s, snooze %s", c.task, te, err, c.msg, c.outcome, c.snooze)
		}
	}
}

// TestOutcomesCrossTheWire: what a provider's task asks for (snooze,
// permanent failure, cancel) reaches the host's client, and through the
// host's relay (HostServices.RunTask) the plugin that asked the host to
// run it.
func TestOutcomesCrossTheWire(t *testing.T) {
	provider := capabilitytest.Connect(t, &outcomes{})
	ctx := context.Background()
	checkOutcomes(t, func(task string) error {
		_, err := provider.RunTask(ctx, capability.TaskRun{Task: task}, nil)
		return err
	})

	// A plugin runs the provider's tasks through the host.
	caller := &lifecycleOnly{}
	capabilitytest.Start(t, caller, nil, &capabilitytest.Host{
		RunTaskFunc: func(ctx context.Context, _ string, run capability.TaskRun, ev capability.TaskEvents) (json.RawMessage, error) {
			return provider.RunTask(ctx, run, ev)
		},
	})
	checkOutcomes(t, func(task string) error {
		_, err := caller.host.RunTask(ctx, "outcomes", capability.TaskRun{Task: task}, nil)
		return err
	})
}

// TestOldPluginsErrorIsAnError: the final event of a plugin built before
// outcomes existed carries done and error, and nothing of the outcome
// fields: it reads as an ordinary failure.
func TestOldPluginsErrorIsAnError(t *testing.T) {
	var b []byte
	b = protowire.AppendTag(b, 4, protowire.VarintType) // done
	b = protowire.AppendVarint(b, 1)
	b = protowire.AppendTag(b, 6, protowire.BytesType) // error
	b = protowire.AppendString(b, "boom")
	te, err := capability.TaskErrorOfWire(b)
	if err != nil || te.Msg != "boom" || te.Outcome != capability.OutcomeError || te.Snooze != 0 {
		t.Fatalf("an old plugin's error reads as %#v, %v; want an ordinary failure", te, err)
	}

	// A snooze that is not a number, or too long for a duration, reads as
	// one the host refuses.
	for _, s := range []float64{math.NaN(), math.Inf(1), 1e300, math.Inf(-1)} {
		ev := append([]byte(nil), b...)
		ev = protowire.AppendTag(ev, 7, protowire.VarintType)
		ev = protowire.AppendVarint(ev, 1) // OUTCOME_SNOOZE
		ev = protowire.AppendTag(ev, 8, protowire.Fixed64Type)
		ev = protowire.AppendFixed64(ev, math.Float64bits(s))
		te, err := capability.TaskErrorOfWire(ev)
		if err != nil || te.Outcome != capability.OutcomeSnooze || (te.Snooze >= 0 && te.Snooze < math.MaxInt64) {
			t.Errorf("snooze of %v seconds reads as %#v, %v; want a snooze out of range", s, te, err)
		}
	}
}

// TestRunTaskCancellationCrossesTheWire: cancelling the caller's context
// cancels the provider's, directly and through the host's relay.
func TestRunTaskCancellationCrossesTheWire(t *testing.T) {
	p := &outcomes{}
	provider := capabilitytest.Connect(t, p)
	caller := &lifecycleOnly{}
	capabilitytest.Start(t, caller, nil, &capabilitytest.Host{
		RunTaskFunc: func(ctx context.Context, _ string, run capability.TaskRun, ev capability.TaskEvents) (json.RawMessage, error) {
			return provider.RunTask(ctx, run, ev)
		},
	})
	for name, run := range map[string]func(ctx context.Context) error{
		"direct": func(ctx context.Context) error {
			_, err := provider.RunTask(ctx, capability.TaskRun{Task: "wait"}, nil)
			return err
		},
		"through the host": func(ctx context.Context) error {
			_, err := caller.host.RunTask(ctx, "outcomes", capability.TaskRun{Task: "wait"}, nil)
			return err
		},
	} {
		p.started, p.ended = make(chan struct{}), make(chan error, 1)
		ctx, cancel := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		go func() { ran <- run(ctx) }()
		select {
		case <-p.started:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: the task did not start", name)
		}
		cancel()
		select {
		case cause := <-p.ended:
			if !errors.Is(cause, context.Canceled) {
				t.Errorf("%s: the provider's context ended with %v, want canceled", name, cause)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: the provider's context was not cancelled", name)
		}
		if err := <-ran; err == nil {
			t.Errorf("%s: a cancelled run returned no error", name)
		}
	}
}
