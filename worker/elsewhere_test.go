package worker

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/memory"
	"github.com/taskhost/taskhost/broker/postgres"
	"github.com/taskhost/taskhost/internal/testdb"
)

// TestTaskRunByAnotherWorkerWaitsForIt: two workers share a PostgreSQL
// broker and a topic, and only A runs task "x"; B, which does not, claims
// messages of "x" too. B requeues them for A (its attempt given back)
// instead of failing them as unknown: every one ends done, once. A task
// that B registers after it started ("late") is announced at its next
// heartbeat and waits for B the same way. A task no live worker runs
// still fails at once.
func TestTaskRunByAnotherWorkerWaitsForIt(t *testing.T) {
	a, schema := pgBrokerNamed(t)
	dsn := testdb.DSN()
	b, err := postgres.New(t.Context(), postgres.Options{DSN: dsn, Schema: schema, MaxConns: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })

	noop := func(context.Context, *TaskContext) (any, error) { return "ran", nil }
	regA, regB := NewRegistry(), NewRegistry()
	recA, recB := newRecorder(), newRecorder()
	// A's runs of x wait until B has deferred one, so that B claims some
	// of them however the two pools are scheduled.
	bDeferred := make(chan struct{})
	go func() {
		defer close(bDeferred)
		deadline := time.Now().Add(60 * time.Second)
		for recB.count(StatusDeferred) == 0 && time.Now().Before(deadline) && t.Context().Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
	}()
	regA.MustRegister(Task{Name: "x", Handler: func(ctx context.Context, _ *TaskContext) (any, error) {
		select {
		case <-bDeferred:
		case <-ctx.Done():
		}
		return "ran", nil
	}})
	regB.MustRegister(Task{Name: "other", Handler: noop})
	startPool(t, a, regA, Options{Concurrency: 2, Observer: recA, HeartbeatInterval: 100 * time.Millisecond})
	pb := startPool(t, b, regB, Options{Concurrency: 2, Observer: recB, HeartbeatInterval: 100 * time.Millisecond})

	var ids []int64
	for range 20 {
		ids = append(ids, submit(t, a, "x", `{}`))
	}
	for _, id := range ids {
		if m := waitState(t, a, id, broker.StateDone); m.Attempts != 1 || m.ClaimedBy == pb.WorkerID() {
			t.Errorf("message %d: %d attempts, done by %s; want 1 attempt, done by A", id, m.Attempts, m.ClaimedBy)
		}
	}
	if recB.count(StatusDeferred) == 0 {
		t.Error("B deferred no message of x: the test did not make B claim one")
	}

	regB.MustRegister(Task{Name: "late", Handler: noop})
	eventually(t, "B to announce its new task", func() bool {
		ws, err := a.Workers(context.Background())
		if err != nil {
			return false
		}
		for _, w := range ws {
			if w.ID == pb.WorkerID() {
				for _, task := range w.Tasks {
					if task == "late" {
						return true
					}
				}
			}
		}
		return false
	})
	var late []int64
	for range 6 {
		late = append(late, submit(t, a, "late", `{}`))
	}
	for _, id := range late {
		if m := waitState(t, a, id, broker.StateDone); m.Attempts != 1 || m.ClaimedBy != pb.WorkerID() {
			t.Errorf("message %d of late: %d attempts, done by %s; want 1 attempt, done by B", id, m.Attempts, m.ClaimedBy)
		}
	}

	nobody := submit(t, a, "nobody.runs.this", `{}`)
	if m := waitState(t, a, nobody, broker.StateDead); m.Attempts != 1 {
		t.Errorf("message of a task no worker runs: %d attempts, want 1", m.Attempts)
	}
}

// TestTaskRunElsewhereButNotOnItsTopic: B runs task y but does not claim
// topic bulk, where a message of y was submitted; A claims bulk but does
// not run y. No worker will ever run that message, so A fails it as
// unknown instead of handing it back every second for ever.
func TestTaskRunElsewhereButNotOnItsTopic(t *testing.T) {
	b := memory.New()
	noop := func(context.Context, *TaskContext) (any, error) { return "ran", nil }
	regA, regB := NewRegistry(), NewRegistry()
	regA.MustRegister(Task{Name: "a", Topic: "a", Handler: noop})
	regB.MustRegister(Task{Name: "y", Topic: "y", Handler: noop})
	recA := newRecorder()
	startPool(t, b, regA, Options{Topics: []string{"bulk"}, Observer: recA})
	startPool(t, b, regB, Options{})
	id, err := b.Submit(context.Background(), broker.SubmitRequest{Topic: "bulk", Task: "y", Payload: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	if m := waitState(t, b, id, broker.StateDead); m.Attempts != 1 || !strings.Contains(m.LastError, `unknown task "y"`) {
		t.Errorf("message of y on bulk: %d attempts, last error %q; want 1 attempt, failed as unknown", m.Attempts, m.LastError)
	}
	if n := recA.count(StatusDeferred); n != 0 {
		t.Errorf("A deferred the message %d times for a worker that does not claim its topic", n)
	}
}

// TestMessagesWaitForTheWorkerThatRunsTheirTask: A is the only worker that
// runs task x, and it stops (a deploy of its host) with messages of x
// queued. B, which does not run x, claims them meanwhile: with
// UnknownTaskWait it requeues them, their attempts given back, instead of
// failing them as unknown, and once A is back they run, each once. A task
// that nobody runs for longer than the wait still fails as unknown.
func TestMessagesWaitForTheWorkerThatRunsTheirTask(t *testing.T) {
	b := memory.New()
	noop := func(context.Context, *TaskContext) (any, error) { return "ran", nil }
	regA, regB := NewRegistry(), NewRegistry()
	regA.MustRegister(Task{Name: "x", Handler: noop})
	regB.MustRegister(Task{Name: "other", Handler: noop})
	recB := newRecorder()
	startPool(t, b, regB, Options{Concurrency: 2, Observer: recB, UnknownTaskWait: 30 * time.Second})

	var ids []int64
	for range 5 {
		ids = append(ids, submit(t, b, "x", `{}`))
	}
	eventually(t, "B to defer the messages of x while no worker runs it", func() bool { return recB.count(StatusDeferred) >= 5 })
	for _, id := range ids {
		if m, err := b.GetMessage(context.Background(), id); err != nil || m.State == broker.StateDead {
			t.Fatalf("message %d while A is away: %+v, %v; want it waiting", id, m, err)
		}
	}

	startPool(t, b, regA, Options{Concurrency: 2})
	for _, id := range ids {
		if m := waitState(t, b, id, broker.StateDone); m.Attempts != 1 {
			t.Errorf("message %d: %d attempts once A was back, want 1", id, m.Attempts)
		}
	}

	gone := NewRegistry()
	gone.MustRegister(Task{Name: "other2", Handler: noop})
	startPool(t, b, gone, Options{Topics: []string{"lonely"}, UnknownTaskWait: 2 * time.Second})
	start := time.Now()
	id, err := b.Submit(context.Background(), broker.SubmitRequest{Topic: "lonely", Task: "removed", Payload: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	m := waitState(t, b, id, broker.StateDead)
	if took := time.Since(start); took < 2*time.Second || m.Attempts != 1 || !strings.Contains(m.LastError, `unknown task "removed"`) {
		t.Errorf("message of a task no worker runs: %s after %s with %d attempts (%q); want dead as unknown after the 2 s wait, 1 attempt", m.State, took, m.Attempts, m.LastError)
	}
}

// TestTheWaitForAWorkerOutlivesTheProcess: a message that already waited
// for a worker that runs its task carries when the wait began
// (broker.Message.WaitingSince), so a worker that starts later (this process restarted, another
// host) counts from then: with 20 s of a 30 s wait gone, the message fails
// as unknown within about 10 s, not 30 s after this worker first saw it.
func TestTheWaitForAWorkerOutlivesTheProcess(t *testing.T) {
	b := memory.New()
	ctx := context.Background()
	if err := b.RegisterWorker(ctx, broker.WorkerInfo{ID: "before"}); err != nil {
		t.Fatal(err)
	}
	id := submit(t, b, "gone", `{}`)
	ms, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "before", Topics: []string{broker.DefaultTopic}, Max: 1})
	if err != nil || len(ms) != 1 {
		t.Fatalf("claim: %v, %v", ms, err)
	}
	began := time.Now().Add(-20 * time.Second)
	if err := b.Nack(ctx, broker.NackRequest{Claim: ms[0].ClaimOf(), Requeue: true, NotRun: true, WaitingSince: &began,
		Error: "requeued by a worker that is gone"}); err != nil {
		t.Fatal(err)
	}
	if err := b.UnregisterWorker(ctx, "before"); err != nil {
		t.Fatal(err)
	}

	reg := NewRegistry()
	reg.MustRegister(Task{Name: "other", Handler: func(context.Context, *TaskContext) (any, error) { return nil, nil }})
	start := time.Now()
	// As in the plugin, the worker gives tasks it does not know a grace
	// at start first; requeues in that grace keep when the wait began.
	startPool(t, b, reg, Options{UnknownTaskWait: 30 * time.Second, UnknownTaskGrace: 3 * time.Second})
	deadline := time.Now().Add(20 * time.Second)
	for {
		m, err := b.GetMessage(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if m.State == broker.StateDead {
			if took := time.Since(start); took > 15*time.Second || !strings.Contains(m.LastError, `unknown task "gone"`) {
				t.Fatalf("dead after %s (%q); want failed as unknown within about 10 s", took, m.LastError)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("message still %s after 20 s (%q): the wait did not count from when it began", m.State, m.LastError)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
