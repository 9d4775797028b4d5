package local

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// Environment of TestHelperClaimer, set by TestLimitAcrossProcesses.
const (
	envHelperDB     = "TASKHOST_LOCAL_HELPER_DB"
	envHelperWorker = "TASKHOST_LOCAL_HELPER_WORKER"
	envHelperTopic  = "TASKHOST_LOCAL_HELPER_TOPIC"
)

// TestLimitAcrossProcesses runs claimers in three OS processes (this test
// binary re-executed as TestHelperClaimer) on one file with a topic limited
// to 2, while this process samples the running count through its own
// Broker: it never exceeds 2, and every message ends done, acked exactly
// once.
func TestLimitAcrossProcesses(t *testing.T) {
	const (
		topic = "limited"
		limit = 2
		total = 150
		procs = 3
	)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "taskhost.db")
	b := openTest(t, Options{Path: path})
	if _, err := b.SetTopic(ctx, topic, broker.TopicPatch{ConcurrencyLimit: ptr(limit)}); err != nil {
		t.Fatal(err)
	}
	for range total {
		mustSubmit(t, b, topic)
	}

	type proc struct {
		cmd    *exec.Cmd
		stdout bytes.Buffer
		stderr bytes.Buffer
	}
	ps := make([]*proc, procs)
	for i := range ps {
		p := &proc{cmd: exec.Command(os.Args[0], "-test.run=^TestHelperClaimer$", "-test.count=1", "-test.v")}
		p.cmd.Env = append(os.Environ(),
			envHelperDB+"="+path, envHelperWorker+"="+fmt.Sprintf("proc-%d", i), envHelperTopic+"="+topic)
		p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
		if err := p.cmd.Start(); err != nil {
			for _, started := range ps[:i] {
				_ = started.cmd.Process.Kill()
				_ = started.cmd.Wait()
			}
			t.Fatalf("start helper %d: %v", i, err)
		}
		ps[i] = p
	}

	// A failing helper leaves claims running that the others would wait
	// for: on the first failure (or a sample over the limit) stop them all.
	var killOnce sync.Once
	killAll := func() {
		killOnce.Do(func() {
			for _, p := range ps {
				_ = p.cmd.Process.Kill()
			}
		})
	}
	waitErrs := make([]error, procs)
	var waitWG sync.WaitGroup
	for i, p := range ps {
		waitWG.Add(1)
		go func() {
			defer waitWG.Done()
			if waitErrs[i] = p.cmd.Wait(); waitErrs[i] != nil {
				killAll()
			}
		}()
	}
	helpersDone := make(chan struct{})
	go func() { waitWG.Wait(); close(helpersDone) }()

	// Sample the broker's own count until the helpers are done.
	var maxRunning, samples int
	var sampleErr error
sampling:
	for {
		select {
		case <-helpersDone:
			break sampling
		default:
		}
		st, err := b.Stats(ctx)
		if err != nil {
			sampleErr = err
			killAll()
			break
		}
		for _, ts := range st.Topics {
			if ts.Name == topic {
				maxRunning = max(maxRunning, ts.Running)
				samples++
			}
		}
		if maxRunning > limit {
			killAll()
			break
		}
		time.Sleep(time.Millisecond)
	}
	<-helpersDone
	if sampleErr != nil {
		t.Fatalf("Stats: %v", sampleErr)
	}
	if maxRunning > limit {
		t.Fatalf("Stats saw %d running, limit %d", maxRunning, limit)
	}

	acked := map[int64]int{}
	perProc := make([]int, procs)
	for i, p := range ps {
		if waitErrs[i] != nil {
			t.Errorf("helper %d: %v\nstdout:\n%s\nstderr:\n%s", i, waitErrs[i], p.stdout.String(), p.stderr.String())
			continue
		}
		sc := bufio.NewScanner(&p.stdout)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "ACKED "); ok {
				id, err := strconv.ParseInt(rest, 10, 64)
				if err != nil {
					t.Fatalf("helper %d printed %q", i, sc.Text())
				}
				acked[id]++
				perProc[i]++
			}
		}
	}
	if t.Failed() {
		return
	}
	t.Logf("%d samples, at most %d running; acks per process %v", samples, maxRunning, perProc)
	if samples == 0 {
		t.Fatalf("no samples taken")
	}
	done, err := b.ListMessages(ctx, broker.MessageFilter{Topic: topic, State: broker.StateDone, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(done) != total {
		t.Fatalf("%d messages done, want %d", len(done), total)
	}
	for _, m := range done {
		if acked[m.ID] != 1 {
			t.Errorf("message %d acked %d times, want once", m.ID, acked[m.ID])
		}
	}
	if len(acked) != total {
		t.Fatalf("helpers acked %d distinct messages, want %d", len(acked), total)
	}
}

// TestHelperClaimer is one claimer process of TestLimitAcrossProcesses; it
// skips unless started by it. It claims 1 to 3 messages at a time, holds
// them a moment, acks them and prints "ACKED id" for each, until its topic
// has nothing queued or running. It also checks the limit itself: a claim
// that returns more than the limit's worth is an error.
func TestHelperClaimer(t *testing.T) {
	path := os.Getenv(envHelperDB)
	if path == "" {
		return // only meaningful as the child of TestLimitAcrossProcesses
	}
	worker, topic := os.Getenv(envHelperWorker), os.Getenv(envHelperTopic)
	ctx := context.Background()
	b, err := Open(ctx, Options{Path: path})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer b.Close()
	rng := rand.New(rand.NewPCG(uint64(os.Getpid()), 7))
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: worker, Topics: []string{topic}, Max: 1 + rng.IntN(3)})
		if err != nil {
			t.Fatalf("Claim: %v", err)
		}
		if len(msgs) > 2 {
			t.Fatalf("one claim returned %d messages past the limit of 2", len(msgs))
		}
		if len(msgs) == 0 {
			st, err := b.Stats(ctx)
			if err != nil {
				t.Fatalf("Stats: %v", err)
			}
			for _, ts := range st.Topics {
				if ts.Name == topic && ts.Queued == 0 && ts.Running == 0 {
					return
				}
			}
			time.Sleep(time.Duration(1+rng.IntN(3)) * time.Millisecond)
			continue
		}
		time.Sleep(time.Duration(1+rng.IntN(4)) * time.Millisecond)
		outcomes := make([]broker.Outcome, len(msgs))
		for i, m := range msgs {
			outcomes[i] = broker.Outcome{Claim: m.ClaimOf()}
		}
		errs, err := b.Ack(ctx, outcomes)
		if err != nil {
			t.Fatalf("Ack: %v", err)
		}
		for i, e := range errs {
			if e != nil {
				t.Fatalf("Ack(%d): %v", msgs[i].ID, e)
			}
			fmt.Printf("ACKED %d\n", msgs[i].ID)
		}
	}
	t.Fatalf("gave up after a minute")
}

// TestOrphanOfKilledProcess: a process claims a message, takes a lock and
// is killed (SIGKILL, no Close). Its commits survive; the reaper's calls
// then expire the worker and reclaim both.
func TestOrphanOfKilledProcess(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "taskhost.db")
	b := openTest(t, Options{Path: path})
	id := mustSubmit(t, b, "crash")
	if err := b.RegisterWorker(ctx, broker.WorkerInfo{ID: "reaper"}); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperCrasher$", "-test.count=1")
	cmd.Env = append(os.Environ(), envHelperDB+"="+path, envHelperWorker+"=doomed", envHelperTopic+"=crash")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	claimed := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "CLAIMED "); ok {
				claimed <- rest
			}
		}
		close(claimed)
	}()
	select {
	case got, ok := <-claimed:
		if !ok || got != strconv.FormatInt(id, 10) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("helper claimed %q (ok %v), want %d; stderr:\n%s", got, ok, id, stderr.String())
		}
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("helper did not claim; stderr:\n%s", stderr.String())
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	m := mustState(t, b, id, broker.StateRunning)
	if m.ClaimedBy != "doomed" {
		t.Fatalf("claimed by %q, want doomed", m.ClaimedBy)
	}
	if ls, _ := b.Locks(ctx); len(ls) != 1 || ls[0].Holder != "doomed" {
		t.Fatalf("Locks = %+v, want the killed process's lock", ls)
	}
	// Still live by its heartbeat; the host knows the process is gone.
	if live, _ := b.LiveWorkers(ctx, time.Minute); !slices.Equal(live, []string{"doomed", "reaper"}) {
		t.Fatalf("LiveWorkers = %v, want [doomed reaper]", live)
	}
	if err := b.ExpireWorker(ctx, "doomed"); err != nil {
		t.Fatal(err)
	}
	live, err := b.LiveWorkers(ctx, time.Minute)
	if err != nil || !slices.Equal(live, []string{"reaper"}) {
		t.Fatalf("LiveWorkers = %v, %v, want [reaper]", live, err)
	}
	res, err := b.ReclaimOrphans(ctx, broker.ReclaimRequest{Live: live, MaxAttempts: 5})
	if err != nil || res.Reclaimed != 1 || res.LocksReleased != 1 {
		t.Fatalf("ReclaimOrphans = %+v, %v, want 1 reclaimed, 1 lock released", res, err)
	}
	again := mustClaim(t, b, "reaper", "crash")
	if again.ID != id || again.Attempts != 2 {
		t.Fatalf("re-claim = %+v, want %d attempt 2", again, id)
	}
	if ok, err := b.AcquireLock(ctx, "crash-lock", "reaper", again.ClaimOf()); err != nil || !ok {
		t.Fatalf("AcquireLock after the reclaim = %v, %v", ok, err)
	}
}

// TestHelperCrasher is the doomed process of TestOrphanOfKilledProcess: it
// registers, claims one message, takes a lock, prints "CLAIMED id" and
// waits to be killed.
func TestHelperCrasher(t *testing.T) {
	path := os.Getenv(envHelperDB)
	if path == "" {
		return // only meaningful as the child of TestOrphanOfKilledProcess
	}
	worker, topic := os.Getenv(envHelperWorker), os.Getenv(envHelperTopic)
	ctx := context.Background()
	b, err := Open(ctx, Options{Path: path})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if err := b.RegisterWorker(ctx, broker.WorkerInfo{ID: worker}); err != nil {
		t.Fatal(err)
	}
	msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: worker, Topics: []string{topic}, Max: 1})
	if err != nil || len(msgs) != 1 {
		t.Fatalf("Claim = %d, %v", len(msgs), err)
	}
	if ok, err := b.AcquireLock(ctx, "crash-lock", worker, msgs[0].ClaimOf()); err != nil || !ok {
		t.Fatalf("AcquireLock = %v, %v", ok, err)
	}
	fmt.Printf("CLAIMED %d\n", msgs[0].ID)
	time.Sleep(time.Minute)
	t.Fatalf("not killed")
}
