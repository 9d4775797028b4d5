package tasksworker

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/memory"
	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/capabilitytest"
	"github.com/taskhost/taskhost/worker"
)

// outcomeProvider is a task provider whose tasks end each way a provided
// task may, served over the real gRPC adapters.
type outcomeProvider struct{ snoozes *atomic.Int32 }

func (outcomeProvider) Describe(context.Context) (capability.Description, error) {
	return capability.Description{Name: "prov", Version: "1"}, nil
}
func (outcomeProvider) Configure(context.Context, capability.ConfigureRequest) error { return nil }
func (outcomeProvider) CheckHealth(context.Context) (capability.Health, error) {
	return capability.Health{Status: capability.HealthOK}, nil
}
func (outcomeProvider) Stop(context.Context) error { return nil }
func (outcomeProvider) ListTasks(context.Context) ([]capability.TaskSpec, error) {
	return nil, nil
}

func (p outcomeProvider) RunTask(ctx context.Context, run capability.TaskRun, _ capability.TaskEvents) (json.RawMessage, error) {
	switch run.Task {
	case "p.snooze":
		if p.snoozes.Add(1) <= 2 {
			return nil, capability.Snooze(time.Millisecond)
		}
		return json.RawMessage(`"woke"`), nil
	case "p.snooze.bad":
		return nil, capability.Snooze(-time.Minute)
	case "p.permanent":
		return nil, capability.Permanent(errors.New("unusable payload"))
	case "p.cancel":
		return nil, capability.CancelTask("not wanted")
	case "p.wait":
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return nil, errors.New("plain failure")
}

// TestProvidedTaskOutcomes: what a provider's task asks for, across the
// wire, is what the worker does: a snooze that uses no attempt, a bad
// snooze and a plain error that are retried, a permanent failure and a
// self-cancel that are not; a cancel of the running task reaches the
// provider.
func TestProvidedTaskOutcomes(t *testing.T) {
	snoozes := &atomic.Int32{}
	client := capabilitytest.Connect(t, outcomeProvider{snoozes})
	host := &capabilitytest.Host{
		StreamProviderFunc: func(context.Context, string) (*capability.Client, error) { return client, nil },
	}
	runner := capability.NewTaskRunner(capabilitytest.HostServices(t, host), capability.TaskRunnerOptions{})
	t.Cleanup(runner.Close)
	reg := worker.NewRegistry()
	for _, name := range []string{"p.snooze", "p.snooze.bad", "p.permanent", "p.cancel", "p.wait", "p.fail"} {
		reg.MustRegister(providedTask(runner, "prov", capability.TaskSpec{Name: name, MaxAttempts: 3}))
	}
	b := memory.New()
	pool := worker.NewPool(b, reg, worker.Options{Logger: hclog.NewNullLogger(), ClaimIdleInterval: 5 * time.Millisecond, HeartbeatInterval: time.Hour})
	if err := pool.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pool.Stop(context.Background()) })

	submit := func(task, payload string, maxAttempts int) int64 {
		id, err := b.Submit(context.Background(), broker.SubmitRequest{Topic: broker.DefaultTopic, Task: task,
			Payload: json.RawMessage(payload), MaxAttempts: maxAttempts})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	wait := func(id int64, what string, cond func(broker.Message) bool) broker.Message {
		t.Helper()
		var m broker.Message
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			var err error
			if m, err = b.GetMessage(context.Background(), id); err != nil {
				t.Fatal(err)
			}
			if cond(m) {
				return m
			}
			if time.Now().After(deadline) {
				t.Fatalf("message %d (%s) is %s after %d attempts (%q), want %s", id, m.Task, m.State, m.Attempts, m.LastError, what)
			}
		}
	}
	in := func(state string) func(broker.Message) bool {
		return func(m broker.Message) bool { return m.State == state }
	}

	if m := wait(submit("p.snooze", `"first"`, 1), "done", in(broker.StateDone)); m.Attempts != 1 || string(m.Result) != `"woke"` || snoozes.Load() != 3 {
		t.Errorf("snooze: %d attempts, %d runs, result %s; want done in its one attempt, after two snoozes", m.Attempts, snoozes.Load(), m.Result)
	}
	if m := wait(submit("p.snooze.bad", `{}`, 2), "dead", in(broker.StateDead)); m.Attempts != 2 || m.LastError != "the task asked to snooze for -1m0s, which is out of range: a snooze is from 0 to 8760h0m0s" {
		t.Errorf("bad snooze: %d attempts, error %q", m.Attempts, m.LastError)
	}
	if m := wait(submit("p.permanent", `{}`, 0), "dead", in(broker.StateDead)); m.Attempts != 1 || m.LastError != "unusable payload" {
		t.Errorf("permanent: %d attempts, error %q", m.Attempts, m.LastError)
	}
	if m := wait(submit("p.cancel", `{}`, 0), "cancelled", in(broker.StateCancelled)); m.Attempts != 1 || m.LastError != "not wanted" {
		t.Errorf("self-cancel: %d attempts, error %q", m.Attempts, m.LastError)
	}
	if m := wait(submit("p.fail", `{}`, 2), "dead", in(broker.StateDead)); m.Attempts != 2 || m.LastError != "plain failure" {
		t.Errorf("plain failure: %d attempts, error %q", m.Attempts, m.LastError)
	}
	id := submit("p.wait", `{}`, 0)
	wait(id, "running", in(broker.StateRunning))
	for !pool.CancelRunning(id) {
		time.Sleep(5 * time.Millisecond) // claimed, not yet handed to the pool's workers
	}
	if m := wait(id, "cancelled", in(broker.StateCancelled)); m.Attempts != 1 {
		t.Errorf("cancelled while running: %d attempts", m.Attempts)
	}
}
