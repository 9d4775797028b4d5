package scheduler

import (
	"context"
	"errors"
	"slices"
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

// stallingLeaser is a store whose renewals can hang (a connection that
// does not answer), fail at once, or arrive late; it records the expiry
// of the last lease it answered held.
type stallingLeaser struct {
	broker.Leaser
	stall atomic.Bool  // TryLease waits for its context to end, then fails
	fail  atomic.Bool  // TryLease fails at once
	delay atomic.Int64 // TryLease waits this long (ns) before it writes

	mu      sync.Mutex
	expires time.Time // of the last lease answered held
}

func (s *stallingLeaser) TryLease(ctx context.Context, name, holder string, ttl time.Duration) (broker.Lease, bool, error) {
	switch {
	case s.stall.Load():
		<-ctx.Done()
		return broker.Lease{}, false, ctx.Err()
	case s.fail.Load():
		return broker.Lease{}, false, errors.New("connection refused")
	}
	if d := time.Duration(s.delay.Load()); d > 0 {
		select {
		case <-ctx.Done():
			return broker.Lease{}, false, ctx.Err()
		case <-time.After(d):
		}
	}
	l, held, err := s.Leaser.TryLease(ctx, name, holder, ttl)
	if err == nil && held {
		s.mu.Lock()
		s.expires = l.ExpiresAt
		s.mu.Unlock()
	}
	return l, held, err
}

func (s *stallingLeaser) lastExpiry() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.expires
}

// termRecord is one run of OnElected.
type termRecord struct {
	term         int64
	began, ended time.Time
}

// recorder is an OnElected that records its runs.
type recorder struct {
	mu      sync.Mutex
	runs    []termRecord
	elected chan int64
}

func newRecorder() *recorder { return &recorder{elected: make(chan int64, 10)} }

func (r *recorder) run(ctx context.Context, f broker.Fence) {
	r.mu.Lock()
	i := len(r.runs)
	r.runs = append(r.runs, termRecord{term: f.Term, began: time.Now()})
	r.mu.Unlock()
	r.elected <- f.Term
	<-ctx.Done()
	r.mu.Lock()
	r.runs[i].ended = time.Now()
	r.mu.Unlock()
}

func (r *recorder) all() []termRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.runs)
}

func waitElected(t *testing.T, r *recorder, within time.Duration, who string) int64 {
	t.Helper()
	select {
	case term := <-r.elected:
		return term
	case <-time.After(within):
		t.Fatalf("%s was not elected within %s", who, within)
		return 0
	}
}

const testTTL = 3 * time.Second // renewals every second, work stopped half a second before the lease can end

// TestADeposedLeaderStopsBeforeItsLeaseCanBeTaken: the leader's renewals
// hang (its link to the store is a blackhole). Its work stops before the
// lease it last renewed runs out, so before a standby can take the lease,
// and it no longer says it leads; the standby then leads at a later term.
func TestADeposedLeaderStopsBeforeItsLeaseCanBeTaken(t *testing.T) {
	mem := memory.New()
	store := &stallingLeaser{Leaser: mem}
	ra, rb := newRecorder(), newRecorder()
	a := NewLeader(store, LeaderOptions{Holder: "a", TTL: testTTL, OnElected: ra.run})
	a.Start(context.Background())
	t.Cleanup(func() { a.Stop(context.Background()) })
	first := waitElected(t, ra, 2*time.Second, "a")
	b := NewLeader(mem, LeaderOptions{Holder: "b", TTL: testTTL, OnElected: rb.run})
	b.Start(context.Background())
	t.Cleanup(func() { b.Stop(context.Background()) })

	time.Sleep(testTTL / 2) // a renews at least once
	store.stall.Store(true)
	second := waitElected(t, rb, 3*testTTL, "the standby")
	if second <= first {
		t.Fatalf("the standby leads at term %d, not after %d", second, first)
	}
	runs, expiry := ra.all(), store.lastExpiry()
	if len(runs) != 1 || runs[0].ended.IsZero() {
		t.Fatalf("the deposed leader's work: %+v; want one run, ended", runs)
	}
	began := rb.all()[0].began
	t.Logf("the deposed leader's work stopped %s before its lease expired, %s before the standby led",
		expiry.Sub(runs[0].ended).Round(time.Millisecond), began.Sub(runs[0].ended).Round(time.Millisecond))
	if !runs[0].ended.Before(expiry) {
		t.Errorf("the deposed leader's work stopped %s after its lease expired", runs[0].ended.Sub(expiry))
	}
	if !runs[0].ended.Before(began) {
		t.Errorf("the deposed leader's work went on %s after the standby led", runs[0].ended.Sub(began))
	}
	if _, ok := a.Fence(); ok {
		t.Error("the deposed leader still says it leads")
	}
}

// TestALeaderWhoseRenewalsFailStopsBeforeItsLeaseRunsOut: renewals that
// fail at once (a database that refuses connections) stop the work before
// the lease it last renewed runs out, not at the renewal that follows.
func TestALeaderWhoseRenewalsFailStopsBeforeItsLeaseRunsOut(t *testing.T) {
	store := &stallingLeaser{Leaser: memory.New()}
	r := newRecorder()
	l := NewLeader(store, LeaderOptions{Holder: "a", TTL: testTTL, OnElected: r.run})
	l.Start(context.Background())
	t.Cleanup(func() { l.Stop(context.Background()) })
	waitElected(t, r, 2*time.Second, "a")
	time.Sleep(testTTL / 2)
	store.fail.Store(true)
	deadline := time.Now().Add(2 * testTTL)
	for {
		if runs := r.all(); !runs[0].ended.IsZero() {
			if expiry := store.lastExpiry(); !runs[0].ended.Before(expiry) {
				t.Errorf("the work stopped %s after the lease expired", runs[0].ended.Sub(expiry))
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the work still runs %s after the renewals began to fail", 2*testTTL)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestALateRenewalThatLandsLeadsAgainAtTheSameTerm: a renewal that takes
// longer than the term may wait ends the term's work; when it lands
// before the lease ran out, the leader leads again at the same term, its
// work never running twice at once.
func TestALateRenewalThatLandsLeadsAgainAtTheSameTerm(t *testing.T) {
	store := &stallingLeaser{Leaser: memory.New()}
	r := newRecorder()
	l := NewLeader(store, LeaderOptions{Holder: "a", TTL: testTTL, OnElected: r.run})
	l.Start(context.Background())
	t.Cleanup(func() { l.Stop(context.Background()) })
	term := waitElected(t, r, 2*time.Second, "a")
	// Sent a renewal period after the last, the renewal writes after 1.7
	// of them: past the work's deadline (2.5), before the lease ends (3).
	store.delay.Store(int64(1700 * time.Millisecond))
	again := waitElected(t, r, 3*testTTL, "a again")
	store.delay.Store(0)
	if again != term {
		t.Fatalf("led again at term %d, want the same term %d", again, term)
	}
	runs := r.all()
	if len(runs) < 2 || runs[0].ended.IsZero() || !runs[0].ended.Before(runs[1].began) {
		t.Fatalf("runs %+v; want the first ended before the second began", runs)
	}
}
