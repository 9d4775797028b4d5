package brokertest

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// RunSchedules runs the conformance suite of broker.ScheduleStore; newBroker
// is as for Run. The rules it checks are those of package broker's
// documentation (Schedules and reports).
//
// Options, at most one, name the cases that cannot apply to the broker.
func RunSchedules(t *testing.T, newBroker func(t *testing.T) broker.Broker, opts ...Options) {
	o := optionsOf(t, opts)
	defer o.checkNames(t)
	runCases(t, newBroker, o, []testCase[broker.Broker]{
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
		{"AddReportsKeyed", testAddReportsKeyed},
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
