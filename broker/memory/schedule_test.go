package memory

import (
	"testing"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/brokertest"
)

func TestSchedules(t *testing.T) {
	brokertest.RunSchedules(t, func(t *testing.T) broker.Broker {
		b := New()
		t.Cleanup(func() {
			checkBooks(t, b)
			_ = b.Close()
		})
		return b
	})
}
