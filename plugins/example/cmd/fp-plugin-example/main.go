// Command fp-plugin-example is the example task plugin.
package main

import (
	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/plugins/example"
)

func main() {
	log := capability.NewLogger(example.Name)
	capability.Serve(example.Plugin{}, capability.WithLogger(log))
}
