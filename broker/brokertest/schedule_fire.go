package brokertest

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// Firing schedules: one at a time, in batches, fenced, and the due ones
// found by their next run.

func testFireOnce(t *testing.T, b broker.Broker) {
	sched := every("s", 60)
	sched.Topic = "fired"
	sched.Payload = json.RawMessage(`{"k": "v", "n": 7}`)
	sched = putSchedule(t, b, sched)
	base := baseTime()
	next := base.Add(time.Minute)

	req := broker.FireRequest{Name: "s", Slot: base, Next: next, Submit: &broker.SubmitRequest{
		Topic: sched.Topic, Task: sched.Task, Payload: sched.Payload,
		Headers: map[string]string{"trace": "abc", "schedule": "overridden"},
	}}
	const n = 8
	results := make([]broker.FireResult, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	before := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i], errs[i] = b.FireSchedule(ctxOf(t), req)
		}()
	}
	close(start)
	wg.Wait()
	after := time.Now()
	var winner broker.FireResult
	fired := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("concurrent FireSchedule #%d: %v", i, errs[i])
		}
		if results[i].Fired {
			fired++
			winner = results[i]
		} else if results[i].MessageID != 0 {
			t.Fatalf("a fire that did not fire returned message %d", results[i].MessageID)
		}
	}
	if fired != 1 || winner.MessageID <= 0 {
		t.Fatalf("%d concurrent fires of one slot: %d fired (results %+v); want exactly one, with a message", n, fired, results)
	}
	msgs := list(t, b, broker.MessageFilter{Topic: "fired"})
	if len(msgs) != 1 || msgs[0].ID != winner.MessageID {
		t.Fatalf("messages on the topic = %v, want only %d", ids(msgs), winner.MessageID)
	}
	m := msgs[0]
	if m.Task != sched.Task || m.State != broker.StateQueued || !jsonEqual(m.Payload, sched.Payload) {
		t.Fatalf("submitted message = %+v; want task %s, queued, payload %s", m, sched.Task, sched.Payload)
	}
	if m.Headers["schedule"] != "s" || m.Headers["trace"] != "abc" {
		t.Fatalf("submitted message headers = %v; want schedule=s and trace=abc", m.Headers)
	}
	if len(req.Submit.Headers) != 2 || req.Submit.Headers["schedule"] != "overridden" {
		t.Fatalf("FireSchedule changed the caller's headers: %v", req.Submit.Headers)
	}
	s1 := getSchedule(t, b, "s")
	wantRecent(t, "LastAttempt", s1.LastAttempt, before, after)
	wantRunState(t, "after the fire", s1, s1.LastAttempt, nil, &next)

	// The same slot again, with another Next: nothing changes.
	again := req
	again.Next = base.Add(time.Hour)
	if res := fire(t, b, again); res.Fired || res.MessageID != 0 {
		t.Fatalf("fire of a fired slot = %+v, want not fired", res)
	}
	wantRunState(t, "after a repeated fire", getSchedule(t, b, "s"), s1.LastAttempt, nil, &next)
	if msgs := list(t, b, broker.MessageFilter{Topic: "fired"}); len(msgs) != 1 {
		t.Fatalf("a repeated fire submitted: messages %v", ids(msgs))
	}

	// The next slot fires and advances the schedule.
	time.Sleep(5 * time.Millisecond)
	next2 := base.Add(2 * time.Minute)
	req2 := req
	req2.Slot, req2.Next = next, next2
	res := fire(t, b, req2)
	if !res.Fired || res.MessageID <= winner.MessageID {
		t.Fatalf("fire of the next slot = %+v, want fired with a new message", res)
	}
	s2 := getSchedule(t, b, "s")
	if s2.LastAttempt == nil || s2.LastAttempt.Before(*s1.LastAttempt) {
		t.Fatalf("LastAttempt went from %s to %s", fmtTime(s1.LastAttempt), fmtTime(s2.LastAttempt))
	}
	wantRunState(t, "after the next slot", s2, s2.LastAttempt, nil, &next2)
	if msgs := list(t, b, broker.MessageFilter{Topic: "fired"}); len(msgs) != 2 {
		t.Fatalf("after two slots: messages %v, want 2", ids(msgs))
	}
	// A zero Next clears the next run.
	req3 := req
	req3.Slot, req3.Next, req3.Submit = next2, time.Time{}, nil
	fire(t, b, req3)
	s3 := getSchedule(t, b, "s")
	wantRunState(t, "after a fire with no next slot", s3, s3.LastAttempt, nil, nil)
}

func testFireWithoutSubmit(t *testing.T, b broker.Broker) {
	putSchedule(t, b, every("s", 60))
	base := baseTime()
	next := base.Add(time.Minute)
	before := time.Now()
	res := fire(t, b, broker.FireRequest{Name: "s", Slot: base, Next: next})
	if !res.Fired || res.MessageID != 0 {
		t.Fatalf("fire without a message = %+v, want fired, message 0", res)
	}
	s := getSchedule(t, b, "s")
	wantRecent(t, "LastAttempt", s.LastAttempt, before, time.Now())
	wantRunState(t, "after a fire without a message", s, s.LastAttempt, nil, &next)
	if msgs := list(t, b, broker.MessageFilter{}); len(msgs) != 0 {
		t.Fatalf("a fire without a message submitted %v", ids(msgs))
	}
	if res := fire(t, b, broker.FireRequest{Name: "s", Slot: base, Next: next}); res.Fired {
		t.Fatal("the slot fired twice")
	}
}

func testFireFenced(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	putSchedule(t, b, every("s", 60))
	l, held, err := b.TryLease(ctx, "beat", "a", time.Minute)
	if err != nil || !held {
		t.Fatalf("TryLease = %+v, %v, %v", l, held, err)
	}
	base := baseTime()
	sub := &broker.SubmitRequest{Topic: "fenced", Task: "t.s"}
	for _, f := range []broker.Fence{
		{Name: "beat", Holder: "a", Term: l.Term + 1},
		{Name: "beat", Holder: "a", Term: l.Term - 1},
		{Name: "beat", Holder: "b", Term: l.Term},
		{Name: "other", Holder: "a", Term: l.Term},
	} {
		_, err := b.FireSchedule(ctx, broker.FireRequest{Name: "s", Slot: base, Next: base.Add(time.Minute), Submit: sub, Fence: &f})
		wantErr(t, fmt.Sprintf("FireSchedule with fence %+v", f), err, broker.ErrNotLeader)
	}
	wantRunState(t, "after refused fires", getSchedule(t, b, "s"), nil, nil, nil)
	if msgs := list(t, b, broker.MessageFilter{}); len(msgs) != 0 {
		t.Fatalf("a refused fire submitted %v", ids(msgs))
	}
	// The slot was not recorded: the leader fires it.
	res := fire(t, b, broker.FireRequest{Name: "s", Slot: base, Next: base.Add(time.Minute), Submit: sub,
		Fence: &broker.Fence{Name: "beat", Holder: "a", Term: l.Term}})
	if !res.Fired || res.MessageID == 0 {
		t.Fatalf("fire under the held lease = %+v, want fired with a message", res)
	}
	// Released, the lease no longer fences.
	if err := b.ReleaseLease(ctx, "beat", "a", l.Term); err != nil {
		t.Fatal(err)
	}
	_, err = b.FireSchedule(ctx, broker.FireRequest{Name: "s", Slot: base.Add(time.Minute), Submit: sub,
		Fence: &broker.Fence{Name: "beat", Holder: "a", Term: l.Term}})
	wantErr(t, "FireSchedule under a released lease", err, broker.ErrNotLeader)
}

func testFireMissing(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	base := baseTime()
	sub := &broker.SubmitRequest{Topic: "gone", Task: "t.s"}
	_, err := b.FireSchedule(ctx, broker.FireRequest{Name: "s", Slot: base, Submit: sub})
	wantErr(t, "FireSchedule(missing)", err, broker.ErrNotFound)

	putSchedule(t, b, every("s", 60))
	if res := fire(t, b, broker.FireRequest{Name: "s", Slot: base, Submit: sub}); !res.Fired {
		t.Fatal("first fire did not fire")
	}
	if err := b.DeleteSchedule(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	_, err = b.FireSchedule(ctx, broker.FireRequest{Name: "s", Slot: base.Add(time.Minute), Submit: sub})
	wantErr(t, "FireSchedule(deleted)", err, broker.ErrNotFound)
	if msgs := list(t, b, broker.MessageFilter{Topic: "gone"}); len(msgs) != 1 {
		t.Fatalf("fires of a missing schedule submitted: messages %v, want 1", ids(msgs))
	}

	// Created again, the schedule has no fired slots: its fires went with
	// it.
	putSchedule(t, b, every("s", 60))
	if res := fire(t, b, broker.FireRequest{Name: "s", Slot: base, Submit: sub}); !res.Fired {
		t.Fatal("a re-created schedule did not fire a slot its predecessor fired")
	}

	// Malformed requests store nothing.
	for _, tc := range []struct {
		name string
		req  broker.FireRequest
	}{
		{"no name", broker.FireRequest{Slot: base}},
		{"no slot", broker.FireRequest{Name: "s"}},
		{"invalid message", broker.FireRequest{Name: "s", Slot: base.Add(time.Hour), Submit: &broker.SubmitRequest{Topic: "gone"}}},
		{"message not JSON", broker.FireRequest{Name: "s", Slot: base.Add(time.Hour),
			Submit: &broker.SubmitRequest{Topic: "gone", Task: "x", Payload: json.RawMessage(`{`)}}},
	} {
		_, err := b.FireSchedule(ctx, tc.req)
		wantErr(t, "FireSchedule("+tc.name+")", err, broker.ErrInvalid)
	}
	if res := fire(t, b, broker.FireRequest{Name: "s", Slot: base.Add(time.Hour)}); !res.Fired {
		t.Fatal("an invalid fire recorded its slot")
	}
}

// dueNames lists the names DueSchedules returns for f.
func dueNames(t *testing.T, b broker.Broker, f broker.DueFilter) []string {
	t.Helper()
	ss, err := b.DueSchedules(ctxOf(t), f)
	if err != nil {
		t.Fatalf("DueSchedules(%+v): %v", f, err)
	}
	return scheduleNames(ss)
}

// wantNextFire checks a schedule's NextFireAt.
func wantNextFire(t *testing.T, what string, s broker.Schedule, want *time.Time) {
	t.Helper()
	if !sameTime(s.NextFireAt, want) {
		t.Fatalf("%s: NextFireAt %s, want %s", what, fmtTime(s.NextFireAt), fmtTime(want))
	}
}

// NextFireAt is the start of the second of UpdatedAt until the schedule
// fires, then its expected next run; a put keeps it with the run state,
// and resets it when the timing changed. DueSchedules returns the enabled
// schedules due by At, by (NextFireAt, Name), in bounded pages that go on
// after a given schedule.
func testDueSchedules(t *testing.T, b broker.Broker) {
	a := putSchedule(t, b, every("a", 60))
	first := a.UpdatedAt.Truncate(time.Second)
	wantNextFire(t, "new schedule", a, &first)
	wantNextFire(t, "read back", getSchedule(t, b, "a"), &first)

	c := putSchedule(t, b, every("c", 60))
	d := every("d", 60)
	d.Enabled = false
	putSchedule(t, b, d)
	bb := putSchedule(t, b, every("b", 60))
	late := bb.UpdatedAt.Add(time.Hour)

	if got := dueNames(t, b, broker.DueFilter{At: first.Add(-time.Second)}); len(got) != 0 {
		t.Fatalf("due before any first slot: %v, want none", got)
	}
	if got := dueNames(t, b, broker.DueFilter{At: late}); !slices.Equal(got, sortedByNext(a, bb, c)) {
		t.Fatalf("due = %v, want %v (enabled ones by next fire, then name; d is disabled)", got, sortedByNext(a, bb, c))
	}

	// Firing a moves its NextFireAt to Next: due only from then.
	slot, next := first, first.Add(2*time.Hour)
	fire(t, b, broker.FireRequest{Name: "a", Slot: slot, Next: next})
	wantNextFire(t, "after a fire", getSchedule(t, b, "a"), &next)
	if got := dueNames(t, b, broker.DueFilter{At: late}); slices.Contains(got, "a") {
		t.Fatalf("due after a's fire = %v; a is next due at %s", got, next)
	}
	if got := dueNames(t, b, broker.DueFilter{At: next}); !slices.Contains(got, "a") {
		t.Fatalf("due at a's next fire = %v; want a", got)
	}
	// A put that keeps the timing keeps it; one that changes it resets it.
	a2 := putSchedule(t, b, every("a", 60))
	wantNextFire(t, "put, same timing", a2, &next)
	a3 := putSchedule(t, b, every("a", 30))
	reset := a3.UpdatedAt.Truncate(time.Second)
	wantNextFire(t, "put, new timing", a3, &reset)

	// Pages: limit 1, going on after the last one seen.
	want := dueNames(t, b, broker.DueFilter{At: late.Add(time.Hour)})
	var paged []string
	f := broker.DueFilter{At: late.Add(time.Hour), Limit: 1}
	for range 10 {
		ss, err := b.DueSchedules(ctxOf(t), f)
		if err != nil {
			t.Fatal(err)
		}
		if len(ss) == 0 {
			break
		}
		if len(ss) != 1 {
			t.Fatalf("limit 1 returned %d", len(ss))
		}
		paged = append(paged, ss[0].Name)
		f.AfterNext, f.AfterName = *ss[0].NextFireAt, ss[0].Name
	}
	if !slices.Equal(paged, want) || len(want) != 3 {
		t.Fatalf("paged = %v, want %v (3 enabled schedules)", paged, want)
	}

	// Disabled schedules are never due; enabling makes them due again.
	d.Enabled = true
	putSchedule(t, b, d)
	if got := dueNames(t, b, broker.DueFilter{At: late.Add(time.Hour)}); !slices.Contains(got, "d") {
		t.Fatalf("due after enabling d = %v", got)
	}
	if err := b.DeleteSchedule(ctxOf(t), "d"); err != nil {
		t.Fatal(err)
	}
	if got := dueNames(t, b, broker.DueFilter{At: late.Add(time.Hour)}); slices.Contains(got, "d") {
		t.Fatalf("due after deleting d = %v", got)
	}
}

// sortedByNext returns the names of ss by (NextFireAt, Name).
func sortedByNext(ss ...broker.Schedule) []string {
	slices.SortFunc(ss, func(x, y broker.Schedule) int {
		if c := x.NextFireAt.Compare(*y.NextFireAt); c != 0 {
			return c
		}
		return strings.Compare(x.Name, y.Name)
	})
	return scheduleNames(ss)
}

// DeferSchedule moves a never-fired, unchanged schedule's NextFireAt
// forward, and nothing else.
func testDeferSchedule(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	s := putSchedule(t, b, broker.Schedule{Name: "cron", Task: "t", Topic: "sched", Cron: "0 0 1 1 *", Enabled: true})
	until := s.UpdatedAt.Truncate(time.Second).Add(48 * time.Hour)
	ok, err := b.DeferSchedule(ctx, s, until)
	if err != nil || !ok {
		t.Fatalf("DeferSchedule = %v, %v; want true", ok, err)
	}
	got := getSchedule(t, b, "cron")
	wantNextFire(t, "deferred", got, &until)
	wantRunState(t, "deferred", got, nil, nil, nil)
	if !got.UpdatedAt.Equal(s.UpdatedAt) {
		t.Fatalf("DeferSchedule changed updated_at")
	}
	if names := dueNames(t, b, broker.DueFilter{At: until.Add(-time.Second)}); len(names) != 0 {
		t.Fatalf("due before its deferred first slot: %v", names)
	}
	// Not backwards, not for a stale read, not once fired.
	if ok, _ := b.DeferSchedule(ctx, got, until.Add(-time.Hour)); ok {
		t.Fatal("DeferSchedule moved NextFireAt backwards")
	}
	s2 := putSchedule(t, b, broker.Schedule{Name: "cron", Task: "t2", Topic: "sched", Cron: "0 0 1 1 *", Enabled: true})
	if ok, _ := b.DeferSchedule(ctx, s, until.Add(time.Hour)); ok {
		t.Fatal("DeferSchedule applied a read older than the last put")
	}
	fire(t, b, broker.FireRequest{Name: "cron", Slot: until, Next: until.Add(time.Hour)})
	if ok, _ := b.DeferSchedule(ctx, s2, until.Add(2*time.Hour)); ok {
		t.Fatal("DeferSchedule moved a schedule that has fired")
	}
	if _, err := b.DeferSchedule(ctx, broker.Schedule{Name: "none"}, until); err != nil {
		t.Fatalf("DeferSchedule of a missing schedule: %v, want false and no error", err)
	}
}

// FireSchedules fires a batch as FireSchedule fires each: in order, a
// slot fired before reports Fired false, a missing schedule Missing; a
// bad fence or an invalid request changes nothing.
func testFireSchedules(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	base := baseTime()
	putSchedule(t, b, every("a", 60))
	putSchedule(t, b, every("b", 60))
	fire(t, b, broker.FireRequest{Name: "b", Slot: base, Next: base.Add(time.Minute)})
	sub := &broker.SubmitRequest{Topic: "sched", Task: "t.a", Payload: json.RawMessage(`{}`)}
	lease, held, err := b.TryLease(ctx, "beat", "h", time.Minute)
	if err != nil || !held {
		t.Fatalf("TryLease: %v %v", held, err)
	}
	good := &broker.Fence{Name: "beat", Holder: "h", Term: lease.Term}
	bad := &broker.Fence{Name: "beat", Holder: "h", Term: lease.Term + 1}
	reqs := func(f *broker.Fence) []broker.FireRequest {
		return []broker.FireRequest{
			{Name: "a", Slot: base, Next: base.Add(time.Minute), Submit: sub, Fence: f},
			{Name: "gone", Slot: base, Next: base.Add(time.Minute), Fence: f},
			{Name: "b", Slot: base, Next: base.Add(time.Minute), Submit: sub, Fence: f},
		}
	}
	_, err = b.FireSchedules(ctx, reqs(bad))
	wantErr(t, "FireSchedules with a stale fence", err, broker.ErrNotLeader)
	if s := getSchedule(t, b, "a"); s.LastAttempt != nil {
		t.Fatalf("a fenced-off batch fired a: %+v", s)
	}
	invalid := reqs(good)
	invalid[2].Slot = time.Time{}
	_, err = b.FireSchedules(ctx, invalid)
	wantErr(t, "FireSchedules with a request without a slot", err, broker.ErrInvalid)

	res, err := b.FireSchedules(ctx, reqs(good))
	if err != nil {
		t.Fatalf("FireSchedules: %v", err)
	}
	if len(res) != 3 || !res[0].Fired || res[0].MessageID == 0 || !res[1].Missing || res[1].Fired ||
		res[2].Fired || res[2].Missing || res[2].MessageID != 0 {
		t.Fatalf("results %+v, want a fired with a message, gone missing, b fired before", res)
	}
	a := getSchedule(t, b, "a")
	next := base.Add(time.Minute)
	wantNextFire(t, "a after the batch", a, &next)
	if a.LastAttempt == nil || !sameTime(a.ExpectedNextRun, &next) {
		t.Fatalf("a after the batch: %+v", a)
	}
	m, err := b.GetMessage(ctx, res[0].MessageID)
	if err != nil || m.Headers[broker.ScheduleHeader] != "a" {
		t.Fatalf("a's message: %+v, %v", m, err)
	}
	again, err := b.FireSchedules(ctx, reqs(good)[:1])
	if err != nil || len(again) != 1 || again[0].Fired {
		t.Fatalf("a's slot fired again: %+v, %v", again, err)
	}
	if none, err := b.FireSchedules(ctx, nil); err != nil || len(none) != 0 {
		t.Fatalf("FireSchedules of nothing: %v, %v", none, err)
	}
}
