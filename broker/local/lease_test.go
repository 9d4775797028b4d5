package local

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

func TestLeases(t *testing.T) {
	b := openTest(t, Options{})
	ctx := context.Background()
	try := func(holder string, ttl time.Duration) (broker.Lease, bool) {
		t.Helper()
		l, held, err := b.TryLease(ctx, "beat", holder, ttl)
		if err != nil {
			t.Fatalf("TryLease(%s): %v", holder, err)
		}
		return l, held
	}
	if _, _, err := b.TryLease(ctx, "", "a", time.Minute); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("TryLease(no name): %v, want ErrInvalid", err)
	}
	if _, _, err := b.TryLease(ctx, "beat", "", time.Minute); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("TryLease(no holder): %v, want ErrInvalid", err)
	}

	l, held := try("a", time.Minute)
	if !held || l.Holder != "a" || l.Term != 1 || l.Name != "beat" || time.Until(l.ExpiresAt) < 50*time.Second {
		t.Fatalf("first TryLease = %+v, %v; want a at term 1 for a minute", l, held)
	}
	l2, held := try("a", time.Minute)
	if !held || l2.Term != 1 || l2.ExpiresAt.Before(l.ExpiresAt) {
		t.Fatalf("renewal = %+v, %v; want term 1, expiry moved on", l2, held)
	}
	if l, held := try("b", time.Minute); held || l.Holder != "a" || l.Term != 1 || !l.ExpiresAt.Equal(l2.ExpiresAt) {
		t.Fatalf("TryLease by b while a holds = %+v, %v; want a's lease as it stands, not held", l, held)
	}

	// Releasing at the wrong term (or as someone else) does nothing; at
	// the right one b takes over at the next term.
	if err := b.ReleaseLease(ctx, "beat", "a", 7); err != nil {
		t.Fatal(err)
	}
	if err := b.ReleaseLease(ctx, "beat", "b", 1); err != nil {
		t.Fatal(err)
	}
	if _, held := try("b", time.Minute); held {
		t.Fatalf("b took the lease after a release at the wrong term")
	}
	if err := b.ReleaseLease(ctx, "beat", "a", 1); err != nil {
		t.Fatal(err)
	}
	if l, held := try("b", time.Minute); !held || l.Holder != "b" || l.Term != 2 {
		t.Fatalf("TryLease by b after the release = %+v, %v; want b at term 2", l, held)
	}

	// Expiry by the clock: a short lease runs out and a takes it back at
	// term 3; b renewing its own expired lease would also get a new term.
	if _, held := try("b", 100*time.Millisecond); !held {
		t.Fatal("b lost its own lease")
	}
	time.Sleep(200 * time.Millisecond)
	if l, held := try("a", time.Minute); !held || l.Term != 3 {
		t.Fatalf("TryLease by a after b's lease expired = %+v, %v; want a at term 3", l, held)
	}
	if _, held := try("a", 50*time.Millisecond); !held {
		t.Fatal("a lost its own lease")
	}
	time.Sleep(100 * time.Millisecond)
	if l, held := try("a", time.Minute); !held || l.Term != 4 {
		t.Fatalf("a retaking its own expired lease = %+v, %v; want term 4", l, held)
	}

	// Leases are independent by name.
	if l, held, err := b.TryLease(ctx, "other", "b", time.Minute); err != nil || !held || l.Term != 1 {
		t.Fatalf("TryLease(other) = %+v, %v, %v", l, held, err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.TryLease(ctx, "beat", "a", time.Minute); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("TryLease after Close: %v", err)
	}
}

// TestLeaseOneLeader: brokers on one file (as processes would be) race for
// one lease, round after round; each round exactly one holds it.
func TestLeaseOneLeader(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "taskhost.db")
	const n = 4
	var brokers []*Broker
	for range n {
		brokers = append(brokers, openTest(t, Options{Path: path}))
	}
	var lastTerm int64
	for round := range 10 {
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			terms = map[int64]int{}
			held  int
		)
		for i, br := range brokers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l, ok, err := br.TryLease(ctx, "leader", string(rune('a'+i)), time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				terms[l.Term]++
				if ok {
					held++
				}
			}()
		}
		wg.Wait()
		if held != 1 || len(terms) != 1 {
			t.Fatalf("round %d: %d holders, terms seen %v; want one holder and one term", round, held, terms)
		}
		for term := range terms {
			if term != lastTerm+1 {
				t.Fatalf("round %d: term %d after %d", round, term, lastTerm)
			}
			lastTerm = term
		}
		// Expire it for the next round.
		execSQL(t, brokers[0], `UPDATE tw_leases SET expires_at = 0`)
	}
}

// TestFencedReclaim: a reclaim pass fenced by a lease runs only while that
// term holds it.
func TestFencedReclaim(t *testing.T) {
	ctx := context.Background()
	b := openTest(t, Options{})
	if err := b.RegisterWorker(ctx, broker.WorkerInfo{ID: "beat"}); err != nil {
		t.Fatal(err)
	}
	id := mustSubmit(t, b, "f")
	mustClaim(t, b, "ghost", "f")
	execSQL(t, b, `UPDATE tw_messages SET claimed_at = claimed_at - ?`, int64(time.Hour))
	l, held, err := b.TryLease(ctx, "beat", "beat", time.Minute)
	if err != nil || !held {
		t.Fatalf("TryLease = %v, %v", held, err)
	}
	req := broker.ReclaimRequest{Live: []string{"beat"}, Grace: time.Minute, MaxAttempts: 5}

	for name, f := range map[string]broker.Fence{
		"a stale term":    {Name: "beat", Holder: "beat", Term: l.Term - 1},
		"another holder":  {Name: "beat", Holder: "other", Term: l.Term},
		"an unknown name": {Name: "nope", Holder: "beat", Term: l.Term},
	} {
		req.Fence = &f
		if _, err := b.ReclaimOrphans(ctx, req); !errors.Is(err, broker.ErrNotLeader) {
			t.Fatalf("fenced by %s: %v, want ErrNotLeader", name, err)
		}
	}
	mustState(t, b, id, broker.StateRunning)

	// An expired lease fences nothing either.
	execSQL(t, b, `UPDATE tw_leases SET expires_at = 0`)
	req.Fence = &broker.Fence{Name: "beat", Holder: "beat", Term: l.Term}
	if _, err := b.ReclaimOrphans(ctx, req); !errors.Is(err, broker.ErrNotLeader) {
		t.Fatalf("fenced by an expired lease: %v, want ErrNotLeader", err)
	}
	mustState(t, b, id, broker.StateRunning)

	l, held, err = b.TryLease(ctx, "beat", "beat", time.Minute)
	if err != nil || !held {
		t.Fatalf("TryLease = %v, %v", held, err)
	}
	req.Fence = &broker.Fence{Name: "beat", Holder: "beat", Term: l.Term}
	res, err := b.ReclaimOrphans(ctx, req)
	if err != nil || res.Reclaimed != 1 {
		t.Fatalf("fenced by the current term = %+v, %v; want 1 reclaimed", res, err)
	}
	mustState(t, b, id, broker.StateQueued)

	// Fail closed on an empty live set.
	req.Live = nil
	if _, err := b.ReclaimOrphans(ctx, req); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("empty live set: %v, want ErrInvalid", err)
	}
}

// TestMigrationUpgrade: a file at schema version 1 gets the pending
// migrations and keeps its data.
func TestMigrationUpgrade(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "taskhost.db")
	b, err := Open(ctx, Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	id := mustSubmit(t, b, "u")
	// Roll back what the later migrations created.
	for _, table := range []string{"tw_reports", "tw_schedule_fires", "tw_schedules", "tw_leases"} {
		execSQL(t, b, `DROP TABLE `+table)
	}
	execSQL(t, b, `ALTER TABLE tw_messages DROP COLUMN orphaned`)
	execSQL(t, b, `ALTER TABLE tw_workers DROP COLUMN tasks`)
	execSQL(t, b, `DELETE FROM tw_schema_migrations WHERE version > 1`)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = openTest(t, Options{Path: path})
	if _, held, err := b.TryLease(ctx, "x", "y", time.Minute); err != nil || !held {
		t.Fatalf("TryLease after the upgrade = %v, %v", held, err)
	}
	mustState(t, b, id, broker.StateQueued)
	ms, _ := loadMigrations()
	var n int
	if err := b.reader.QueryRow(`SELECT count(*) FROM tw_schema_migrations`).Scan(&n); err != nil || n != len(ms) {
		t.Fatalf("versions recorded: %d, %v; want %d", n, err, len(ms))
	}
}
