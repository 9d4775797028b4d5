package tasksworker

import (
	"errors"
	"net/http"
	goruntime "runtime"
	"strconv"
	"strings"
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

// nestedJSON is value inside n levels of open ... close.
func nestedJSON(n int, open, value, close string) string {
	return strings.Repeat(open, n) + value + strings.Repeat(close, n)
}

// bytesAllocated is what f allocates in this process (the plugin runs in
// it, behind the in-process gRPC harness), over runs runs.
func bytesAllocated(runs int, f func()) uint64 {
	var before, after goruntime.MemStats
	goruntime.GC()
	goruntime.ReadMemStats(&before)
	for range runs {
		f()
	}
	goruntime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / uint64(runs)
}

// A payload nested deeper than broker.MaxJSONDepth is refused by the API
// (submit and schedules) with a 400 that names the limit, in memory that
// does not grow with the depth; the broker refuses it too. At the limit,
// it is taken.
func TestDeepJSONIsRefused(t *testing.T) {
	atLimit := nestedJSON(broker.MaxJSONDepth, `{"k":`, `1`, `}`)
	over := nestedJSON(broker.MaxJSONDepth+1, `[`, `1`, `]`)
	if err := broker.ValidateSubmit(broker.SubmitRequest{Topic: "default", Task: "demo.echo", Payload: []byte(atLimit)}, 0); err != nil {
		t.Fatalf("the broker refuses a payload at the depth limit: %v", err)
	}
	if err := broker.ValidateSubmit(broker.SubmitRequest{Topic: "default", Task: "demo.echo", Payload: []byte(over)}, 0); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("the broker takes a payload over the depth limit: %v", err)
	}

	f := start(t, nil)
	f.submit(`{"task": "demo.echo", "delay_seconds": 3600, "payload": ` + atLimit + `}`)
	limit := strconv.Itoa(broker.MaxJSONDepth)
	for _, c := range []struct{ path, body string }{
		{"/api/tasks", `{"task": "demo.echo", "payload": ` + over + `}`},
		{"/api/tasks", `{"task": "demo.echo", "payload": ` + nestedJSON(9999, `[`, ``, `]`) + `}`},
		{"/api/tasks", `{"task": "demo.echo", "payload": ` + nestedJSON(9999, `{"abcdefgh":`, `1`, `}`) + `}`},
		{"/api/schedules", `{"name": "deep", "task": "demo.echo", "interval_seconds": 60, "payload": ` + nestedJSON(9999, `[`, ``, `]`) + `}`},
	} {
		var res response
		if got := bytesAllocated(1, func() { res = f.do("POST", c.path, c.body) }); got > 16<<20 {
			t.Errorf("POST %s with a %d-byte body allocated %d MB, want at most 16 MB", c.path, len(c.body), got>>20)
		}
		msg, _ := res.json(t)["error"].(string)
		if res.status != http.StatusBadRequest || !strings.Contains(msg, `field "payload" nests arrays and objects more than `+limit+` levels deep`) {
			t.Errorf("POST %s with a payload nested over the limit: %d %s", c.path, res.status, res.body)
		}
	}
	if res := f.do("POST", "/api/tasks", nestedJSON(9999, `[`, ``, `]`)); res.status != http.StatusBadRequest || !strings.Contains(string(res.body), "must be a JSON object") {
		t.Errorf("POST /api/tasks with a deep array as its body: %d %s", res.status, res.body)
	}
}
