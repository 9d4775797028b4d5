package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/memory"
)

// recorder is an Observer that counts statuses.
type recorder struct {
	mu       sync.Mutex
	started  int
	statuses map[string]int
}

func newRecorder() *recorder { return &recorder{statuses: map[string]int{}} }

func (r *recorder) TaskStarted(string) {
	r.mu.Lock()
	r.started++
	r.mu.Unlock()
}

func (r *recorder) TaskFinished(_, _, status string, _ time.Duration) {
	r.mu.Lock()
	r.statuses[status]++
	r.mu.Unlock()
}

func (r *recorder) count(status string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.statuses[status]
}

func testLogger(t *testing.T) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Warn, Output: testWriter{t}})
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// startPool starts a pool over b with fast timings and stops it when the
// test ends.
func startPool(t *testing.T, b broker.Broker, reg *Registry, opts Options) *Pool {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	if opts.ClaimIdleInterval == 0 {
		opts.ClaimIdleInterval = 5 * time.Millisecond
	}
	p := NewPool(b, reg, opts)
	if err := p.Start(context.Background()); err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Stop(context.Background()); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return p
}

func submit(t *testing.T, b broker.Broker, task, payload string) int64 {
	t.Helper()
	id, err := b.Submit(context.Background(), broker.SubmitRequest{Topic: broker.DefaultTopic, Task: task, Payload: json.RawMessage(payload)})
	if err != nil {
		t.Fatalf("submit %s: %v", task, err)
	}
	return id
}

// waitState polls until message id is in state and returns it.
// waitDeadline bounds the waits on a condition: generous, since a loaded
// 2-core machine can hold a goroutine back for seconds, and a message
// requeued for another worker comes back only after a delay of seconds.
const waitDeadline = 60 * time.Second

func waitState(t *testing.T, b broker.Broker, id int64, state string) broker.Message {
	t.Helper()
	deadline := time.Now().Add(waitDeadline)
	var m broker.Message
	for time.Now().Before(deadline) {
		var err error
		m, err = b.GetMessage(context.Background(), id)
		if err != nil {
			t.Fatalf("get message %d: %v", id, err)
		}
		if m.State == state {
			return m
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("message %d is %s (attempts %d, error %q), want %s", id, m.State, m.Attempts, m.LastError, state)
	return m
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitDeadline)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func fastBackoff(int) time.Duration { return time.Millisecond }

func TestTaskRunsAndItsResultIsStored(t *testing.T) {
	b := memory.New()
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "echo", Handler: func(ctx context.Context, tc *TaskContext) (any, error) {
		tc.Logf("echoing %d bytes", len(tc.Payload))
		tc.SetProgress(1)
		return map[string]any{"got": tc.Payload, "attempt": tc.Attempt}, nil
	}})
	rec := newRecorder()
	startPool(t, b, reg, Options{Observer: rec})

	id := submit(t, b, "echo", `{"a":1}`)
	m := waitState(t, b, id, broker.StateDone)
	if got, want := string(m.Result), `{"attempt":1,"got":{"a":1}}`; got != want {
		t.Errorf("result = %s, want %s", got, want)
	}
	eventually(t, "observer done", func() bool { return rec.count(StatusDone) == 1 })
}

func TestFailingTaskIsRetriedThenDead(t *testing.T) {
	b := memory.New()
	reg := NewRegistry()
	var calls atomic.Int32
	reg.MustRegister(Task{Name: "flaky", MaxAttempts: 3, Backoff: fastBackoff, Handler: func(ctx context.Context, tc *TaskContext) (any, error) {
		calls.Add(1)
		return nil, fmt.Errorf("attempt %d broke", tc.Attempt)
	}})
	rec := newRecorder()
	startPool(t, b, reg, Options{Observer: rec})

	id := submit(t, b, "flaky", `{}`)
	m := waitState(t, b, id, broker.StateDead)
	if m.Attempts != 3 || calls.Load() != 3 {
		t.Errorf("attempts = %d, handler calls = %d, want 3 and 3", m.Attempts, calls.Load())
	}
	if m.LastError != "attempt 3 broke" {
		t.Errorf("last error = %q", m.LastError)
	}
	eventually(t, "3 failed attempts observed", func() bool { return rec.count(StatusFailed) == 3 })
}

func TestMessageMaxAttemptsOverridesTheTasks(t *testing.T) {
	b := memory.New()
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "fail", MaxAttempts: 1, Backoff: fastBackoff, Handler: func(context.Context, *TaskContext) (any, error) {
		return nil, errors.New("no")
	}})
	startPool(t, b, reg, Options{})
	id, err := b.Submit(context.Background(), broker.SubmitRequest{Topic: broker.DefaultTopic, Task: "fail", MaxAttempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	if m := waitState(t, b, id, broker.StateDead); m.Attempts != 2 {
		t.Errorf("attempts = %d, want 2", m.Attempts)
	}
}

func TestPanicIsCaught(t *testing.T) {
	b := memory.New()
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "boom", Handler: func(context.Context, *TaskContext) (any, error) {
		panic("kaboom")
	}})
	reg.MustRegister(Task{Name: "ok", Handler: func(context.Context, *TaskContext) (any, error) { return "fine", nil }})
	startPool(t, b, reg, Options{Concurrency: 1})

	m := waitState(t, b, submit(t, b, "boom", `{}`), broker.StateDead)
	if m.LastError != "panic: kaboom" {
		t.Errorf("last error = %q, want %q", m.LastError, "panic: kaboom")
	}
	// The worker goroutine survived.
	waitState(t, b, submit(t, b, "ok", `{}`), broker.StateDone)
}

func TestTimeoutFailsTheAttempt(t *testing.T) {
	b := memory.New()
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "slow", Timeout: 20 * time.Millisecond, Handler: func(ctx context.Context, _ *TaskContext) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}})
	startPool(t, b, reg, Options{})
	m := waitState(t, b, submit(t, b, "slow", `{}`), broker.StateDead)
	if !strings.HasPrefix(m.LastError, "timed out after 20ms") {
		t.Errorf("last error = %q", m.LastError)
	}
}

// TestTimeoutSeenFirstByTheHandlersOwnContext: a handler whose failure
// comes from a context of its own with the same deadline (a gRPC call's,
// as a provider plugin's task makes) can return before the attempt's
// context has seen its deadline pass; the failure is still a timeout.
func TestTimeoutSeenFirstByTheHandlersOwnContext(t *testing.T) {
	b := memory.New()
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "rpc", Timeout: 20 * time.Millisecond, Handler: func(ctx context.Context, _ *TaskContext) (any, error) {
		d, _ := ctx.Deadline()
		own, cancel := context.WithDeadline(context.Background(), d)
		defer cancel()
		<-own.Done()
		return nil, own.Err()
	}})
	startPool(t, b, reg, Options{})
	for range 20 {
		m := waitState(t, b, submit(t, b, "rpc", `{}`), broker.StateDead)
		if !strings.HasPrefix(m.LastError, "timed out after 20ms") {
			t.Fatalf("last error = %q, want a timeout", m.LastError)
		}
	}
}

func TestUnknownTaskEndsWithoutRetry(t *testing.T) {
	b := memory.New()
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "known", Handler: func(context.Context, *TaskContext) (any, error) { return nil, nil }})
	startPool(t, b, reg, Options{})
	m := waitState(t, b, submit(t, b, "nobody.knows", `{}`), broker.StateDead)
	if m.Attempts != 1 || !strings.Contains(m.LastError, "unknown task") {
		t.Errorf("attempts %d, error %q", m.Attempts, m.LastError)
	}
}

func TestNonConcurrentTaskNeverOverlaps(t *testing.T) {
	b := memory.New()
	reg := NewRegistry()
	var now, peak atomic.Int32
	reg.MustRegister(Task{
		Name: "serial", NonConcurrent: true, OnLockConflict: LockRequeue, LockRetryDelay: time.Millisecond,
		Handler: func(ctx context.Context, tc *TaskContext) (any, error) {
			n := now.Add(1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			time.Sleep(5 * time.Millisecond)
			now.Add(-1)
			return nil, nil
		},
	})
	// Two pools on one broker: the lock is the broker's, not the process's.
	startPool(t, b, reg, Options{Concurrency: 4})
	startPool(t, b, reg, Options{Concurrency: 4})
	var ids []int64
	for range 6 {
		ids = append(ids, submit(t, b, "serial", `{}`))
	}
	for _, id := range ids {
		waitState(t, b, id, broker.StateDone)
	}
	if peak.Load() != 1 {
		t.Errorf("%d runs overlapped", peak.Load())
	}
}

// blockingTask registers a task whose first message holds its lock until
// release is closed.
func lockedTasks(t *testing.T, policy string) (*Registry, chan struct{}, chan struct{}) {
	t.Helper()
	reg := NewRegistry()
	running := make(chan struct{}, 10)
	release := make(chan struct{})
	reg.MustRegister(Task{
		Name:           "locked",
		LockKey:        func(p json.RawMessage) string { return "customer-" + string(p) },
		OnLockConflict: policy,
		LockRetryDelay: 10 * time.Millisecond,
		Handler: func(ctx context.Context, tc *TaskContext) (any, error) {
			running <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return "ran", nil
		},
	})
	return reg, running, release
}

func TestLockConflictSkip(t *testing.T) {
	b := memory.New()
	reg, running, release := lockedTasks(t, LockSkip)
	rec := newRecorder()
	startPool(t, b, reg, Options{Observer: rec})

	first := submit(t, b, "locked", `1`)
	<-running
	locks, err := b.Locks(context.Background())
	if err != nil || len(locks) != 1 || locks[0].Name != "customer-1" || locks[0].MessageID != first {
		t.Fatalf("locks = %+v, %v; want customer-1 held by %d", locks, err, first)
	}
	second := submit(t, b, "locked", `1`)
	m := waitState(t, b, second, broker.StateDone)
	if string(m.Result) != `{"skipped":"lock held"}` {
		t.Errorf("skipped result = %s", m.Result)
	}
	other := submit(t, b, "locked", `2`) // another key runs at once
	<-running
	close(release)
	waitState(t, b, first, broker.StateDone)
	waitState(t, b, other, broker.StateDone)
	eventually(t, "one skip observed", func() bool { return rec.count(StatusSkipped) == 1 })
	eventually(t, "locks released", func() bool {
		l, _ := b.Locks(context.Background())
		return len(l) == 0
	})
}

func TestLockConflictRequeue(t *testing.T) {
	b := memory.New()
	reg, running, release := lockedTasks(t, LockRequeue)
	startPool(t, b, reg, Options{})

	first := submit(t, b, "locked", `1`)
	<-running
	second := submit(t, b, "locked", `1`)
	eventually(t, "the second message to be deferred", func() bool {
		m, _ := b.GetMessage(context.Background(), second)
		return strings.Contains(m.LastError, `lock "customer-1" is held`)
	})
	// Deferred again and again while the lock is held...
	time.Sleep(100 * time.Millisecond)
	close(release)
	waitState(t, b, first, broker.StateDone)
	m := waitState(t, b, second, broker.StateDone)
	if string(m.Result) != `"ran"` {
		t.Errorf("second result = %s, want it to have run", m.Result)
	}
	// ...without using up its attempts: it ran once.
	if m.Attempts != 1 {
		t.Errorf("second message: %d attempts after waiting for the lock, want 1", m.Attempts)
	}
}

// claimStealer acks and nacks nothing: every write finds the claim gone, as
// when the reaper or an operator took the message back meanwhile.
type claimStealer struct {
	broker.Broker
	acks, nacks atomic.Int32
}

func (s *claimStealer) Ack(_ context.Context, outcomes []broker.Outcome) ([]error, error) {
	s.acks.Add(1)
	errs := make([]error, len(outcomes))
	for i := range errs {
		errs[i] = broker.ErrClaimLost
	}
	return errs, nil
}

func (s *claimStealer) Nack(context.Context, broker.NackRequest) error {
	s.nacks.Add(1)
	return broker.ErrClaimLost
}

func TestClaimLostIsRecordedAsLost(t *testing.T) {
	b := &claimStealer{Broker: memory.New()}
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "ok", Handler: func(context.Context, *TaskContext) (any, error) { return 1, nil }})
	reg.MustRegister(Task{Name: "bad", Handler: func(context.Context, *TaskContext) (any, error) { return nil, errors.New("bad") }})
	rec := newRecorder()
	startPool(t, b, reg, Options{Observer: rec})

	okID := submit(t, b, "ok", `{}`)
	badID := submit(t, b, "bad", `{}`)
	eventually(t, "two lost attempts", func() bool { return rec.count(StatusLost) == 2 })
	if rec.count(StatusDone) != 0 || rec.count(StatusFailed) != 0 {
		t.Errorf("statuses = %v; a lost attempt is neither done nor failed", rec.statuses)
	}
	// Nothing was written: the messages still belong to whoever took them.
	for _, id := range []int64{okID, badID} {
		if m, _ := b.GetMessage(context.Background(), id); m.State != broker.StateRunning {
			t.Errorf("message %d is %s", id, m.State)
		}
	}
	if b.acks.Load() != 1 || b.nacks.Load() != 1 {
		t.Errorf("acks %d nacks %d: ErrClaimLost must not be retried", b.acks.Load(), b.nacks.Load())
	}
}

func TestStopRequeuesTasksStillRunningAfterDrainTimeout(t *testing.T) {
	b := memory.New()
	reg := NewRegistry()
	started := make(chan struct{})
	reg.MustRegister(Task{Name: "long", Handler: func(ctx context.Context, _ *TaskContext) (any, error) {
		close(started)
		<-ctx.Done()
		return nil, ctx.Err()
	}})
	rec := newRecorder()
	p := NewPool(b, reg, Options{Observer: rec, DrainTimeout: 50 * time.Millisecond, Logger: testLogger(t)})
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	id := submit(t, b, "long", `{}`)
	p.Wake()
	<-started
	if p.Running() != 1 {
		t.Errorf("running = %d", p.Running())
	}

	begin := time.Now()
	if err := p.Stop(context.Background()); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if took := time.Since(begin); took > 2*time.Second {
		t.Errorf("stop took %s", took)
	}
	m, _ := b.GetMessage(context.Background(), id)
	const stopped = "worker stopped before the task finished; requeued"
	if m.State != broker.StateQueued || m.LastError != stopped || m.ClaimedBy != "" || m.Attempts != 0 {
		t.Errorf("after stop: state %s, error %q, claimed by %q, attempts %d; want queued, %q, nobody, 0 (the stop gives the attempt back)",
			m.State, m.LastError, m.ClaimedBy, m.Attempts, stopped)
	}
	if ws, _ := b.Workers(context.Background()); len(ws) != 0 {
		t.Errorf("workers after stop = %+v, want none", ws)
	}
	if rec.count(StatusStopped) != 1 || rec.count(StatusFailed) != 0 {
		t.Errorf("statuses = %v", rec.statuses)
	}
	if p.Running() != 0 {
		t.Errorf("running after stop = %d", p.Running())
	}
}

func TestStopWaitsForTasksThatFinishInTime(t *testing.T) {
	b := memory.New()
	reg := NewRegistry()
	started := make(chan struct{})
	reg.MustRegister(Task{Name: "short", Handler: func(ctx context.Context, _ *TaskContext) (any, error) {
		close(started)
		time.Sleep(50 * time.Millisecond)
		return "finished", ctx.Err()
	}})
	p := NewPool(b, reg, Options{Logger: testLogger(t), ClaimIdleInterval: time.Millisecond})
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	id := submit(t, b, "short", `{}`)
	<-started
	if err := p.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if m, _ := b.GetMessage(context.Background(), id); m.State != broker.StateDone {
		t.Errorf("state = %s, want done: a task that finishes within the drain timeout completes", m.State)
	}
}

func TestStopAbandonsTasksThatIgnoreCancellation(t *testing.T) {
	b := memory.New()
	reg := NewRegistry()
	started := make(chan struct{})
	stuck := make(chan struct{})
	reg.MustRegister(Task{Name: "stubborn", Handler: func(context.Context, *TaskContext) (any, error) {
		close(started)
		<-stuck
		return "too late", nil
	}})
	p := NewPool(b, reg, Options{Logger: testLogger(t), DrainTimeout: -1, AbandonAfter: 20 * time.Millisecond, ClaimIdleInterval: time.Millisecond})
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	id := submit(t, b, "stubborn", `{}`)
	<-started
	if err := p.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if m, _ := b.GetMessage(context.Background(), id); m.State != broker.StateQueued {
		t.Errorf("state = %s, want queued", m.State)
	}
	// The handler returns after Stop: its worker drops the result (the
	// message was requeued) and writes nothing to the stopped pool.
	close(stuck)
	deadline := time.Now().Add(10 * time.Second)
	for p.Running() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the abandoned handler returned, but the pool still counts %d running", p.Running())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if m, _ := b.GetMessage(context.Background(), id); m.State != broker.StateQueued || len(m.Result) != 0 {
		t.Errorf("after the abandoned handler returned: state %s, result %s; want queued, no result", m.State, m.Result)
	}
}

func TestStopTwiceAndStopBeforeStart(t *testing.T) {
	b := memory.New()
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "x", Handler: func(context.Context, *TaskContext) (any, error) { return nil, nil }})

	never := NewPool(b, reg, Options{})
	if err := never.Stop(context.Background()); err != nil {
		t.Errorf("stop before start: %v", err)
	}
	if err := never.Stop(context.Background()); err != nil {
		t.Errorf("second stop before start: %v", err)
	}
	if err := never.Start(context.Background()); !errors.Is(err, ErrStopped) {
		t.Errorf("start after stop = %v, want ErrStopped", err)
	}

	p := NewPool(b, reg, Options{})
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background()); err == nil {
		t.Error("second start succeeded")
	}
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.Stop(context.Background()); err != nil {
				t.Errorf("concurrent stop: %v", err)
			}
		}()
	}
	wg.Wait()
	if err := p.Stop(context.Background()); err != nil {
		t.Errorf("stop after stop: %v", err)
	}
}

// countingBroker counts Claim and Ack calls.
type countingBroker struct {
	broker.Broker
	claims, acks, acked atomic.Int32
	maxAsked            atomic.Int32
}

func (c *countingBroker) Claim(ctx context.Context, req broker.ClaimRequest) ([]broker.Message, error) {
	c.claims.Add(1)
	for {
		m := c.maxAsked.Load()
		if int32(req.Max) <= m || c.maxAsked.CompareAndSwap(m, int32(req.Max)) {
			break
		}
	}
	return c.Broker.Claim(ctx, req)
}

func (c *countingBroker) Ack(ctx context.Context, o []broker.Outcome) ([]error, error) {
	c.acks.Add(1)
	c.acked.Add(int32(len(o)))
	return c.Broker.Ack(ctx, o)
}

func TestManyTasksAllEndDone(t *testing.T) {
	b := &countingBroker{Broker: memory.New()}
	reg := NewRegistry()
	var now, peak atomic.Int32
	reg.MustRegister(Task{Name: "work", Handler: func(ctx context.Context, tc *TaskContext) (any, error) {
		n := now.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(time.Millisecond)
		now.Add(-1)
		return tc.MessageID, nil
	}})
	var ids []int64
	for i := range 200 {
		ids = append(ids, submit(t, b, "work", fmt.Sprint(i)))
	}
	rec := newRecorder()
	startPool(t, b, reg, Options{Concurrency: 8, Observer: rec})
	for _, id := range ids {
		if m := waitState(t, b, id, broker.StateDone); string(m.Result) != fmt.Sprint(id) {
			t.Fatalf("message %d result %s", id, m.Result)
		}
	}
	if peak.Load() > 8 {
		t.Errorf("%d handlers ran at once, concurrency is 8", peak.Load())
	}
	if b.maxAsked.Load() > 8 {
		t.Errorf("a claim asked for %d messages, concurrency is 8", b.maxAsked.Load())
	}
	if b.acked.Load() != 200 {
		t.Errorf("acked %d outcomes, want 200", b.acked.Load())
	}
	t.Logf("200 messages: %d claim calls, %d ack calls, peak %d", b.claims.Load(), b.acks.Load(), peak.Load())
	eventually(t, "200 done observed", func() bool { return rec.count(StatusDone) == 200 })
}

func TestRegistry(t *testing.T) {
	ok := func(context.Context, *TaskContext) (any, error) { return nil, nil }
	reg := NewRegistry()
	if err := reg.Register(Task{Name: "a.b", Handler: ok}); err != nil {
		t.Fatal(err)
	}
	if err := reg.Register(Task{Name: "a.b", Handler: ok}); !errors.Is(err, ErrDuplicateTask) {
		t.Errorf("duplicate: %v", err)
	}
	bad := map[string]Task{
		"empty name":           {Handler: ok},
		"space in name":        {Name: "a b", Handler: ok},
		"leading dot":          {Name: ".a", Handler: ok},
		"no handler":           {Name: "h"},
		"negative attempts":    {Name: "n", MaxAttempts: -1, Handler: ok},
		"unknown lock policy":  {Name: "p", OnLockConflict: "wait", Handler: ok},
		"topic too long":       {Name: "t", Topic: strings.Repeat("x", broker.MaxTopicLen+1), Handler: ok},
		"name too long":        {Name: strings.Repeat("x", broker.MaxTaskLen+1), Handler: ok},
		"negative lock delay":  {Name: "d", LockRetryDelay: -1, Handler: ok},
		"negative timeout set": {Name: "to", Timeout: -1, Handler: ok},
	}
	for name, task := range bad {
		if err := reg.Register(task); err == nil {
			t.Errorf("%s: registered", name)
		}
	}
	got, found := reg.Lookup("a.b")
	if !found || got.Topic != broker.DefaultTopic || got.MaxAttempts != 1 || got.OnLockConflict != LockSkip || got.LockRetryDelay != DefaultLockRetryDelay {
		t.Errorf("defaults not filled in: %+v", got)
	}
	if names := reg.Names(); len(names) != 1 || names[0] != "a.b" {
		t.Errorf("names = %v", names)
	}
}

func TestDefaultBackoff(t *testing.T) {
	cases := map[int]time.Duration{0: time.Second, 1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 9: 256 * time.Second, 10: 5 * time.Minute, 100: 5 * time.Minute}
	for n, want := range cases {
		if got := DefaultBackoff(n); got != want {
			t.Errorf("DefaultBackoff(%d) = %s, want %s", n, got, want)
		}
	}
}

func TestStopLeavesPartOfItsDeadlineToHandBackWork(t *testing.T) {
	b := memory.New()
	reg := NewRegistry()
	started := make(chan struct{})
	reg.MustRegister(Task{Name: "long", Handler: func(ctx context.Context, _ *TaskContext) (any, error) {
		close(started)
		<-ctx.Done()
		return nil, ctx.Err()
	}})
	// The drain timeout is longer than the caller's deadline: the caller
	// wins, and the message is back in the queue before its deadline.
	p := NewPool(b, reg, Options{DrainTimeout: time.Minute, Logger: testLogger(t), ClaimIdleInterval: time.Millisecond})
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	id := submit(t, b, "long", `{}`)
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if ctx.Err() != nil {
		t.Error("stop used its whole deadline")
	}
	if m, _ := b.GetMessage(context.Background(), id); m.State != broker.StateQueued {
		t.Errorf("state = %s, want queued", m.State)
	}
}
