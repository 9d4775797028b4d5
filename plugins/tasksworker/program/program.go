// Package program is the tasks_worker program: the plugin, served to the
// host, and the subcommands the host's command line hands on to it.
//
// The stock binary, fp-plugin-tasks_worker, is Main with no option. A Go
// program of one's own that calls Main with tasksworker.WithTasks, built
// as fp-plugin-tasks_worker and put in the host's plugins directory in
// place of the stock one, runs its tasks in the tasks_worker process
// itself, as the built-in tasks run, with no plugin boundary to cross:
//
//	func main() {
//		program.Main(tasksworker.WithTasks(func(reg *worker.Registry) error {
//			return reg.Register(worker.Task{Name: "mail.send", Handler: sendMail})
//		}))
//	}
//
// Tasks in a plugin of their own (capability.TaskProvider) are isolated
// from tasks_worker (a crash or a leak ends their process alone) and are
// deployed apart from it; tasks linked in share its process, its memory
// and its releases, and cost no more than the built-in ones.
//
// The subcommands, which never serve the plugin:
//
//	fp-plugin-tasks_worker migrate [flags]   migrate the PostgreSQL broker's tables
//	fp-plugin-tasks_worker check-config      check the config block on stdin
//
// The program never writes to stdout, which carries the go-plugin
// handshake.
package program

import (
	"os"

	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/plugins/tasksworker"
	"github.com/taskhost/taskhost/plugins/tasksworker/program/internal/migrate"
	"github.com/taskhost/taskhost/worker"
)

// commands are the subcommands the program runs instead of serving the
// plugin; each takes the arguments after its name and returns the exit
// status. (check-config is answered by capability.Serve.)
var commands = map[string]func(args []string) int{
	"migrate": migrate.Main,
}

// Main runs the program: a subcommand named by its first argument, or
// else the tasks_worker plugin made by tasksworker.New with opts, served
// to the host that started it. It does not return (capability.Serve).
func Main(opts ...tasksworker.Option) {
	if len(os.Args) > 1 {
		if cmd, ok := commands[os.Args[1]]; ok {
			os.Exit(cmd(os.Args[2:]))
		}
	}
	worker.TuneGC()
	log := capability.NewLogger(tasksworker.Name)
	capability.Serve(tasksworker.New(log, opts...), capability.WithLogger(log))
}
