package sqlstore

import (
	"testing"

	"github.com/taskhost/taskhost/broker"
)

func TestTake(t *testing.T) {
	for _, c := range []struct {
		name string
		f    TakeFacts
		want Verdict
	}{
		{"an available queued message is taken", TakeFacts{Found: true, State: broker.StateQueued, Available: true}, TakeOK},
		{"a queued message not available yet waits", TakeFacts{Found: true, State: broker.StateQueued}, TakeWait},
		{"a queued message of a paused topic is for later", TakeFacts{Found: true, State: broker.StateQueued, Available: true, Paused: true}, TakeLater},
		{"a queued message of a topic at its limit is for later", TakeFacts{Found: true, State: broker.StateQueued, Available: true, Limit: 2, Running: 2}, TakeLater},
		{"a running message is taken again from a redelivery", TakeFacts{Found: true, State: broker.StateRunning, Redelivered: true, Limit: 1, Running: 1}, TakeOK},
		{"a running message met by a first delivery is a duplicate", TakeFacts{Found: true, State: broker.StateRunning}, TakeDrop},
		{"a finished message is dropped", TakeFacts{Found: true, State: broker.StateDone, Available: true}, TakeDrop},
		{"a message without a row is gone, not dropped", TakeFacts{}, TakeGone},
		{"a message without a row is gone, redelivered or not", TakeFacts{Redelivered: true}, TakeGone},
	} {
		if got := Take(c.f); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
