// Command fp-plugin-tasks_worker is the tasks_worker plugin binary: the
// program (package program) with no task of its own beyond the built-in
// ones. The host starts it; run by hand it refuses to start.
//
// `host bench` is a binary of its own, built from the bench module
// (bench/), so this one links none of the bench.
package main

import "github.com/taskhost/taskhost/plugins/tasksworker/program"

func main() { program.Main() }
