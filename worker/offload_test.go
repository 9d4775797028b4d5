package worker

import (
	"context"
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
