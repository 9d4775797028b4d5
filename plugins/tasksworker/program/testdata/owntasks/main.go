// Command owntasks is a tasks_worker program of a user's own: the stock
// program with one task linked in, own.pid, which returns the id of the
// process it runs in.
package main

import (
	"context"
	"os"

	"github.com/taskhost/taskhost/plugins/tasksworker"
	"github.com/taskhost/taskhost/plugins/tasksworker/program"
	"github.com/taskhost/taskhost/worker"
)

func main() {
	program.Main(tasksworker.WithTasks(func(reg *worker.Registry) error {
		return reg.Register(worker.Task{
			Name:        "own.pid",
			Description: "Returns the id of the process it runs in.",
			Handler: func(context.Context, *worker.TaskContext) (any, error) {
				return map[string]int{"pid": os.Getpid()}, nil
			},
		})
	}))
}
