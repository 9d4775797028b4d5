package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/memory"
	"github.com/taskhost/taskhost/worker"
)

// A task is registered once, with its handler; a pool then claims its
// messages from a broker and runs them.
func ExampleRegistry_Register() {
	reg := worker.NewRegistry()
	err := reg.Register(worker.Task{
		Name:        "greet",
		MaxAttempts: 3,
		Timeout:     10 * time.Second,
		Handler: func(ctx context.Context, tc *worker.TaskContext) (any, error) {
			var p struct {
				Name string `json:"name"`
			}
			if err := json.Unmarshal(tc.Payload, &p); err != nil || p.Name == "" {
				return nil, worker.Permanent(fmt.Errorf(`the payload must be {"name": "..."}`))
			}
			tc.Logf("greeting %s", p.Name)
			return map[string]string{"greeting": "hello, " + p.Name}, nil
		},
	})
	if err != nil {
		fmt.Println("register:", err)
		return
	}

	b := memory.New()
	pool := worker.NewPool(b, reg, worker.Options{Concurrency: 2})
	ctx := context.Background()
	if err := pool.Start(ctx); err != nil {
		fmt.Println("start:", err)
		return
	}
	defer pool.Stop(ctx)

	id, _ := b.Submit(ctx, broker.SubmitRequest{Topic: broker.DefaultTopic, Task: "greet", Payload: json.RawMessage(`{"name": "Ada"}`)})
	pool.Wake()
	var m broker.Message
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m, _ = b.GetMessage(ctx, id); m.State == broker.StateDone {
			break
		}
	}
	fmt.Println(m.State, string(m.Result))
	// Output: done {"greeting":"hello, Ada"}
}
