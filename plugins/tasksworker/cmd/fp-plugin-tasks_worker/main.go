// Command fp-plugin-tasks_worker is the tasks_worker plugin binary. The
// host starts it; run by hand it refuses to start. It never writes to
// stdout, which carries the go-plugin handshake.
//
// It also runs the task system's migrations, which the host's command
// line hands on to it (`host migrate ...` runs `fp-plugin-tasks_worker
// migrate ...` with the plugin's config block on stdin):
//
//	fp-plugin-tasks_worker migrate [flags]   migrate the PostgreSQL broker's tables
//	fp-plugin-tasks_worker check-config      check the config block on stdin
//
// `host bench` is a binary of its own, built from the bench module
// (bench/), so this one links none of the bench.
package main

import (
	"os"

	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/plugins/tasksworker"
	"github.com/taskhost/taskhost/plugins/tasksworker/cmd/internal/migrate"
	"github.com/taskhost/taskhost/worker"
)

// commands are the subcommands the binary runs instead of serving the
// plugin; each takes the arguments after its name and returns the exit
// status. (check-config is answered by capability.Serve.)
var commands = map[string]func(args []string) int{
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
