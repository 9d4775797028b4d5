package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/internal/testdb"
)

// heldFixture is a claimed message acked with a plain success report (kept in its
// row) and one acked with a report that has logs (kept in tw_report_rows).
type heldFixture struct {
	b            *Broker
	plain, other broker.Message
	plainKey     string
}

func newHeldFixture(t *testing.T) heldFixture {
	t.Helper()
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	if _, err := b.SubmitMany(ctx, []broker.SubmitRequest{{Topic: "t", Task: "plain"}, {Topic: "t", Task: "other"}}); err != nil {
		t.Fatal(err)
	}
	msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"t"}, Max: 2})
	if err != nil || len(msgs) != 2 {
		t.Fatalf("claim: %d, %v", len(msgs), err)
	}
	f := heldFixture{b: b, plain: msgs[0], other: msgs[1]}
	if f.plain.Task != "plain" {
		f.plain, f.other = f.other, f.plain
	}
	f.plainKey = broker.ReportKey(*f.plain.ClaimedAt, f.plain.Token)
	res := json.RawMessage(`{"ok":true}`)
	start := time.Now().Add(-time.Second)
	report := func(m broker.Message, logs []string, key string) *broker.Report {
		return &broker.Report{MessageID: m.ID, Task: m.Task, Topic: m.Topic, Attempt: m.Attempts, Worker: "w",
			Status: broker.ReportSuccess, StartedAt: start, EndedAt: start.Add(time.Second), Duration: 1,
			Result: res, Progress: 1, Logs: logs, Key: key}
	}
	errs, err := b.Ack(ctx, []broker.Outcome{
		{Claim: f.plain.ClaimOf(), Result: res, Report: report(f.plain, nil, f.plainKey)},
		{Claim: f.other.ClaimOf(), Result: res, Report: report(f.other, []string{"a line"}, "other-key")},
	})
	if err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatalf("ack: %v %v", errs, err)
	}
	return f
}

// rowsOf returns how many reports of message id tw_report_rows holds and
// whether its message keeps one (in its row or its batch: tw_messages_all).
func rowsOf(t *testing.T, b *Broker, id int64) (rows int, inRow bool) {
	t.Helper()
	c := schemaConn(t, b)
	if err := c.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM tw_report_rows WHERE message_id = $1),
		coalesce((SELECT report_id IS NOT NULL FROM tw_messages_all WHERE id = $1), false)`, id).Scan(&rows, &inRow); err != nil {
		t.Fatal(err)
	}
	return rows, inRow
}

// onlyReport returns the one report ListReports gives for message id,
// failing t unless there is exactly one.
func onlyReport(t *testing.T, b *Broker, id int64) broker.Report {
	t.Helper()
	list, err := b.ListReports(t.Context(), broker.ReportFilter{MessageID: id})
	if err != nil || len(list) != 1 {
		t.Fatalf("reports of message %d: %v, %v; want one", id, list, err)
	}
	return list[0]
}

// TestPlainSuccessReportIsKeptInItsMessagesRow: the ack keeps a success
// report that says no more than the acked row in that row, and reads give
// it back as they give the others.
func TestPlainSuccessReportIsKeptInItsMessagesRow(t *testing.T) {
	f := newHeldFixture(t)
	ctx := t.Context()
	if rows, inRow := rowsOf(t, f.b, f.plain.ID); rows != 0 || !inRow {
		t.Fatalf("plain report: %d in tw_report_rows, in its row %v; want 0 and true", rows, inRow)
	}
	if rows, inRow := rowsOf(t, f.b, f.other.ID); rows != 1 || inRow {
		t.Fatalf("report with logs: %d in tw_report_rows, in its row %v; want 1 and false", rows, inRow)
	}
	r := onlyReport(t, f.b, f.plain.ID)
	if r.Task != "plain" || r.Topic != "t" || r.Status != broker.ReportSuccess || r.Worker != "w" || r.Attempt != 1 ||
		r.Duration != 1 || r.Progress != 1 || string(r.Result) != `{"ok": true}` || len(r.Logs) != 0 || r.EndedAt.Sub(r.StartedAt) != time.Second {
		t.Errorf("report kept in the row reads back as %+v", r)
	}
	byID, err := f.b.GetReport(ctx, r.ID)
	if err != nil || byID.MessageID != f.plain.ID {
		t.Errorf("GetReport(%d): %+v, %v", r.ID, byID, err)
	}
	for _, fl := range []broker.ReportFilter{{Task: "plain"}, {Status: broker.ReportSuccess}, {}} {
		list, err := f.b.ListReports(ctx, fl)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, x := range list {
			found = found || x.ID == r.ID
		}
		if !found {
			t.Errorf("ListReports(%+v) = %v misses the report kept in the row (id %d)", fl, list, r.ID)
		}
	}
	all, err := f.b.ListReports(ctx, broker.ReportFilter{})
	if err != nil || len(all) != 2 || all[0].ID < all[1].ID {
		t.Errorf("ListReports() = %v, %v; want both, newest first", all, err)
	}
	if list, err := f.b.ListReports(ctx, broker.ReportFilter{Schedule: "s"}); err != nil || len(list) != 0 {
		t.Errorf("ListReports(schedule s) = %v, %v; want none", list, err)
	}
}

// TestAckWithPlainReportsOnly: a batch in which every outcome carries a
// plain success report takes the lean statement (ackKeptSQL). A report
// that names its message's task is kept in the row; one that names
// another task is stored apart, once, as it says; a stale claim stores
// none.
func TestAckWithPlainReportsOnly(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	if _, err := b.SubmitMany(ctx, []broker.SubmitRequest{{Topic: "t", Task: "a"}, {Topic: "t", Task: "a"}, {Topic: "t", Task: "a"}}); err != nil {
		t.Fatal(err)
	}
	msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"t"}, Max: 3})
	if err != nil || len(msgs) != 3 {
		t.Fatalf("claim: %d, %v", len(msgs), err)
	}
	res := json.RawMessage(`{"n":1}`)
	end := time.Now()
	outcomes := make([]broker.Outcome, len(msgs))
	for i, m := range msgs {
		r := &broker.Report{MessageID: m.ID, Task: m.Task, Topic: m.Topic, Attempt: m.Attempts, Worker: "w",
			Status: broker.ReportSuccess, StartedAt: end.Add(-time.Second), EndedAt: end, Duration: 1, Result: res,
			Key: broker.ReportKey(*m.ClaimedAt, m.Token)}
		outcomes[i] = broker.Outcome{Claim: m.ClaimOf(), Result: res, Report: r}
	}
	if a, err := newAckBatch(outcomes); err != nil || a.kept == nil {
		t.Fatalf("a batch of plain reports does not take ackKeptSQL (%v)", err)
	}
	outcomes[1].Report.Task = "renamed"
	outcomes[2].Claim.Token = broker.NewToken()
	errs, err := b.Ack(ctx, outcomes)
	if err != nil || errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], broker.ErrClaimLost) {
		t.Fatalf("ack: %v, %v; want nil, nil, claim lost", errs, err)
	}
	if rows, inRow := rowsOf(t, b, msgs[0].ID); rows != 0 || !inRow {
		t.Errorf("report naming its task: %d in tw_report_rows, in its row %v; want 0 and true", rows, inRow)
	}
	if rows, inRow := rowsOf(t, b, msgs[1].ID); rows != 1 || inRow {
		t.Errorf("report naming another task: %d in tw_report_rows, in its row %v; want 1 and false", rows, inRow)
	}
	if r := onlyReport(t, b, msgs[1].ID); r.Task != "renamed" || r.Status != broker.ReportSuccess || string(r.Result) != `{"n": 1}` ||
		r.Worker != "w" || r.Attempt != 1 || r.Duration != 1 {
		t.Errorf("report naming another task reads back as %+v", r)
	}
	if rows, inRow := rowsOf(t, b, msgs[2].ID); rows != 0 || inRow {
		t.Errorf("stale claim: %d reports in tw_report_rows, in its row %v; want none", rows, inRow)
	}
	for i, want := range []bool{true, true, false, false, false} {
		o := broker.Outcome{Claim: msgs[0].ClaimOf(), Result: res, Report: &broker.Report{MessageID: msgs[0].ID,
			Task: "a", Topic: "t", Status: broker.ReportSuccess, Result: res}}
		switch i {
		case 1:
			o.Result, o.Report.Result = nil, nil
		case 2:
			o.Report.Logs = []string{"x"}
		case 3:
			o.Report.Result = json.RawMessage(`{"n":2}`)
		case 4:
			o.Report.Schedule = "s"
		}
		var res *string
		if len(o.Result) > 0 {
			s := string(o.Result)
			res = &s
		}
		if got := plainReport(o.Report, res); got != want {
			t.Errorf("case %d: plainReport = %v, want %v", i, got, want)
		}
	}
}

// TestLostReportOfAnAttemptKeptInItsRowIsNotStoredAgain: a report stored
// again with the key of one kept in its message's row (its outcome's
// answer was lost) gets that report's id, and nothing more is stored.
func TestLostReportOfAnAttemptKeptInItsRowIsNotStoredAgain(t *testing.T) {
	f := newHeldFixture(t)
	ctx := t.Context()
	kept := onlyReport(t, f.b, f.plain.ID)
	id, err := f.b.AddReport(ctx, broker.Report{MessageID: f.plain.ID, Task: "plain", Topic: "t", Attempt: 1, Worker: "w",
		Status: broker.ReportLost, Error: "claim lost", Key: f.plainKey})
	if err != nil || id != kept.ID {
		t.Fatalf("AddReport with the held key = %d, %v; want %d", id, err, kept.ID)
	}
	if rows, inRow := rowsOf(t, f.b, f.plain.ID); rows != 0 || !inRow {
		t.Errorf("after it: %d in tw_report_rows, in its row %v; want 0 and true", rows, inRow)
	}
}

// TestPurgesKeepReportsToTheirOwnRetention: purging a finished message
// moves the report its row holds to tw_report_rows with its id; purging
// reports clears those still in rows.
func TestPurgesKeepReportsToTheirOwnRetention(t *testing.T) {
	f := newHeldFixture(t)
	ctx := t.Context()
	before := onlyReport(t, f.b, f.plain.ID)
	if n, err := f.b.PurgeFinished(ctx, time.Now().Add(time.Hour)); err != nil || n != 2 {
		t.Fatalf("PurgeFinished = %d, %v; want 2", n, err)
	}
	if after := onlyReport(t, f.b, f.plain.ID); after.ID != before.ID || after.Worker != "w" || string(after.Result) != `{"ok": true}` {
		t.Fatalf("after the message's purge its report is %+v; want %+v", after, before)
	}
	if rows, _ := rowsOf(t, f.b, f.plain.ID); rows != 1 {
		t.Errorf("tw_report_rows holds %d of the purged message's reports, want 1", rows)
	}

	g := newHeldFixture(t)
	if n, err := g.b.PurgeReports(ctx, time.Now().Add(-time.Hour)); err != nil || n != 0 {
		t.Fatalf("PurgeReports of an hour ago = %d, %v; want 0", n, err)
	}
	if n, err := g.b.PurgeReports(ctx, time.Now().Add(time.Hour)); err != nil || n != 2 {
		t.Fatalf("PurgeReports = %d, %v; want 2", n, err)
	}
	if rows, inRow := rowsOf(t, g.b, g.plain.ID); rows != 0 || inRow {
		t.Errorf("after PurgeReports: %d in tw_report_rows, in its row %v; want none", rows, inRow)
	}
	if list, err := g.b.ListReports(ctx, broker.ReportFilter{}); err != nil || len(list) != 0 {
		t.Errorf("ListReports after PurgeReports = %v, %v", list, err)
	}
}

// TestListReportsPlansUseIndexes: every filter of ListReports reads the
// reports kept in messages' rows through an index, newest first, never by
// reading the message table whole.
func TestListReportsPlansUseIndexes(t *testing.T) {
	b := newTestBroker(t, Options{})
	c := schemaConn(t, b)
	execAll(t, c,
		`INSERT INTO tw_messages (topic, task, state, finished_at, claimed_by, attempts, report_id, report_attempt,
			report_started_at, report_ended_at, report_duration, report_progress)
			SELECT 't', 'task' || (i % 20), 'done', now(), 'w', 1, nextval('tw_reports_id_seq'), 1, now(), now(), 0.1, 1
			FROM generate_series(1, 50000) i`,
		`INSERT INTO tw_report_rows (message_id, task, topic, attempt, worker, status, started_at, ended_at)
			SELECT i, 'task' || (i % 20), 't', 1, 'w', 'failed', now(), now() FROM generate_series(1, 5000) i`,
		`ANALYZE tw_messages`, `ANALYZE tw_report_rows`, fillDoneSQL, `ANALYZE tw_done`)
	for _, f := range []broker.ReportFilter{{}, {Task: "task7"}, {Task: "task7", Before: 30000}, {MessageID: 1234},
		{Status: broker.ReportSuccess}, {Status: "failed"}, {Before: 20000}, {Before: 220000}, {Task: "task7", Before: 220000},
		{MessageID: 120000}} {
		q, args := dialect{}.ListReportsSQL(f, broker.DefaultReportLimit)
		plan := explain(t, c, q, args...)
		if testing.Verbose() {
			t.Logf("%+v:\n%s", f, plan)
		}
		if strings.Contains(plan, "Seq Scan on tw_messages") || strings.Contains(plan, "Seq Scan on tw_done") {
			t.Errorf("ListReports(%+v) reads tw_messages whole:\n%s", f, plan)
		}
	}
}

// TestUpgradeTo019KeepsReports: a database whose reports are in the table
// tw_reports (before migration 019) keeps them, with their ids, readable as
// before; new acks keep their reports in the rows, with ids after them.
func TestUpgradeTo019KeepsReports(t *testing.T) {
	f := newHeldFixture(t)
	ctx := t.Context()
	c := schemaConn(t, f.b)
	// Roll back to version 18, with a report in the table of that time.
	execAll(t, c,
		`DROP FUNCTION tw_message(bigint), tw_report(bigint)`,
		`DROP VIEW tw_reports`, `DROP VIEW tw_messages_all`, `DROP TABLE tw_done`, `DROP TYPE tw_done_message`, `DROP TABLE tw_claims`,
		`ALTER TABLE tw_report_rows RENAME TO tw_reports`,
		`DELETE FROM tw_reports`,
		`ALTER TABLE tw_messages DROP COLUMN report_id, DROP COLUMN report_attempt, DROP COLUMN report_worker,
			DROP COLUMN report_started_at, DROP COLUMN report_ended_at, DROP COLUMN report_duration, DROP COLUMN report_progress`,
		`DELETE FROM tw_schema_migrations WHERE version >= 19`)
	var old int64
	if err := c.QueryRow(ctx, `INSERT INTO tw_reports (message_id, task, topic, attempt, worker, status, started_at, ended_at, report_key)
		VALUES ($1, 'plain', 't', 1, 'w', 'success', now(), now(), 'k') RETURNING id`, f.plain.ID).Scan(&old); err != nil {
		t.Fatal(err)
	}
	if err := Migrate(ctx, testdb.DSN(), f.b.schema); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	b2, err := New(ctx, Options{DSN: testdb.DSN(), Schema: f.b.schema})
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	if r, err := b2.GetReport(ctx, old); err != nil || r.MessageID != f.plain.ID || r.Task != "plain" {
		t.Fatalf("report %d after the upgrade: %+v, %v", old, r, err)
	}
	if id, err := b2.AddReport(ctx, broker.Report{MessageID: f.plain.ID, Task: "plain", Topic: "t", Attempt: 1,
		Status: broker.ReportLost, Key: "k"}); err != nil || id != old {
		t.Errorf("a report with the upgraded one's key = %d, %v; want %d", id, err, old)
	}
	if _, err := b2.Submit(ctx, broker.SubmitRequest{Topic: "t2", Task: "new"}); err != nil {
		t.Fatal(err)
	}
	msgs, err := b2.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"t2"}, Max: 1})
	if err != nil || len(msgs) != 1 {
		t.Fatalf("claim: %v, %v", msgs, err)
	}
	m := msgs[0]
	now := time.Now()
	if errs, err := b2.Ack(ctx, []broker.Outcome{{Claim: m.ClaimOf(), Report: &broker.Report{MessageID: m.ID, Task: m.Task,
		Topic: m.Topic, Attempt: m.Attempts, Worker: "w", Status: broker.ReportSuccess, StartedAt: now, EndedAt: now}}}); err != nil || errs[0] != nil {
		t.Fatalf("ack: %v %v", errs, err)
	}
	if rows, inRow := rowsOf(t, b2, m.ID); rows != 0 || !inRow {
		t.Errorf("the new ack's report: %d in tw_report_rows, in its row %v; want 0 and true", rows, inRow)
	}
	list, err := b2.ListReports(ctx, broker.ReportFilter{})
	if err != nil || len(list) != 2 || list[0].MessageID != m.ID || list[1].ID != old {
		t.Errorf("ListReports after the upgrade = %+v, %v; want the new ack's report, then %d", list, err, old)
	}
}
