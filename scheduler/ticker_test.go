package scheduler

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/memory"
	"github.com/taskhost/taskhost/scheduler/timing"
)

// clockTicker returns a ticker over b, on a clock the test sets, that
// counts each schedule's submissions, and the fence to tick with.
func clockTicker(t *testing.T, b *memory.Broker) (*Ticker, *slowStore, *time.Time, broker.Fence) {
	t.Helper()
	lease, held, err := b.TryLease(context.Background(), BeatLease, "h", time.Hour)
	if err != nil || !held {
		t.Fatalf("lease: %+v %v %v", lease, held, err)
	}
	store := &slowStore{ScheduleStore: b, submitted: map[string]int{}}
	clock := new(time.Time)
	tk := &Ticker{Store: store, Now: func() time.Time { return *clock },
		Lookup: func(task, topic string) (string, bool) { return "q", true }}
	return tk, store, clock, broker.Fence{Name: BeatLease, Holder: "h", Term: lease.Term}
}

func tick(t *testing.T, tk *Ticker, fence broker.Fence) {
	t.Helper()
	if err := tk.Tick(context.Background(), fence); err != nil {
		t.Fatal(err)
	}
}

// A pass that reaches a schedule after more than its period (the passes
// are slower than the slots) fires the latest slot late; before, it
// skipped it as "missed while no beat ran", at every pass.
func TestSlowPassFiresLateSlot(t *testing.T) {
	b := memory.New()
	ctx := context.Background()
	s, err := b.PutSchedule(ctx, broker.Schedule{Name: "a", Task: "t", Topic: "q", IntervalSeconds: 1, Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	tk, store, clock, fence := clockTicker(t, b)
	first := s.UpdatedAt.UTC().Truncate(time.Second)
	*clock = first.Add(500 * time.Millisecond)
	tick(t, tk, fence)
	// The next pass starts 3 s later (the previous one took that long):
	// slots first+1s and first+2s were passed over while the beat ran.
	*clock = first.Add(3500 * time.Millisecond)
	tick(t, tk, fence)
	if n := store.submitted["a"]; n != 2 {
		t.Fatalf("submitted %d, want 2: the late slot fires, it is not skipped", n)
	}
	got, _ := b.GetSchedule(ctx, "a")
	if want := first.Add(4 * time.Second); got.ExpectedNextRun == nil || !got.ExpectedNextRun.Equal(want) {
		t.Fatalf("next run %v, want %s (after the latest due slot)", got.ExpectedNextRun, want)
	}
	// A pause far longer than a tick (no beat ran): the missed policy
	// (skip) applies again.
	*clock = first.Add(time.Minute)
	tick(t, tk, fence)
	if n := store.submitted["a"]; n != 2 {
		t.Fatalf("submitted %d after a pause with no pass, want 2 (the slots missed while no beat ran are skipped)", n)
	}
	// And from there, passes that follow each other catch up again.
	*clock = first.Add(time.Minute + 2500*time.Millisecond)
	tick(t, tk, fence)
	if n := store.submitted["a"]; n != 3 {
		t.Fatalf("submitted %d, want 3", n)
	}
}

// Slots missed while no beat ran keep their policy at a term's first
// pass: skip records the latest slot without submitting, fire_once
// submits it once.
func TestMissedWhileNoBeatRanKeepsPolicy(t *testing.T) {
	b := memory.New()
	ctx := context.Background()
	for _, s := range []broker.Schedule{
		{Name: "skip", Task: "t", Topic: "q", IntervalSeconds: 60, Enabled: true},
		{Name: "once", Task: "t", Topic: "q", IntervalSeconds: 60, Enabled: true, MissedPolicy: broker.MissedFireOnce},
	} {
		if _, err := b.PutSchedule(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	tk, store, clock, fence := clockTicker(t, b)
	s, _ := b.GetSchedule(ctx, "skip")
	*clock = s.UpdatedAt.UTC().Truncate(time.Second).Add(185 * time.Second)
	tick(t, tk, fence)
	if store.submitted["skip"] != 0 || store.submitted["once"] != 1 {
		t.Fatalf("submitted %v, want skip 0 and once 1", store.submitted)
	}
	for _, name := range []string{"skip", "once"} {
		got, _ := b.GetSchedule(ctx, name)
		if got.LastAttempt == nil || got.ExpectedNextRun == nil || !got.ExpectedNextRun.After(*clock) {
			t.Fatalf("%s: attempt %v next %v, want the latest slot recorded and the next after now", name, got.LastAttempt, got.ExpectedNextRun)
		}
	}
}

// A cron schedule's first slot is not due yet: the pass defers its index
// entry to that slot, so later passes do not read it until then.
func TestCronFirstSlotIsDeferred(t *testing.T) {
	b := memory.New()
	ctx := context.Background()
	s, err := b.PutSchedule(ctx, broker.Schedule{Name: "yearly", Task: "t", Topic: "q", Cron: "0 0 1 1 *", Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	tk, store, clock, fence := clockTicker(t, b)
	*clock = s.UpdatedAt.Add(time.Second)
	if due, _ := b.DueSchedules(ctx, broker.DueFilter{At: *clock}); len(due) != 1 {
		t.Fatalf("due before the pass: %d, want the cron schedule (its index entry is a lower bound)", len(due))
	}
	tick(t, tk, fence)
	if due, _ := b.DueSchedules(ctx, broker.DueFilter{At: *clock}); len(due) != 0 {
		t.Fatalf("due after the pass: %d, want none until its first slot", len(due))
	}
	first, _ := timing.NextRun(s)
	got, _ := b.GetSchedule(ctx, "yearly")
	if got.NextFireAt == nil || !got.NextFireAt.Equal(first) || store.submitted["yearly"] != 0 {
		t.Fatalf("next fire %v, want %s; submitted %d", got.NextFireAt, first, store.submitted["yearly"])
	}
	*clock = first
	tick(t, tk, fence)
	if store.submitted["yearly"] != 1 {
		t.Fatalf("submitted %d at the first slot, want 1", store.submitted["yearly"])
	}
}

// Many due schedules are read in bounded batches and every one fires.
func TestPassReadsInBatches(t *testing.T) {
	b := memory.New()
	ctx := context.Background()
	for i := range 250 {
		if _, err := b.PutSchedule(ctx, broker.Schedule{Name: fmt.Sprintf("s%03d", i), Task: "t", Topic: "q", IntervalSeconds: 60, Enabled: true}); err != nil {
			t.Fatal(err)
		}
	}
	tk, store, clock, fence := clockTicker(t, b)
	tk.Batch = 7
	*clock = time.Now().Add(time.Second)
	tick(t, tk, fence)
	store.mu.Lock()
	defer store.mu.Unlock()
	if len(store.submitted) != 250 {
		t.Fatalf("%d schedules fired, want 250", len(store.submitted))
	}
}

// A schedule's unique key goes with its fires: while the task of one fire
// is still queued, the next fire submits nothing.
func TestUniqueKeyHoldsNextFire(t *testing.T) {
	b := memory.New()
	ctx := context.Background()
	s, err := b.PutSchedule(ctx, broker.Schedule{Name: "k", Task: "t", Topic: "q", IntervalSeconds: 1, Enabled: true, UniqueKey: "only-one"})
	if err != nil {
		t.Fatal(err)
	}
	tk, _, clock, fence := clockTicker(t, b)
	first := s.UpdatedAt.UTC().Truncate(time.Second)
	for i := range 3 {
		*clock = first.Add(time.Duration(i)*time.Second + 500*time.Millisecond)
		tick(t, tk, fence)
	}
	msgs, err := b.ListMessages(ctx, broker.MessageFilter{Topic: "q"})
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 1 || msgs[0].UniqueKey != "only-one" {
		t.Fatalf("%d messages (%+v), want the first fire's alone, with the key", len(msgs), msgs)
	}
	got, _ := b.GetSchedule(ctx, "k")
	if want := first.Add(3 * time.Second); got.ExpectedNextRun == nil || !got.ExpectedNextRun.Equal(want) {
		t.Fatalf("next run %v, want %s: the refused fires still count as fired", got.ExpectedNextRun, want)
	}
}
