package worker

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/local"
)

// TestSuspectsRunAlone: three messages come back from a worker that died
// running them (the reaper requeued them as orphans), queued ahead of six
// others. Any of the three may be what killed that worker, so each runs
// with nothing beside it: if it kills this process too, nothing else is
// orphaned with it. The other six still run side by side.
func TestSuspectsRunAlone(t *testing.T) {
	ctx := context.Background()
	b, suspectIDs := orphans(t, 3)
	for range 6 {
		submit(t, b, "n", `{}`)
	}

	var (
		running     atomic.Int32
		mu          sync.Mutex
		notAlone    []int64 // suspects that had company
		maxBesides  int32   // most handlers seen at once while no suspect ran
		suspectsRan int
	)
	handler := func(isSuspect bool) Func {
		return func(_ context.Context, tc *TaskContext) (any, error) {
			now := running.Add(1)
			defer running.Add(-1)
			time.Sleep(40 * time.Millisecond)
			after := running.Load()
			mu.Lock()
			defer mu.Unlock()
			if isSuspect {
				suspectsRan++
				if now != 1 || after != 1 {
					notAlone = append(notAlone, tc.MessageID)
				}
			} else {
				maxBesides = max(maxBesides, now, after)
			}
			return nil, nil
		}
	}
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "s", Handler: handler(true)})
	reg.MustRegister(Task{Name: "n", Handler: handler(false)})
	startPool(t, b, reg, Options{Concurrency: 4})
	for _, id := range suspectIDs {
		waitState(t, b, id, broker.StateDone)
	}
	eventually(t, "every message done", func() bool {
		st, err := b.Stats(ctx)
		if err != nil {
			return false
		}
		for _, tp := range st.Topics {
			if tp.Queued+tp.Running > 0 {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	if suspectsRan != 3 || len(notAlone) > 0 {
		t.Errorf("%d suspects ran, %v of them beside other handlers; want 3, each alone", suspectsRan, notAlone)
	}
	if maxBesides < 2 {
		t.Errorf("the other messages ran at most %d at once, want them side by side", maxBesides)
	}
}

// TestOnlyOneSuspectIsHeld: a claim brings three suspects. The pool keeps
// one and gives the other two back at once, still marked as suspects:
// held while the first runs, they would die with it if it is the poison,
// and be orphaned once more without having run.
func TestOnlyOneSuspectIsHeld(t *testing.T) {
	ctx := context.Background()
	b, ids := orphans(t, 3)

	release := make(chan struct{})
	started := make(chan int64, 3)
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "s", Handler: func(_ context.Context, tc *TaskContext) (any, error) {
		started <- tc.MessageID
		<-release
		return nil, nil
	}})
	p := startPool(t, b, reg, Options{Concurrency: 4})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	first := <-started
	for _, id := range ids {
		if id == first {
			continue
		}
		m := waitState(t, b, id, broker.StateQueued)
		if !m.Suspect || !strings.HasPrefix(m.LastError, broker.OrphanedErrorPrefix) {
			t.Errorf("message %d given back (suspect %t) with last error %q: it lost its suspect mark", id, m.Suspect, m.LastError)
		}
	}
	if m, err := b.GetMessage(ctx, first); err != nil || m.State != broker.StateRunning || m.ClaimedBy != p.WorkerID() {
		t.Fatalf("the suspect that runs: %+v, %v", m, err)
	}
	close(release)
	for _, id := range ids {
		if m := waitState(t, b, id, broker.StateDone); m.Attempts != 2 {
			t.Errorf("message %d: %d attempts, want 2 (the orphaned one and the run; a give-back is not an attempt)", id, m.Attempts)
		}
	}
}

// slowNacks is a broker whose Nack is slow to return, as on a loaded
// machine: a suspect given back stays claimed by this worker for as long.
type slowNacks struct {
	*local.Broker
}

func (b slowNacks) Nack(ctx context.Context, req broker.NackRequest) error {
	time.Sleep(300 * time.Millisecond)
	return b.Broker.Nack(ctx, req)
}

// TestASuspectRunsOnlyOnceTheOthersAreBack: the suspect held runs alone
// only once the others given back are back in the queue, not as soon as
// the handlers are idle: while a give-back is still being written, its
// message is still claimed by this worker, and a poison run then would
// orphan it once more without its having run.
func TestASuspectRunsOnlyOnceTheOthersAreBack(t *testing.T) {
	ctx := context.Background()
	lb, ids := orphans(t, 3)
	b := slowNacks{lb}
	var (
		mu        sync.Mutex
		claimedBy []int64 // messages still claimed when a suspect started
	)
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "s", Handler: func(_ context.Context, tc *TaskContext) (any, error) {
		for _, id := range ids {
			if id == tc.MessageID {
				continue
			}
			m, err := lb.GetMessage(ctx, id)
			if err != nil {
				return nil, err
			}
			if m.State == broker.StateRunning {
				mu.Lock()
				claimedBy = append(claimedBy, id)
				mu.Unlock()
			}
		}
		return nil, nil
	}})
	startPool(t, b, reg, Options{Concurrency: 4})
	for _, id := range ids {
		waitState(t, b, id, broker.StateDone)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(claimedBy) > 0 {
		t.Errorf("a suspect started while messages %v were still claimed (given back, not yet requeued)", claimedBy)
	}
}

// orphans opens a local store in a temporary file and leaves n messages
// of task "s" in it as the reaper leaves a dead worker's: requeued, their
// last error saying they were orphaned.
func orphans(t *testing.T, n int) (*local.Broker, []int64) {
	t.Helper()
	ctx := context.Background()
	b, err := local.Open(ctx, local.Options{Path: filepath.Join(t.TempDir(), "tw.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	for _, id := range []string{"dead", "reaper"} {
		if err := b.RegisterWorker(ctx, broker.WorkerInfo{ID: id, Roles: []string{broker.RoleWorker}}); err != nil {
			t.Fatal(err)
		}
	}
	var ids []int64
	for range n {
		ids = append(ids, submit(t, b, "s", `{}`))
	}
	if ms, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "dead", Topics: []string{broker.DefaultTopic}, Max: n}); err != nil || len(ms) != n {
		t.Fatalf("claim for the worker that dies: %v, %v", ms, err)
	}
	if err := b.ExpireWorker(ctx, "dead"); err != nil {
		t.Fatal(err)
	}
	if res, err := b.ReclaimOrphans(ctx, broker.ReclaimRequest{Live: []string{"reaper"}, MaxAttempts: 5}); err != nil || res.Reclaimed != n {
		t.Fatalf("reclaim: %+v, %v", res, err)
	}
	return b, ids
}

// TestASuspectDoesNotStallABusyPool: a pool that holds a suspect claims
// nothing until it can run it alone. While a long task runs, that must
// not last: the suspect goes back after suspectHoldMax and the pool goes
// on with other work. And a suspect of a task the pool does not run is
// not held at all: it goes back, still marked, for a worker that runs it.
func TestASuspectDoesNotStallABusyPool(t *testing.T) {
	for _, tc := range []struct {
		name    string
		runsS   bool
		holdMax time.Duration
	}{
		{"held, then given back while the pool stays busy", true, 300 * time.Millisecond},
		{"not held when the pool does not run its task", false, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func(d time.Duration) { suspectHoldMax = d }(suspectHoldMax)
			suspectHoldMax = tc.holdMax
			b, ids := orphans(t, 1)
			release := make(chan struct{})
			noop := func(context.Context, *TaskContext) (any, error) { return nil, nil }
			reg := NewRegistry()
			reg.MustRegister(Task{Name: "long", Handler: func(context.Context, *TaskContext) (any, error) { <-release; return nil, nil }})
			reg.MustRegister(Task{Name: "quick", Handler: noop})
			if tc.runsS {
				reg.MustRegister(Task{Name: "s", Handler: noop})
			}
			long := submit(t, b, "long", `{}`)
			startPool(t, b, reg, Options{Concurrency: 4, UnknownTaskWait: time.Minute})
			defer close(release)
			waitState(t, b, long, broker.StateRunning)
			var quick []int64
			for range 3 {
				quick = append(quick, submit(t, b, "quick", `{}`))
			}
			for _, id := range quick {
				waitState(t, b, id, broker.StateDone) // within waitState's 10 s, while long still runs
			}
			if m, err := b.GetMessage(context.Background(), long); err != nil || m.State != broker.StateRunning {
				t.Fatalf("the long task: %+v, %v; want it still running", m, err)
			}
			m, err := b.GetMessage(context.Background(), ids[0])
			if err != nil || !m.Suspect {
				t.Fatalf("the suspect: %+v, %v; want it still marked", m, err)
			}
		})
	}
}
