// Command fp-plugin-tasks_worker is the tasks_worker plugin binary. The
// host starts it; run by hand it refuses to start. It never writes to
// stdout, which carries the go-plugin handshake.
package main

import (
	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/plugins/tasksworker"
	"github.com/taskhost/taskhost/worker"
)

func main() {
	worker.TuneGC()
	log := capability.NewLogger(tasksworker.Name)
	capability.Serve(tasksworker.New(log), capability.WithLogger(log))
}
