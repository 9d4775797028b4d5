package e2e

// Process-level tests of the rabbitmq broker: real host and tasks_worker
// processes sharing one RabbitMQ (a fresh name prefix per test) and one
// PostgreSQL state store (a fresh schema per test), killed and frozen with
// real signals.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/taskhost/taskhost/internal/testrabbit"
)

// rabbitEnv is what hosts sharing one rabbitmq broker share: the RabbitMQ,
// the prefix of their queues and the state store's schema.
type rabbitEnv struct {
	url, prefix, schema string
}

// newRabbitEnv makes a fresh prefix and schema; the queues of topics
// (and of the built-in tasks' topic, default) are deleted at cleanup. RabbitMQ being unreachable fails the test. Call
// it before starting the hosts that use it: cleanups run last in first
// out, so the hosts stop before their queues go.
func newRabbitEnv(tb testing.TB, url string, topics ...string) rabbitEnv {
	tb.Helper()
	e := rabbitEnv{url: url, prefix: testrabbit.Prefix(), schema: pgSchema(tb)}
	queues := []string{e.prefix + ".store"} // the marker of the state store that uses the prefix
	for _, t := range append(topics, "default") {
		q := e.prefix + ".t." + t
		queues = append(queues, q, q+".dead", q+".rejected")
	}
	tb.Cleanup(func() { testrabbit.Delete(tb, url, queues, []string{e.prefix + ".dead"}) })
	return e
}

// config is twConfig on the rabbitmq broker, its state in PostgreSQL.
func (e rabbitEnv) config(o twOpts) string {
	const pg = "      broker: postgres\n"
	c := twConfig(e.schema, o)
	if !strings.Contains(c, pg) {
		panic("twConfig no longer names the postgres broker on a line of its own")
	}
	return strings.Replace(c, pg, fmt.Sprintf("      broker: rabbitmq\n      amqp_url: %q\n      amqp_prefix: %s\n      state_store: postgres\n", e.url, e.prefix), 1)
}

// TestRabbitMQSecondStateStoreOnAPrefixIsRefused: two hosts on one
// RabbitMQ and one amqp_prefix, each with the default state_store: local
// (a store each). The second's tasks_worker does not start: it is failed
// at once, not restarted in a loop, and its error in /admin/ names
// amqp_prefix, both stores and the fix. The first host runs its tasks.
func TestRabbitMQSecondStateStoreOnAPrefixIsRefused(t *testing.T) {
	env := newRabbitEnv(t, testrabbit.URL(t))
	config := func() string {
		return strings.Replace(env.config(twOpts{}), "state_store: postgres\n",
			fmt.Sprintf("state_store: local\n      data_dir: %q\n", t.TempDir()), 1)
	}
	first := startHost(t, config())
	first.pluginPID(t, 0)
	second := startHost(t, config())
	var st pluginStatus
	waitFor(t, 60*time.Second, "the second host's tasks_worker is failed", func() bool {
		st = second.worker(t)
		return st.State == "failed"
	})
	t.Logf("the second host's tasks_worker: %s", st.LastError)
	for _, want := range []string{"plugins.tasks_worker.config: amqp_prefix: the prefix " + strconv.Quote(env.prefix),
		"belongs to state store", "own amqp_prefix", "state_store: postgres", "rabbitmqctl delete_queue", "fix the config file and restart"} {
		if !strings.Contains(st.LastError, want) {
			t.Errorf("last error %q, want it to contain %q", st.LastError, want)
		}
	}
	if st.Restarts != 0 {
		t.Errorf("tasks_worker restarted %d times; a refused prefix is not retried", st.Restarts)
	}
	req, err := http.NewRequest("GET", second.base+"/admin/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+reaperToken)
	resp, err := apiClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(page), template_escape(st.LastError)) {
		t.Errorf("/admin/ does not show the error %q", st.LastError)
	}
	id, err := first.submit("demo.echo", "default", map[string]any{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the first host runs its task", func() bool {
		m, err := first.task(id)
		return err == nil && m.State == "done"
	})
}

// pluginPID waits until h's tasks_worker runs in a process other than
// notPID and answers /api/health; it returns the pid and the worker id.
func (p *hostProc) pluginPID(tb testing.TB, notPID int) (int, string) {
	tb.Helper()
	var pid int
	var worker string
	waitFor(tb, 60*time.Second, fmt.Sprintf("tasks_worker runs (not as pid %d) and answers", notPID), func() bool {
		st := p.worker(tb)
		if st.State != "running" || st.PID == 0 || st.PID == notPID {
			return false
		}
		h, err := p.health()
		if err != nil || !strings.Contains(h.WorkerID, fmt.Sprintf("-%d-", st.PID)) {
			return false
		}
		pid, worker = st.PID, h.WorkerID
		return true
	})
	return pid, worker
}

// killedWorker is what one kill -9 of a worker holding messages gave.
type killedWorker struct {
	// back: from the kill until every message the killed worker held was
	// taken again, from RabbitMQ's redelivery, by a live worker (its
	// second attempt began).
	back time.Duration
	// firstRuns: from the kill until one of them ran under another worker.
	firstRuns time.Duration
	// allRan: from the kill until every one of them ran (or was done)
	// under another worker. They are suspects (their last worker died
	// running them), which a pool runs one at a time, alone: so this is
	// about one task's length per message beyond the first.
	allRan time.Duration
	ids    []string    // the messages the killed worker held
	old    string      // the killed worker's id
	by     *hostProc   // the host that was not killed
	hosts  []*hostProc // both hosts
}

// killWorkerHoldingMessages starts two hosts serving topic k, submits
// sleeps until both run, and kills with SIGKILL the tasks_worker of the
// host whose worker holds more of them. It returns once every sleep that
// worker held runs under another worker (the other host's, or the killed
// one's successor), with the time that took.
func killWorkerHoldingMessages(tb testing.TB, url string, n int) killedWorker {
	tb.Helper()
	env := newRabbitEnv(tb, url, "k")
	cfg := env.config(twOpts{topics: "{k: {}}"})
	hosts := []*hostProc{startHost(tb, cfg), startHost(tb, cfg)}
	pids := make([]int, len(hosts))
	workers := make([]string, len(hosts))
	for i, h := range hosts {
		pids[i], workers[i] = h.pluginPID(tb, 0)
	}
	heldBy := map[string][]string{}
	var ids []string
	for range n {
		id, err := hosts[0].submit("demo.sleep", "k", map[string]any{"seconds": 5})
		if err != nil {
			tb.Fatal(err)
		}
		ids = append(ids, id)
	}
	for _, id := range ids {
		waitFor(tb, 30*time.Second, "sleep "+id+" runs", func() bool {
			m, err := hosts[0].task(id)
			if err != nil || m.State != "running" {
				return false
			}
			heldBy[m.claimer()] = append(heldBy[m.claimer()], id)
			return true
		})
	}
	victim := 0
	if len(heldBy[workers[1]]) > len(heldBy[workers[0]]) {
		victim = 1
	}
	held, other := heldBy[workers[victim]], hosts[1-victim]
	if len(held) == 0 {
		tb.Fatalf("no sleep runs on either host's worker: %v (workers %v)", heldBy, workers)
	}

	killed := time.Now()
	kill(tb, pids[victim], syscall.SIGKILL)
	k := killedWorker{ids: held, old: workers[victim], by: other, hosts: hosts}
	ran := map[string]bool{}
	conn := pgConn(tb, env.schema)
	defer func() { _ = conn.Close(context.Background()) }()
	waitFor(tb, 60*time.Second, "every sleep the killed worker held runs under another worker", func() bool {
		since := time.Since(killed)
		// A take from a redelivery counts in its row's orphaned.
		var retaken int
		if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM tw_messages WHERE id::text = ANY ($1) AND orphaned > 0`, held).Scan(&retaken); err != nil {
			tb.Logf("reading the held messages' rows: %v", err)
			return false
		}
		for _, id := range held {
			m, err := other.task(id)
			if err != nil {
				return false
			}
			if m.claimer() != "" && m.claimer() != workers[victim] && (m.State == "running" || m.State == "done") {
				ran[id] = true
			}
		}
		if k.back == 0 && retaken == len(held) {
			k.back = since
		}
		if k.firstRuns == 0 && len(ran) > 0 {
			k.firstRuns = since
		}
		if len(ran) < len(held) {
			return false
		}
		k.allRan = since
		return k.back > 0
	})
	return k
}

// TestRabbitMQKilledWorkerMessagesRunElsewhere: a worker holding messages
// is killed with SIGKILL. RabbitMQ takes its deliveries back when
// its connection closes, another worker runs them, and each ends done
// after two attempts, the second by another worker. How soon they run
// again is measured by BenchmarkRabbitMQKilledWorkerRecovery.
func TestRabbitMQKilledWorkerMessagesRunElsewhere(t *testing.T) {
	k := killWorkerHoldingMessages(t, testrabbit.URL(t), 4)
	t.Logf("the killed worker's %d messages: all taken again %s after the kill, the first running elsewhere after %s, all after %s",
		len(k.ids), k.back.Round(time.Millisecond), k.firstRuns.Round(time.Millisecond), k.allRan.Round(time.Millisecond))
	for _, id := range k.ids {
		m := k.by.waitTask(t, id, 60*time.Second, "is done", func(m twTask) bool { return m.State == "done" })
		if m.Attempts != 2 || m.claimer() == k.old || string(m.Result) != `{"slept_seconds":5}` {
			t.Errorf("message %s: %+v; want done after 2 attempts, the second by another worker than %s", id, m, k.old)
		}
	}
}

// BenchmarkRabbitMQKilledWorkerRecovery measures, per kill -9 of a worker
// holding messages (fresh hosts each time), the time until all of them
// were taken again by live workers from RabbitMQ's redelivery, reported
// as s/recovery (the median); the time until the first ran under another
// worker as s/first-run; and until all had, as s/all-ran (see
// killedWorker: suspects run one at a time).
func BenchmarkRabbitMQKilledWorkerRecovery(b *testing.B) {
	url := testrabbit.URL(b)
	var back, first, all []time.Duration
	for range b.N {
		k := killWorkerHoldingMessages(b, url, 4)
		back, first, all = append(back, k.back), append(first, k.firstRuns), append(all, k.allRan)
		// Their database connections go now, not at the end of the run.
		for _, h := range k.hosts {
			h.stop()
		}
	}
	for _, d := range [][]time.Duration{back, first, all} {
		slices.Sort(d)
	}
	b.Logf("%d kill -9 recoveries: taken again %v; first running elsewhere %v; all ran %v", len(back), back, first, all)
	b.ReportMetric(back[len(back)/2].Seconds(), "s/recovery")
	b.ReportMetric(first[len(first)/2].Seconds(), "s/first-run")
	b.ReportMetric(all[len(all)/2].Seconds(), "s/all-ran")
	b.ReportMetric(0, "ns/op")
}

// TestRabbitMQFrozenWorkerLateAckIsLost: host A's worker is SIGSTOPped
// while it runs a message. RabbitMQ misses its AMQP heartbeats, closes
// its connection and delivers the message again, to host B, which runs
// it. A, continued, finishes its run: its ack is refused (the claim was
// taken from it) and its attempt is recorded lost; B's run is the one
// that counts.
func TestRabbitMQFrozenWorkerLateAckIsLost(t *testing.T) {
	env := newRabbitEnv(t, testrabbit.URL(t), "frozen")
	// The host must not restart A for not answering its health checks
	// while it is stopped.
	cfg := env.config(twOpts{topics: "{frozen: {}}", hostExtra: "health_interval_seconds: 30"})
	a := startHost(t, cfg)
	apid, aworker := a.pluginPID(t, 0)
	// The sleep must outlast B's start, which a loaded machine can
	// stretch to several seconds, up to A's SIGSTOP.
	id := a.mustSubmit(t, "demo.sleep", "frozen", map[string]any{"seconds": 10})
	a.waitTask(t, id, 30*time.Second, "runs on A", func(m twTask) bool {
		return m.State == "running" && m.claimer() == aworker
	})
	b := startHost(t, cfg)
	_, bworker := b.pluginPID(t, 0)

	t.Cleanup(func() { _ = syscall.Kill(apid, syscall.SIGCONT) })
	kill(t, apid, syscall.SIGSTOP)
	// Read through B: A's plugin cannot answer while it is stopped.
	b.waitTask(t, id, 60*time.Second, "runs on B", func(m twTask) bool {
		return m.State == "running" && m.claimer() == bworker
	})
	kill(t, apid, syscall.SIGCONT)
	m := b.waitTask(t, id, 60*time.Second, "is done", func(m twTask) bool { return m.State == "done" })
	if m.Attempts != 2 || m.claimer() != bworker || string(m.Result) != `{"slept_seconds":10}` {
		t.Errorf("message: %+v; want done after 2 attempts, by B (%s)", m, bworker)
	}
	var reports []reportView
	waitFor(t, 30*time.Second, "a lost report of A's attempt and a success of B's", func() bool {
		reports = b.reportsOf(t, id)
		return strings.Contains(statusesOf(reports), "lost") && strings.Contains(statusesOf(reports), "success")
	})
	if s := statusesOf(reports); s != "lost,success" && s != "success,lost" {
		t.Errorf("reports of message %s: %s; want A's attempt lost and B's success, nothing else", id, s)
	}
	if st := a.worker(t); st.PID != apid || st.Restarts != 0 {
		t.Errorf("A's tasks_worker: pid %d (was %d), restarts %d; the supervisor must not have killed it", st.PID, apid, st.Restarts)
	}
	// A reconnects and serves again.
	waitFor(t, 60*time.Second, "A's health is ok again", func() bool {
		var h struct {
			Status string `json:"status"`
		}
		_, err := call("GET", a.api("/health"), nil, &h)
		return err == nil && h.Status == "ok"
	})
}

// TestRabbitMQLimitAcrossProcesses: 6 claimers (workers) in 3 host
// processes take from a topic of concurrency limit 3. Each process has 2
// workers, so no process alone can fill the limit: the third slot is
// always another process's to take, and the run exercises claimers in
// several processes however the machine schedules them. Two witnesses: the
// state store's running count, sampled through the API all along, and
// the claimers' own account, the start and end of each attempt in its
// report. Neither ever sees more than 3 running, and every task ends done.
func TestRabbitMQLimitAcrossProcesses(t *testing.T) {
	const (
		limit = 3
		total = 90
	)
	env := newRabbitEnv(t, testrabbit.URL(t), "limited")
	var hosts []*hostProc
	for _, workers := range []int{2, 2, 2} {
		cfg := env.config(twOpts{topics: fmt.Sprintf("{limited: {concurrency_limit: %d}}", limit)})
		cfg = strings.Replace(cfg, "      workers: 4\n", fmt.Sprintf("      workers: %d\n", workers), 1)
		hosts = append(hosts, startHost(t, cfg))
	}
	for _, h := range hosts {
		h.pluginPID(t, 0)
	}

	var (
		mu        sync.Mutex
		samples   int
		busy      int
		maxSeen   int
		overLimit []string
	)
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			tp, ok, err := hosts[i%len(hosts)].topic("limited")
			if err != nil || !ok {
				continue
			}
			mu.Lock()
			samples++
			maxSeen = max(maxSeen, tp.Running)
			if tp.Running > 0 {
				busy++
			}
			if tp.Running > limit {
				overLimit = append(overLimit, fmt.Sprintf("%s: %d running", time.Now().Format(time.StampMilli), tp.Running))
			}
			mu.Unlock()
		}
	}()
	stopSampling := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-sampled
	}
	defer stopSampling()

	var ids []string
	for i := range total {
		ids = append(ids, hosts[i%len(hosts)].mustSubmit(t, "demo.sleep", "limited", map[string]any{"seconds": 0.2}))
	}
	doneBy := map[string]int{}
	for _, id := range ids {
		m := hosts[0].waitTask(t, id, 3*time.Minute, "is done", func(m twTask) bool { return m.State == "done" })
		doneBy[m.claimer()]++
	}
	stopSampling()

	// The claimers' own account: each successful attempt's start and end.
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, id := range ids {
		var out struct {
			Reports []struct {
				Status    string    `json:"status"`
				StartedAt time.Time `json:"started_at"`
				EndedAt   time.Time `json:"ended_at"`
			} `json:"reports"`
		}
		waitFor(t, 30*time.Second, "the report of message "+id, func() bool {
			_, err := call("GET", hosts[0].api("/reports?task_id="+id), nil, &out)
			return err == nil && len(out.Reports) > 0
		})
		for _, r := range out.Reports {
			edges = append(edges, edge{r.StartedAt, 1}, edge{r.EndedAt, -1})
		}
	}
	// Ends before starts at the same instant: touching runs do not overlap.
	sort.Slice(edges, func(i, j int) bool {
		if !edges[i].at.Equal(edges[j].at) {
			return edges[i].at.Before(edges[j].at)
		}
		return edges[i].delta < edges[j].delta
	})
	running, maxReported := 0, 0
	for _, e := range edges {
		running += e.delta
		maxReported = max(maxReported, running)
	}

	mu.Lock()
	defer mu.Unlock()
	t.Logf("sampler: %d samples, %d busy, at most %d running; reports: at most %d running at once; done by %v",
		samples, busy, maxSeen, maxReported, doneBy)
	if len(overLimit) > 0 {
		t.Errorf("the state store counted more than %d running: %v", limit, overLimit)
	}
	if maxReported > limit {
		t.Errorf("the workers' reports show %d attempts running at once, limit %d", maxReported, limit)
	}
	if busy == 0 || maxReported == 0 {
		t.Errorf("the witnesses never saw a task running: they did not watch the run")
	}
	if len(doneBy) < 2 {
		t.Errorf("tasks were done by %d worker(s) (%v): the run did not exercise claimers in several processes", len(doneBy), doneBy)
	}
}

// TestRabbitMQPoisonTaskIsDeadLettered: demo.crash kills with SIGKILL
// whichever worker runs it. Each death brings its delivery back; once the
// message has been delivered orphan_max_attempts (3) times, RabbitMQ's
// delivery limit dead-letters it, the broker ends it dead with a reason
// naming the limit, and no fourth worker dies of it.
func TestRabbitMQPoisonTaskIsDeadLettered(t *testing.T) {
	env := newRabbitEnv(t, testrabbit.URL(t), "poison")
	h := startHost(t, env.config(twOpts{topics: "{poison: {}}"}))
	first, _ := h.pluginPID(t, 0)
	id := h.mustSubmit(t, "demo.crash", "poison", nil)
	m := h.waitTask(t, id, 3*time.Minute, "is dead", func(m twTask) bool { return m.State == "dead" })
	var lastErr string
	if m.Error != nil {
		lastErr = *m.Error
	}
	if m.Attempts != 3 || !strings.Contains(lastErr, "delivery limit") {
		t.Errorf("poison message: attempts %d, error %q; want 3 attempts and an error naming the delivery limit", m.Attempts, lastErr)
	}
	h.pluginPID(t, first)
	if st := h.worker(t); st.Restarts != 3 {
		t.Errorf("tasks_worker restarted %d times, want 3: one death per delivery of the poison, none after it was dead-lettered", st.Restarts)
	}
}
