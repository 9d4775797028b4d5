package brokertest

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// Task reports: writing, listing, purging, and a schedule's last success.

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

// testAddReportsKeyed: a report whose key is stored already is stored
// once, and its id comes back again, as a writer retrying a batch whose
// commit it did not hear of needs; reports without a key are all stored.
func testAddReportsKeyed(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	base := baseTime()
	prefix := fmt.Sprintf("%s-%d-", t.Name(), time.Now().UnixNano())
	report := func(msg int64, key string) broker.Report {
		return broker.Report{MessageID: msg, Task: "t", Topic: "q", Attempt: 1, Worker: "w",
			Status: broker.ReportSuccess, EndedAt: base.Add(time.Duration(msg) * time.Second), Key: key}
	}
	count := func() int {
		t.Helper()
		return len(listReports(t, b, broker.ReportFilter{Task: "t", Limit: broker.MaxReportLimit}))
	}
	rs := []broker.Report{report(1, prefix+"1"), report(2, ""), report(3, prefix+"3"), report(4, ""), report(5, prefix+"5")}
	first, err := b.AddReports(ctx, rs)
	if err != nil || len(first) != len(rs) {
		t.Fatalf("AddReports = %v, %v", first, err)
	}
	if n := count(); n != 5 {
		t.Fatalf("%d reports stored, want 5", n)
	}
	again, err := b.AddReports(ctx, rs)
	if err != nil || len(again) != len(rs) {
		t.Fatalf("AddReports again = %v, %v", again, err)
	}
	for i, r := range rs {
		if r.Key != "" && again[i] != first[i] {
			t.Fatalf("AddReports again: report %d (keyed) got id %d, want %d as the first time (ids %v then %v)", i, again[i], first[i], first, again)
		}
		if r.Key == "" && slices.Contains(first, again[i]) {
			t.Fatalf("AddReports again: report %d (no key) got id %d of the first call (ids %v then %v)", i, again[i], first, again)
		}
	}
	if n := count(); n != 7 {
		t.Fatalf("%d reports stored after the same batch twice, want 7 (the keyed ones once, the others twice)", n)
	}
	got, err := b.GetReport(ctx, first[0])
	if err != nil {
		t.Fatal(err)
	}
	if got.MessageID != 1 || got.Key != "" {
		t.Fatalf("GetReport(%d) = message %d, key %q; want message 1 and no key (reads leave it empty)", first[0], got.MessageID, got.Key)
	}

	// A key repeated within a batch, and one stored earlier.
	mixed := []broker.Report{report(6, prefix+"6"), report(7, ""), report(6, prefix+"6"), report(1, prefix+"1")}
	ids, err := b.AddReports(ctx, mixed)
	if err != nil || len(ids) != len(mixed) {
		t.Fatalf("AddReports with a repeated key = %v, %v", ids, err)
	}
	if ids[0] != ids[2] || ids[3] != first[0] || ids[1] == ids[0] || slices.Contains(first, ids[0]) {
		t.Fatalf("AddReports with a repeated key: ids %v; want the first and third equal and new, the last %d", ids, first[0])
	}
	if n := count(); n != 9 {
		t.Fatalf("%d reports stored, want 9", n)
	}
}
