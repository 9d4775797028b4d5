package brokertest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/taskhost/taskhost/broker"
)

func testLocks(t *testing.T, b broker.Broker) {
	const n = 8
	submitN(t, b, "lk", n)
	msgs := claim(t, b, "w", n, "lk")
	if len(msgs) != n {
		t.Fatalf("claimed %d, want %d", len(msgs), n)
	}

	won := make([]bool, n)
	var wg sync.WaitGroup
	startGate := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-startGate
			ok, err := b.AcquireLock(ctxOf(t), "L", fmt.Sprintf("holder-%d", i), msgs[i].ClaimOf())
			if err != nil {
				t.Errorf("AcquireLock(%d): %v", i, err)
			}
			won[i] = ok
		}()
	}
	close(startGate)
	wg.Wait()
	if t.Failed() {
		return
	}
	winner := -1
	for i, ok := range won {
		if ok {
			if winner >= 0 {
				t.Fatalf("both %d and %d acquired the lock", winner, i)
			}
			winner = i
		}
	}
	if winner < 0 {
		t.Fatalf("nobody acquired the lock")
	}
	ls := locks(t, b)
	if len(ls) != 1 || ls[0].Name != "L" || ls[0].Holder != fmt.Sprintf("holder-%d", winner) ||
		ls[0].MessageID != msgs[winner].ID || ls[0].AcquiredAt.IsZero() {
		t.Fatalf("Locks = %+v, want L held by holder-%d for message %d", ls, winner, msgs[winner].ID)
	}
	if ok, err := b.AcquireLock(ctxOf(t), "L", "again", msgs[winner].ClaimOf()); err != nil || !ok {
		t.Fatalf("re-acquire by the holder = %v, %v, want true (idempotent)", ok, err)
	}
	loser := (winner + 1) % n
	wantErr(t, "ReleaseLock by a loser", b.ReleaseLock(ctxOf(t), "L", msgs[loser].ClaimOf()), broker.ErrClaimLost)

	if err := b.ReleaseLock(ctxOf(t), "L", msgs[winner].ClaimOf()); err != nil {
		t.Fatalf("ReleaseLock by the winner: %v", err)
	}
	wantErr(t, "second ReleaseLock", b.ReleaseLock(ctxOf(t), "L", msgs[winner].ClaimOf()), broker.ErrClaimLost)
	if ls := locks(t, b); len(ls) != 0 {
		t.Fatalf("after release Locks = %+v", ls)
	}

	if ok, err := b.AcquireLock(ctxOf(t), "L", "loser", msgs[loser].ClaimOf()); err != nil || !ok {
		t.Fatalf("acquire after release = %v, %v, want true", ok, err)
	}
	if ok, err := b.AcquireLock(ctxOf(t), "L", "winner", msgs[winner].ClaimOf()); err != nil || ok {
		t.Fatalf("acquire of a held lock = %v, %v, want false", ok, err)
	}
	if ok, err := b.ForceReleaseLock(ctxOf(t), "L"); err != nil || !ok {
		t.Fatalf("ForceReleaseLock = %v, %v, want true", ok, err)
	}
	if ok, err := b.ForceReleaseLock(ctxOf(t), "L"); err != nil || ok {
		t.Fatalf("second ForceReleaseLock = %v, %v, want false", ok, err)
	}
	wantErr(t, "ReleaseLock after a force release", b.ReleaseLock(ctxOf(t), "L", msgs[loser].ClaimOf()), broker.ErrClaimLost)

	// Several locks are sorted by name.
	third := (winner + 2) % n
	for _, name := range []string{"b", "a", "c"} {
		if ok, err := b.AcquireLock(ctxOf(t), name, "h", msgs[third].ClaimOf()); err != nil || !ok {
			t.Fatalf("AcquireLock(%s) = %v, %v", name, ok, err)
		}
	}
	var names []string
	for _, l := range locks(t, b) {
		names = append(names, l.Name)
	}
	if !slices.Equal(names, []string{"a", "b", "c"}) {
		t.Fatalf("Locks names = %v, want [a b c]", names)
	}
	if n := stats(t, b).Locks; n != 3 {
		t.Fatalf("Stats.Locks = %d, want 3", n)
	}

	if _, err := b.AcquireLock(ctxOf(t), "", "h", msgs[0].ClaimOf()); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("AcquireLock(empty name): %v, want ErrInvalid", err)
	}
	wantErr(t, "ReleaseLock(empty name)", b.ReleaseLock(ctxOf(t), "", msgs[0].ClaimOf()), broker.ErrInvalid)
}

func testLocksAutoRelease(t *testing.T, b broker.Broker) {
	submitN(t, b, "la", 3)
	msgs := claim(t, b, "w", 3, "la")
	if len(msgs) != 3 {
		t.Fatalf("claimed %d, want 3", len(msgs))
	}
	for i, m := range msgs {
		if ok, err := b.AcquireLock(ctxOf(t), fmt.Sprintf("lock-%d", i), "w", m.ClaimOf()); err != nil || !ok {
			t.Fatalf("AcquireLock(%d) = %v, %v", i, ok, err)
		}
	}
	if ok, err := b.AcquireLock(ctxOf(t), "lock-0-extra", "w", msgs[0].ClaimOf()); err != nil || !ok {
		t.Fatalf("second lock under one claim = %v, %v", ok, err)
	}

	lockNames := func() []string {
		var names []string
		for _, l := range locks(t, b) {
			names = append(names, l.Name)
		}
		return names
	}
	ack(t, b, msgs[0].ClaimOf(), "")
	if got := lockNames(); !slices.Equal(got, []string{"lock-1", "lock-2"}) {
		t.Fatalf("after ack, locks %v, want [lock-1 lock-2]", got)
	}
	if err := b.Nack(ctxOf(t), broker.NackRequest{Claim: msgs[1].ClaimOf(), Requeue: true}); err != nil {
		t.Fatal(err)
	}
	if got := lockNames(); !slices.Equal(got, []string{"lock-2"}) {
		t.Fatalf("after nack, locks %v, want [lock-2]", got)
	}
	if err := b.DeadLetter(ctxOf(t), msgs[2].ClaimOf(), "x", nil); err != nil {
		t.Fatal(err)
	}
	if got := lockNames(); len(got) != 0 {
		t.Fatalf("after dead letter, locks %v, want none", got)
	}
	if _, err := b.AcquireLock(ctxOf(t), "late", "w", msgs[0].ClaimOf()); !errors.Is(err, broker.ErrClaimLost) {
		t.Fatalf("AcquireLock under an acked claim: %v, want ErrClaimLost", err)
	}
}
