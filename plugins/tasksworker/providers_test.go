package tasksworker

import (
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/capabilitytest"
)

// TestProvidedTaskKeepsItsSpec: a provided task gets the attempts and the
// timeout its plugin asks for: 3 attempts when it names none, fewer when
// it asks for fewer, never more than a submit may ask for.
func TestProvidedTaskKeepsItsSpec(t *testing.T) {
	for _, c := range []struct {
		attempts, want int
		timeout        time.Duration
	}{
		{0, 3, 0},
		{1, 1, 30 * time.Second},
		{2, 2, 0},
		{10, 10, time.Hour},
		{broker.MaxAttempts + 1, broker.MaxAttempts, 0},
	} {
		task := providedTask(capability.NewTaskRunner(&capabilitytest.Host{}, capability.TaskRunnerOptions{}), "p", capability.TaskSpec{Name: "p.t", Topic: "default", MaxAttempts: c.attempts, Timeout: c.timeout})
		if task.MaxAttempts != c.want || task.Timeout != c.timeout {
			t.Errorf("spec asking %d attempts and a timeout of %s: task has %d and %s, want %d and %s",
				c.attempts, c.timeout, task.MaxAttempts, task.Timeout, c.want, c.timeout)
		}
	}
}
