package client_test

import (
	"testing"

	"github.com/taskhost/taskhost/internal/testhost"
)

// hostURL is the address of the host TestMain starts for the tests and
// the examples: bin/host with tasks_worker on the local store, built
// from this tree.
var hostURL string

func TestMain(m *testing.M) {
	testhost.Main(m, "the client tests", testhost.LocalTasksWorker, &hostURL)
}
