package ui

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// The pages and forms are tested through the plugin, in package
// tasksworker (ui_test.go there); these are the UI's own parts.

// TestUILinksNeitherWorkerNorBeat: the UI reaches the task system through
// package service alone, which reads the worker and the beat through
// interfaces, so the UI links neither package worker nor scheduler.
func TestUILinksNeitherWorkerNorBeat(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("go list -deps (this test needs the go command on PATH, as go test has it): %v %s", err, stderr)
	}
	deps := strings.Fields(string(out))
	for _, pkg := range []string{"github.com/taskhost/taskhost/worker", "github.com/taskhost/taskhost/scheduler"} {
		if slices.Contains(deps, pkg) {
			t.Errorf("the UI links %s", pkg)
		}
	}
}

func TestUICheckOriginDirect(t *testing.T) {
	// Without X-Forwarded-Host (called directly) the Host header counts.
	if err := checkOrigin(&http.Request{Host: "direct:1", Header: http.Header{"Origin": {"http://direct:1"}}}); err != nil {
		t.Errorf("direct request: %v", err)
	}
}

func TestUISamplerRing(t *testing.T) {
	s := &sampleRing{}
	t0 := time.Date(2030, 1, 1, 12, 0, 10, 0, time.UTC)
	st := func(q, r, d int) broker.Stats {
		return broker.Stats{Topics: []broker.TopicStats{{Queued: q, Running: r, DeadLetter: d}, {Queued: 1}}}
	}
	s.record(t0, st(4, 1, 0), 10, 1)                     // baseline: counters not counted
	s.record(t0.Add(30*time.Second), st(2, 2, 1), 15, 1) // same minute: max depth, +5 done
	s.record(t0.Add(65*time.Second), st(0, 0, 1), 18, 3) // next minute
	s.record(t0.Add(5*time.Minute), st(0, 0, 0), 18, 3)  // a gap of three minutes
	mins := s.minutes(t0.Add(5 * time.Minute))
	if len(mins) != chartMinutes {
		t.Fatalf("%d minutes", len(mins))
	}
	last := mins[len(mins)-1]
	m0, m1 := mins[len(mins)-6], mins[len(mins)-5]
	if m0.Queued != 5 || m0.Running != 2 || m0.Dead != 1 || m0.Done != 5 || m0.Failed != 0 {
		t.Errorf("first minute %+v", m0)
	}
	if m1.Queued != 1 || m1.Done != 3 || m1.Failed != 2 {
		t.Errorf("second minute %+v", m1)
	}
	if !mins[len(mins)-4].At.IsZero() || last.At.IsZero() {
		t.Errorf("gap not kept: %+v / %+v", mins[len(mins)-4], last)
	}
	// An hour later the first minute is gone (its slot is reused), and
	// the window starts at 12:01.
	s.record(t0.Add(time.Hour), st(9, 0, 0), 18, 3)
	mins = s.minutes(t0.Add(time.Hour))
	n := 0
	for _, m := range mins {
		if !m.At.IsZero() {
			n++
		}
	}
	if n != 3 || mins[len(mins)-1].Queued != 10 || !mins[0].At.Equal(t0.Add(time.Minute).Truncate(time.Minute)) {
		t.Errorf("after an hour: %d sampled minute(s), last %+v", n, mins[len(mins)-1])
	}
	charts := s.charts(t0.Add(time.Hour))
	if len(charts) != 2 || charts[0].ID != "depth" || len(charts[0].Series) != 3 {
		t.Fatalf("charts %+v", charts)
	}
	q := charts[0].Series[0]
	if len(q.Segments)+len(q.Dots) != 3 || q.Last != "10" || charts[0].Ticks[2].Label != "10" {
		t.Errorf("queued series %+v, ticks %+v", q, charts[0].Ticks)
	}
	for _, c := range []struct{ in, want float64 }{{0, 1}, {1, 1}, {3, 5}, {7, 10}, {12, 20}, {230, 500}} {
		if got := niceCeil(c.in); got != c.want {
			t.Errorf("niceCeil(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestUIDurationsAndJSONProblems(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "0s", 1500 * time.Millisecond: "1s", 5 * time.Minute: "5m", 185 * time.Second: "3m 05s",
		2*time.Hour + 3*time.Minute: "2h 03m", 80 * time.Hour: "3d 08h"} {
		if got := duration(d); got != want {
			t.Errorf("duration(%s) = %q, want %q", d, got, want)
		}
	}
	if got := jsonProblem("payload", "{\n\"a\": 1,\n}"); !strings.Contains(got, "near line 3, column 1") {
		t.Errorf("problem %q", got)
	}
	if got := jsonProblem("payload", `{"a": 1}`); got != "" {
		t.Errorf("valid JSON: %q", got)
	}
}

func TestUIBrokerProblemsArePlainWords(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{broker.Invalid("message 5 is queued; only dead or failed messages can be requeued"), "Could not requeue task 5: message 5 is queued; only dead or failed messages can be requeued."},
		{fmt.Errorf("message 5: %w", broker.ErrNotFound), "Could not requeue task 5: it does not exist (any more)."},
		{broker.ErrClosed, "Could not requeue task 5: the broker is closed (the plugin is stopping or restarting). Retry in a few seconds."},
		{context.DeadlineExceeded, "Could not requeue task 5: the broker did not answer in time."},
		{errors.New("connection refused"), "Could not requeue task 5: the broker failed (connection refused)."},
	} {
		if got := brokerProblem("requeue task 5", c.err); !strings.HasPrefix(got, c.want) {
			t.Errorf("%v: %q, want %q", c.err, got, c.want)
		}
	}
}
