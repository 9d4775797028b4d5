package capability_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/taskhost/taskhost/capability"
)

// greeter is a task plugin: it offers greeter.hello, and runs up to 16 of
// its attempts at once.
type greeter struct{}

func (greeter) Describe(context.Context) (capability.Description, error) {
	return capability.Description{Name: "greeter", Version: "1.0.0"}, nil
}
func (greeter) Configure(context.Context, capability.ConfigureRequest) error { return nil }
func (greeter) CheckHealth(context.Context) (capability.Health, error) {
	return capability.Health{Status: capability.HealthOK}, nil
}
func (greeter) Stop(context.Context) error { return nil }

func (greeter) ListTasks(context.Context) ([]capability.TaskSpec, error) {
	return []capability.TaskSpec{{Name: "greeter.hello", Description: `Greets {"name": "..."}.`, MaxAttempts: 3, Timeout: time.Minute}}, nil
}

func (greeter) RunTask(ctx context.Context, run capability.TaskRun, ev capability.TaskEvents) (json.RawMessage, error) {
	var p struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(run.Payload, &p); err != nil || p.Name == "" {
		return nil, capability.Permanent(errors.New(`the payload must be {"name": "..."}`))
	}
	if p.Name == "busy" {
		return nil, capability.RetryAfter(errors.New("the greeting service is busy"), 30*time.Second)
	}
	ev.Log("greeting " + p.Name)
	return json.Marshal(map[string]string{"greeting": "hello, " + p.Name})
}

// TaskCapacity bounds the attempts that run at once in this process.
func (greeter) TaskCapacity() int { return 16 }

// A task plugin's main serves its value; the host starts the binary
// (fp-plugin-greeter in its plugins directory) and tasks_worker runs its
// tasks. Serve never returns.
func ExampleServe() {
	capability.Serve(greeter{}, capability.WithLogger(capability.NewLogger("greeter")))
}

// A task queues more tasks from its own context; each records the running
// task as its parent.
func ExampleSubmit() {
	run := func(ctx context.Context, run capability.TaskRun, ev capability.TaskEvents) (json.RawMessage, error) {
		got, err := capability.Submit(ctx,
			capability.TaskSubmission{Task: "greeter.hello", Payload: json.RawMessage(`{"name": "Ada"}`)},
			capability.TaskSubmission{Task: "greeter.hello", Payload: json.RawMessage(`{"name": "Bob"}`), Delay: time.Minute},
		)
		if err != nil {
			return nil, fmt.Errorf("submit the greetings: %w", err) // ErrUnavailable while tasks_worker does not run
		}
		return json.Marshal(map[string]string{"first": got[0].ID, "second": got[1].ID})
	}
	_ = run // a TaskProvider's RunTask
}
