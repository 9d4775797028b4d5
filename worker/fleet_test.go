package worker

import (
	"context"
	"testing"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/memory"
)

// TestFleetSeesTheOtherWorkersAlone: a pool's fleet counts a task another
// worker runs on a topic it claims, and neither the pool's own tasks nor
// another worker's task on a topic it does not claim.
func TestFleetSeesTheOtherWorkersAlone(t *testing.T) {
	b := memory.New()
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "mine", Handler: func(context.Context, *TaskContext) (any, error) { return nil, nil }})
	p := startPool(t, b, reg, Options{})
	other := broker.WorkerInfo{ID: "other", Host: "h", PID: 1, Roles: []string{broker.RoleWorker},
		Topics: []string{"theirs"}, Capacity: 1, Tasks: []string{"their.task"}}
	if err := b.RegisterWorker(t.Context(), other); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		task, topic string
		want        bool
	}{
		{"their.task", "theirs", true},
		{"their.task", broker.DefaultTopic, false},
		{"mine", broker.DefaultTopic, false},
	} {
		got, err := p.Fleet().RunsElsewhere(c.task, c.topic)
		if err != nil || got != c.want {
			t.Errorf("RunsElsewhere(%q, %q) = %v, %v; want %v", c.task, c.topic, got, err, c.want)
		}
	}
}
