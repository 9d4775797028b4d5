// Command fp-plugin-tasks_worker is the tasks_worker plugin binary. The
// host starts it; run by hand it refuses to start. It never writes to
// stdout, which carries the go-plugin handshake.
//
// It also runs the task system's own commands, which the host's command
// line hands on to it (`host bench ...` runs `fp-plugin-tasks_worker
// bench ...`):
//
//	fp-plugin-tasks_worker bench [flags]     measure the broker and the worker pool
//	fp-plugin-tasks_worker migrate [flags]   migrate the PostgreSQL broker's tables
//	fp-plugin-tasks_worker check-config      check the config block on stdin
package main

import (
	"os"

	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/plugins/tasksworker"
	"github.com/taskhost/taskhost/plugins/tasksworker/cmd/internal/bench"
	"github.com/taskhost/taskhost/plugins/tasksworker/cmd/internal/migrate"
	"github.com/taskhost/taskhost/worker"
)

// commands are the subcommands the binary runs instead of serving the
// plugin; each takes the arguments after its name and returns the exit
// status. (check-config is answered by capability.Serve.)
var commands = map[string]func(args []string) int{
	"bench":   bench.Main,
	"migrate": migrate.Main,
}

func main() {
	if len(os.Args) > 1 {
		if cmd, ok := commands[os.Args[1]]; ok {
			os.Exit(cmd(os.Args[2:]))
		}
	}
	worker.TuneGC()
	log := capability.NewLogger(tasksworker.Name)
	capability.Serve(tasksworker.New(log), capability.WithLogger(log))
}
