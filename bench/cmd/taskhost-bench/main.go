// Command taskhost-bench is `host bench`: it measures the broker and the
// worker pool as they ship (see package bench for its phases). `make
// build` puts it beside bin/host, which hands `host bench ...` to it with
// the same arguments, so a user runs it as `bin/host bench`.
//
// It is built from the bench module (bench/, with the product as a
// replaced dependency), so that neither the host nor the plugin binaries
// link any of it.
package main

import (
	"os"

	"github.com/taskhost/taskhost/bench/internal/bench"
)

func main() {
	os.Exit(bench.Main(os.Args[1:]))
}
