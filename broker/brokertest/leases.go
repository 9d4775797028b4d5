package brokertest

import (
	"errors"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// testLeases: the lease rules every broker keeps (broker.Leaser), by the
// broker's own clock.
func testLeases(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
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
		t.Fatalf("b took the lease after a release at the wrong term or by another holder")
	}
	if err := b.ReleaseLease(ctx, "beat", "a", 1); err != nil {
		t.Fatal(err)
	}
	if l, held := try("b", time.Minute); !held || l.Holder != "b" || l.Term != 2 {
		t.Fatalf("TryLease by b after the release = %+v, %v; want b at term 2", l, held)
	}

	// Expiry by the broker's clock: a short lease runs out and a takes it
	// back at term 3; a holder retaking its own expired lease gets a new
	// term too.
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
