package python_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/internal/testhost"
)

// packWith packs a Python plugin with the SDK of sdkDir (its mkplugin.py).
func packWith(t *testing.T, sdkDir, plugins, source, name string) {
	t.Helper()
	src, err := filepath.Abs(source)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(python, filepath.Join(sdkDir, "mkplugin.py"), src, "-o", filepath.Join(plugins, "fp-plugin-"+name)).CombinedOutput()
	if err != nil {
		t.Fatalf("mkplugin %s: %v\n%s", source, err, out)
	}
}

type fullTask struct {
	task
	ParentTaskID string `json:"parent_task_id"`
	SubmittedBy  string `json:"submitted_by"`
}

type timedReport struct {
	report
	StartedAt time.Time `json:"started_at"`
	EndedAt   time.Time `json:"ended_at"`
}

func (h *host) timedReports(t *testing.T, id string) []timedReport {
	t.Helper()
	var r struct {
		Reports []timedReport `json:"reports"`
	}
	h.get(t, h.api("/reports?message_id="+id), &r)
	return r.Reports
}

// TestPythonTasksOnTheStreamUnderTheHost runs Python plugins under the real
// host and tasks_worker: their attempts go on one stream of attempts per
// plugin (RunTasks), a plugin without it (stream=False) still runs one
// call per attempt, a handler that sleeps past its timeout keeps its
// topic's limit, a hard_stop handler is killed and its task retried, a
// task submits a child, and RetryAfter holds the retry back.
func TestPythonTasksOnTheStreamUnderTheHost(t *testing.T) {
	checkPython(t)
	dir := t.TempDir()
	plugins := filepath.Join(dir, "plugins")
	if err := testhost.Build(dir); err != nil {
		t.Fatal(err)
	}
	pack(t, plugins, "testdata/pytasks.py", "pytasks")
	pack(t, plugins, "testdata/pylegacy.py", "pylegacy")
	// TASKHOST_TEST_PYSDK names the directory of another SDK (its
	// mkplugin.py) to pack pylimit with: with the SDK before the stream,
	// whose timeout freed the topic's place while the handler slept on,
	// the limit test fails.
	if other := os.Getenv("TASKHOST_TEST_PYSDK"); other != "" {
		packWith(t, other, plugins, "testdata/pylimit.py", "pylimit")
	} else {
		pack(t, plugins, "testdata/pylimit.py", "pylimit")
	}
	spans := filepath.Join(dir, "spans")

	log := &testhost.SyncBuffer{}
	url, stop, err := testhost.Start(dir, fmt.Sprintf(`shutdown_timeout_seconds: 20
plugins:
  tasks_worker:
    enabled: true
    config: {broker: memory, workers: 8, topics: {one: {concurrency_limit: 1}}}
  pytasks: {enabled: true}
  pylegacy: {enabled: true}
  pylimit:
    enabled: true
    config: {spans: %q}
`, spans), log)
	if err != nil {
		t.Fatalf("start the host: %v\n%s", err, log.String())
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("host log:\n%s", log.String())
		}
	})
	h := &host{url: url, log: log}
	for _, name := range []string{"pytasks", "pylegacy", "pylimit"} {
		h.waitState(t, name, "running")
	}

	t.Run("the attempts of a Python plugin go on its stream; a plugin without it runs one call each", func(t *testing.T) {
		ids := []string{h.submit(t, "pytasks.count", map[string]any{"to": 3, "step_ms": 1}, 0)}
		for i := 0; i < 200; i++ {
			ids = append(ids, h.submit(t, "pytasks.noop", nil, 0))
		}
		var aio []string
		for i := 0; i < 50; i++ {
			aio = append(aio, h.submit(t, "pytasks.aio", map[string]any{"ms": 200}, 0))
		}
		legacy := h.submit(t, "pylegacy.echo", map[string]any{"n": 1}, 0)
		for _, id := range ids {
			if v := h.wait(t, id, 120*time.Second); v.State != "done" {
				t.Fatalf("task %s: state %s, error %v", id, v.State, v.Error)
			}
		}
		for _, id := range aio {
			if v := h.wait(t, id, 120*time.Second); v.State != "done" || string(v.Result) != `{"slept_ms":200}` {
				t.Fatalf("pytasks.aio %s: state %s, result %s, error %v", id, v.State, v.Result, v.Error)
			}
		}
		if v := h.wait(t, legacy, 60*time.Second); v.State != "done" || string(v.Result) != `{"payload":{"n":1},"attempt":1}` {
			t.Fatalf("pylegacy.echo: state %s, result %s, error %v", v.State, v.Result, v.Error)
		}
		if reps := h.reports(t, legacy); len(reps) != 1 || strings.Join(reps[0].Logs, "|") != "echo" {
			t.Fatalf("pylegacy.echo's reports: %+v; want one with its log line", reps)
		}
		if reps := h.reports(t, ids[0]); len(reps) != 1 || reps[0].Progress != 1 {
			t.Fatalf("pytasks.count's reports: %+v; want one with progress 1", reps)
		}
		out := log.String()
		// The plugin's side says it serves the stream, and tasks_worker
		// never fell back to one call per attempt for it.
		if !regexp.MustCompile(`host\.pytasks\S*: serving a stream of attempts: .*capacity=\d+`).MatchString(out) {
			t.Error("the host log does not show pytasks serving a stream of attempts")
		}
		if strings.Contains(out, "plugin runs its tasks one call each: it, or the host, predates the stream of attempts: @module=tasks_worker.providers plugin=pytasks") {
			t.Error("tasks_worker ran pytasks' attempts one call each")
		}
		if !strings.Contains(out, "plugin runs its tasks one call each: it, or the host, predates the stream of attempts: @module=tasks_worker.providers plugin=pylegacy") {
			t.Error("tasks_worker did not say it runs pylegacy's attempts one call each")
		}
		if regexp.MustCompile(`host\.pylegacy\S*: serving a stream of attempts`).MatchString(out) {
			t.Error("pylegacy served a stream of attempts")
		}
	})

	t.Run("a handler that sleeps past its timeout never runs beside another on a topic limited to one", func(t *testing.T) {
		// Each pylimit.sleepy ignores its 0.2 s timeout and sleeps 1.5 s,
		// past the second after its cancel from which the plugin counts
		// an overrun: its attempt keeps the topic's one place until its
		// handler has returned, so the plugin never runs two at once,
		// while noop tasks keep the plugin's stream busy beside them.
		const n = 12
		var ids []string
		for i := 0; i < n; i++ {
			ids = append(ids, h.submit(t, "pylimit.sleepy", map[string]any{"seconds": 1.5}, 0))
		}
		var load []string
		for i := 0; i < 300; i++ {
			load = append(load, h.submit(t, "pylimit.noop", nil, 0))
		}
		var starts, ends, most int
		waitFor(t, 180*time.Second, "every handler of pylimit.sleepy has ended", func() bool {
			starts, ends, most = readSpans(t, spans)
			return ends == n
		}, func() string { return fmt.Sprintf("%d started, %d ended", starts, ends) })
		if most != 1 || starts != n {
			t.Fatalf("the plugin ran %d handlers of pylimit.sleepy at once on a topic limited to 1 (%d started)", most, starts)
		}
		for _, id := range append(ids, load...) {
			v := h.wait(t, id, 180*time.Second)
			if v.State != "done" {
				t.Errorf("task %s: state %s, error %s; want done (a handler that returns after its timeout wins)", id, v.State, deref(v.Error))
			}
		}
		// Each ran on about 1.3 s past its cancel; a cancel that a loaded
		// machine delays past 0.5 s leaves less than the second from which
		// the plugin counts an overrun, so not every one need be counted.
		overruns := regexp.MustCompile(`task handlers running past their cancel: 0 now, (\d+) since start`)
		var health string
		waitFor(t, 60*time.Second, "the plugin's health counts the overruns", func() bool {
			var r struct {
				Plugins []struct {
					Name   string `json:"name"`
					Health string `json:"health"`
				} `json:"plugins"`
			}
			h.get(t, h.url+"/admin/api/plugins", &r)
			for _, p := range r.Plugins {
				if p.Name == "pylimit" {
					health = p.Health
				}
			}
			m := overruns.FindStringSubmatch(health)
			if m == nil {
				return false
			}
			k, _ := strconv.Atoi(m[1])
			return k >= 1 && k <= n
		}, func() string { return health })
		if !strings.Contains(log.String(), "a task's handler runs on past its cancel; its attempt keeps its place") {
			t.Error("the host log has no warning of the plugin about a handler past its cancel")
		}
	})

	t.Run("a hard_stop handler past its timeout is killed and its task retried", func(t *testing.T) {
		id := h.submit(t, "pytasks.hardstop", nil, 0)
		v := h.wait(t, id, 120*time.Second)
		if v.State != "done" || v.Attempts != 2 {
			t.Fatalf("pytasks.hardstop: state %s, attempts %d, result %s, error %v; want done at its second attempt", v.State, v.Attempts, v.Result, v.Error)
		}
		reps := h.timedReports(t, id)
		if len(reps) != 2 {
			t.Fatalf("pytasks.hardstop's reports: %+v; want 2", reps)
		}
		first := reps[0]
		if first.Attempt != 1 {
			first = reps[1]
		}
		if first.Status != "timeout" || !strings.Contains(first.Error, "timed out after 500ms: task pytasks.hardstop was killed") {
			t.Fatalf("pytasks.hardstop's first attempt: %+v; want timeout, killed after it", first)
		}
		// Its timeout (0.5 s) and the grace (1 s): well under the
		// hour its handler sleeps.
		if d := first.EndedAt.Sub(first.StartedAt); d > 30*time.Second {
			t.Errorf("the first attempt ended %s after it started", d)
		}
		if len(first.Logs) != 1 || !strings.HasPrefix(first.Logs[0], "pid ") {
			t.Fatalf("pytasks.hardstop's first attempt logs %q, want its process id", first.Logs)
		}
		pid, _ := strconv.Atoi(strings.TrimPrefix(first.Logs[0], "pid "))
		if pid == h.plugin(t, "pytasks").PID || pidAlive(pid) {
			t.Errorf("the process of the first attempt (%d) still runs, or is the plugin's", pid)
		}
	})

	t.Run("a task submits a child, whose parent is the task", func(t *testing.T) {
		id := h.submit(t, "pytasks.parent", nil, 0)
		v := h.wait(t, id, 60*time.Second)
		var res struct {
			Child   string `json:"child"`
			Refused string `json:"refused"`
		}
		if v.State != "done" || json.Unmarshal(v.Result, &res) != nil || res.Child == "" {
			t.Fatalf("pytasks.parent: state %s, result %s, error %v", v.State, v.Result, v.Error)
		}
		if !strings.Contains(res.Refused, "submit refused: ") || !strings.Contains(res.Refused, "pytasks.nosuchtask") {
			t.Errorf("a submit of an unknown task: %q; want a refusal naming it", res.Refused)
		}
		var child fullTask
		waitFor(t, 60*time.Second, "the child ends", func() bool {
			h.get(t, h.api("/tasks/"+res.Child), &child)
			return child.State == "done"
		}, func() string { return child.State })
		if child.ParentTaskID != id || child.SubmittedBy != "plugin:pytasks" {
			t.Fatalf("child %s: parent_task_id %q, submitted_by %q; want %q and plugin:pytasks", res.Child, child.ParentTaskID, child.SubmittedBy, id)
		}
	})

	t.Run("RetryAfter holds the retry back", func(t *testing.T) {
		id := h.submit(t, "pytasks.retry_after", map[string]any{"seconds": 3}, 0)
		v := h.wait(t, id, 120*time.Second)
		if v.State != "done" || v.Attempts != 2 {
			t.Fatalf("pytasks.retry_after: state %s, attempts %d, error %v", v.State, v.Attempts, v.Error)
		}
		reps := h.timedReports(t, id)
		if len(reps) != 2 {
			t.Fatalf("reports: %+v", reps)
		}
		a, b := reps[0], reps[1]
		if a.Attempt != 1 {
			a, b = b, a
		}
		if a.Status != "failed" || a.Error != "come back later" {
			t.Fatalf("first attempt: %+v", a)
		}
		// The backoff alone would retry after 1 s.
		if gap := b.StartedAt.Sub(a.EndedAt); gap < 2900*time.Millisecond {
			t.Fatalf("the retry started %s after the failure, want at least 3 s", gap)
		}
	})
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// readSpans reads pylimit's file: how many handlers started and ended,
// and the most that ran at once in the plugin.
func readSpans(t *testing.T, path string) (starts, ends, most int) {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return 0, 0, 0
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 4 {
			t.Fatalf("%s: a line %q", path, sc.Text())
		}
		switch fields[0] {
		case "start":
			starts++
			n, _ := strconv.Atoi(fields[2])
			most = max(most, n)
		case "end":
			ends++
		}
	}
	return starts, ends, most
}
