package postgres

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

func TestLeases(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := t.Context()
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

	l, held := try("a", time.Minute)
	if !held || l.Holder != "a" || l.Term != 1 || l.Name != "beat" || time.Until(l.ExpiresAt) < 50*time.Second {
		t.Fatalf("first TryLease = %+v, %v; want a at term 1 for a minute", l, held)
	}
	l2, held := try("a", time.Minute)
	if !held || l2.Term != 1 || l2.ExpiresAt.Before(l.ExpiresAt) {
		t.Fatalf("renewal = %+v, %v; want term 1, expiry moved on", l2, held)
	}
	if l, held := try("b", time.Minute); held || l.Holder != "a" || l.Term != 1 {
		t.Fatalf("TryLease by b while a holds = %+v, %v; want a's lease, not held", l, held)
	}

	// Releasing at the wrong term does nothing; at the right one b takes
	// over at the next term.
	if err := b.ReleaseLease(ctx, "beat", "a", 7); err != nil {
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

	// Expiry by database time: a short lease runs out and a takes it back
	// at term 3.
	if _, held := try("b", 100*time.Millisecond); !held {
		t.Fatal("b lost its own lease")
	}
	time.Sleep(200 * time.Millisecond)
	if l, held := try("a", time.Minute); !held || l.Term != 3 {
		t.Fatalf("TryLease by a after b's lease expired = %+v, %v; want a at term 3", l, held)
	}
}

// TestLeaseOneLeader: brokers with their own connections race for one
// lease, round after round; each round exactly one holds it.
func TestLeaseOneLeader(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	const n = 4
	brokers := []*Broker{b}
	for range n - 1 {
		o, err := New(ctx, Options{DSN: testDSN(), Schema: b.schema})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = o.Close() })
		brokers = append(brokers, o)
	}
	c := schemaConn(t, b)
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
		if _, err := c.Exec(ctx, `UPDATE tw_leases SET expires_at = now() - interval '1 second'`); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFencedReclaim: a reclaim pass fenced by a lease runs only while that
// term holds it.
func TestFencedReclaim(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	c := schemaConn(t, b)
	if err := b.RegisterWorker(ctx, broker.WorkerInfo{ID: "beat"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Submit(ctx, broker.SubmitRequest{Topic: "f", Task: "x"}); err != nil {
		t.Fatal(err)
	}
	m := claimAs(t, b, "ghost", "f")
	if _, err := c.Exec(ctx, `UPDATE tw_messages SET claimed_at = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
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
	if got, _ := b.GetMessage(ctx, m.ID); got.State != broker.StateRunning {
		t.Fatalf("a refused pass changed the message: %+v", got)
	}

	// An expired lease fences nothing either.
	if _, err := c.Exec(ctx, `UPDATE tw_leases SET expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	req.Fence = &broker.Fence{Name: "beat", Holder: "beat", Term: l.Term}
	if _, err := b.ReclaimOrphans(ctx, req); !errors.Is(err, broker.ErrNotLeader) {
		t.Fatalf("fenced by an expired lease: %v, want ErrNotLeader", err)
	}

	l, held, err = b.TryLease(ctx, "beat", "beat", time.Minute)
	if err != nil || !held {
		t.Fatalf("TryLease = %v, %v", held, err)
	}
	req.Fence = &broker.Fence{Name: "beat", Holder: "beat", Term: l.Term}
	res, err := b.ReclaimOrphans(ctx, req)
	if err != nil || res.Reclaimed != 1 {
		t.Fatalf("fenced by the current term = %+v, %v; want 1 reclaimed", res, err)
	}

	// While the pass holds the lease row, a takeover waits for it: hold it
	// in a transaction as the pass does and watch a takeover block.
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkFence(ctx, tx, req.Fence); err != nil {
		t.Fatal(err)
	}
	other := schemaConn(t, b)
	done := make(chan error, 1)
	go func() {
		_, err := other.Exec(ctx, `UPDATE tw_leases SET holder = 'usurper', term = term + 1 WHERE name = 'beat'`)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("a takeover committed while a fenced pass held the lease (err %v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestMigrationUpgrade: a database at an older version gets the pending
// migrations and keeps its data.
func TestMigrationUpgrade(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := context.Background()
	id, err := b.Submit(ctx, broker.SubmitRequest{Topic: "u", Task: "x"})
	if err != nil {
		t.Fatal(err)
	}
	c := schemaConn(t, b)
	// Roll the schema back to version 1.
	if _, err := c.Exec(ctx, `DROP TABLE tw_reports, tw_schedule_fires, tw_schedules, tw_leases;
		ALTER TABLE tw_messages DROP COLUMN orphaned;
		DELETE FROM tw_schema_migrations WHERE version > 1`); err != nil {
		t.Fatal(err)
	}
	b2, err := New(ctx, Options{DSN: testDSN(), Schema: b.schema})
	if err != nil {
		t.Fatalf("New on a version-1 schema: %v", err)
	}
	defer b2.Close()
	if _, held, err := b2.TryLease(ctx, "x", "y", time.Minute); err != nil || !held {
		t.Fatalf("TryLease after the upgrade = %v, %v", held, err)
	}
	if _, err := b2.GetMessage(ctx, id); err != nil {
		t.Fatalf("message lost in the upgrade: %v", err)
	}
	all, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM tw_schema_migrations`).Scan(&n); err != nil || n != len(all) {
		t.Fatalf("versions recorded: %d, %v; want %d", n, err, len(all))
	}
}
