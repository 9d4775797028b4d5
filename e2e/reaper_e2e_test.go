package e2e

// Process-level tests of orphan recovery (spec 000) and of the beat's
// leadership: real host and tasks_worker processes on a real PostgreSQL
// (a fresh schema per test), killed and frozen with real signals.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/taskhost/taskhost/internal/testdb"
)

// ---- PostgreSQL ----

// pgConn opens a connection (search_path = schema when not empty), closed
// at cleanup. PostgreSQL being unreachable fails the test.
func pgConn(tb testing.TB, schema string) *pgx.Conn {
	tb.Helper()
	return testdb.Connect(tb, schema)
}

// pgSchema returns a fresh schema name for the broker, dropped at cleanup.
// Call it before starting the hosts that use it: cleanups run last in
// first out, so the hosts are stopped before the schema goes.
func pgSchema(tb testing.TB) string {
	tb.Helper()
	return testdb.FreshSchema(tb, "tw_e2e_")
}

// ---- host configs ----

const reaperToken = "reaper-e2e-admin-token-0123456789"

// twOpts vary a tasks_worker config; zero fields take the defaults.
type twOpts struct {
	topics    string // YAML flow mapping
	grace     string // orphan_claim_grace_seconds
	hostExtra string // more top-level host settings, one per line
	noBeat    bool   // beat: false (never a beat candidate)
}

func twConfig(schema string, o twOpts) string {
	if o.topics == "" {
		o.topics = "{default: {}}"
	}
	if o.grace == "" {
		o.grace = "1"
	}
	return fmt.Sprintf(`
listen: LISTEN
plugins_dir: PLUGINS
restart_budget: 50
admin_token: %s
%s
plugins:
  tasks_worker:
    enabled: true
    config:
      broker: postgres
      dsn: %q
      schema: %s
      workers: 4
      demo_tasks: true
      heartbeat_interval_seconds: 0.5
      orphan_reclaim_interval_seconds: 1
      orphan_reclaim_after_seconds: 2
      orphan_claim_grace_seconds: %s
      orphan_max_attempts: 3
      beat_lease_ttl_seconds: 2
      drain_timeout_seconds: 1
      beat: %t
      topics: %s
`, reaperToken, o.hostExtra, testdb.DSN(), schema, o.grace, !o.noBeat, o.topics)
}

// ---- HTTP ----

var (
	apiClient    = &http.Client{Timeout: 5 * time.Second}
	sampleClient = &http.Client{Timeout: time.Second}
)

// call sends a request with the admin token; errors are returned, not
// fatal, since the plugin is down (503) or frozen while tests poll it.
func call(method, url string, body any, out any) (int, error) {
	return callWith(apiClient, method, url, body, out)
}

func callWith(client *http.Client, method, url string, body any, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+reaperToken)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode >= 300 {
		return resp.StatusCode, fmt.Errorf("%s %s: %d %s", method, url, resp.StatusCode, bytes.TrimSpace(raw))
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s %s: %v in %s", method, url, err, raw)
		}
	}
	return resp.StatusCode, nil
}

func (p *hostProc) api(path string) string { return p.base + "/plugin-pkg/tasks_worker/api" + path }

type twTask struct {
	ID        string          `json:"id"`
	Task      string          `json:"task"`
	Topic     string          `json:"topic"`
	State     string          `json:"state"`
	Attempts  int             `json:"attempts"`
	ClaimedBy *string         `json:"claimed_by"`
	Result    json.RawMessage `json:"result"`
	Error     *string         `json:"error"`
}

func (m twTask) claimer() string {
	if m.ClaimedBy == nil {
		return ""
	}
	return *m.ClaimedBy
}

type twHealth struct {
	WorkerID string `json:"worker_id"`
	Beat     struct {
		Candidate bool  `json:"candidate"`
		Leader    bool  `json:"leader"`
		Term      int64 `json:"term"`
	} `json:"beat"`
}

type twLock struct {
	Name      string `json:"name"`
	Holder    string `json:"holder"`
	MessageID int64  `json:"message_id"`
}

type twTopic struct {
	Name    string `json:"name"`
	Queued  int    `json:"queued"`
	Running int    `json:"running"`
}

func (p *hostProc) submit(task, topic string, payload any) (string, error) {
	var created struct {
		ID string `json:"id"`
	}
	_, err := call("POST", p.api("/tasks"), map[string]any{"task": task, "topic": topic, "payload": payload}, &created)
	if err == nil && created.ID == "" {
		err = fmt.Errorf("submit %s: no id in the answer", task)
	}
	return created.ID, err
}

// mustSubmit submits, retrying while the plugin is restarting.
func (p *hostProc) mustSubmit(t *testing.T, task, topic string, payload any) string {
	t.Helper()
	var id string
	var last error
	waitFor(t, 30*time.Second, "a "+task+" submit is accepted", func() bool {
		id, last = p.submit(task, topic, payload)
		return last == nil
	})
	return id
}

func (p *hostProc) task(id string) (twTask, error) {
	var m twTask
	_, err := call("GET", p.api("/tasks/"+id), nil, &m)
	return m, err
}

func (p *hostProc) health() (twHealth, error) {
	var h twHealth
	_, err := call("GET", p.api("/health"), nil, &h)
	return h, err
}

func (p *hostProc) locks() ([]twLock, error) {
	var body struct {
		Locks []twLock `json:"locks"`
	}
	_, err := call("GET", p.api("/locks"), nil, &body)
	return body.Locks, err
}

func (p *hostProc) topic(name string) (twTopic, bool, error) {
	var body struct {
		Topics []twTopic `json:"topics"`
	}
	if _, err := call("GET", p.api("/topics"), nil, &body); err != nil {
		return twTopic{}, false, err
	}
	for _, tp := range body.Topics {
		if tp.Name == name {
			return tp, true, nil
		}
	}
	return twTopic{}, false, nil
}

// waitTask polls a message until cond holds; poll errors (a restarting or
// frozen plugin) only mean "not yet".
func (p *hostProc) waitTask(t *testing.T, id string, timeout time.Duration, what string, cond func(twTask) bool) twTask {
	t.Helper()
	var m twTask
	waitFor(t, timeout, "message "+id+" "+what, func() bool {
		got, err := p.task(id)
		if err != nil {
			return false
		}
		m = got
		return cond(m)
	})
	return m
}

// worker returns tasks_worker's supervisor status (the admin API needs the
// token these hosts are configured with).
func (p *hostProc) worker(tb testing.TB) pluginStatus {
	tb.Helper()
	var body struct {
		Plugins []pluginStatus `json:"plugins"`
	}
	if _, err := call("GET", p.base+"/admin/api/plugins", nil, &body); err != nil {
		tb.Fatal(err)
	}
	for _, s := range body.Plugins {
		if s.Name == "tasks_worker" {
			return s
		}
	}
	tb.Fatal("no tasks_worker in /admin/api/plugins")
	return pluginStatus{}
}

// waitWorker waits until tasks_worker runs in a process other than
// notPID and answers /api/health, and returns its status and health.
func (p *hostProc) waitWorker(t *testing.T, notPID int) (pluginStatus, twHealth) {
	t.Helper()
	var st pluginStatus
	var h twHealth
	waitFor(t, 60*time.Second, fmt.Sprintf("tasks_worker runs (not as pid %d) and answers", notPID), func() bool {
		st = p.worker(t)
		if st.State != "running" || st.PID == 0 || st.PID == notPID {
			return false
		}
		var err error
		h, err = p.health()
		return err == nil && h.WorkerID != "" && strings.Contains(h.WorkerID, fmt.Sprintf("-%d-", st.PID))
	})
	return st, h
}

// reclaimNow runs the admin action, as an operator with the token would.
func (p *hostProc) reclaimNow(t *testing.T) (message string, result map[string]any) {
	t.Helper()
	var body struct {
		Message string         `json:"message"`
		Result  map[string]any `json:"result"`
	}
	if _, err := call("POST", p.base+"/admin/plugins/tasks_worker/actions/reclaim_orphaned_messages", nil, &body); err != nil {
		t.Fatal(err)
	}
	return body.Message, body.Result
}

func kill(t testing.TB, pid int, sig syscall.Signal) {
	t.Helper()
	if pid <= 0 {
		t.Fatalf("no pid to send %v to", sig)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatalf("kill -%d %d: %v", sig, pid, err)
	}
}

// ---- 1. the brain wedge ----

// TestReaperWedgeClearsAfterSIGKILL is brain#72 on real processes: a topic
// of limit 2 whose two running messages lose their worker to SIGKILL. The
// orphans burn both slots, so the topic cannot dispatch until they are
// reclaimed; the restarted worker (fast path and beat) reclaims them, the
// topic dispatches again, every message ends done, and the topic never
// shows more running than its limit.
func TestReaperWedgeClearsAfterSIGKILL(t *testing.T) {
	schema := pgSchema(t)
	h := startHost(t, twConfig(schema, twOpts{topics: "{wedge: {concurrency_limit: 2}}"}))
	before, _ := h.waitWorker(t, 0)

	// The sleeps must outlast everything up to the SIGKILL below, which
	// a loaded machine can stretch to several seconds: they take 15 s.
	var sleeps, echoes []string
	for range 2 {
		sleeps = append(sleeps, h.mustSubmit(t, "demo.sleep", "wedge", map[string]any{"seconds": 15}))
	}
	for _, id := range sleeps {
		h.waitTask(t, id, 30*time.Second, "runs", func(m twTask) bool { return m.State == "running" })
	}

	// Sample the topic all along: its running count is the gate.
	var (
		mu         sync.Mutex
		maxRunning int
		samples    int
		overLimit  []string
	)
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			tp, ok, err := h.topic("wedge")
			if err != nil || !ok {
				continue // restarting
			}
			mu.Lock()
			samples++
			maxRunning = max(maxRunning, tp.Running)
			if tp.Running > 2 {
				overLimit = append(overLimit, fmt.Sprintf("%s: running %d", time.Now().Format(time.StampMilli), tp.Running))
			}
			mu.Unlock()
		}
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-sampled
	}()

	for i := range 3 {
		echoes = append(echoes, h.mustSubmit(t, "demo.echo", "wedge", map[string]any{"n": i}))
	}
	// The topic is full: the echoes wait behind the two sleeps.
	waitFor(t, 60*time.Second, "the topic shows 2 running and 3 queued", func() bool {
		tp, ok, err := h.topic("wedge")
		return err == nil && ok && tp.Running == 2 && tp.Queued == 3
	})
	for _, id := range echoes {
		if m, err := h.task(id); err != nil || m.State != "queued" {
			t.Fatalf("echo %s behind a full topic: %+v, %v; want queued", id, m, err)
		}
	}

	kill(t, before.PID, syscall.SIGKILL)
	after, _ := h.waitWorker(t, before.PID)
	if after.Restarts < 1 {
		t.Errorf("restarts = %d after a SIGKILL", after.Restarts)
	}

	for _, id := range append(slices.Clone(sleeps), echoes...) {
		h.waitTask(t, id, 120*time.Second, "is done", func(m twTask) bool { return m.State == "done" })
	}
	for _, id := range sleeps {
		m, _ := h.task(id)
		if m.Attempts != 2 || string(m.Result) != `{"slept_seconds":15}` {
			t.Errorf("sleep %s: attempts %d, result %s; want 2 attempts (one orphaned, one run to the end)", id, m.Attempts, m.Result)
		}
	}
	for i, id := range echoes {
		m, _ := h.task(id)
		if m.Attempts != 1 || string(m.Result) != fmt.Sprintf(`{"n":%d}`, i) {
			t.Errorf("echo %s: attempts %d, result %s", id, m.Attempts, m.Result)
		}
	}

	close(stop)
	<-sampled
	mu.Lock()
	defer mu.Unlock()
	if len(overLimit) > 0 {
		t.Errorf("the topic ran more than its limit of 2: %v", overLimit)
	}
	// The two sleeps, orphaned together, are suspects after the restart:
	// the pool runs each alone (worker/suspects.go), so the topic shows 2
	// running only in the window before the SIGKILL, which the wait above
	// saw; the samples must have seen the reruns.
	if samples < 10 || maxRunning < 1 {
		t.Errorf("topic sampled %d times, max running %d; want many samples that saw the reruns", samples, maxRunning)
	}

	// A manual pass runs (the guards trust the live set) and finds nothing.
	msg, res := h.reclaimNow(t)
	if res["skipped"] != nil || res["reclaimed"] != float64(0) || !strings.Contains(msg, "reclaimed 0") {
		t.Errorf("manual pass after recovery: %q %v; want a pass that ran and found nothing", msg, res)
	}
}

// ---- 2. a poison task ----

// TestReaperPoisonTaskIsDeadLettered: demo.crash SIGKILLs whichever worker
// runs it. Each crash orphans it; the reaper requeues it until it has been
// claimed orphan_max_attempts (3) times, then dead-letters it instead of
// letting it take a fourth worker down. Echo tasks trickling in on another
// topic keep completing between the crashes, and all complete.
func TestReaperPoisonTaskIsDeadLettered(t *testing.T) {
	schema := pgSchema(t)
	// A grace of 3 s keeps each restarted worker alive for a while before
	// it reclaims (and runs, and dies of) the poison again, so there is
	// time between the crashes for echo tasks to complete.
	h := startHost(t, twConfig(schema, twOpts{topics: "{poison: {}, default: {}}", grace: "3"}))
	first, _ := h.waitWorker(t, 0)

	var (
		mu     sync.Mutex
		echoes []string
	)
	stop := make(chan struct{})
	trickled := make(chan struct{})
	go func() {
		defer close(trickled)
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			id, err := h.submit("demo.echo", "default", map[string]any{"n": n})
			if err != nil {
				continue // the worker is restarting: this one is not sent
			}
			mu.Lock()
			echoes = append(echoes, id)
			mu.Unlock()
		}
	}()
	stopTrickle := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-trickled
	}
	defer stopTrickle()
	waitFor(t, 30*time.Second, "the first echo task is done", func() bool {
		mu.Lock()
		defer mu.Unlock()
		if len(echoes) == 0 {
			return false
		}
		m, err := h.task(echoes[0])
		return err == nil && m.State == "done"
	})

	poison := h.mustSubmit(t, "demo.crash", "poison", nil)
	m := h.waitTask(t, poison, 120*time.Second, "is dead-lettered", func(m twTask) bool { return m.State == "dead" })
	stopTrickle()
	if m.Attempts != 3 || m.Error == nil || !strings.Contains(*m.Error, "dead-lettered") {
		t.Errorf("poison message: attempts %d, error %v; want 3 attempts and an error saying it was dead-lettered", m.Attempts, m.Error)
	}
	final, health := h.waitWorker(t, first.PID)
	if final.Restarts != 3 {
		t.Errorf("tasks_worker restarted %d times, want 3: one crash per claim of the poison, none after it died", final.Restarts)
	}

	mu.Lock()
	ids := slices.Clone(echoes)
	mu.Unlock()
	if len(ids) < 10 {
		t.Fatalf("only %d echo tasks were submitted", len(ids))
	}
	// Workers that completed echoes, other than the one that survives:
	// the first (before the first crash) and at least one that lived
	// between two crashes.
	doneBy := map[string]int{}
	for _, id := range ids {
		m := h.waitTask(t, id, 60*time.Second, "is done", func(m twTask) bool { return m.State == "done" })
		if !bytes.HasPrefix(m.Result, []byte(`{"n":`)) {
			t.Errorf("echo %s: result %s", id, m.Result)
		}
		doneBy[m.claimer()]++
	}
	delete(doneBy, health.WorkerID)
	if len(doneBy) < 2 {
		t.Errorf("echo tasks were completed by %d crashed worker(s) (%v); want the first and at least one between crashes", len(doneBy), doneBy)
	}
	// Still dead, and still 3: nothing claimed it after it was retired.
	if m, err := h.task(poison); err != nil || m.State != "dead" || m.Attempts != 3 {
		t.Errorf("poison message later: %+v, %v", m, err)
	}
	t.Logf("%d echoes; completed by crashed workers: %v", len(ids), doneBy)
}

// ---- 3. an orphaned lock ----

// TestReaperOrphanedLockIsReleased: a worker dies holding the lock its
// message took. The reaper releases the lock in the same transaction that
// requeues the message, so the message's next run takes the lock at once
// (attempts 2: no lock conflict in between) under the new worker.
func TestReaperOrphanedLockIsReleased(t *testing.T) {
	schema := pgSchema(t)
	h := startHost(t, twConfig(schema, twOpts{}))
	before, bh := h.waitWorker(t, 0)

	id := h.mustSubmit(t, "demo.sleep", "default", map[string]any{"seconds": 30, "lock": "L"})
	h.waitTask(t, id, 30*time.Second, "runs", func(m twTask) bool { return m.State == "running" })
	var held []twLock
	waitFor(t, 60*time.Second, "lock L is held by the running worker", func() bool {
		var err error
		held, err = h.locks()
		return err == nil && len(held) == 1 && held[0].Name == "L" && held[0].Holder == bh.WorkerID &&
			fmt.Sprint(held[0].MessageID) == id
	})

	kill(t, before.PID, syscall.SIGKILL)
	_, ah := h.waitWorker(t, before.PID)
	if ah.WorkerID == bh.WorkerID {
		t.Fatalf("the restarted worker has the old worker id %s", ah.WorkerID)
	}
	waitFor(t, 60*time.Second, "lock L is held by the new worker for the same message", func() bool {
		locks, err := h.locks()
		return err == nil && len(locks) == 1 && locks[0].Name == "L" && locks[0].Holder == ah.WorkerID &&
			fmt.Sprint(locks[0].MessageID) == id
	})
	m, err := h.task(id)
	if err != nil {
		t.Fatal(err)
	}
	if m.Attempts != 2 || (m.State != "running" && m.State != "done") || m.claimer() != ah.WorkerID {
		t.Errorf("message after the restart: %+v; want attempts 2, running or done, claimed by %s", m, ah.WorkerID)
	}
	// The reclaim that requeued the message released the lock too (the
	// restarted process's reclaim of its dead predecessor, which the host
	// saw exit).
	re := regexp.MustCompile(`reclaimed the work of dead workers.*locks_released=1.*reclaimed=1|reclaimed the work of dead workers.*reclaimed=1.*locks_released=1`)
	waitFor(t, 60*time.Second, "a reclaim that took back the message and released its lock together is in the host log", func() bool {
		return re.MatchString(h.log.String())
	})

	// A manual pass leaves the live holder's lock alone.
	msg, res := h.reclaimNow(t)
	if res["skipped"] != nil || res["reclaimed"] != float64(0) || res["locks_released"] != float64(0) {
		t.Errorf("manual pass: %q %v; want a pass that ran and changed nothing", msg, res)
	}
	if locks, err := h.locks(); err != nil || len(locks) != 1 || locks[0].Holder != ah.WorkerID {
		t.Errorf("locks after the manual pass: %+v, %v", locks, err)
	}
}

// ---- 4. a frozen worker ----

// TestReaperFrozenWorkerLosesItsClaim: host A's worker, the beat leader, is
// SIGSTOPped while it runs a message only it serves. Its heartbeat and its
// beat lease lapse; host B's beat takes over and its reaper requeues the
// message (A looks dead). When A is continued, its first run finishes and
// its ack is refused (claim lost), A claims the message again and the
// second run is the one that counts. A, continued, never says it still
// leads.
func TestReaperFrozenWorkerLosesItsClaim(t *testing.T) {
	schema := pgSchema(t)
	a := startHost(t, twConfig(schema, twOpts{topics: "{frozen: {}, default: {}}", hostExtra: "health_interval_seconds: 30"}))
	ast, ah := a.waitWorker(t, 0)
	// A leads before B starts, so B's beat takes over only once A's lease
	// lapses while A is stopped.
	waitFor(t, 30*time.Second, "A leads the beat", func() bool {
		h, err := a.health()
		ah = h
		return err == nil && h.Beat.Leader
	})
	b := startHost(t, twConfig(schema, twOpts{topics: "{default: {}}"}))
	_, bh := b.waitWorker(t, 0)

	id := a.mustSubmit(t, "demo.sleep", "frozen", map[string]any{"seconds": 3})
	a.waitTask(t, id, 30*time.Second, "runs on A", func(m twTask) bool {
		return m.State == "running" && m.claimer() == ah.WorkerID
	})

	t.Cleanup(func() { _ = syscall.Kill(ast.PID, syscall.SIGCONT) })
	kill(t, ast.PID, syscall.SIGSTOP)
	// Read through B: A's plugin cannot answer while it is stopped.
	m := b.waitTask(t, id, 60*time.Second, "is requeued by B's reaper", func(m twTask) bool { return m.State == "queued" })
	if m.Attempts != 1 || m.ClaimedBy != nil || m.Error == nil || !strings.Contains(*m.Error, "orphaned") {
		t.Errorf("requeued message: %+v; want attempts 1, claimed_by empty, an error saying it was orphaned", m)
	}
	if h, err := b.health(); err != nil || !h.Beat.Leader || h.WorkerID != bh.WorkerID || h.Beat.Term <= ah.Beat.Term {
		t.Errorf("B's health while A is stopped: %+v, %v; want B leading at a term after A's %d", h, err, ah.Beat.Term)
	}
	waitFor(t, 60*time.Second, "B's log shows its reaper reclaiming the message", func() bool {
		return strings.Contains(b.log.String(), "reaper reclaimed orphans of dead workers")
	})
	// B does not serve the topic: the message waits for A.
	time.Sleep(time.Second)
	if m, err := b.task(id); err != nil || m.State != "queued" {
		t.Fatalf("message while A is stopped: %+v, %v; want still queued", m, err)
	}

	// From just before A is continued, sample both healths, many at a
	// time: requests queued while A was stopped are served the moment it
	// runs again. A must not say it leads on the lease it held before it
	// was stopped, which B holds now.
	sampler := sampleLeaders(t, [2]*hostProc{a, b}, 4)
	time.Sleep(1500 * time.Millisecond)
	kill(t, ast.PID, syscall.SIGCONT)
	m = b.waitTask(t, id, 60*time.Second, "is done", func(m twTask) bool { return m.State == "done" })
	samples := sampler.stop()
	answered := 0
	for _, s := range samples {
		if s.ok[0] && s.ok[1] {
			answered++
		}
		if s.leaders() > 1 {
			t.Errorf("%s: A and B both say they lead (A at term %d, B at term %d)",
				s.at.Format(time.StampMilli), s.h[0].Beat.Term, s.h[1].Beat.Term)
		}
	}
	if answered < 10 {
		t.Errorf("only %d samples where both hosts answered after A was continued", answered)
	}
	if m.Attempts != 2 || m.claimer() != ah.WorkerID || string(m.Result) != `{"slept_seconds":3}` {
		t.Errorf("message after A continued: %+v; want attempts 2, claimed by A (%s), the second run's result", m, ah.WorkerID)
	}
	// worker/pool.go: "claim lost: the message was taken back from this
	// worker; its outcome is discarded" with op=ack.
	waitFor(t, 60*time.Second, "A's log says the ack of message "+id+" was refused: claim lost", func() bool {
		for _, l := range strings.Split(a.log.String(), "\n") {
			if strings.Contains(strings.ToLower(l), "claim lost") && strings.Contains(l, "op=ack") &&
				regexp.MustCompile(`\bmessage_id=`+id+`\b`).MatchString(l) {
				return true
			}
		}
		return false
	})
	if st := a.worker(t); st.PID != ast.PID || st.Restarts != 0 {
		t.Errorf("A's tasks_worker: pid %d (was %d), restarts %d; the supervisor must not have killed it", st.PID, ast.PID, st.Restarts)
	}
}

// ---- 5. leadership ----

// leaderSample is one look at both hosts' /api/health, taken at once.
type leaderSample struct {
	at  time.Time
	ok  [2]bool
	h   [2]twHealth
	err [2]error
}

func (s leaderSample) leaders() int {
	n := 0
	for i := range 2 {
		if s.ok[i] && s.h[i].Beat.Leader {
			n++
		}
	}
	return n
}

// leaderSampler samples both hosts' beat state every ~50ms from each of
// its goroutines until stopped.
type leaderSampler struct {
	mu      sync.Mutex
	samples []leaderSample
	quit    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once
}

func sampleLeaders(t *testing.T, hosts [2]*hostProc, goroutines int) *leaderSampler {
	ls := &leaderSampler{quit: make(chan struct{})}
	for range goroutines {
		ls.wg.Go(func() {
			for {
				select {
				case <-ls.quit:
					return
				case <-time.After(50 * time.Millisecond):
				}
				var s leaderSample
				var wg sync.WaitGroup
				for i, h := range hosts {
					wg.Go(func() {
						// A frozen host accepts the connection and never
						// answers: give up soon, it cannot answer anyway.
						_, s.err[i] = callWith(sampleClient, "GET", h.api("/health"), nil, &s.h[i])
						s.ok[i] = s.err[i] == nil
					})
				}
				wg.Wait()
				s.at = time.Now()
				ls.mu.Lock()
				ls.samples = append(ls.samples, s)
				ls.mu.Unlock()
			}
		})
	}
	t.Cleanup(func() { ls.stop() })
	return ls
}

// last is the latest sample, or a zero one.
func (ls *leaderSampler) last() leaderSample {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if len(ls.samples) == 0 {
		return leaderSample{}
	}
	return ls.samples[len(ls.samples)-1]
}

// stop ends the sampling and returns every sample, in order.
func (ls *leaderSampler) stop() []leaderSample {
	ls.once.Do(func() { close(ls.quit) })
	ls.wg.Wait()
	ls.mu.Lock()
	defer ls.mu.Unlock()
	out := slices.Clone(ls.samples)
	slices.SortFunc(out, func(a, b leaderSample) int { return a.at.Compare(b.at) })
	return out
}

// TestReaperBeatLeaderFailover: two hosts share a schema; exactly one
// leads the beat. SIGKILL the leader's worker: the other takes over at a
// higher term once the lease runs out, and the killed one, restarted by
// its host, comes back as a standby and stays one. Both are sampled every
// ~50ms for the whole test: never do both say they lead.
func TestReaperBeatLeaderFailover(t *testing.T) {
	schema := pgSchema(t)
	hosts := [2]*hostProc{
		startHost(t, twConfig(schema, twOpts{})),
		startHost(t, twConfig(schema, twOpts{})),
	}
	var pids [2]int
	for i, h := range hosts {
		st, hh := h.waitWorker(t, 0)
		pids[i] = st.PID
		if !hh.Beat.Candidate {
			t.Fatalf("host %d is no beat candidate: %+v", i, hh)
		}
	}

	sampler := sampleLeaders(t, hosts, 1)
	last := sampler.last
	waitFor(t, 30*time.Second, "exactly one host leads", func() bool {
		s := last()
		return s.ok[0] && s.ok[1] && s.leaders() == 1
	})
	steadyFrom := time.Now()
	time.Sleep(3 * time.Second) // a few renewals: the leadership stays put
	s := last()
	leader := 0
	if s.h[1].Beat.Leader {
		leader = 1
	}
	standby := 1 - leader
	term1 := s.h[leader].Beat.Term

	// The leader's host is frozen while its worker dies, so it restarts
	// the worker only after the standby has taken over: otherwise the
	// restarted worker (back within about a second) and the standby race
	// for the expired lease, and either may win it.
	lh := hosts[leader].cmd.Process.Pid
	t.Cleanup(func() { _ = syscall.Kill(lh, syscall.SIGCONT) })
	kill(t, lh, syscall.SIGSTOP)
	killedAt := time.Now()
	kill(t, pids[leader], syscall.SIGKILL)
	var tookOver time.Time
	var term2 int64
	waitFor(t, 30*time.Second, "the standby leads at a higher term", func() bool {
		h, err := hosts[standby].health()
		if err == nil && h.Beat.Leader && h.Beat.Term > term1 {
			tookOver, term2 = time.Now(), h.Beat.Term
			return true
		}
		return false
	})
	kill(t, lh, syscall.SIGCONT)
	_, back := hosts[leader].waitWorker(t, pids[leader])
	backAt := time.Now()
	time.Sleep(4 * time.Second) // the restarted worker campaigns, and must lose
	all := sampler.stop()

	for _, s := range all {
		if s.leaders() > 1 {
			t.Errorf("%s: both hosts lead (terms %d and %d)", s.at.Format(time.StampMilli), s.h[0].Beat.Term, s.h[1].Beat.Term)
		}
		switch {
		case s.at.After(steadyFrom) && s.at.Before(killedAt) && s.ok[0] && s.ok[1]:
			if s.leaders() != 1 || !s.h[leader].Beat.Leader || s.h[leader].Beat.Term != term1 {
				t.Errorf("%s, before the kill: leaders %d, want host %d alone at term %d: %+v", s.at.Format(time.StampMilli), s.leaders(), leader, term1, s.h)
			}
		case s.at.After(backAt) && s.ok[0] && s.ok[1]:
			if s.leaders() != 1 || !s.h[standby].Beat.Leader || s.h[standby].Beat.Term != term2 ||
				s.h[leader].Beat.Leader || !s.h[leader].Beat.Candidate || s.h[leader].WorkerID != back.WorkerID {
				t.Errorf("%s, after the restart: want host %d leading at term %d and the restarted host %d a standby: %+v",
					s.at.Format(time.StampMilli), standby, term2, leader, s.h)
			}
		}
	}
	t.Logf("%d samples; term %d -> %d; takeover %s after the kill (lease ttl 2s)", len(all), term1, term2, tookOver.Sub(killedAt).Round(10*time.Millisecond))
}

// ---- benchmark ----

// BenchmarkKillToRequeue: SIGKILL the worker running a message, and time
// until the message is requeued (or already running again under the
// restarted worker). Each iteration runs a fresh host on a fresh schema,
// so every kill meets the supervisor's first restart backoff; everything
// but kill-to-requeue is outside the timer.
func BenchmarkKillToRequeue(b *testing.B) {
	var total time.Duration
	b.StopTimer()
	for range b.N {
		schema := pgSchema(b)
		h := startHost(b, twConfig(schema, twOpts{grace: "0.5"}))
		var st pluginStatus
		waitFor(b, 60*time.Second, "tasks_worker runs", func() bool {
			st = h.worker(b)
			if st.State != "running" {
				return false
			}
			_, err := h.health()
			return err == nil
		})
		var id string
		waitFor(b, 30*time.Second, "the submit is accepted", func() bool {
			var err error
			id, err = h.submit("demo.sleep", "default", map[string]any{"seconds": 60})
			return err == nil
		})
		var first twTask
		waitFor(b, 30*time.Second, "the message runs", func() bool {
			var err error
			first, err = h.task(id)
			return err == nil && first.State == "running"
		})
		time.Sleep(600 * time.Millisecond) // past the 0.5 s grace: the claim is eligible as soon as its worker is dead
		c := pgConn(b, schema)
		ctx := context.Background()

		b.StartTimer()
		start := time.Now()
		kill(b, st.PID, syscall.SIGKILL)
		for {
			var state string
			var attempts int
			if err := c.QueryRow(ctx, `SELECT state, attempts FROM tw_messages_all WHERE id = $1`, id).Scan(&state, &attempts); err != nil {
				b.Fatal(err)
			}
			if state == "queued" || attempts >= 2 {
				break
			}
			if time.Since(start) > 2*time.Minute {
				b.Fatalf("message %s not requeued 2 minutes after the kill (state %s)", id, state)
			}
			time.Sleep(5 * time.Millisecond)
		}
		total += time.Since(start)
		b.StopTimer()
		h.stop()
		_ = c.Close(ctx)
	}
	b.ReportMetric(total.Seconds()/float64(b.N), "s/op")
}
