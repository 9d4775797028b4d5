package brokertest

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// Durable is a broker whose running messages outlive the workers that
// claimed them (local, postgres): the reaper reclaims them.
type Durable interface {
	broker.Broker
	broker.OrphanReclaimer
}

// Store is one fresh durable store for RunDurable, with the hooks its cases
// need: another broker on the same store, and moving stored times back as
// time passing would. Each hook fails t when it cannot do its work.
type Store struct {
	Broker Durable
	// Another opens another broker on the same store, as another process
	// would; it is closed at t's cleanup.
	Another func(t *testing.T) Durable
	// AgeClaim moves message id's claimed_at back by d.
	AgeClaim func(t *testing.T, id int64, d time.Duration)
	// AgeLock moves lock name's acquired_at back by d.
	AgeLock func(t *testing.T, name string, d time.Duration)
	// AgeHeartbeat moves worker id's heartbeat back by d.
	AgeHeartbeat func(t *testing.T, worker string, d time.Duration)
	// ExpireLeases makes every lease expired.
	ExpireLeases func(t *testing.T)
}

// RunDurable runs the cases of durable stores: orphan reclaim, the orphan
// budget, fenced passes and leader election across brokers sharing a
// store. newStore returns a fresh, empty store for one subtest and
// registers its cleanup; it is called from parallel subtests.
//
// Options, at most one, name the cases that cannot apply to the store.
func RunDurable(t *testing.T, newStore func(t *testing.T) Store, opts ...Options) {
	o := optionsOf(t, opts)
	defer o.checkNames(t)
	runCases(t, newStore, o, []testCase[Store]{
		{"ReclaimOrphans", testReclaimOrphans},
		{"ReclaimDead", testReclaimDead},
		{"ErrorRetriesDoNotUseTheOrphanBudget", testOrphanBudget},
		{"ExpireWorkerAndLiveWorkers", testExpireWorker},
		{"FencedReclaim", testFencedReclaim},
		{"LeaseOneLeader", testLeaseOneLeader},
		{"ClosedOrphanMethods", testClosedOrphanMethods},
		{"StatsCountReclaims", testStatsCountReclaims},
	})
	runCases(t, newStore, o, cancelDurableCases)
}

func register(t *testing.T, b broker.Broker, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if err := b.RegisterWorker(ctxOf(t), broker.WorkerInfo{ID: id, Roles: []string{broker.RoleWorker}, Topics: []string{"*"}}); err != nil {
			t.Fatal(err)
		}
	}
}

func acquire(t *testing.T, b broker.Broker, name, holder string, c broker.Claim) {
	t.Helper()
	if ok, err := b.AcquireLock(ctxOf(t), name, holder, c); err != nil || !ok {
		t.Fatalf("AcquireLock(%s) = %v, %v", name, ok, err)
	}
}

func lockNames(t *testing.T, b broker.Broker) []string {
	t.Helper()
	var names []string
	for _, l := range locks(t, b) {
		names = append(names, l.Name)
	}
	return names
}

// testReclaimOrphans: one reaper pass over every kind of candidate.
func testReclaimOrphans(t *testing.T, s Store) {
	b := s.Broker
	ctx := ctxOf(t)
	const grace = time.Minute
	register(t, b, "alive", "dead")

	// Poisoned: orphaned twice before (each time requeued by a pass),
	// now claimed a third time by a dead worker: dead at max 3.
	poisonedID := submit(t, b, broker.SubmitRequest{Topic: "p", Task: "task"})
	for i := range 2 {
		m := claimOne(t, b, "dead", "p")
		s.AgeClaim(t, m.ID, 2*grace)
		res, err := b.ReclaimOrphans(ctx, broker.ReclaimRequest{Live: []string{"alive"}, Grace: grace, MaxAttempts: 3})
		if err != nil || res.Reclaimed != 1 || !slices.Equal(res.IDs, []int64{poisonedID}) {
			t.Fatalf("orphaning %d of the poisoned message = %+v, %v; want it requeued", i+1, res, err)
		}
	}
	poisoned := claimOne(t, b, "dead", "p")
	if poisoned.Attempts != 3 {
		t.Fatalf("third claim of the poisoned message: attempt %d, want 3", poisoned.Attempts)
	}
	s.AgeClaim(t, poisoned.ID, 2*grace)

	setTopic(t, b, "o", broker.TopicPatch{ConcurrencyLimit: ptr(3)})
	submitN(t, b, "o", 3)
	old := claimOne(t, b, "dead", "o")    // orphan, old enough: requeued
	young := claimOne(t, b, "dead", "o")  // orphan inside the grace: left
	alive := claimOne(t, b, "alive", "o") // live owner, old: left
	for _, m := range []broker.Message{old, alive} {
		s.AgeClaim(t, m.ID, 2*grace)
	}
	// The wedge the reaper exists for: the limit of 3 is used up.
	claimNone(t, b, "o")

	// Locks: under the old (reclaimed) claim, young: released with its
	// claim. Under the young claim, young: kept (the grace). Held by
	// alive, old: kept. Held by dead under alive's claim, old: released
	// (its holder is gone).
	acquire(t, b, "old-lock", "dead", old.ClaimOf())
	acquire(t, b, "young-lock", "dead", young.ClaimOf())
	acquire(t, b, "alive-lock", "alive", alive.ClaimOf())
	acquire(t, b, "dead-lock-on-live-claim", "dead", alive.ClaimOf())
	s.AgeLock(t, "alive-lock", 2*grace)
	s.AgeLock(t, "dead-lock-on-live-claim", 2*grace)

	// Fail closed.
	for what, req := range map[string]broker.ReclaimRequest{
		"an empty live set":     {Grace: grace, MaxAttempts: 3},
		"a negative grace":      {Live: []string{"alive"}, Grace: -time.Second},
		"negative max attempts": {Live: []string{"alive"}, Grace: grace, MaxAttempts: -1},
	} {
		if _, err := b.ReclaimOrphans(ctx, req); !errors.Is(err, broker.ErrInvalid) {
			t.Fatalf("ReclaimOrphans with %s: %v, want ErrInvalid", what, err)
		}
	}
	wantState(t, b, old.ID, broker.StateRunning)

	res, err := b.ReclaimOrphans(ctx, broker.ReclaimRequest{Live: []string{"alive"}, Grace: grace, MaxAttempts: 3})
	if err != nil {
		t.Fatalf("ReclaimOrphans: %v", err)
	}
	wantIDs := []int64{old.ID, poisoned.ID}
	slices.Sort(wantIDs)
	slices.Sort(res.IDs)
	if res.Reclaimed != 1 || res.DeadLettered != 1 || res.LocksReleased != 2 || !slices.Equal(res.IDs, wantIDs) || res.WithinGrace != 2 {
		t.Fatalf("ReclaimOrphans = %+v, want 2 reclaimed, 1 dead-lettered, 2 locks released (old-lock and dead-lock-on-live-claim), "+
			"ids %v (old, poisoned), 2 within the grace (young and young-lock)", res, wantIDs)
	}

	// The old orphan is queued again with its claim cleared, its attempts
	// kept and a last error saying what happened.
	q := wantState(t, b, old.ID, broker.StateQueued)
	if q.ClaimedBy != "" || q.ClaimedAt != nil || q.Attempts != 1 || !q.Suspect || !strings.HasPrefix(q.LastError, broker.OrphanedErrorPrefix) {
		t.Fatalf("reclaimed message = %+v, want claim cleared, attempts 1, suspect, last error starting with %q", q, broker.OrphanedErrorPrefix)
	}
	// The dead worker's late writes are refused.
	wantErr(t, "Ack with the reclaimed token", ackErr(t, b, old.ClaimOf()), broker.ErrClaimLost)
	wantErr(t, "Nack with the reclaimed token", b.Nack(ctx, broker.NackRequest{Claim: old.ClaimOf(), Requeue: true}), broker.ErrClaimLost)
	wantErr(t, "ReleaseLock of a lock released with its claim", b.ReleaseLock(ctx, "old-lock", old.ClaimOf()), broker.ErrClaimLost)

	wantState(t, b, young.ID, broker.StateRunning)
	wantState(t, b, alive.ID, broker.StateRunning)
	d := wantState(t, b, poisoned.ID, broker.StateDead)
	if d.FinishedAt == nil || !strings.HasPrefix(d.LastError, broker.OrphanedErrorPrefix) || !strings.Contains(d.LastError, "dead-lettered") {
		t.Fatalf("dead-lettered orphan = %+v, want finished_at and a last error saying orphaned and dead-lettered", d)
	}

	if st := stats(t, b); st.Locks != 2 {
		t.Fatalf("Stats.Locks = %d, want 2 (alive-lock, young-lock)", st.Locks)
	}
	if names := lockNames(t, b); !slices.Equal(names, []string{"alive-lock", "young-lock"}) {
		t.Fatalf("locks after the pass %v, want [alive-lock young-lock]", names)
	}

	// The freed slot and locks are usable: the requeued message is claimed
	// again (attempt 2, a new token) and the released locks re-acquired;
	// their old holders cannot release them.
	again := claimOne(t, b, "alive", "o")
	if again.ID != old.ID || again.Attempts != 2 || again.Token == old.Token {
		t.Fatalf("claim after reclaim = %+v, want message %d attempt 2 with a new token", again, old.ID)
	}
	acquire(t, b, "old-lock", "alive", again.ClaimOf())
	acquire(t, b, "dead-lock-on-live-claim", "alive", again.ClaimOf())
	wantErr(t, "ReleaseLock by the old holder", b.ReleaseLock(ctx, "dead-lock-on-live-claim", alive.ClaimOf()), broker.ErrClaimLost)

	// A second pass finds nothing more to do; max attempts 0 means no
	// bound.
	res, err = b.ReclaimOrphans(ctx, broker.ReclaimRequest{Live: []string{"alive"}, Grace: grace})
	if err != nil || res.Reclaimed+res.DeadLettered+res.LocksReleased != 0 || res.WithinGrace != 2 {
		t.Fatalf("second pass = %+v, %v; want nothing done, 2 within the grace", res, err)
	}
}

// testReclaimDead: a reclaim of a worker known dead takes all its work at
// once, its youngest claims and locks too, and nothing of any other
// worker, dead-looking or not.
func testReclaimDead(t *testing.T, s Store) {
	dr, ok := s.Broker.(broker.DeadReclaimer)
	if !ok {
		t.Fatalf("%T does not implement broker.DeadReclaimer; a store that cannot names this case NotApplicable with its reason", s.Broker)
	}
	b := s.Broker
	ctx := ctxOf(t)
	register(t, b, "alive", "dead", "silent")

	// Poisoned: orphaned twice before, now claimed a third time by the
	// dead worker: dead at max 3.
	poisonedID := submit(t, b, broker.SubmitRequest{Topic: "p", Task: "task"})
	for range 2 {
		m := claimOne(t, b, "dead", "p")
		if _, err := dr.ReclaimDead(ctx, broker.ReclaimRequest{Dead: []string{"dead"}, MaxAttempts: 3}); err != nil {
			t.Fatal(err)
		}
		wantState(t, b, m.ID, broker.StateQueued)
	}
	poisoned := claimOne(t, b, "dead", "p")
	if poisoned.ID != poisonedID {
		t.Fatalf("claimed %d, want the poisoned message %d", poisoned.ID, poisonedID)
	}

	setTopic(t, b, "o", broker.TopicPatch{ConcurrencyLimit: ptr(4)})
	submitN(t, b, "o", 4)
	young := claimOne(t, b, "dead", "o")     // claimed just now: taken all the same
	cancelled := claimOne(t, b, "dead", "o") // its cancel requested: ends cancelled
	silent := claimOne(t, b, "silent", "o")  // a worker that only looks dead: left
	alive := claimOne(t, b, "alive", "o")    // a live worker's: left
	s.AgeClaim(t, silent.ID, time.Hour)
	s.AgeHeartbeat(t, "silent", time.Hour)
	if _, err := b.Cancel(ctx, cancelled.ID); err != nil {
		t.Fatal(err)
	}
	claimNone(t, b, "o")

	acquire(t, b, "young-lock", "dead", young.ClaimOf())
	acquire(t, b, "dead-lock-on-live-claim", "dead", alive.ClaimOf())
	acquire(t, b, "silent-lock", "silent", silent.ClaimOf())
	acquire(t, b, "alive-lock", "alive", alive.ClaimOf())
	s.AgeLock(t, "silent-lock", time.Hour)

	for what, req := range map[string]broker.ReclaimRequest{
		"no dead worker":        {MaxAttempts: 3},
		"a live set":            {Dead: []string{"dead"}, Live: []string{"alive"}},
		"a grace":               {Dead: []string{"dead"}, Grace: time.Second},
		"negative max attempts": {Dead: []string{"dead"}, MaxAttempts: -1},
	} {
		if _, err := dr.ReclaimDead(ctx, req); !errors.Is(err, broker.ErrInvalid) {
			t.Fatalf("ReclaimDead with %s: %v, want ErrInvalid", what, err)
		}
	}
	if _, err := b.ReclaimOrphans(ctx, broker.ReclaimRequest{Live: []string{"alive"}, Dead: []string{"dead"}}); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("ReclaimOrphans naming dead workers: %v, want ErrInvalid", err)
	}
	wantState(t, b, young.ID, broker.StateRunning)

	res, err := dr.ReclaimDead(ctx, broker.ReclaimRequest{Dead: []string{"dead"}, MaxAttempts: 3})
	if err != nil {
		t.Fatalf("ReclaimDead: %v", err)
	}
	wantIDs := []int64{young.ID, cancelled.ID, poisoned.ID}
	slices.Sort(wantIDs)
	slices.Sort(res.IDs)
	if res.Reclaimed != 1 || res.Cancelled != 1 || res.DeadLettered != 1 || res.LocksReleased != 2 || res.WithinGrace != 0 || !slices.Equal(res.IDs, wantIDs) {
		t.Fatalf("ReclaimDead = %+v, want 1 reclaimed (young), 1 cancelled, 1 dead-lettered (poisoned), ids %v, "+
			"2 locks released (young-lock, dead-lock-on-live-claim), none within a grace", res, wantIDs)
	}
	q := wantState(t, b, young.ID, broker.StateQueued)
	if q.ClaimedBy != "" || q.Attempts != 1 || !q.Suspect || !strings.HasPrefix(q.LastError, broker.OrphanedErrorPrefix) {
		t.Fatalf("reclaimed message = %+v, want claim cleared, attempts 1, suspect, last error starting with %q", q, broker.OrphanedErrorPrefix)
	}
	wantState(t, b, cancelled.ID, broker.StateCancelled)
	wantState(t, b, poisoned.ID, broker.StateDead)
	wantErr(t, "Ack with the reclaimed token", ackErr(t, b, young.ClaimOf()), broker.ErrClaimLost)
	wantState(t, b, silent.ID, broker.StateRunning)
	wantState(t, b, alive.ID, broker.StateRunning)
	if names := lockNames(t, b); !slices.Equal(names, []string{"alive-lock", "silent-lock"}) {
		t.Fatalf("locks after the reclaim %v, want [alive-lock silent-lock]", names)
	}
	// The slot is free: the young message is claimed again.
	if again := claimOne(t, b, "alive", "o"); again.ID != young.ID || again.Attempts != 2 {
		t.Fatalf("claim after the reclaim = %+v, want message %d at attempt 2", again, young.ID)
	}
	// Again, nothing is left to take.
	res, err = dr.ReclaimDead(ctx, broker.ReclaimRequest{Dead: []string{"dead"}, MaxAttempts: 3})
	if err != nil || len(res.IDs)+res.LocksReleased != 0 {
		t.Fatalf("second ReclaimDead = %+v, %v; want nothing done", res, err)
	}
}

// testOrphanBudget: a message that failed and was retried four times, then
// orphaned once, is requeued, not dead-lettered, under an orphan budget of
// 3; its third orphaning dead-letters it.
func testOrphanBudget(t *testing.T, s Store) {
	b := s.Broker
	ctx := ctxOf(t)
	id := submit(t, b, broker.SubmitRequest{Topic: "r", Task: "x"})
	for range 4 {
		m := claimOne(t, b, "alive", "r")
		if err := b.Nack(ctx, broker.NackRequest{Claim: m.ClaimOf(), Requeue: true, Error: "boom"}); err != nil {
			t.Fatal(err)
		}
	}
	req := broker.ReclaimRequest{Live: []string{"alive"}, MaxAttempts: 3}
	for orphaning := 1; orphaning <= 3; orphaning++ {
		m := claimOne(t, b, "gone", "r")
		s.AgeClaim(t, m.ID, time.Hour)
		res, err := b.ReclaimOrphans(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		got := get(t, b, id)
		switch {
		case orphaning < 3 && (res.Reclaimed != 1 || got.State != broker.StateQueued):
			t.Fatalf("orphaning %d after 4 error retries: %+v, state %s; want requeued", orphaning, res, got.State)
		case orphaning == 3 && (res.DeadLettered != 1 || got.State != broker.StateDead):
			t.Fatalf("third orphaning: %+v, state %s; want dead-lettered", res, got.State)
		case !got.Suspect:
			// Workers tell a message that may have killed its worker by it.
			t.Fatalf("orphaning %d: the message is not marked suspect", orphaning)
		case !strings.HasPrefix(got.LastError, broker.OrphanedErrorPrefix):
			t.Fatalf("orphaning %d: last error %q does not start with %q", orphaning, got.LastError, broker.OrphanedErrorPrefix)
		}
	}
}

func liveWorkers(t *testing.T, b Durable, after time.Duration) []string {
	t.Helper()
	live, err := b.LiveWorkers(ctxOf(t), after)
	if err != nil {
		t.Fatalf("LiveWorkers(%s): %v", after, err)
	}
	return live
}

// testExpireWorker: ExpireWorker takes a worker out of the live set at
// once (its row stays), a heartbeat brings it back, and LiveWorkers counts
// freshness by the window it is given.
func testExpireWorker(t *testing.T, s Store) {
	b := s.Broker
	ctx := ctxOf(t)
	register(t, b, "a", "b")
	if live := liveWorkers(t, b, time.Minute); !slices.Equal(live, []string{"a", "b"}) {
		t.Fatalf("LiveWorkers = %v, want [a b]", live)
	}
	if _, err := b.LiveWorkers(ctx, -time.Second); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("LiveWorkers(negative window): %v, want ErrInvalid", err)
	}
	if err := b.ExpireWorker(ctx, "a"); err != nil {
		t.Fatalf("ExpireWorker: %v", err)
	}
	if live := liveWorkers(t, b, 365*24*time.Hour); !slices.Equal(live, []string{"b"}) {
		t.Fatalf("after ExpireWorker(a) LiveWorkers = %v, want [b]", live)
	}
	if st := stats(t, b); st.Workers != 1 {
		t.Fatalf("Stats.Workers = %d, want 1", st.Workers)
	}
	// The row stays: Workers still lists it.
	if ws, err := b.Workers(ctx); err != nil || len(ws) != 2 {
		t.Fatalf("Workers after ExpireWorker = %+v, %v; want both", ws, err)
	}
	wantErr(t, "ExpireWorker(unknown)", b.ExpireWorker(ctx, "nobody"), broker.ErrNotFound)
	// A heartbeat brings it back.
	if err := b.Heartbeat(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if live := liveWorkers(t, b, time.Minute); !slices.Equal(live, []string{"a", "b"}) {
		t.Fatalf("after a heartbeat LiveWorkers = %v", live)
	}
	s.AgeHeartbeat(t, "b", 2*time.Minute)
	if live := liveWorkers(t, b, time.Minute); !slices.Equal(live, []string{"a"}) {
		t.Fatalf("with b two minutes silent LiveWorkers(1m) = %v, want [a]", live)
	}
	if live := liveWorkers(t, b, 3*time.Minute); !slices.Equal(live, []string{"a", "b"}) {
		t.Fatalf("LiveWorkers(3m) = %v, want [a b]", live)
	}
}

// testFencedReclaim: a reclaim pass fenced by a lease runs only while that
// term holds it, unexpired.
func testFencedReclaim(t *testing.T, s Store) {
	b := s.Broker
	ctx := ctxOf(t)
	register(t, b, "beat")
	id := submit(t, b, broker.SubmitRequest{Topic: "f", Task: "x"})
	m := claimOne(t, b, "ghost", "f")
	s.AgeClaim(t, m.ID, time.Hour)
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
		wantErr(t, "a pass fenced by "+name, func() error { _, err := b.ReclaimOrphans(ctx, req); return err }(), broker.ErrNotLeader)
	}
	wantState(t, b, id, broker.StateRunning)

	// An expired lease fences nothing either.
	s.ExpireLeases(t)
	req.Fence = &broker.Fence{Name: "beat", Holder: "beat", Term: l.Term}
	if _, err := b.ReclaimOrphans(ctx, req); !errors.Is(err, broker.ErrNotLeader) {
		t.Fatalf("fenced by an expired lease: %v, want ErrNotLeader", err)
	}
	wantState(t, b, id, broker.StateRunning)

	l, held, err = b.TryLease(ctx, "beat", "beat", time.Minute)
	if err != nil || !held {
		t.Fatalf("TryLease = %v, %v", held, err)
	}
	req.Fence = &broker.Fence{Name: "beat", Holder: "beat", Term: l.Term}
	res, err := b.ReclaimOrphans(ctx, req)
	if err != nil || res.Reclaimed != 1 {
		t.Fatalf("fenced by the current term = %+v, %v; want 1 reclaimed", res, err)
	}
	wantState(t, b, id, broker.StateQueued)

	// Fail closed on an empty live set, fence or not.
	req.Live = nil
	if _, err := b.ReclaimOrphans(ctx, req); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("empty live set: %v, want ErrInvalid", err)
	}
}

// testLeaseOneLeader: brokers on one store (as processes would be) race for
// one lease, round after round; each round exactly one holds it, at the
// next term.
func testLeaseOneLeader(t *testing.T, s Store) {
	ctx := ctxOf(t)
	const n = 4
	brokers := []Durable{s.Broker}
	for range n - 1 {
		brokers = append(brokers, s.Another(t))
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
		s.ExpireLeases(t)
	}
}

// testClosedOrphanMethods: after Close the reaper's methods, and calls that
// would do nothing, return broker.ErrClosed.
func testClosedOrphanMethods(t *testing.T, s Store) {
	b := s.Broker
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	ctx := ctxOf(t)
	if _, err := b.LiveWorkers(ctx, time.Minute); !errors.Is(err, broker.ErrClosed) {
		t.Errorf("LiveWorkers: %v", err)
	}
	if _, err := b.ReclaimOrphans(ctx, broker.ReclaimRequest{Live: []string{"x"}}); !errors.Is(err, broker.ErrClosed) {
		t.Errorf("ReclaimOrphans: %v", err)
	}
	if err := b.ExpireWorker(ctx, "x"); !errors.Is(err, broker.ErrClosed) {
		t.Errorf("ExpireWorker: %v", err)
	}
	if _, err := b.Stats(ctx); !errors.Is(err, broker.ErrClosed) {
		t.Errorf("Stats: %v", err)
	}
	if _, err := b.Ack(ctx, nil); !errors.Is(err, broker.ErrClosed) {
		t.Errorf("Ack(nothing): %v", err)
	}
	if _, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w"}); !errors.Is(err, broker.ErrClosed) {
		t.Errorf("Claim(no topics): %v", err)
	}
}
