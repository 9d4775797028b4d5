package local

import (
	"testing"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/brokertest"
)

func TestSchedules(t *testing.T) {
	brokertest.RunSchedules(t, func(t *testing.T) broker.Broker {
		return openTest(t, Options{})
	})
}
