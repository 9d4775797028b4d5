package tasksworker

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// The API and the broker take their limits from one table
// (broker/limits.go): what the API refuses, the broker refuses too, and
// the API's bounds are the broker's.
func TestAPIAndBrokerShareTheLimits(t *testing.T) {
	ok := broker.SubmitRequest{Topic: "default", Task: "demo.echo", Delay: broker.MaxDelay, MaxAttempts: broker.MaxAttempts}
	if err := broker.ValidateSubmit(ok, 0); err != nil {
		t.Fatalf("the broker refuses the API's largest delay and attempts: %v", err)
	}
	over := ok
	over.Delay += time.Second
	if err := broker.ValidateSubmit(over, 0); err == nil {
		t.Errorf("the broker takes a delay over %s", broker.MaxDelay)
	}
	over = ok
	over.MaxAttempts++
	if err := broker.ValidateSubmit(over, 0); err == nil {
		t.Errorf("the broker takes max_attempts over %d", broker.MaxAttempts)
	}

	f := start(t, nil)
	maxDelay := strconv.FormatFloat(broker.MaxDelay.Seconds(), 'f', 0, 64)
	for _, c := range []struct {
		body string
		want int
	}{
		{`{"task": "demo.echo", "delay_seconds": ` + maxDelay + `, "max_attempts": ` + strconv.Itoa(broker.MaxAttempts) + `}`, http.StatusCreated},
		{`{"task": "demo.echo", "delay_seconds": ` + maxDelay + `.5}`, http.StatusBadRequest},
		{`{"task": "demo.echo", "max_attempts": ` + strconv.Itoa(broker.MaxAttempts+1) + `}`, http.StatusBadRequest},
	} {
		if res := f.do("POST", "/api/tasks", c.body); res.status != c.want {
			t.Errorf("POST %s: %d, want %d: %s", c.body, res.status, c.want, res.body)
		}
	}
}
