package tasksworker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/memory"
	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/worker"
)

// goldenMetrics is the public metric surface of tasks_worker: alert rules
// select these names. Renaming or dropping one, or changing its type, is a
// breaking change (deprecate, emit both for a release, then drop).
var goldenMetrics = map[string]dto.MetricType{
	"fastpluggy_broker_topics":                       dto.MetricType_GAUGE,
	"fastpluggy_broker_workers":                      dto.MetricType_GAUGE,
	"fastpluggy_broker_locks":                        dto.MetricType_GAUGE,
	"fastpluggy_broker_topic_queued":                 dto.MetricType_GAUGE,
	"fastpluggy_broker_topic_running":                dto.MetricType_GAUGE,
	"fastpluggy_broker_topic_dead_letter":            dto.MetricType_GAUGE,
	"fastpluggy_broker_topic_subscribers":            dto.MetricType_GAUGE,
	"fastpluggy_broker_topic_paused":                 dto.MetricType_GAUGE,
	"fastpluggy_broker_messages_queued_total":        dto.MetricType_GAUGE,
	"fastpluggy_broker_messages_running_total":       dto.MetricType_GAUGE,
	"fastpluggy_broker_beats":                        dto.MetricType_GAUGE,
	"fastpluggy_broker_oldest_running_claim_seconds": dto.MetricType_GAUGE,
	"fastpluggy_broker_deliveries_rejected_total":    dto.MetricType_COUNTER,
	"fastpluggy_broker_messages_republished_total":   dto.MetricType_COUNTER,
	"fastpluggy_broker_messages_missing":             dto.MetricType_GAUGE,
	"fastpluggy_tasks_submitted_total":               dto.MetricType_COUNTER,
	"fastpluggy_tasks_completed_total":               dto.MetricType_COUNTER,
	"fastpluggy_tasks_failed_total":                  dto.MetricType_COUNTER,
	"fastpluggy_tasks_cancelled_total":               dto.MetricType_COUNTER,
	"fastpluggy_tasks_submitted_per_topic_total":     dto.MetricType_COUNTER,
	"fastpluggy_tasks_completed_per_topic_total":     dto.MetricType_COUNTER,
	"fastpluggy_tasks_failed_per_topic_total":        dto.MetricType_COUNTER,
	"fastpluggy_tasks_running":                       dto.MetricType_GAUGE,
	"fastpluggy_tasks_duration_seconds":              dto.MetricType_HISTOGRAM,
	"fastpluggy_tasks_heartbeat_age_seconds":         dto.MetricType_GAUGE,
	"fastpluggy_schedules_waiting":                   dto.MetricType_GAUGE,
	"fastpluggy_tasks_overrunning":                   dto.MetricType_GAUGE,
}

// scrape collects the plugin's metrics over gRPC and parses them.
func (f *fixture) scrape() map[string]*dto.MetricFamily {
	f.t.Helper()
	m, err := f.client.CollectMetrics(context.Background())
	if err != nil {
		f.t.Fatalf("collect metrics: %v", err)
	}
	if !strings.HasPrefix(m.Format, "text/plain") {
		f.t.Errorf("format = %q, want the text exposition", m.Format)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(m.Body))
	if err != nil {
		f.t.Fatalf("the exposition does not parse: %v\n%s", err, m.Body)
	}
	return fams
}

// value returns the value of the family's series whose labels include
// labels (name=value pairs), or -1.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	mf := fams[name]
	if mf == nil {
		return -1
	}
next:
	for _, m := range mf.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return -1
}

// scrapeUntil scrapes until problems, given each scrape, finds nothing
// wrong, and returns that scrape; after settle it fails the test with what
// was still wrong. The counters and the running gauge move when the worker
// takes up or ends an attempt, just after the state the API shows: a test
// that has seen a state waits for them, it never expects them by now.
func (f *fixture) scrapeUntil(problems func(map[string]*dto.MetricFamily) []string) map[string]*dto.MetricFamily {
	f.t.Helper()
	deadline := time.Now().Add(settle)
	for {
		fams := f.scrape()
		wrong := problems(fams)
		if len(wrong) == 0 {
			return fams
		}
		if time.Now().After(deadline) {
			for _, w := range wrong {
				f.t.Error(w)
			}
			f.t.FailNow()
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestMetricNamesAndTypesAreGolden(t *testing.T) {
	f := start(t, nil)
	// A running claim makes the oldest-claim gauge appear; a finished one
	// the per-topic counters and the histogram.
	sleeper := f.submit(`{"task": "demo.sleep", "payload": {"seconds": 600}}`)
	f.waitState(f.submit(`{"task": "demo.echo"}`), "done")
	f.waitState(f.submit(`{"task": "demo.fail"}`), "dead")
	f.waitState(sleeper, "running")

	f.scrapeUntil(func(fams map[string]*dto.MetricFamily) []string {
		var wrong []string
		for name, typ := range goldenMetrics {
			mf := fams[name]
			switch {
			case mf == nil:
				wrong = append(wrong, fmt.Sprintf("metric %s is missing", name))
			case mf.GetType() != typ:
				wrong = append(wrong, fmt.Sprintf("metric %s is a %s, want a %s", name, mf.GetType(), typ))
			case mf.GetHelp() == "":
				wrong = append(wrong, fmt.Sprintf("metric %s has no HELP text", name))
			}
		}
		for _, name := range []string{"go_goroutines", "process_cpu_seconds_total"} {
			if fams[name] == nil {
				wrong = append(wrong, fmt.Sprintf("%s is missing: the Go and process collectors belong in the registry", name))
			}
		}
		if v := value(fams, "fastpluggy_broker_oldest_running_claim_seconds", "topic", "default"); v < 0 {
			wrong = append(wrong, fmt.Sprintf("oldest running claim of topic default = %v, want a value", v))
		}
		for _, c := range []struct {
			name, what string
			want       float64
		}{
			{"fastpluggy_broker_messages_running_total", "messages running", 1},
			{"fastpluggy_broker_workers", "workers", 1},
			{"fastpluggy_broker_beats", "beats (this process is a beat candidate)", 1},
			{"fastpluggy_tasks_running", "tasks running", 1},
		} {
			if v := value(fams, c.name); v != c.want {
				wrong = append(wrong, fmt.Sprintf("%s = %v, want %v", c.what, v, c.want))
			}
		}
		if v := value(fams, "fastpluggy_broker_topic_dead_letter", "topic", "default"); v != 1 {
			wrong = append(wrong, fmt.Sprintf("dead letters = %v, want 1", v))
		}
		return wrong
	})
}

func TestOldestClaimIsAbsentWithNothingRunning(t *testing.T) {
	f := start(t, nil)
	f.waitState(f.submit(`{"task": "demo.echo"}`), "done")
	fams := f.scrape()
	if mf := fams["fastpluggy_broker_oldest_running_claim_seconds"]; mf != nil {
		t.Errorf("oldest claim emitted with nothing running: %v", mf)
	}
}

func TestCountersStartAtZeroAndMove(t *testing.T) {
	f := start(t, nil)
	fams := f.scrape()
	for _, name := range []string{"fastpluggy_tasks_submitted_total", "fastpluggy_tasks_completed_total", "fastpluggy_tasks_failed_total"} {
		if v := value(fams, name); v != 0 {
			t.Errorf("%s = %v before any task, want 0", name, v)
		}
	}
	for _, reason := range []string{"other_store", "not_a_task"} {
		if v := value(fams, "fastpluggy_broker_deliveries_rejected_total", "reason", reason); v != 0 {
			t.Errorf("fastpluggy_broker_deliveries_rejected_total{reason=%q} = %v, want 0 from the start", reason, v)
		}
	}
	if v := value(fams, "fastpluggy_broker_messages_republished_total", "reason", "missing"); v != 0 {
		t.Errorf(`fastpluggy_broker_messages_republished_total{reason="missing"} = %v, want 0 from the start`, v)
	}
	if v := value(fams, "fastpluggy_broker_messages_missing"); v != 0 {
		t.Errorf("fastpluggy_broker_messages_missing = %v, want 0 on a broker whose queue is its store", v)
	}

	f.waitState(f.submit(`{"task": "demo.echo"}`), "done")
	f.waitState(f.submit(`{"task": "demo.echo"}`), "done")
	f.waitState(f.submit(`{"task": "demo.fail", "max_attempts": 2}`), "dead")

	// The counters move when the outcome is written, just after the state
	// changes: poll.
	deadline := time.Now().Add(settle)
	want := map[string]float64{
		"fastpluggy_tasks_submitted_total":  3,
		"fastpluggy_tasks_completed_total":  2,
		"fastpluggy_tasks_failed_total":     2, // each failed attempt counts
		"fastpluggy_tasks_duration_seconds": 4,
		"fastpluggy_tasks_running":          0,
	}
	for {
		fams = f.scrape()
		ok := true
		for name, w := range want {
			if value(fams, name) != w {
				ok = false
			}
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			for name, w := range want {
				if got := value(fams, name); got != w {
					t.Errorf("%s = %v, want %v", name, got, w)
				}
			}
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	for name, w := range map[string]float64{
		"fastpluggy_tasks_submitted_per_topic_total": 3,
		"fastpluggy_tasks_completed_per_topic_total": 2,
		"fastpluggy_tasks_failed_per_topic_total":    2,
	} {
		if got := value(fams, name, "topic", "default"); got != w {
			t.Errorf("%s{topic=default} = %v, want %v", name, got, w)
		}
	}
}

// failingStats is a broker whose Stats fails.
type failingStats struct{ broker.Broker }

func (failingStats) Stats(context.Context) (broker.Stats, error) {
	return broker.Stats{}, errors.New("database is gone")
}

func TestBrokerGaugesAreLeftOutWhenStatsFails(t *testing.T) {
	f := start(t, nil)
	rt := f.plugin.current()
	f.plugin.swap(&runtime{cfg: rt.cfg, broker: failingStats{rt.broker}, reg: rt.reg, pool: rt.pool,
		svc: f.plugin.newService(rt.cfg, failingStats{rt.broker}, rt.reg, rt.pool, rt.reaper)})
	defer f.plugin.swap(rt)

	fams := f.scrape()
	for name, typ := range goldenMetrics {
		// fastpluggy_broker_messages_missing is the rabbitmq broker's last
		// look at its topic queues, not a read of Stats.
		if name == "fastpluggy_broker_messages_missing" {
			continue
		}
		if strings.HasPrefix(name, "fastpluggy_broker_") && typ == dto.MetricType_GAUGE && fams[name] != nil {
			t.Errorf("%s emitted although Stats failed", name)
		}
	}
	if fams["fastpluggy_tasks_submitted_total"] == nil {
		t.Error("the task counters must not depend on the broker")
	}
	if h, _ := f.plugin.CheckHealth(context.Background()); !strings.Contains(h.Message, "database is gone") {
		t.Errorf("health = %+v", h)
	}
}

// TestScheduledSubmissionsAreCounted: a message the beat submits for a
// schedule counts in the submitted counters like one submitted through the
// API, so submitted and completed agree on a schedule-driven process.
func TestScheduledSubmissionsAreCounted(t *testing.T) {
	f := start(t, map[string]any{"schedules": []any{
		// An interval schedule fires once at once, then an hour later.
		map[string]any{"name": "hourly", "task": "demo.echo", "interval_seconds": 3600},
	}})
	deadline := time.Now().Add(settle)
	for {
		fams := f.scrape()
		if value(fams, "fastpluggy_tasks_completed_total") == 1 {
			if got := value(fams, "fastpluggy_tasks_submitted_total"); got != 1 {
				t.Fatalf("fastpluggy_tasks_submitted_total = %v after the schedule's first run, want 1", got)
			}
			if got := value(fams, "fastpluggy_tasks_submitted_per_topic_total", "topic", "default"); got != 1 {
				t.Fatalf("fastpluggy_tasks_submitted_per_topic_total{topic=default} = %v, want 1", got)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the schedule's first run did not complete within %s (completed_total %v)", settle, value(fams, "fastpluggy_tasks_completed_total"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// refusedHeartbeats is a broker whose heartbeats fail: it answers reads
// and refuses writes, as a local store on a full disk does.
type refusedHeartbeats struct{ broker.Broker }

func (refusedHeartbeats) Heartbeat(context.Context, string) error {
	return errors.New("database or disk is full (13)")
}

// TestRefusedHeartbeatsDegradeHealthAndShowInTheAge: a worker whose
// heartbeats the broker refuses says so in its health (the host shows it
// degraded), and fastpluggy_tasks_heartbeat_age_seconds grows from the
// last one that went through.
func TestRefusedHeartbeatsDegradeHealthAndShowInTheAge(t *testing.T) {
	f := start(t, nil)
	if h, _ := f.plugin.CheckHealth(context.Background()); h.Status != capability.HealthOK {
		t.Fatalf("health before = %+v, want ok", h)
	}
	if age := value(f.scrape(), "fastpluggy_tasks_heartbeat_age_seconds"); age < 0 || age > 10 {
		t.Fatalf("heartbeat age of a healthy worker = %v, want a few seconds at most", age)
	}

	rt := f.plugin.current()
	b := refusedHeartbeats{memory.New()}
	reg := worker.NewRegistry()
	reg.MustRegister(worker.Task{Name: "x", Handler: func(context.Context, *worker.TaskContext) (any, error) { return nil, nil }})
	pool := worker.NewPool(b, reg, worker.Options{HeartbeatInterval: 20 * time.Millisecond, Logger: testLogger(t)})
	if err := pool.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pool.Stop(context.Background()) }()
	f.plugin.swap(&runtime{cfg: rt.cfg, broker: b, reg: reg, pool: pool, svc: f.plugin.newService(rt.cfg, b, reg, pool, nil)})
	defer f.plugin.swap(rt)

	deadline := time.Now().Add(settle)
	for {
		h, _ := f.plugin.CheckHealth(context.Background())
		if h.Status == capability.HealthDegraded {
			if !strings.Contains(h.Message, "refuses this worker's heartbeat") || !strings.Contains(h.Message, "disk is full") {
				t.Fatalf("degraded health = %q, want it to say the heartbeat is refused and why", h.Message)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health = %+v %s after heartbeats began to fail, want degraded", h, settle)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if h := f.do("GET", "/api/health", "").json(t); h["status"] != "degraded" || !strings.Contains(fmt.Sprint(h["error"]), "disk is full") {
		t.Fatalf("GET health = %v, want degraded with the heartbeat's error", h)
	}
	first := value(f.scrape(), "fastpluggy_tasks_heartbeat_age_seconds")
	time.Sleep(300 * time.Millisecond)
	if later := value(f.scrape(), "fastpluggy_tasks_heartbeat_age_seconds"); later < first+0.25 {
		t.Fatalf("heartbeat age went from %v to %v in 0.3 s while every heartbeat failed, want it to grow", first, later)
	}
}

// unreadableWorkers is a broker whose worker list cannot be read.
type unreadableWorkers struct{ broker.Broker }

func (unreadableWorkers) Workers(context.Context) ([]broker.WorkerInfo, error) {
	return nil, errors.New("connection reset")
}

// TestSubmitsAndSchedulesOfOtherHostsTasksWaitForTheWorkerList: whether a
// task this host does not run is run elsewhere is read from the broker's
// worker list; when that cannot be read, a submit of such a task gets a
// 503 (retry), not a 400 (give up) and not a 201 for a task that may not
// exist. A schedule needs no worker to be stored: it is accepted, and not
// shown waiting while that cannot be told (the beat fires it then, and
// its message waits for a worker as every message does).
func TestSubmitsAndSchedulesOfOtherHostsTasksWaitForTheWorkerList(t *testing.T) {
	f := start(t, nil)
	rt := f.plugin.current()
	b := unreadableWorkers{memory.New()}
	reg := worker.NewRegistry()
	reg.MustRegister(worker.Task{Name: "x", Handler: func(context.Context, *worker.TaskContext) (any, error) { return nil, nil }})
	pool := worker.NewPool(b, reg, worker.Options{Logger: testLogger(t)})
	if err := pool.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pool.Stop(context.Background()) }()
	f.plugin.swap(&runtime{cfg: rt.cfg, broker: b, reg: reg, pool: pool, svc: f.plugin.newService(rt.cfg, b, reg, pool, nil)})
	defer f.plugin.swap(rt)

	if res := f.do("POST", "/api/tasks", `{"task": "elsewhere.task", "topic": "default"}`); res.status != http.StatusServiceUnavailable {
		t.Errorf("submit: %d %s, want 503", res.status, res.body)
	}
	res := f.do("POST", "/api/schedules", `{"name": "s", "task": "elsewhere.task", "topic": "default", "interval_seconds": 60}`)
	if res.status != http.StatusCreated || res.json(t)["schedule"].(map[string]any)["waiting"] != nil {
		t.Errorf("schedule: %d %s, want 201, not waiting", res.status, res.body)
	}
}
