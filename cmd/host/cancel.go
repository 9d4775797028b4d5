package main

// `host tasks cancel ID` and `host tasks cancel -topic T [-task N]`.

import (
	"context"
	"flag"
	"fmt"

	"github.com/taskhost/taskhost/client"
)

func tasksCancel(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	var f client.CancelFilter
	fs.StringVar(&f.Topic, "topic", "", "with no ID: cancel the queued tasks of `TOPIC`")
	fs.StringVar(&f.Task, "task", "", "with no ID: cancel the queued tasks named `NAME` (of -topic, when given)")
	return func(ctx context.Context, e *env, args []string) error {
		if len(args) == 1 {
			if f.Topic != "" || f.Task != "" {
				return usageError{"give a task ID, or -topic and/or -task to cancel queued tasks, not both"}
			}
			return cancelOne(ctx, e, args[0])
		}
		if f.Topic == "" && f.Task == "" {
			return usageError{"say what to cancel: a task ID, or -topic and/or -task for the queued tasks they select"}
		}
		res, err := e.c.CancelQueued(ctx, f)
		if err != nil {
			return err
		}
		if e.json {
			return e.printJSON(res)
		}
		fmt.Fprintf(e.stdout, "cancelled %d queued task(s)\n", res.Cancelled)
		return nil
	}
}

// cancelOne cancels task id and says what became of it.
func cancelOne(ctx context.Context, e *env, id string) error {
	res, err := e.c.Cancel(ctx, id)
	if err != nil {
		return err
	}
	if e.json {
		return e.printJSON(res)
	}
	if res.CancelRequested {
		fmt.Fprintf(e.stdout, "task %s is running: it is asked to stop, and ends cancelled unless it finishes first (host tasks wait %s tells)\n", res.ID, res.ID)
		return nil
	}
	fmt.Fprintf(e.stdout, "task %s cancelled\n", res.ID)
	return nil
}
