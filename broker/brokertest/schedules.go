package brokertest

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// RunSchedules runs the conformance suite of broker.ScheduleStore; newBroker
// is as for Run. The rules it checks are those of package broker's
// documentation (Schedules and reports).
func RunSchedules(t *testing.T, newBroker func(t *testing.T) broker.Broker) {
	runCases(t, newBroker, []testCase[broker.Broker]{
		{"PutGetListDelete", testSchedulePutGetListDelete},
		{"Validation", testScheduleValidation},
		{"RunStateKeptAcrossPut", testScheduleRunState},
		{"FireOncePerSlotUnderContention", testFireOnce},
		{"FireWithoutSubmit", testFireWithoutSubmit},
		{"FireFenced", testFireFenced},
		{"FireMissingOrDeleted", testFireMissing},
		{"DueSchedulesByIndex", testDueSchedules},
		{"DeferSchedule", testDeferSchedule},
		{"FireSchedulesBatch", testFireSchedules},
		{"ReportsStampLastSuccess", testReportsLastSuccess},
		{"AddReports", testAddReports},
		{"ListReports", testListReports},
		{"PurgeReports", testPurgeReports},
	})
}

// ---- helpers ----

func putSchedule(t *testing.T, b broker.Broker, s broker.Schedule) broker.Schedule {
	t.Helper()
	out, err := b.PutSchedule(ctxOf(t), s)
	if err != nil {
		t.Fatalf("PutSchedule(%s): %v", s.Name, err)
	}
	return out
}

func getSchedule(t *testing.T, b broker.Broker, name string) broker.Schedule {
	t.Helper()
	s, err := b.GetSchedule(ctxOf(t), name)
	if err != nil {
		t.Fatalf("GetSchedule(%s): %v", name, err)
	}
	return s
}

func fire(t *testing.T, b broker.Broker, req broker.FireRequest) broker.FireResult {
	t.Helper()
	res, err := b.FireSchedule(ctxOf(t), req)
	if err != nil {
		t.Fatalf("FireSchedule(%s @ %s): %v", req.Name, req.Slot.Format(time.RFC3339Nano), err)
	}
	return res
}

func addReport(t *testing.T, b broker.Broker, r broker.Report) int64 {
	t.Helper()
	id, err := b.AddReport(ctxOf(t), r)
	if err != nil {
		t.Fatalf("AddReport(%+v): %v", r, err)
	}
	if id <= 0 {
		t.Fatalf("AddReport returned id %d, want > 0", id)
	}
	return id
}

func listReports(t *testing.T, b broker.Broker, f broker.ReportFilter) []broker.Report {
	t.Helper()
	rs, err := b.ListReports(ctxOf(t), f)
	if err != nil {
		t.Fatalf("ListReports(%+v): %v", f, err)
	}
	return rs
}

func reportIDs(rs []broker.Report) []int64 {
	out := make([]int64, len(rs))
	for i, r := range rs {
		out[i] = r.ID
	}
	return out
}

// baseTime is a whole second, so every broker stores it exactly.
func baseTime() time.Time { return time.Now().UTC().Truncate(time.Second) }

func sameTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Equal(*b)
}

func fmtTime(p *time.Time) string {
	if p == nil {
		return "nil"
	}
	return p.Format(time.RFC3339Nano)
}

// wantRunState checks a schedule's run state.
func wantRunState(t *testing.T, what string, s broker.Schedule, attempt, success, next *time.Time) {
	t.Helper()
	if !sameTime(s.LastAttempt, attempt) || !sameTime(s.LastSuccess, success) || !sameTime(s.ExpectedNextRun, next) {
		t.Fatalf("%s: run state (attempt %s, success %s, next %s), want (%s, %s, %s)", what,
			fmtTime(s.LastAttempt), fmtTime(s.LastSuccess), fmtTime(s.ExpectedNextRun),
			fmtTime(attempt), fmtTime(success), fmtTime(next))
	}
}

// wantRecent checks that p is set and within slack of [from, to]: the
// broker's clock may be a database's.
func wantRecent(t *testing.T, what string, p *time.Time, from, to time.Time) {
	t.Helper()
	const slack = 5 * time.Second
	if p == nil || p.Before(from.Add(-slack)) || p.After(to.Add(slack)) {
		t.Fatalf("%s = %s, want between %s and %s", what, fmtTime(p), from.Format(time.RFC3339Nano), to.Format(time.RFC3339Nano))
	}
}

func every(name string, seconds int) broker.Schedule {
	return broker.Schedule{Name: name, Task: "t." + name, Topic: "sched", IntervalSeconds: seconds, Enabled: true}
}

// ---- tests ----

func testSchedulePutGetListDelete(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	if ss, err := b.ListSchedules(ctx); err != nil || len(ss) != 0 {
		t.Fatalf("ListSchedules on an empty broker = %v, %v; want none", ss, err)
	}

	before := time.Now()
	// Run state in the argument is ignored.
	stamp := baseTime().Add(-time.Hour)
	bs := putSchedule(t, b, broker.Schedule{Name: "b", Task: "t.b", Topic: "sched", IntervalSeconds: 60,
		LastAttempt: &stamp, LastSuccess: &stamp, ExpectedNextRun: &stamp})
	after := time.Now()
	if bs.Name != "b" || bs.Task != "t.b" || bs.Topic != "sched" || bs.IntervalSeconds != 60 || bs.Cron != "" || bs.Enabled {
		t.Fatalf("PutSchedule(b) = %+v", bs)
	}
	if bs.MissedPolicy != broker.MissedSkip || bs.Source != "api" || !jsonEqual(bs.Payload, []byte(`{}`)) {
		t.Fatalf("PutSchedule(b) defaults: missed_policy %q source %q payload %s; want skip, api, {}",
			bs.MissedPolicy, bs.Source, bs.Payload)
	}
	wantRunState(t, "new schedule b", bs, nil, nil, nil)
	wantRecent(t, "b.CreatedAt", &bs.CreatedAt, before, after)
	if !bs.UpdatedAt.Equal(bs.CreatedAt) {
		t.Fatalf("new schedule: UpdatedAt %v, CreatedAt %v; want equal", bs.UpdatedAt, bs.CreatedAt)
	}

	as := putSchedule(t, b, broker.Schedule{Name: "a", Task: "t.a", Topic: "other", Cron: "*/5 * * * *", Enabled: true,
		Payload: json.RawMessage(`{"x": [1, 2]}`), MissedPolicy: broker.MissedFireOnce, Source: "config"})
	if as.Cron != "*/5 * * * *" || as.IntervalSeconds != 0 || !as.Enabled || as.MissedPolicy != broker.MissedFireOnce ||
		as.Source != "config" || !jsonEqual(as.Payload, []byte(`{"x":[1,2]}`)) {
		t.Fatalf("PutSchedule(a) = %+v", as)
	}

	if got := getSchedule(t, b, "b"); !reflect.DeepEqual(normSchedule(got), normSchedule(bs)) {
		t.Fatalf("GetSchedule(b) = %+v, want what PutSchedule returned: %+v", got, bs)
	}
	ss, err := b.ListSchedules(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ss) != 2 || ss[0].Name != "a" || ss[1].Name != "b" {
		t.Fatalf("ListSchedules = %v, want a, b by name", scheduleNames(ss))
	}
	if !reflect.DeepEqual(normSchedule(ss[0]), normSchedule(as)) {
		t.Fatalf("ListSchedules[0] = %+v, want %+v", ss[0], as)
	}

	_, err = b.GetSchedule(ctx, "missing")
	wantErr(t, "GetSchedule(missing)", err, broker.ErrNotFound)
	wantErr(t, "DeleteSchedule(missing)", b.DeleteSchedule(ctx, "missing"), broker.ErrNotFound)

	if err := b.DeleteSchedule(ctx, "a"); err != nil {
		t.Fatalf("DeleteSchedule(a): %v", err)
	}
	wantErr(t, "DeleteSchedule(a) again", b.DeleteSchedule(ctx, "a"), broker.ErrNotFound)
	_, err = b.GetSchedule(ctx, "a")
	wantErr(t, "GetSchedule(a) after delete", err, broker.ErrNotFound)
	if ss, err := b.ListSchedules(ctx); err != nil || len(ss) != 1 || ss[0].Name != "b" {
		t.Fatalf("ListSchedules after deleting a = %v, %v; want b", scheduleNames(ss), err)
	}
}

// normSchedule makes two reads of one schedule comparable with DeepEqual.
func normSchedule(s broker.Schedule) broker.Schedule {
	var v any
	if json.Unmarshal(s.Payload, &v) == nil {
		s.Payload, _ = json.Marshal(v)
	}
	for _, p := range []**time.Time{&s.LastAttempt, &s.LastSuccess, &s.ExpectedNextRun, &s.NextFireAt} {
		if *p != nil {
			u := (*p).UTC()
			*p = &u
		}
	}
	s.CreatedAt, s.UpdatedAt = s.CreatedAt.UTC(), s.UpdatedAt.UTC()
	return s
}

func scheduleNames(ss []broker.Schedule) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.Name
	}
	return out
}

func testScheduleValidation(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	good := every("good", 10)
	cases := []struct {
		name string
		edit func(s *broker.Schedule)
		want string // in the error
	}{
		{"empty name", func(s *broker.Schedule) { s.Name = "" }, "name"},
		{"name of 201 characters", func(s *broker.Schedule) { s.Name = strings.Repeat("n", 201) }, "name"},
		{"empty task", func(s *broker.Schedule) { s.Task = "" }, "task"},
		{"empty topic", func(s *broker.Schedule) { s.Topic = "" }, "topic"},
		{"topic too long", func(s *broker.Schedule) { s.Topic = strings.Repeat("t", broker.MaxTopicLen+1) }, "topic"},
		{"payload not JSON", func(s *broker.Schedule) { s.Payload = json.RawMessage(`{nope`) }, "payload"},
		{"neither interval nor cron", func(s *broker.Schedule) { s.IntervalSeconds = 0 }, "neither"},
		{"blank cron", func(s *broker.Schedule) { s.IntervalSeconds, s.Cron = 0, "   " }, "neither"},
		{"both interval and cron", func(s *broker.Schedule) { s.Cron = "* * * * *" }, "both"},
		{"negative interval", func(s *broker.Schedule) { s.IntervalSeconds = -5 }, "negative"},
		{"interval too long", func(s *broker.Schedule) { s.IntervalSeconds = broker.MaxIntervalSeconds + 1 }, "limit"},
		{"unknown missed policy", func(s *broker.Schedule) { s.MissedPolicy = "catch_up" }, "missed_policy"},
	}
	for _, tc := range cases {
		s := good
		tc.edit(&s)
		_, err := b.PutSchedule(ctx, s)
		wantErr(t, "PutSchedule("+tc.name+")", err, broker.ErrInvalid)
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("PutSchedule(%s): error %q does not mention %q", tc.name, err, tc.want)
		}
	}
	if ss, err := b.ListSchedules(ctx); err != nil || len(ss) != 0 {
		t.Fatalf("invalid schedules stored something: %v, %v", scheduleNames(ss), err)
	}

	// The limits themselves are fine: 200 characters (not bytes), a cron
	// schedule, both missed policies.
	long := strings.Repeat("é", broker.MaxScheduleNameLen)
	s := good
	s.Name = long
	putSchedule(t, b, s)
	s = good
	s.IntervalSeconds, s.Cron, s.MissedPolicy = 0, "0 3 * * *", broker.MissedFireOnce
	if got := putSchedule(t, b, s); got.Cron != "0 3 * * *" || got.MissedPolicy != broker.MissedFireOnce {
		t.Fatalf("cron schedule stored as %+v", got)
	}
	if got := getSchedule(t, b, long); got.Name != long {
		t.Fatalf("GetSchedule(200 characters) returned name %q", got.Name)
	}
}

func testScheduleRunState(t *testing.T, b broker.Broker) {
	base := baseTime()
	orig := putSchedule(t, b, every("s", 60))
	next := base.Add(time.Minute)
	fire(t, b, broker.FireRequest{Name: "s", Slot: base, Next: next})
	end := base.Add(2 * time.Second)
	addReport(t, b, broker.Report{MessageID: 1, Task: "t.s", Topic: "sched", Schedule: "s", Status: broker.ReportSuccess,
		StartedAt: base, EndedAt: end})
	fired := getSchedule(t, b, "s")
	if fired.LastAttempt == nil {
		t.Fatal("LastAttempt not set by the fire")
	}
	wantRunState(t, "after a fire and a success", fired, fired.LastAttempt, &end, &next)

	// Only the payload changes: the run state stays, CreatedAt too.
	s := every("s", 60)
	s.Payload = json.RawMessage(`{"v": 2}`)
	put := putSchedule(t, b, s)
	wantRunState(t, "PutSchedule's answer after a payload change", put, fired.LastAttempt, &end, &next)
	got := getSchedule(t, b, "s")
	wantRunState(t, "after a payload change", got, fired.LastAttempt, &end, &next)
	if !jsonEqual(got.Payload, []byte(`{"v":2}`)) {
		t.Fatalf("payload after the put = %s", got.Payload)
	}
	if !got.CreatedAt.Equal(orig.CreatedAt) || got.UpdatedAt.Before(orig.UpdatedAt) {
		t.Fatalf("after a put: CreatedAt %v UpdatedAt %v; want CreatedAt %v kept and UpdatedAt not before %v",
			got.CreatedAt, got.UpdatedAt, orig.CreatedAt, orig.UpdatedAt)
	}
	// So does a change of enabled, topic, missed policy or source.
	s.Enabled, s.Topic, s.MissedPolicy, s.Source = false, "elsewhere", broker.MissedFireOnce, "config"
	wantRunState(t, "after other changes", putSchedule(t, b, s), fired.LastAttempt, &end, &next)

	// The interval changes: the next run is cleared, the rest stays.
	s.IntervalSeconds = 30
	wantRunState(t, "PutSchedule's answer after an interval change", putSchedule(t, b, s), fired.LastAttempt, &end, nil)
	wantRunState(t, "after an interval change", getSchedule(t, b, "s"), fired.LastAttempt, &end, nil)

	// Fired again (new slot), then moved from interval to cron: cleared.
	next2 := base.Add(2 * time.Minute)
	fire(t, b, broker.FireRequest{Name: "s", Slot: base.Add(time.Minute), Next: next2})
	got = getSchedule(t, b, "s")
	wantRunState(t, "after the second fire", got, got.LastAttempt, &end, &next2)
	s.IntervalSeconds, s.Cron = 0, "* * * * *"
	wantRunState(t, "after a change to cron", putSchedule(t, b, s), got.LastAttempt, &end, nil)
}

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

func testReportsLastSuccess(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	putSchedule(t, b, every("s", 60))
	base := baseTime()
	res := fire(t, b, broker.FireRequest{Name: "s", Slot: base, Next: base.Add(time.Minute),
		Submit: &broker.SubmitRequest{Topic: "sched", Task: "t.s"}})
	report := func(status string, end time.Time, result string) broker.Report {
		r := broker.Report{MessageID: res.MessageID, Task: "t.s", Topic: "sched", Schedule: "s", Attempt: 1,
			Worker: "w1", Status: status, StartedAt: end.Add(-time.Second), EndedAt: end, Duration: 1}
		if result != "" {
			r.Result = json.RawMessage(result)
		}
		return r
	}
	lastSuccess := func() *time.Time { return getSchedule(t, b, "s").LastSuccess }

	t1 := base.Add(10 * time.Second)
	full := report(broker.ReportSuccess, t1, `{"rows": 3}`)
	full.Error, full.Progress, full.Logs = "", 1, []string{"started", "done: 3 rows"}
	id := addReport(t, b, full)
	if p := lastSuccess(); !sameTime(p, &t1) {
		t.Fatalf("LastSuccess after a success = %s, want %s", fmtTime(p), t1)
	}
	got, err := b.GetReport(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	want := full
	want.ID = id
	if !jsonEqual(got.Result, want.Result) {
		t.Fatalf("report result = %s, want %s", got.Result, want.Result)
	}
	got.Result, want.Result = nil, nil
	if !got.StartedAt.Equal(want.StartedAt) || !got.EndedAt.Equal(want.EndedAt) {
		t.Fatalf("report times = %v..%v, want %v..%v", got.StartedAt, got.EndedAt, want.StartedAt, want.EndedAt)
	}
	got.StartedAt, got.EndedAt, want.StartedAt, want.EndedAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("GetReport = %+v, want %+v", got, want)
	}

	// Not successes, whatever their times.
	for _, status := range []string{broker.ReportFailed, broker.ReportError, broker.ReportTimeout, broker.ReportSkipped, broker.ReportLost} {
		addReport(t, b, report(status, base.Add(20*time.Second), `{"ok": true}`))
	}
	if p := lastSuccess(); !sameTime(p, &t1) {
		t.Fatalf("LastSuccess after failures = %s, want %s still", fmtTime(p), t1)
	}
	// The status decides, not the payload: a healthy skip is a success.
	t3 := base.Add(30 * time.Second)
	addReport(t, b, report(broker.ReportSuccess, t3, `{"skipped": "healthy"}`))
	if p := lastSuccess(); !sameTime(p, &t3) {
		t.Fatalf("LastSuccess after a success returning {skipped} = %s, want %s", fmtTime(p), t3)
	}
	// A late report of an older success does not move it back.
	addReport(t, b, report(broker.ReportSuccess, base.Add(5*time.Second), ""))
	if p := lastSuccess(); !sameTime(p, &t3) {
		t.Fatalf("LastSuccess after an older success = %s, want %s kept", fmtTime(p), t3)
	}
	// A success without a schedule touches no schedule.
	r := report(broker.ReportSuccess, base.Add(time.Minute), "")
	r.Schedule = ""
	addReport(t, b, r)
	if p := lastSuccess(); !sameTime(p, &t3) {
		t.Fatalf("LastSuccess after an unscheduled success = %s, want %s kept", fmtTime(p), t3)
	}

	// Defaults: no logs read back as none, a zero end is now.
	before := time.Now()
	id = addReport(t, b, broker.Report{MessageID: 99, Task: "t.x", Topic: "x", Status: broker.ReportCancelled})
	got, err = b.GetReport(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Logs) != 0 || got.Result != nil || got.Schedule != "" {
		t.Fatalf("minimal report read back as %+v", got)
	}
	wantRecent(t, "EndedAt of a report without one", &got.EndedAt, before, time.Now())
	if !got.StartedAt.Equal(got.EndedAt) {
		t.Fatalf("report without times: StartedAt %v, EndedAt %v; want equal", got.StartedAt, got.EndedAt)
	}

	// A deleted schedule's success is stored without error.
	if err := b.DeleteSchedule(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	addReport(t, b, report(broker.ReportSuccess, base.Add(time.Hour), ""))

	// Invalid reports store nothing.
	n := len(listReports(t, b, broker.ReportFilter{}))
	for _, bad := range []broker.Report{
		report("", t1, ""),
		report("succeeded", t1, ""),
		report(broker.ReportSuccess, t1, `{"x":`),
	} {
		_, err := b.AddReport(ctx, bad)
		wantErr(t, fmt.Sprintf("AddReport(status %q, result %s)", bad.Status, bad.Result), err, broker.ErrInvalid)
	}
	if m := len(listReports(t, b, broker.ReportFilter{})); m != n {
		t.Fatalf("invalid reports stored something: %d reports, want %d", m, n)
	}
	_, err = b.GetReport(ctx, 1<<40)
	wantErr(t, "GetReport(missing)", err, broker.ErrNotFound)
}

func testListReports(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	base := baseTime()
	type spec struct {
		msg      int64
		task     string
		status   string
		schedule string
	}
	specs := []spec{
		{1, "a", broker.ReportSuccess, "s1"},
		{1, "a", broker.ReportFailed, "s1"},
		{2, "b", broker.ReportSuccess, ""},
		{3, "a", broker.ReportError, "s2"},
		{4, "b", broker.ReportSuccess, "s2"},
		{5, "c", broker.ReportTimeout, ""},
		{6, "a", broker.ReportSuccess, "s1"},
	}
	var all []int64
	byID := map[int64]spec{}
	for i, s := range specs {
		id := addReport(t, b, broker.Report{MessageID: s.msg, Task: s.task, Topic: "q", Schedule: s.schedule,
			Status: s.status, StartedAt: base, EndedAt: base.Add(time.Duration(i) * time.Second)})
		if len(all) > 0 && id <= all[len(all)-1] {
			t.Fatalf("report ids not increasing: %d after %d", id, all[len(all)-1])
		}
		all = append(all, id)
		byID[id] = s
	}
	newest := slices.Clone(all)
	slices.Reverse(newest)
	if got := reportIDs(listReports(t, b, broker.ReportFilter{})); !slices.Equal(got, newest) {
		t.Fatalf("ListReports() = %v, want %v (newest first)", got, newest)
	}
	match := func(keep func(s spec) bool) []int64 {
		var out []int64
		for _, id := range newest {
			if keep(byID[id]) {
				out = append(out, id)
			}
		}
		return out
	}
	for _, tc := range []struct {
		f    broker.ReportFilter
		keep func(s spec) bool
	}{
		{broker.ReportFilter{MessageID: 1}, func(s spec) bool { return s.msg == 1 }},
		{broker.ReportFilter{Task: "a"}, func(s spec) bool { return s.task == "a" }},
		{broker.ReportFilter{Status: broker.ReportSuccess}, func(s spec) bool { return s.status == broker.ReportSuccess }},
		{broker.ReportFilter{Schedule: "s1"}, func(s spec) bool { return s.schedule == "s1" }},
		{broker.ReportFilter{Schedule: "s2", Status: broker.ReportSuccess}, func(s spec) bool {
			return s.schedule == "s2" && s.status == broker.ReportSuccess
		}},
		{broker.ReportFilter{Task: "a", MessageID: 1, Status: broker.ReportFailed}, func(s spec) bool {
			return s.task == "a" && s.msg == 1 && s.status == broker.ReportFailed
		}},
		{broker.ReportFilter{Task: "zzz"}, func(spec) bool { return false }},
		{broker.ReportFilter{Before: all[3]}, func(s spec) bool { return s.msg <= 2 }},
		{broker.ReportFilter{Before: all[5], Task: "a"}, func(s spec) bool { return s.task == "a" && s.msg <= 3 }},
	} {
		got := reportIDs(listReports(t, b, tc.f))
		if want := match(tc.keep); !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
			t.Fatalf("ListReports(%+v) = %v, want %v", tc.f, got, want)
		}
	}
	for _, r := range listReports(t, b, broker.ReportFilter{Schedule: "s1"}) {
		if r.Schedule != "s1" || r.Topic != "q" {
			t.Fatalf("ListReports(schedule s1) returned %+v", r)
		}
	}

	// Paging with Limit and Before walks every report once.
	var paged []int64
	before := int64(0)
	for {
		page := reportIDs(listReports(t, b, broker.ReportFilter{Limit: 3, Before: before}))
		if len(page) > 3 {
			t.Fatalf("page of %d reports with Limit 3", len(page))
		}
		if len(page) == 0 {
			break
		}
		paged = append(paged, page...)
		before = page[len(page)-1]
	}
	if !slices.Equal(paged, newest) {
		t.Fatalf("paging read %v, want %v", paged, newest)
	}

	// The default limit is 50.
	for i := range 50 {
		addReport(t, b, broker.Report{MessageID: 100 + int64(i), Task: "bulk", Topic: "q", Status: broker.ReportSuccess, EndedAt: base})
	}
	if got := listReports(t, b, broker.ReportFilter{}); len(got) != broker.DefaultReportLimit {
		t.Fatalf("ListReports() returned %d reports, want the default limit %d", len(got), broker.DefaultReportLimit)
	}
	if got := listReports(t, b, broker.ReportFilter{Limit: 100000}); len(got) != 50+len(specs) {
		t.Fatalf("ListReports(Limit 100000) returned %d reports, want all %d", len(got), 50+len(specs))
	}

	_, err := b.ListReports(ctx, broker.ReportFilter{Status: "bogus"})
	wantErr(t, "ListReports(unknown status)", err, broker.ErrInvalid)
}

func testPurgeReports(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	base := baseTime()
	old1 := addReport(t, b, broker.Report{MessageID: 1, Task: "a", Topic: "q", Status: broker.ReportSuccess, EndedAt: base.Add(-2 * time.Hour)})
	old2 := addReport(t, b, broker.Report{MessageID: 2, Task: "a", Topic: "q", Status: broker.ReportFailed, EndedAt: base.Add(-time.Hour)})
	edge := addReport(t, b, broker.Report{MessageID: 3, Task: "a", Topic: "q", Status: broker.ReportSuccess, EndedAt: base.Add(-30 * time.Minute)})
	recent := addReport(t, b, broker.Report{MessageID: 4, Task: "a", Topic: "q", Status: broker.ReportSuccess, EndedAt: base})

	n, err := b.PurgeReports(ctx, base.Add(-30*time.Minute))
	if err != nil || n != 2 {
		t.Fatalf("PurgeReports = %d, %v; want 2 (ended strictly before the cutoff)", n, err)
	}
	for _, id := range []int64{old1, old2} {
		_, err := b.GetReport(ctx, id)
		wantErr(t, fmt.Sprintf("GetReport(%d) after the purge", id), err, broker.ErrNotFound)
	}
	if got := reportIDs(listReports(t, b, broker.ReportFilter{})); !slices.Equal(got, []int64{recent, edge}) {
		t.Fatalf("reports after the purge = %v, want %v", got, []int64{recent, edge})
	}
	if n, err := b.PurgeReports(ctx, base.Add(-30*time.Minute)); err != nil || n != 0 {
		t.Fatalf("PurgeReports again = %d, %v; want 0", n, err)
	}
	if n, err := b.PurgeReports(ctx, base.Add(time.Second)); err != nil || n != 2 {
		t.Fatalf("PurgeReports(everything) = %d, %v; want 2", n, err)
	}
	if got := listReports(t, b, broker.ReportFilter{}); len(got) != 0 {
		t.Fatalf("reports after purging everything: %v", reportIDs(got))
	}
	// Ids are not reused after a purge.
	if id := addReport(t, b, broker.Report{MessageID: 5, Task: "a", Topic: "q", Status: broker.ReportSuccess}); id <= recent {
		t.Fatalf("report id %d after a purge, want above %d", id, recent)
	}
}

func testAddReports(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	putSchedule(t, b, every("a", 60))
	putSchedule(t, b, every("b", 60))
	base := baseTime()
	report := func(msg int64, schedule, status string, end time.Time) broker.Report {
		return broker.Report{MessageID: msg, Task: "t", Topic: "q", Schedule: schedule, Attempt: 1, Worker: "w",
			Status: status, StartedAt: end.Add(-time.Second), EndedAt: end, Duration: 1, Logs: []string{fmt.Sprint("m", msg)}}
	}
	rs := []broker.Report{
		report(1, "b", broker.ReportSuccess, base.Add(2*time.Second)),
		report(2, "a", broker.ReportSuccess, base.Add(5*time.Second)),
		report(3, "", broker.ReportFailed, base.Add(6*time.Second)),
		report(4, "a", broker.ReportSuccess, base.Add(3*time.Second)),
		report(5, "b", broker.ReportFailed, base.Add(9*time.Second)),
	}
	ids, err := b.AddReports(ctx, rs)
	if err != nil {
		t.Fatalf("AddReports: %v", err)
	}
	if len(ids) != len(rs) {
		t.Fatalf("AddReports returned %d ids for %d reports", len(ids), len(rs))
	}
	seen := map[int64]bool{}
	for i, id := range ids {
		if id <= 0 || seen[id] {
			t.Fatalf("ids %v: not positive and distinct", ids)
		}
		seen[id] = true
		got, err := b.GetReport(ctx, id)
		if err != nil {
			t.Fatalf("GetReport(%d): %v", id, err)
		}
		if got.MessageID != rs[i].MessageID || got.Status != rs[i].Status || !got.EndedAt.Equal(rs[i].EndedAt) ||
			!reflect.DeepEqual(got.Logs, rs[i].Logs) {
			t.Fatalf("report %d (id %d) = %+v, want %+v", i, id, got, rs[i])
		}
	}
	if p, want := getSchedule(t, b, "a").LastSuccess, base.Add(5*time.Second); !sameTime(p, &want) {
		t.Fatalf("schedule a LastSuccess = %s, want %s (the later of its two successes)", fmtTime(p), want)
	}
	if p, want := getSchedule(t, b, "b").LastSuccess, base.Add(2*time.Second); !sameTime(p, &want) {
		t.Fatalf("schedule b LastSuccess = %s, want %s (its success; the failure does not count)", fmtTime(p), want)
	}

	before := len(listReports(t, b, broker.ReportFilter{Limit: broker.MaxReportLimit}))
	bad := []broker.Report{report(6, "", broker.ReportSuccess, base), report(7, "", "fine", base)}
	if _, err := b.AddReports(ctx, bad); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("AddReports with an unknown status: %v, want ErrInvalid", err)
	} else if !strings.Contains(err.Error(), "message 7") {
		t.Fatalf("AddReports error %q does not say which report is invalid", err)
	}
	if after := len(listReports(t, b, broker.ReportFilter{Limit: broker.MaxReportLimit})); after != before {
		t.Fatalf("a refused AddReports stored %d reports", after-before)
	}
	if ids, err := b.AddReports(ctx, nil); err != nil || len(ids) != 0 {
		t.Fatalf("AddReports(nil) = %v, %v; want nothing", ids, err)
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
