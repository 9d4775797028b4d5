package scheduler

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/memory"
)

// campaign starts a leader that records its terms and counts how many
// leaders act at once.
type campaign struct {
	leader  *Leader
	mu      sync.Mutex
	terms   []int64
	elected chan int64
}

func newCampaign(t *testing.T, b broker.Leaser, holder string, acting *atomic.Int32, maxActing *atomic.Int32) *campaign {
	c := &campaign{elected: make(chan int64, 10)}
	c.leader = NewLeader(b, LeaderOptions{
		Holder: holder,
		TTL:    300 * time.Millisecond,
		OnElected: func(ctx context.Context, f broker.Fence) {
			n := acting.Add(1)
			for {
				m := maxActing.Load()
				if n <= m || maxActing.CompareAndSwap(m, n) {
					break
				}
			}
			c.mu.Lock()
			c.terms = append(c.terms, f.Term)
			c.mu.Unlock()
			c.elected <- f.Term
			<-ctx.Done()
			acting.Add(-1)
		},
	})
	c.leader.Start(context.Background())
	t.Cleanup(func() { c.leader.Stop(context.Background()) })
	return c
}

func TestOneLeaderAndFailover(t *testing.T) {
	b := memory.New()
	var acting, maxActing atomic.Int32
	a := newCampaign(t, b, "a", &acting, &maxActing)
	var first int64
	select {
	case first = <-a.elected:
	case <-time.After(2 * time.Second):
		t.Fatal("no leader elected")
	}
	c := newCampaign(t, b, "c", &acting, &maxActing)
	time.Sleep(700 * time.Millisecond) // two TTLs: c must stay a standby
	if _, ok := c.leader.Fence(); ok {
		t.Fatal("a standby leads while the leader renews")
	}
	start := time.Now()
	a.leader.Stop(context.Background())
	var second int64
	select {
	case second = <-c.elected:
	case <-time.After(2 * time.Second):
		t.Fatal("the standby did not take over")
	}
	if second <= first {
		t.Fatalf("new term %d not after the old %d", second, first)
	}
	// Stop releases the lease, so takeover does not wait for the TTL.
	if d := time.Since(start); d > time.Second {
		t.Errorf("takeover took %s after a clean stop", d)
	}
	if m := maxActing.Load(); m != 1 {
		t.Fatalf("%d leaders acted at once", m)
	}
}

func TestExpiredLeaseIsTakenAtTheNextTerm(t *testing.T) {
	b := memory.New()
	ctx := context.Background()
	l, held, err := b.TryLease(ctx, "beat", "a", 50*time.Millisecond)
	if err != nil || !held || l.Term != 1 {
		t.Fatalf("first lease = %+v %v %v", l, held, err)
	}
	if l, held, _ = b.TryLease(ctx, "beat", "b", time.Second); held || l.Holder != "a" {
		t.Fatalf("b took a live lease: %+v", l)
	}
	time.Sleep(80 * time.Millisecond)
	if l, held, _ = b.TryLease(ctx, "beat", "b", time.Second); !held || l.Term != 2 {
		t.Fatalf("b after expiry = %+v %v, want term 2", l, held)
	}
	if l, held, _ = b.TryLease(ctx, "beat", "a", time.Second); held || l.Holder != "b" {
		t.Fatalf("the old holder renewed a lease it lost: %+v", l)
	}
	if err := b.ReleaseLease(ctx, "beat", "a", 1); err != nil {
		t.Fatal(err)
	}
	if l, held, _ = b.TryLease(ctx, "beat", "b", time.Second); !held || l.Term != 2 {
		t.Fatalf("a stale release moved the lease: %+v", l)
	}
}
