package e2e

// Tasks of provider plugins on their stream of attempts, through the real
// host: limits that hold while a task ignores its timeout, a provider
// killed or frozen in the middle of a burn-down, a plugin built before the
// stream, and tasks submitted from inside a task.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// exampleMost is the most tasks that ran at once in the example plugin
// (its GET /running).
func (p *hostProc) exampleMost(t *testing.T) int {
	t.Helper()
	var out struct {
		Most int `json:"most"`
	}
	if _, err := call("GET", p.base+"/plugin-pkg/example/running", nil, &out); err != nil {
		t.Fatal(err)
	}
	return out.Most
}

// TestAProvidersStubbornTaskNeverExceedsItsTopicsLimit: example.stubborn
// ignores its timeout (1 s) and sleeps on. On a topic limited to 1, its
// attempt keeps its slot until the plugin says its code returned, so two
// never run at once in the plugin, however the timeouts fall; each task
// ends (done: a handler that returns success after its timeout wins, as
// in-process). (Before the stream, the host's call was
// cancelled at the timeout and the slot went to the next task while the
// first still ran: the plugin counted 2 at once.)
func TestAProvidersStubbornTaskNeverExceedsItsTopicsLimit(t *testing.T) {
	h := startHost(t, `
listen: LISTEN
plugins_dir: PLUGINS
plugins:
  tasks_worker:
    enabled: true
    config: {broker: memory, workers: 4, heartbeat_interval_seconds: 1, topics: {limited: {concurrency_limit: 1}}}
  example:
    enabled: true
  metrics:
    enabled: true
`)
	h.waitState(t, "tasks_worker", "running", 30*time.Second)
	h.waitState(t, "example", "running", 30*time.Second)
	var ids []string
	ids = append(ids, submitOnceRegistered(t, h, "example.stubborn", `{"task": "example.stubborn", "topic": "limited", "payload": {"seconds": 4.5}, "max_attempts": 1}`))
	for range 2 {
		ids = append(ids, submitTask(t, h, `{"task": "example.stubborn", "topic": "limited", "payload": {"seconds": 4.5}, "max_attempts": 1}`))
	}
	// The metric says an overrun is under way while one runs past its
	// timeout.
	var overran atomic.Bool
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			_, body := getQuiet(h.base + "/plugin-pkg/metrics/api/prometheus")
			if strings.Contains(body, "fp_tasks_worker_fastpluggy_tasks_overrunning 1") {
				overran.Store(true)
			}
		}
	}()
	for _, id := range ids {
		waitFor(t, 2*time.Minute, "stubborn task "+id+" ends", func() bool {
			st := taskState(t, h, id).State
			return st == "dead" || st == "failed" || st == "done"
		})
	}
	close(stop)
	<-sampled
	if most := h.exampleMost(t); most != 1 {
		t.Fatalf("the plugin ran %d stubborn tasks at once on a topic limited to 1", most)
	}
	if !overran.Load() {
		t.Errorf("fastpluggy_tasks_overrunning never read 1 while a task overran its timeout")
	}
	waitFor(t, 60*time.Second, "the WARN about the task that ran on past its timeout is in the host log", func() bool {
		return strings.Contains(h.log.String(), "runs on past its timeout or cancel")
	})
}

// pluginStatus is a plugin's supervisor status, read with the admin token
// (twConfig's hosts have one).
func (p *hostProc) pluginStatus(tb testing.TB, name string) pluginStatus {
	tb.Helper()
	var body struct {
		Plugins []pluginStatus `json:"plugins"`
	}
	if _, err := call("GET", p.base+"/admin/api/plugins", nil, &body); err != nil {
		tb.Fatal(err)
	}
	for _, s := range body.Plugins {
		if s.Name == name {
			return s
		}
	}
	tb.Fatalf("no %s in /admin/api/plugins", name)
	return pluginStatus{}
}

// getQuiet GETs url, answering "" on any failure.
func getQuiet(url string) (int, string) {
	resp, err := sampleClient.Get(url)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, b.String()
}

// TestAProviderKilledOrFrozenMidBurnDownLosesNothing: 10,000 tasks of the
// example plugin on PostgreSQL, run 20 at a time. The plugin is SIGKILLed
// at a tenth done (the host restarts it), then SIGSTOPped for 30 s at half
// done. Every task ends done, exactly once; each attempt has exactly one
// report, and the success is the last attempt's.
func TestAProviderKilledOrFrozenMidBurnDownLosesNothing(t *testing.T) {
	const tasks, batch = 10000, 1000
	schema := pgSchema(t)
	h := startHost(t, twConfig(schema, twOpts{topics: "{default: {}, burn: {concurrency_limit: 20}}"})+`
  example:
    enabled: true
`)
	h.waitWorker(t, 0)
	var ex pluginStatus
	waitFor(t, 30*time.Second, "the example plugin runs", func() bool {
		ex = h.pluginStatus(t, "example")
		return ex.State == "running"
	})
	db := pgConn(t, schema)
	ctx := context.Background()
	waitFor(t, 30*time.Second, "example.sleep is accepted", func() bool {
		_, err := call("POST", h.api("/tasks"), map[string]any{"task": "example.sleep", "topic": "burn", "payload": map[string]float64{"seconds": 0.005}}, nil)
		return err == nil
	})
	slow := &http.Client{Timeout: 2 * time.Minute}
	for i := 1; i < tasks; i += batch {
		n := min(batch, tasks-i)
		items := make([]map[string]any, n)
		for k := range items {
			items[k] = map[string]any{"task": "example.sleep", "topic": "burn", "payload": map[string]float64{"seconds": 0.005}, "max_attempts": 10}
		}
		if _, err := callWith(slow, "POST", h.api("/tasks/batch"), items, nil); err != nil {
			t.Fatalf("submit tasks %d to %d: %v", i, i+n-1, err)
		}
	}
	count := func(where string) int {
		t.Helper()
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM tw_messages_all WHERE `+where).Scan(&n); err != nil {
			t.Fatalf("count messages where %s: %v", where, err)
		}
		return n
	}

	waitFor(t, 5*time.Minute, "a tenth of the tasks done", func() bool { return count("state = 'done'") >= tasks/10 })
	// The Go SDK's provider takes its stream straight from tasks_worker,
	// the host having brokered the connection.
	waitFor(t, time.Minute, "the host log says the stream of attempts to example is direct", func() bool {
		return directStreams(h.log.String()) == 1
	})
	if count("state IN ('queued', 'running')") == 0 {
		t.Fatal("every task was done before the kill")
	}
	t.Logf("SIGKILL the example plugin (pid %d) with %d done", ex.PID, count("state = 'done'"))
	kill(t, ex.PID, syscall.SIGKILL)
	old := ex.PID
	waitFor(t, time.Minute, "the example plugin restarted", func() bool {
		ex = h.pluginStatus(t, "example")
		return ex.State == "running" && ex.PID != old
	})

	waitFor(t, 5*time.Minute, "half the tasks done", func() bool { return count("state = 'done'") >= tasks/2 })
	if n := directStreams(h.log.String()); n < 2 {
		t.Fatalf("%d direct streams of attempts opened in all; want a new one to the restarted plugin", n)
	}
	if count("state IN ('queued', 'running')") == 0 {
		t.Fatal("every task was done before the freeze")
	}
	t.Logf("SIGSTOP the example plugin (pid %d) for 30 s with %d done", ex.PID, count("state = 'done'"))
	kill(t, ex.PID, syscall.SIGSTOP)
	time.Sleep(30 * time.Second) // the freeze itself: what is under test is its length
	kill(t, ex.PID, syscall.SIGCONT)

	waitFor(t, 10*time.Minute, fmt.Sprintf("all %d tasks done", tasks), func() bool { return count("state = 'done'") == tasks })
	if n := count("true"); n != tasks {
		t.Fatalf("%d messages stored, want %d", n, tasks)
	}
	if n := count("attempts > 1"); n == 0 {
		t.Errorf("no task ran twice: the kill caught no attempt in flight")
	}
	rows, err := db.Query(ctx, `
		SELECT m.id, m.attempts,
			count(r.id), count(r.id) FILTER (WHERE r.status = 'success'),
			coalesce(string_agg(r.status || ' of attempt ' || r.attempt, ', ' ORDER BY r.id), '')
		FROM tw_messages_all m LEFT JOIN tw_reports r ON r.message_id = m.id
		GROUP BY m.id, m.attempts
		HAVING count(r.id) <> m.attempts OR count(DISTINCT r.attempt) <> m.attempts
			OR count(r.id) FILTER (WHERE r.status = 'success') <> 1
			OR bool_or(r.status = 'success' AND r.attempt <> m.attempts)
		ORDER BY m.id`)
	if err != nil {
		t.Fatal(err)
	}
	type bad struct {
		id, attempts, reports, successes int64
		which                            string
	}
	wrong, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (bad, error) {
		var b bad
		err := r.Scan(&b.id, &b.attempts, &b.reports, &b.successes, &b.which)
		return b, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(wrong) > 0 {
		var lines []string
		for _, b := range wrong[:min(len(wrong), 20)] {
			lines = append(lines, fmt.Sprintf("message %d (%d attempts): %d reports, %d successes [%s]", b.id, b.attempts, b.reports, b.successes, b.which))
		}
		t.Fatalf("%d of %d tasks do not have one report per attempt and one success, the last:\n%s", len(wrong), tasks, strings.Join(lines, "\n"))
	}
}

// directStreams counts the streams of attempts to the example plugin the
// host log says tasks_worker opened directly.
func directStreams(log string) int {
	n := 0
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "opened a stream of attempts to a task plugin") && strings.Contains(line, "plugin=example") && strings.Contains(line, "path=direct") {
			n++
		}
	}
	return n
}

// TestAPluginBuiltBeforeTheStreamStillRunsItsTasks: a plugin that lists no
// tasks_stream and serves only RunTask (oldprovider, as binaries built
// before the stream answer) runs its tasks one call each.
func TestAPluginBuiltBeforeTheStreamStillRunsItsTasks(t *testing.T) {
	h := startHost(t, `
listen: LISTEN
plugins_dir: PLUGINS
plugins:
  tasks_worker:
    enabled: true
    config: {broker: memory}
  oldtasks:
    enabled: true
`)
	h.waitState(t, "tasks_worker", "running", 30*time.Second)
	h.waitState(t, "oldtasks", "running", 30*time.Second)
	var ids []string
	ids = append(ids, submitOnceRegistered(t, h, "old.greet", `{"task": "old.greet", "payload": {"name": "Grace"}}`))
	for range 20 {
		ids = append(ids, submitTask(t, h, `{"task": "old.greet", "payload": {"name": "Grace"}}`))
	}
	for _, id := range ids {
		var v taskView
		waitFor(t, time.Minute, "old.greet "+id+" is done", func() bool {
			v = taskState(t, h, id)
			return v.State == "done"
		})
		if string(v.Result) != `{"greeting":"hello, Grace"}` || v.Attempts != 1 {
			t.Fatalf("task %s: result %s in %d attempts", id, v.Result, v.Attempts)
		}
	}
}

// TestATaskSubmitsTasksFromItsContext: example.fanout submits its children
// through the host; each records its parent and the plugin that submitted
// it, and runs.
func TestATaskSubmitsTasksFromItsContext(t *testing.T) {
	h := startHost(t, `
listen: LISTEN
plugins_dir: PLUGINS
plugins:
  tasks_worker:
    enabled: true
    config: {broker: memory}
  example:
    enabled: true
`)
	h.waitState(t, "tasks_worker", "running", 30*time.Second)
	h.waitState(t, "example", "running", 30*time.Second)
	parent := submitOnceRegistered(t, h, "example.fanout", `{"task": "example.fanout", "payload": {"count": 3}}`)
	var v taskView
	waitFor(t, time.Minute, "example.fanout is done", func() bool {
		v = taskState(t, h, parent)
		return v.State == "done"
	})
	var res struct {
		Children []string `json:"children"`
	}
	if err := json.Unmarshal(v.Result, &res); err != nil || len(res.Children) != 3 {
		t.Fatalf("fanout's result %s: %v", v.Result, err)
	}
	for _, id := range res.Children {
		var child struct {
			State        string `json:"state"`
			ParentTaskID string `json:"parent_task_id"`
			SubmittedBy  string `json:"submitted_by"`
		}
		waitFor(t, time.Minute, "child "+id+" is done", func() bool {
			_, body := get(t, h.base+"/plugin-pkg/tasks_worker/api/tasks/"+id)
			_ = json.Unmarshal([]byte(body), &child)
			return child.State == "done"
		})
		if child.ParentTaskID != parent || child.SubmittedBy != "plugin:example" {
			t.Fatalf("child %s has parent %q, submitted by %q; want parent %s, submitted by plugin:example", id, child.ParentTaskID, child.SubmittedBy, parent)
		}
	}
}

// TestAProviderThatBreaksTheStreamsRulesChangesNothing: a provider that
// speaks of attempts it was never given, sends empty events and ends an
// attempt twice has those events refused, counted and logged; each task
// ends once, with the first outcome. One that floods its log keeps 1,000
// lines in the report, and neither tasks_worker nor the host grows with
// the flood.
func TestAProviderThatBreaksTheStreamsRulesChangesNothing(t *testing.T) {
	h := startHost(t, `
listen: LISTEN
plugins_dir: PLUGINS
plugins:
  tasks_worker:
    enabled: true
    config: {broker: memory}
  liar:
    enabled: true
  metrics:
    enabled: true
`)
	tw := h.waitState(t, "tasks_worker", "running", 30*time.Second)
	h.waitState(t, "liar", "running", 30*time.Second)
	ids := []string{submitOnceRegistered(t, h, "liar.twice", `{"task": "liar.twice"}`)}
	for range 4 {
		ids = append(ids, submitTask(t, h, `{"task": "liar.twice"}`))
	}
	for _, id := range ids {
		var v taskView
		waitFor(t, time.Minute, "liar.twice "+id+" ends", func() bool {
			v = taskState(t, h, id)
			return v.State == "done" || v.State == "failed" || v.State == "dead"
		})
		if v.State != "done" || string(v.Result) != "1" || v.Attempts != 1 {
			t.Fatalf("task %s: %s with result %s in %d attempts; want done with the first outcome, 1", id, v.State, v.Result, v.Attempts)
		}
	}
	refused := `fp_tasks_worker_fastpluggy_tasks_provider_events_refused_total{plugin="liar"} 15`
	waitFor(t, 30*time.Second, "15 refused events in the scrape", func() bool {
		_, body := getQuiet(h.base + "/plugin-pkg/metrics/api/prometheus")
		return strings.Contains(body, refused)
	})
	waitFor(t, 60*time.Second, "the WARN about the refused events is in the host log", func() bool {
		return strings.Contains(h.log.String(), "refused an event from a task plugin; nothing changed")
	})

	before := rssKiB(t, tw.PID)
	id := submitTask(t, h, `{"task": "liar.flood"}`)
	var v taskView
	waitFor(t, 2*time.Minute, "liar.flood ends", func() bool {
		v = taskState(t, h, id)
		return v.State == "done"
	})
	_, body := get(t, h.base+"/plugin-pkg/tasks_worker/api/reports?task_id="+id)
	var reps struct {
		Reports []struct {
			Logs []string `json:"logs"`
		} `json:"reports"`
	}
	if err := json.Unmarshal([]byte(body), &reps); err != nil || len(reps.Reports) != 1 {
		t.Fatalf("the flood's reports: %s (%v)", body, err)
	}
	logs := reps.Reports[0].Logs
	if len(logs) != 1001 || logs[1000] != "(99000 more lines dropped)" {
		last := ""
		if len(logs) > 0 {
			last = logs[len(logs)-1]
		}
		t.Fatalf("the flood's report keeps %d lines, the last %q; want 1,000 and one that counts 99,000 dropped", len(logs), last)
	}
	// 100 MB of log went through: a side that held it would have grown by
	// that much.
	for name, pid := range map[string]int{"tasks_worker": tw.PID, "host": h.cmd.Process.Pid} {
		if rss := rssKiB(t, pid); rss > 150<<10 {
			t.Errorf("%s holds %d KiB after the flood (%d KiB before tasks_worker's); want it bounded, well under the flood's 100 MB", name, rss, before)
		}
	}
}

// rssKiB is process pid's resident set, in KiB.
func rssKiB(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kib int
			if _, err := fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), &kib); err == nil {
				return kib
			}
		}
	}
	t.Fatalf("no VmRSS for pid %d", pid)
	return 0
}
