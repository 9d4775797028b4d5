package tasksworker

// The built-in tasks every tasks_worker registers (demo.*, the
// watchdog's reclaim pass).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/taskhost/taskhost/plugins/tasksworker/service"
	"github.com/taskhost/taskhost/reaper"
	"github.com/taskhost/taskhost/worker"
)

// maxSleepSeconds bounds demo.sleep.
const maxSleepSeconds = 3600

// registerBuiltins registers the tasks every tasks_worker has, for a
// broker of the given kind.
func registerBuiltins(reg *worker.Registry, cfg Config, reclaim func(context.Context) reaper.Result) error {
	tasks := []worker.Task{
		{
			Name:        "demo.echo",
			Description: `Returns its payload. With "lock": "name" in the payload it takes that lock, and a busy lock skips the message (it ends without running).`,
			Handler: func(_ context.Context, tc *worker.TaskContext) (any, error) {
				return tc.Payload, nil
			},
			LockKey: service.PayloadLock,
		},
		{
			Name:           "demo.sleep",
			Description:    `Sleeps for payload {"seconds": n, "lock": "name"}, 0 <= n <= 3600; stops early when cancelled. With "lock", it holds that lock while it sleeps (a busy lock requeues the message).`,
			Handler:        demoSleep,
			LockKey:        service.PayloadLock,
			OnLockConflict: worker.LockRequeue,
			LockRetryDelay: time.Second,
		},
		{
			Name:        "demo.fail",
			Description: "Always fails.",
			Handler: func(context.Context, *worker.TaskContext) (any, error) {
				return nil, errors.New("demo.fail always fails")
			},
		},
		{
			// No schedule on purpose: the beat drives the reaper in
			// process; this task is for an operator's manual pass.
			Name:        "watchdog.reclaim_orphaned_messages",
			Description: "One orphan-reclaim pass (the beat runs them on its own; this is for a manual pass).",
			Handler: func(ctx context.Context, tc *worker.TaskContext) (any, error) {
				res := reclaim(ctx)
				tc.Logf("%s", res.Summary())
				return res, nil
			},
		},
	}
	if cfg.DemoTasks {
		tasks = append(tasks, worker.Task{
			Name:        "demo.crash",
			Description: "Kills its own process with SIGKILL: a poison task for tests. Registered only with demo_tasks = true.",
			Handler:     demoCrash,
		})
	}
	for _, t := range tasks {
		if err := reg.Register(t); err != nil {
			return err
		}
	}
	return nil
}

func demoSleep(ctx context.Context, tc *worker.TaskContext) (any, error) {
	var p struct {
		Seconds *float64 `json:"seconds"`
		Lock    string   `json:"lock"`
	}
	d := json.NewDecoder(bytes.NewReader(tc.Payload))
	d.DisallowUnknownFields()
	if err := d.Decode(&p); err != nil || p.Seconds == nil {
		return nil, fmt.Errorf(`demo.sleep: the payload must be {"seconds": n} with 0 <= n <= %d, got %s`, maxSleepSeconds, clip(tc.Payload))
	}
	n := *p.Seconds
	if n < 0 || n > maxSleepSeconds {
		return nil, fmt.Errorf("demo.sleep: seconds must be from 0 to %d, got %v", maxSleepSeconds, n)
	}
	tc.Logf("sleeping %vs", n)
	t := time.NewTimer(time.Duration(n * float64(time.Second)))
	defer t.Stop()
	select {
	case <-t.C:
		return map[string]float64{"slept_seconds": n}, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("demo.sleep interrupted: %w", ctx.Err())
	}
}

// demoCrash kills the process it runs in, the way an OOM kill would.
func demoCrash(ctx context.Context, tc *worker.TaskContext) (any, error) {
	tc.Logf("killing process %d", os.Getpid())
	proc, err := os.FindProcess(os.Getpid())
	if err == nil {
		err = proc.Kill() // SIGKILL on Unix
	}
	if err != nil {
		return nil, fmt.Errorf("demo.crash could not kill its process: %w", err)
	}
	<-ctx.Done() // the signal arrives before this returns
	return nil, ctx.Err()
}
