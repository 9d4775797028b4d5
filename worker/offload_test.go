package worker

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/memory"
)

// TestAHandlerThatOverrunsKeepsItsSlot: a handler that runs on past its
// timeout is counted as overrunning, and its message stays running (so its
// topic's limit counts it) until the handler returns; then the attempt
// fails as timed out.
func TestAHandlerThatOverrunsKeepsItsSlot(t *testing.T) {
	b := memory.New()
	release := make(chan struct{})
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "stubborn", Timeout: 20 * time.Millisecond, Handler: func(context.Context, *TaskContext) (any, error) {
		<-release // ignores its context
		return nil, context.DeadlineExceeded
	}})
	p := startPool(t, b, reg, Options{})
	id := submit(t, b, "stubborn", `{}`)
	eventually(t, "the handler to overrun its timeout", func() bool { return p.Overrunning() == 1 })
	if m, err := b.GetMessage(context.Background(), id); err != nil || m.State != broker.StateRunning {
		t.Fatalf("while its handler overruns, the message is %s (%v); want running", m.State, err)
	}
	close(release)
	m := waitState(t, b, id, broker.StateDead)
	if p.Overrunning() != 0 {
		t.Fatalf("%d overrunning after the handler returned", p.Overrunning())
	}
	if m.LastError == "" {
		t.Fatal("no error recorded for the timed-out attempt")
	}
}

// TestACancelledHandlerThatRunsOnIsOverrunning: a cancel request that the
// handler ignores leaves the attempt counted until it returns.
func TestACancelledHandlerThatRunsOnIsOverrunning(t *testing.T) {
	b := memory.New()
	release, started := make(chan struct{}), make(chan struct{}, 1)
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "deaf", Handler: func(context.Context, *TaskContext) (any, error) {
		started <- struct{}{}
		<-release
		return nil, context.Canceled
	}})
	p := startPool(t, b, reg, Options{})
	id := submit(t, b, "deaf", `{}`)
	<-started
	if !p.CancelRunning(id) {
		t.Fatal("CancelRunning found no running attempt")
	}
	eventually(t, "the cancelled handler to count as overrunning", func() bool { return p.Overrunning() == 1 })
	close(release)
	waitState(t, b, id, broker.StateCancelled)
}

// TestOffloadedAttemptsRunBesidesTheWorkers: attempts of an offloaded task
// run on goroutines of their own, so more of them are out at once than
// the pool has workers, up to OffloadSlots, and the workers stay free for
// other tasks meanwhile; past the slots, the workers run them themselves.
func TestOffloadedAttemptsRunBesidesTheWorkers(t *testing.T) {
	b := memory.New()
	release := make(chan struct{})
	var out, most atomic.Int32
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "remote", Offload: true, Handler: func(context.Context, *TaskContext) (any, error) {
		n := out.Add(1)
		defer out.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		<-release
		return nil, nil
	}})
	reg.MustRegister(Task{Name: "local", Handler: func(context.Context, *TaskContext) (any, error) { return "ok", nil }})
	startPool(t, b, reg, Options{Concurrency: 2, OffloadSlots: func() int { return 10 }})
	var once sync.Once
	done := func() { once.Do(func() { close(release) }) }
	defer done()
	var ids []int64
	for range 10 {
		ids = append(ids, submit(t, b, "remote", `{}`))
	}
	eventually(t, "10 offloaded attempts out", func() bool { return out.Load() == 10 })
	// The workers are free: a local task runs while the ten are out.
	waitState(t, b, submit(t, b, "local", `{}`), broker.StateDone)
	// Past the slots, each worker runs one itself, and no more go out.
	for range 20 {
		ids = append(ids, submit(t, b, "remote", `{}`))
	}
	eventually(t, "12 attempts out", func() bool { return out.Load() == 12 })
	done()
	for _, id := range ids {
		waitState(t, b, id, broker.StateDone)
	}
	if m := most.Load(); m != 12 {
		t.Fatalf("at most %d offloaded attempts out at once; want 12 (10 slots and 2 workers)", m)
	}
}

// gatedBroker records the size of each claim and, while held, claims
// nothing, so that a test can queue several messages before the pool
// sees any of them.
type gatedBroker struct {
	broker.Broker
	held atomic.Bool
	mu   sync.Mutex
	asks []int // ClaimRequest.Max of each claim made while not held
}

func (g *gatedBroker) Claim(ctx context.Context, req broker.ClaimRequest) ([]broker.Message, error) {
	if g.held.Load() {
		return nil, nil
	}
	g.mu.Lock()
	g.asks = append(g.asks, req.Max)
	g.mu.Unlock()
	return g.Broker.Claim(ctx, req)
}

// largestAsk is the largest claim made so far.
func (g *gatedBroker) largestAsk() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Max(append([]int{0}, g.asks...))
}

// submitHeld queues n messages of task while the pool claims nothing,
// then lets it claim them.
func submitHeld(t *testing.T, g *gatedBroker, p *Pool, task string, n int) []int64 {
	t.Helper()
	g.held.Store(true)
	var ids []int64
	for range n {
		ids = append(ids, submit(t, g, task, `{}`))
	}
	g.held.Store(false)
	p.Wake()
	return ids
}

// waitAllClaimed waits until every message of ids is running.
func waitAllClaimed(t *testing.T, b broker.Broker, ids []int64) {
	t.Helper()
	eventually(t, fmt.Sprintf("the %d messages claimed", len(ids)), func() bool {
		for _, id := range ids {
			if m, err := b.GetMessage(context.Background(), id); err != nil || m.State != broker.StateRunning {
				return false
			}
		}
		return true
	})
}

// TestClaimsAreSizedForOffloadedAttempts: once a claim brought attempts of
// offloaded tasks, the next ones ask for the free offload slots besides
// the idle workers; in-process messages such a claim brings past the idle
// workers wait for one (never more handlers run than Concurrency) and all
// run, and while they wait the pool claims no more.
func TestClaimsAreSizedForOffloadedAttempts(t *testing.T) {
	g := &gatedBroker{Broker: memory.New()}
	releaseLocal := make(chan struct{})
	var local, mostLocal atomic.Int32
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "remote", Offload: true, Handler: func(context.Context, *TaskContext) (any, error) { return nil, nil }})
	reg.MustRegister(Task{Name: "local", Handler: func(context.Context, *TaskContext) (any, error) {
		n := local.Add(1)
		defer local.Add(-1)
		for m := mostLocal.Load(); n > m && !mostLocal.CompareAndSwap(m, n); m = mostLocal.Load() {
		}
		<-releaseLocal
		return "ok", nil
	}})
	p := startPool(t, g, reg, Options{Concurrency: 2, OffloadSlots: func() int { return 40 }})
	var once sync.Once
	release := func() { once.Do(func() { close(releaseLocal) }) }
	defer release()

	for _, id := range submitHeld(t, g, p, "remote", 3) {
		waitState(t, g, id, broker.StateDone)
	}
	for _, id := range submitHeld(t, g, p, "remote", 30) {
		waitState(t, g, id, broker.StateDone)
	}
	if got := g.largestAsk(); got <= 2 {
		t.Fatalf("the largest claim asked for %d messages, no more than the 2 workers: offloaded attempts were not claimed for", got)
	}

	// The last claim was of offloaded tasks: the next asks past the
	// workers, and brings in-process messages that wait for them.
	ids := submitHeld(t, g, p, "local", 20)
	waitAllClaimed(t, g, ids)
	eventually(t, "2 in-process handlers running", func() bool { return local.Load() == 2 })
	g.mu.Lock()
	asks := len(g.asks)
	g.mu.Unlock()
	release()
	for _, id := range ids {
		waitState(t, g, id, broker.StateDone)
	}
	if m := mostLocal.Load(); m != 2 {
		t.Fatalf("at most %d in-process handlers ran at once; want 2, the pool's Concurrency", m)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, n := range g.asks[asks:] {
		if n > 2 {
			t.Fatalf("after a claim of in-process messages, a claim asked for %d: more than the 2 workers (asks %v)", n, g.asks)
		}
	}
}

// TestStopRequeuesTheMessagesWaitingForAWorker: in-process messages that a
// claim sized for offloaded attempts brought past the idle workers, and
// that still wait for a worker at Stop, are requeued without running, as
// the message a stopping worker had not started; none is lost.
func TestStopRequeuesTheMessagesWaitingForAWorker(t *testing.T) {
	g := &gatedBroker{Broker: memory.New()}
	var ran atomic.Int32
	started := make(chan struct{}, 1)
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "remote", Offload: true, Handler: func(context.Context, *TaskContext) (any, error) { return nil, nil }})
	reg.MustRegister(Task{Name: "local", Handler: func(ctx context.Context, _ *TaskContext) (any, error) {
		ran.Add(1)
		select {
		case started <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}})
	p := NewPool(g, reg, Options{
		Concurrency: 1, OffloadSlots: func() int { return 10 }, DrainTimeout: 50 * time.Millisecond,
		ClaimIdleInterval: 5 * time.Millisecond, Logger: testLogger(t),
	})
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, id := range submitHeld(t, g, p, "remote", 3) {
		waitState(t, g, id, broker.StateDone)
	}
	ids := submitHeld(t, g, p, "local", 8)
	waitAllClaimed(t, g, ids)
	<-started
	if err := p.Stop(context.Background()); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if n := ran.Load(); n != 1 {
		t.Fatalf("%d handlers ran; want 1, the pool's one worker", n)
	}
	for _, id := range ids {
		m, err := g.GetMessage(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if m.State != broker.StateQueued {
			t.Fatalf("after Stop, message %d is %s; want queued", id, m.State)
		}
	}
}
