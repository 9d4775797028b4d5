package client_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/taskhost/taskhost/internal/testhost"
)

// hostURL is the address of the host TestMain starts for the tests and
// the examples: bin/host with tasks_worker on the local store, built
// from this tree.
var hostURL string

// hostLog holds the host's output, printed when a test fails.
var hostLog testhost.SyncBuffer

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "taskhost-client-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	stop, err := startHost(dir)
	code := 1
	if err != nil {
		fmt.Fprintf(os.Stderr, "start a host for the client tests: %v\n%s", err, hostLog.String())
	} else {
		code = m.Run()
		stop()
		if code != 0 {
			fmt.Fprintf(os.Stderr, "host log:\n%s", hostLog.String())
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// startHost builds bin/host and the tasks_worker plugin into dir, starts
// the host on a free loopback port and waits until tasks_worker answers.
func startHost(dir string) (stop func(), err error) {
	if err := testhost.Build(dir); err != nil {
		return nil, err
	}
	hostURL, stop, err = testhost.Start(dir, `plugins:
  tasks_worker:
    enabled: true
    config:
      broker: local
      data_dir: {{dir}}/var
      workers: 4
`, &hostLog)
	return stop, err
}
