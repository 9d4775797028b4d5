package brokertest

import (
	"cmp"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// testRunningClaims: RunningClaims lists exactly the claims (id and token)
// a worker's running messages are held under, by id; ended attempts leave
// the list, and an unknown worker has none.
func testRunningClaims(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	running := func(worker string) []broker.Claim {
		t.Helper()
		cs, err := b.RunningClaims(ctx, worker)
		if err != nil {
			t.Fatalf("RunningClaims(%s): %v", worker, err)
		}
		return cs
	}
	submitN(t, b, "rc", 4)
	a := claim(t, b, "w1", 3, "rc")
	if len(a) != 3 {
		t.Fatalf("claimed %d, want 3", len(a))
	}
	other := claimOne(t, b, "w2", "rc")
	want := []broker.Claim{a[0].ClaimOf(), a[1].ClaimOf(), a[2].ClaimOf()}
	slices.SortFunc(want, func(x, y broker.Claim) int { return cmp.Compare(x.ID, y.ID) })
	if got := running("w1"); !slices.Equal(got, want) {
		t.Fatalf("RunningClaims(w1) = %v, want %v", got, want)
	}
	if got := running("w2"); !slices.Equal(got, []broker.Claim{other.ClaimOf()}) {
		t.Fatalf("RunningClaims(w2) = %v, want %v", got, []broker.Claim{other.ClaimOf()})
	}
	if got := running("nobody"); len(got) != 0 {
		t.Fatalf("RunningClaims(nobody) = %v, want none", got)
	}
	if errs, err := b.Ack(ctx, []broker.Outcome{{Claim: want[0]}}); err != nil || errs[0] != nil {
		t.Fatalf("Ack: %v %v", errs, err)
	}
	if err := b.Nack(ctx, broker.NackRequest{Claim: want[1], Requeue: true}); err != nil {
		t.Fatalf("Nack: %v", err)
	}
	if got := running("w1"); !slices.Equal(got, want[2:]) {
		t.Fatalf("RunningClaims(w1) after an ack and a nack = %v, want %v", got, want[2:])
	}
	// The requeued message, claimed again by w1, comes back under its new
	// token only.
	again := claimOne(t, b, "w1", "rc")
	if again.ID != want[1].ID || again.Token == want[1].Token {
		t.Fatalf("claimed again %d (token %q), want %d under a new token", again.ID, again.Token, want[1].ID)
	}
	if got := running("w1"); !slices.Equal(got, []broker.Claim{again.ClaimOf(), want[2]}) {
		t.Fatalf("RunningClaims(w1) after the claim again = %v, want %v", got, []broker.Claim{again.ClaimOf(), want[2]})
	}
}

func testWorkersStats(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	w1 := broker.WorkerInfo{ID: "w1", Host: "h1", PID: 11, Roles: []string{broker.RoleWorker}, Topics: []string{"a"}, Capacity: 4,
		Tasks: []string{"a.x", "a.y"}}
	w2 := broker.WorkerInfo{ID: "w2", Host: "h2", PID: 22, Roles: []string{broker.RoleWorker, broker.RoleBeat}, Topics: []string{"*"}, Capacity: 2}
	for _, w := range []broker.WorkerInfo{w2, w1} {
		if err := b.RegisterWorker(ctx, w); err != nil {
			t.Fatalf("RegisterWorker(%s): %v", w.ID, err)
		}
	}
	if err := b.RegisterWorker(ctx, broker.WorkerInfo{}); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("RegisterWorker(no id): %v, want ErrInvalid", err)
	}
	ws, err := b.Workers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 2 || ws[0].ID != "w1" || ws[1].ID != "w2" {
		t.Fatalf("Workers = %+v, want w1, w2", ws)
	}
	if w := ws[0]; w.Host != "h1" || w.PID != 11 || w.Capacity != 4 || !slices.Equal(w.Topics, []string{"a"}) ||
		!slices.Equal(w.Roles, []string{broker.RoleWorker}) || w.StartedAt.IsZero() || w.HeartbeatAt.IsZero() ||
		!slices.Equal(w.Tasks, []string{"a.x", "a.y"}) {
		t.Fatalf("w1 = %+v", w)
	}
	if len(ws[1].Tasks) != 0 {
		t.Fatalf("w2 registered no task, has %v", ws[1].Tasks)
	}
	// The same process registers again with one more task: the tasks
	// change, its start does not.
	w1.Tasks = append(w1.Tasks, "a.z")
	if err := b.RegisterWorker(ctx, w1); err != nil {
		t.Fatal(err)
	}
	if again, err := b.Workers(ctx); err != nil || !slices.Equal(again[0].Tasks, w1.Tasks) || !again[0].StartedAt.Equal(ws[0].StartedAt) {
		t.Fatalf("w1 registered again = %+v, %v; want tasks %v and the start %v kept", again[0], err, w1.Tasks, ws[0].StartedAt)
	}
	before := ws[0].HeartbeatAt
	if err := b.Heartbeat(ctx, "w1"); err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}
	wantErr(t, "Heartbeat(unknown)", b.Heartbeat(ctx, "nobody"), broker.ErrNotFound)
	ws, _ = b.Workers(ctx)
	if ws[0].HeartbeatAt.Before(before) {
		t.Fatalf("heartbeat went back in time: %v -> %v", before, ws[0].HeartbeatAt)
	}

	submitN(t, b, "a", 3)
	submitN(t, b, "b", 2)
	c1 := claimOne(t, b, "w1", "a")
	claimOne(t, b, "w2", "b")
	dl := claimOne(t, b, "w2", "b")
	if err := b.DeadLetter(ctx, dl.ClaimOf(), "x", nil); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.AcquireLock(ctx, "lk", "w1", c1.ClaimOf()); err != nil || !ok {
		t.Fatalf("AcquireLock = %v, %v", ok, err)
	}

	ws, _ = b.Workers(ctx)
	if ws[0].Running != 1 || ws[1].Running != 1 {
		t.Fatalf("Workers running = %d, %d, want 1, 1", ws[0].Running, ws[1].Running)
	}

	var st broker.Stats
	eventually(t, 5*time.Second, "OldestClaimAge > 0", func() bool {
		st = stats(t, b)
		return topicStats(t, st, "a").OldestClaimAge > 0
	})
	if st.Workers != 2 || st.Beats != 1 || st.Locks != 1 {
		t.Fatalf("Stats workers %d, beats %d, locks %d, want 2, 1, 1", st.Workers, st.Beats, st.Locks)
	}
	if names := func() []string {
		var n []string
		for _, ts := range st.Topics {
			n = append(n, ts.Name)
		}
		return n
	}(); !slices.Equal(names, []string{"a", "b"}) {
		t.Fatalf("Stats topics %v, want [a b]", names)
	}
	a, bs := topicStats(t, st, "a"), topicStats(t, st, "b")
	if a.Queued != 2 || a.Running != 1 || a.DeadLetter != 0 || a.Subscribers != 2 {
		t.Fatalf("topic a = %+v, want 2 queued, 1 running, 0 dead, 2 subscribers", a)
	}
	if bs.Queued != 0 || bs.Running != 1 || bs.DeadLetter != 1 || bs.Subscribers != 1 || bs.OldestClaimAge <= 0 {
		t.Fatalf("topic b = %+v, want 0 queued, 1 running, 1 dead, 1 subscriber, a claim age", bs)
	}
	if !a.DeadLetterEnabled || a.Paused || a.ConcurrencyLimit != 0 {
		t.Fatalf("topic a config in stats = %+v", a.TopicConfig)
	}

	ack(t, b, c1.ClaimOf(), "")
	if a := topicStats(t, stats(t, b), "a"); a.OldestClaimAge != 0 || a.Running != 0 {
		t.Fatalf("topic a with nothing running: %+v, want claim age 0", a)
	}

	if err := b.UnregisterWorker(ctx, "w1"); err != nil {
		t.Fatalf("UnregisterWorker: %v", err)
	}
	ws, _ = b.Workers(ctx)
	if len(ws) != 1 || ws[0].ID != "w2" {
		t.Fatalf("after unregister Workers = %+v, want w2", ws)
	}
	st = stats(t, b)
	if st.Workers != 1 || st.Beats != 1 || topicStats(t, st, "a").Subscribers != 1 {
		t.Fatalf("after unregister Stats = %+v", st)
	}
	// Re-registering is an upsert.
	w2.Topics = []string{"b"}
	w2.Roles = []string{broker.RoleWorker}
	if err := b.RegisterWorker(ctx, w2); err != nil {
		t.Fatal(err)
	}
	st = stats(t, b)
	if st.Workers != 1 || st.Beats != 0 || topicStats(t, st, "a").Subscribers != 0 || topicStats(t, st, "b").Subscribers != 1 {
		t.Fatalf("after re-register Stats = %+v", st)
	}
}
