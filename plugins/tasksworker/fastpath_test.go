package tasksworker

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/local"
	"github.com/taskhost/taskhost/reaper"
)

// goneProcessPID returns the pid of a process that ran and exited.
func goneProcessPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatalf("run true: %v", err)
	}
	if !pidGone(cmd.Process.Pid) {
		t.Fatalf("pid %d still exists", cmd.Process.Pid)
	}
	return cmd.Process.Pid
}

// neighbourhood opens a local store in a temporary file, closed when the
// test ends, and returns it with this machine's host name.
func neighbourhood(t *testing.T) (*local.Broker, string) {
	t.Helper()
	b, err := local.Open(t.Context(), local.Options{Path: filepath.Join(t.TempDir(), "tw.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return b, host
}

// TestFastReclaimLeavesHeartbeatingNeighbours: three workers registered
// from this machine's name with pids that do not exist here. The one that
// stays silent is the previous process, dead: the fast path marks it dead
// and its message goes back to the queue. The one that goes on
// heartbeating runs in another PID namespace (a container with the same
// hostname): it is left alone, and so is its message. So is the one that
// was silent when the fast path first looked but heartbeats before it
// looks again: a live sibling that was late, not a dead process.
func TestFastReclaimLeavesHeartbeatingNeighbours(t *testing.T) {
	ctx := t.Context()
	b, host := neighbourhood(t)
	pid := goneProcessPID(t)
	workers := []string{"dead", "elsewhere", "late"}
	for _, id := range append([]string{"self"}, workers...) {
		p := pid
		if id == "self" {
			p = os.Getpid()
		}
		if err := b.RegisterWorker(ctx, broker.WorkerInfo{ID: id, Host: host, PID: p, Roles: []string{broker.RoleWorker}}); err != nil {
			t.Fatal(err)
		}
	}
	claimed := map[string]int64{}
	for _, id := range workers {
		if _, err := b.Submit(ctx, broker.SubmitRequest{Topic: "q", Task: "t"}); err != nil {
			t.Fatal(err)
		}
		ms, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: id, Topics: []string{"q"}, Max: 1})
		if err != nil || len(ms) != 1 {
			t.Fatalf("claim for %s: %v, %v", id, ms, err)
		}
		claimed[id] = ms[0].ID
	}
	// The window is long beside the heartbeats' pace, so that a loaded
	// machine's late heartbeat is still within it.
	const window = 2 * time.Second
	hbCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for hbCtx.Err() == nil {
			_ = b.Heartbeat(hbCtx, "self")
			_ = b.Heartbeat(hbCtx, "elsewhere")
			time.Sleep(window / 20)
		}
	}()
	// "dead" and "late" have been silent a while when the fast path first
	// looks; "late" begins to heartbeat while it waits, and goes on.
	time.Sleep(window)
	go func() {
		select {
		case <-hbCtx.Done():
			return
		case <-time.After(window / 4):
		}
		for hbCtx.Err() == nil {
			_ = b.Heartbeat(hbCtx, "late")
			time.Sleep(window / 20)
		}
	}()

	s := reaper.DefaultSettings()
	s.Grace = 0
	rp := reaper.New(b, "self", s, hclog.NewNullLogger(), reaper.NewMetrics(prometheus.NewRegistry()))
	reclaimDeadNeighbours(ctx, b, rp, "self", nil, 0, window, hclog.NewNullLogger())

	live, err := b.LiveWorkers(ctx, window)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(live, "elsewhere") || !slices.Contains(live, "late") || slices.Contains(live, "dead") {
		t.Errorf("live workers after the fast path: %v; want elsewhere and late in, dead out", live)
	}
	if m, err := b.GetMessage(ctx, claimed["dead"]); err != nil || m.State != broker.StateQueued {
		t.Errorf("the dead worker's message: %+v, %v; want it back in the queue", m, err)
	}
	for _, id := range []string{"elsewhere", "late"} {
		if m, err := b.GetMessage(ctx, claimed[id]); err != nil || m.State != broker.StateRunning || m.ClaimedBy != id {
			t.Errorf("the message of %s, which heartbeats: %+v, %v; want it still running under %s", id, m, err, id)
		}
	}
}

func TestFastReclaimWindow(t *testing.T) {
	for _, c := range []struct{ heartbeat, after, want time.Duration }{
		{5 * time.Second, 120 * time.Second, 30 * time.Second},
		{20 * time.Second, 120 * time.Second, 60 * time.Second},
		{60 * time.Second, 120 * time.Second, 120 * time.Second},
		{500 * time.Millisecond, 2 * time.Second, 2 * time.Second},
	} {
		if got := fastReclaimWindow(c.heartbeat, c.after); got != c.want {
			t.Errorf("fastReclaimWindow(%s, %s) = %s, want %s", c.heartbeat, c.after, got, c.want)
		}
	}
}

// TestFastReclaimWaitsOutTheGrace: the previous process died just after
// claiming, so its claim is younger than the grace when the fast path has
// watched it stay silent for its window. The pass waits for the grace
// instead of meeting the claim early: the message comes back, and no skip
// is counted, since a plain crash is not the reaper failing closed.
func TestFastReclaimWaitsOutTheGrace(t *testing.T) {
	ctx := t.Context()
	b, host := neighbourhood(t)
	for id, pid := range map[string]int{"self": os.Getpid(), "dead": goneProcessPID(t)} {
		if err := b.RegisterWorker(ctx, broker.WorkerInfo{ID: id, Host: host, PID: pid, Roles: []string{broker.RoleWorker}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Submit(ctx, broker.SubmitRequest{Topic: "q", Task: "t"}); err != nil {
		t.Fatal(err)
	}
	ms, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "dead", Topics: []string{"q"}, Max: 1})
	if err != nil || len(ms) != 1 {
		t.Fatalf("claim: %v, %v", ms, err)
	}
	const window, grace = 300 * time.Millisecond, 1500 * time.Millisecond
	hbCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for hbCtx.Err() == nil {
			_ = b.Heartbeat(hbCtx, "self")
			time.Sleep(window / 10)
		}
	}()

	s := reaper.DefaultSettings()
	s.Grace = grace
	metrics := reaper.NewMetrics(prometheus.NewRegistry())
	rp := reaper.New(b, "self", s, hclog.NewNullLogger(), metrics)
	reclaimDeadNeighbours(ctx, b, rp, "self", nil, grace, window, hclog.NewNullLogger())

	if m, err := b.GetMessage(ctx, ms[0].ID); err != nil || m.State != broker.StateQueued {
		t.Errorf("the dead worker's message: %+v, %v; want it back in the queue", m, err)
	}
	if got := testutil.ToFloat64(metrics.Skipped); got != 0 {
		t.Errorf("orphan_reclaim_skipped_total = %v after the fast path reclaimed a crashed worker's fresh claim, want 0", got)
	}
}

// TestCertainPathTakesAnEndedInstancesWorkAtOnce: the host says instance
// aaaa… ended. Its workers are taken, and the claim of one, made just now,
// comes back at once with its lock, under the default grace and with its
// heartbeat still fresh;
// the worker of another instance, whose pid is gone too, and a worker of
// the ended instance registered under another machine's name are left to
// the reaper. A worker of an ended instance that died holding a suspect
// waits the grace.
func TestCertainPathTakesAnEndedInstancesWorkAtOnce(t *testing.T) {
	ctx := t.Context()
	b, host := neighbourhood(t)
	pid := goneProcessPID(t)
	const ended, other, suspicious = "aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb", "cccccccccccccccc"
	idOf := func(h string, inst string) string { return fmt.Sprintf("%s-%d-%s-0a0b0c", h, pid, inst) }
	workers := map[string]broker.WorkerInfo{
		"dead":       {ID: idOf(host, ended), Host: host, PID: pid},
		"other":      {ID: idOf(host, other), Host: host, PID: pid},
		"elsewhere":  {ID: idOf("elsewhere", ended), Host: "elsewhere", PID: pid},
		"poisoned":   {ID: idOf(host, suspicious), Host: host, PID: pid},
		"self":       {ID: "self", Host: host, PID: os.Getpid()},
		"dead-again": {ID: fmt.Sprintf("%s-%d-%s-0d0e0f", host, pid, ended), Host: host, PID: pid}, // a second pool of that process
	}
	claimed := map[string]broker.Message{}
	for name, w := range workers {
		w.Roles = []string{broker.RoleWorker}
		if err := b.RegisterWorker(ctx, w); err != nil {
			t.Fatal(err)
		}
		if name == "self" || name == "dead-again" {
			continue
		}
		if _, err := b.Submit(ctx, broker.SubmitRequest{Topic: "q", Task: "t"}); err != nil {
			t.Fatal(err)
		}
		ms, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: w.ID, Topics: []string{"q"}, Max: 1})
		if err != nil || len(ms) != 1 {
			t.Fatalf("claim for %s: %v, %v", name, ms, err)
		}
		claimed[name] = ms[0]
	}
	dead := claimed["dead"]
	if ok, err := b.AcquireLock(ctx, "dead-lock", workers["dead"].ID, dead.ClaimOf()); err != nil || !ok {
		t.Fatalf("lock: %v, %v", ok, err)
	}
	// The poisoned worker's message had already lost a worker: orphan it
	// once by name, then give it to the poisoned worker again.
	poisoned := claimed["poisoned"]
	if err := b.Nack(ctx, broker.NackRequest{Claim: poisoned.ClaimOf(), Requeue: true, Suspect: true}); err != nil {
		t.Fatal(err)
	}
	ms, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: workers["poisoned"].ID, Topics: []string{"q"}, Max: 1})
	if err != nil || len(ms) != 1 || !ms[0].Suspect {
		t.Fatalf("claim of the suspect: %+v, %v", ms, err)
	}
	claimed["poisoned"] = ms[0]

	// The grace is long beside the checks made before it ends, which must
	// find the suspect's work still out on a loaded machine too.
	const grace = 4 * time.Second
	s := reaper.DefaultSettings()
	metrics := reaper.NewMetrics(prometheus.NewRegistry())
	rp := reaper.New(b, "self", s, hclog.NewNullLogger(), metrics)
	var wg sync.WaitGroup
	start := time.Now()
	named := reclaimEnded(ctx, b, rp, "self", []string{ended, suspicious}, grace, &wg, hclog.NewNullLogger())
	if !named[workers["dead"].ID] || !named[workers["dead-again"].ID] || !named[workers["poisoned"].ID] || len(named) != 3 {
		t.Errorf("workers taken as dead: %v; want the ended instances' on this machine (dead, dead-again, poisoned)", named)
	}
	m, err := b.GetMessage(ctx, claimed["dead"].ID)
	if err != nil || m.State != broker.StateQueued || !m.Suspect {
		t.Errorf("the ended instance's message: %+v, %v; want it back in the queue at once, suspect", m, err)
	}
	if locks, _ := b.Locks(ctx); len(locks) != 0 {
		t.Errorf("locks after the certain path: %+v; want the dead worker's released", locks)
	}
	for _, name := range []string{"other", "elsewhere", "poisoned"} {
		if m, err := b.GetMessage(ctx, claimed[name].ID); err != nil || m.State != broker.StateRunning {
			t.Errorf("the message of %s: %+v, %v; want it still running", name, m, err)
		}
	}
	live, err := b.LiveWorkers(ctx, time.Minute)
	if err != nil || slices.Contains(live, workers["dead"].ID) || !slices.Contains(live, workers["poisoned"].ID) {
		t.Errorf("live workers: %v, %v; want the dead one out, the poisoned one in until its work is taken", live, err)
	}
	wg.Wait()
	if waited := time.Since(start); waited < grace {
		t.Errorf("the poisoned worker's work came back after %s, before the grace of %s", waited, grace)
	}
	if m, err := b.GetMessage(ctx, claimed["poisoned"].ID); err != nil || m.State != broker.StateQueued {
		t.Errorf("the poisoned worker's message after the grace: %+v, %v; want it back in the queue", m, err)
	}
	if got := testutil.ToFloat64(metrics.Reclaimed); got != 2 {
		t.Errorf("orphans_reclaimed_total = %v, want 2", got)
	}
	if got := testutil.ToFloat64(metrics.Skipped); got != 0 {
		t.Errorf("orphan_reclaim_skipped_total = %v, want 0: no guard refused", got)
	}
}

func TestWorkerIDNamesTheInstance(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	if id := workerIDFor(""); id != "" {
		t.Errorf("workerIDFor without an instance = %q, want the pool's own", id)
	}
	id := workerIDFor("0123456789abcdef")
	w := broker.WorkerInfo{ID: id, Host: host, PID: os.Getpid()}
	if !ofInstance(w, host, "0123456789abcdef") || ofInstance(w, host, "0123456789abcde0") || ofInstance(w, "another", "0123456789abcdef") {
		t.Errorf("worker id %q is not told by its instance and machine alone", id)
	}
	if workerIDFor("0123456789abcdef") == id {
		t.Errorf("two pools of one process share the worker id %q", id)
	}
}
