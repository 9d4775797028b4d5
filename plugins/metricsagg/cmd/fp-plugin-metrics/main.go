// Command fp-plugin-metrics is the taskhost metrics aggregator plugin. The
// host starts it; it must never write to stdout, which carries the
// go-plugin handshake.
package main

import (
	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/plugins/metricsagg"
)

func main() {
	log := capability.NewLogger("metrics")
	capability.Serve(metricsagg.New(log), capability.WithLogger(log))
}
