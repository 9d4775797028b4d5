package brokertest_test

import (
	"testing"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/brokertest"
	"github.com/taskhost/taskhost/broker/memory"
)

// A store passes the suite every store passes: in a test of its package,
// Run gets a constructor of fresh, empty brokers (one per case).
func ExampleRun() {
	conformance := func(t *testing.T) {
		brokertest.Run(t, func(t *testing.T) broker.Broker {
			b := memory.New()
			t.Cleanup(func() { _ = b.Close() })
			return b
		})
	}
	_ = conformance // func TestConformance(t *testing.T) { ... } in the store's package
}
