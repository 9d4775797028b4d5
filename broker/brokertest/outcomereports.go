package brokertest

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// Reports given with outcomes (Outcome.Report, NackRequest.Report,
// DeadLetter's report): stored in the outcome's transaction, only when it
// applies.

var outcomeReportCases = []testCase[broker.Broker]{
	{"OutcomeReportsStoredWithOutcomes", testOutcomeReportsStored},
	{"OutcomeReportsOfStaleClaimsNotStored", testOutcomeReportsStale},
	{"OutcomeReportRefusedChangesNothing", testOutcomeReportRefused},
	{"OutcomeReportsCommitWithTheirOutcomes", testOutcomeReportsAtomic},
}

// reportOf is a report of m's attempt with status.
func reportOf(m broker.Message, status string) *broker.Report {
	end := time.Now().UTC().Truncate(time.Millisecond)
	return &broker.Report{MessageID: m.ID, Task: m.Task, Topic: m.Topic, Schedule: m.Headers["schedule"], Attempt: m.Attempts,
		Worker: "w1", Status: status, StartedAt: end.Add(-time.Second), EndedAt: end, Duration: 1, Key: m.Token}
}

// reportsOf lists the reports of message id.
func reportsOf(t *testing.T, b broker.Broker, id int64) []broker.Report {
	t.Helper()
	rs, err := b.ListReports(ctxOf(t), broker.ReportFilter{MessageID: id})
	if err != nil {
		t.Fatalf("ListReports(message %d): %v", id, err)
	}
	return rs
}

// wantReports fails unless message id has exactly the reports of
// statuses, newest first.
func wantReports(t *testing.T, b broker.Broker, id int64, statuses ...string) []broker.Report {
	t.Helper()
	rs := reportsOf(t, b, id)
	got := make([]string, len(rs))
	for i, r := range rs {
		got[i] = r.Status
	}
	if fmt.Sprint(got) != fmt.Sprint(statuses) {
		t.Fatalf("reports of message %d: %v, want %v", id, got, statuses)
	}
	return rs
}

func testOutcomeReportsStored(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	putSchedule(t, b, every("s", 60))
	base := baseTime()
	fired := fire(t, b, broker.FireRequest{Name: "s", Slot: base, Next: base.Add(time.Minute),
		Submit: &broker.SubmitRequest{Topic: "rep", Task: "t.rep"}})
	submitN(t, b, "rep", 4)
	setTopic(t, b, "rep", broker.TopicPatch{DeadLetterEnabled: ptr(false)})
	ms := claim(t, b, "w1", 5, "rep")
	if len(ms) != 5 || ms[0].ID != fired.MessageID {
		t.Fatalf("claimed %v, want the fired message and 4 more", ids(ms))
	}

	// An ack of two: the report of each rides on it; the schedule's
	// success moves its LastSuccess, as AddReports does.
	done := reportOf(ms[0], broker.ReportSuccess)
	done.Result = json.RawMessage(`{"rows":1}`)
	plain := reportOf(ms[1], broker.ReportSuccess)
	errs, err := b.Ack(ctx, []broker.Outcome{
		{Claim: ms[0].ClaimOf(), Result: done.Result, Report: done},
		{Claim: ms[1].ClaimOf(), Report: plain},
	})
	if err != nil || len(errs) != 2 || errs[0] != nil || errs[1] != nil {
		t.Fatalf("Ack with reports = %v, %v; want [nil nil], nil", errs, err)
	}
	rs := wantReports(t, b, ms[0].ID, broker.ReportSuccess)
	if rs[0].Schedule != "s" || !jsonEqual(rs[0].Result, done.Result) {
		t.Fatalf("report stored with the ack = %+v, want schedule s and result %s", rs[0], done.Result)
	}
	if ls := getSchedule(t, b, "s").LastSuccess; !sameTime(ls, &done.EndedAt) {
		t.Fatalf("LastSuccess after an ack with a success report = %s, want %s", fmtTime(ls), done.EndedAt)
	}
	wantReports(t, b, ms[1].ID, broker.ReportSuccess)

	// A report with the same key stored again (a writer that did not
	// hear of the commit) is the stored one.
	again, err := b.AddReports(ctx, []broker.Report{*plain})
	if err != nil {
		t.Fatal(err)
	}
	if got := wantReports(t, b, ms[1].ID, broker.ReportSuccess); again[0] != got[0].ID {
		t.Fatalf("AddReports of the ack's report again = id %d, want the stored %d", again[0], got[0].ID)
	}

	// A retry, a failure, a cancel and a dead letter.
	if err := b.Nack(ctx, broker.NackRequest{Claim: ms[2].ClaimOf(), Requeue: true, Error: "again",
		Report: reportOf(ms[2], broker.ReportFailed)}); err != nil {
		t.Fatalf("Nack with requeue and a report: %v", err)
	}
	wantState(t, b, ms[2].ID, broker.StateQueued)
	wantReports(t, b, ms[2].ID, broker.ReportFailed)
	if err := b.Nack(ctx, broker.NackRequest{Claim: ms[3].ClaimOf(), Error: "boom",
		Report: reportOf(ms[3], broker.ReportTimeout)}); err != nil {
		t.Fatalf("Nack with a report: %v", err)
	}
	wantState(t, b, ms[3].ID, broker.StateFailed)
	wantReports(t, b, ms[3].ID, broker.ReportTimeout)
	if err := b.DeadLetter(ctx, ms[4].ClaimOf(), "poison", reportOf(ms[4], broker.ReportError)); err != nil {
		t.Fatalf("DeadLetter with a report: %v", err)
	}
	wantState(t, b, ms[4].ID, broker.StateDead)
	wantReports(t, b, ms[4].ID, broker.ReportError)

	// The requeued one again, cancelled this time: its second report.
	m := claimOne(t, b, "w1", "rep")
	if err := b.Nack(ctx, broker.NackRequest{Claim: m.ClaimOf(), Cancel: true,
		Report: reportOf(m, broker.ReportCancelled)}); err != nil {
		t.Fatalf("Nack with cancel and a report: %v", err)
	}
	wantState(t, b, m.ID, broker.StateCancelled)
	wantReports(t, b, m.ID, broker.ReportCancelled, broker.ReportFailed)
}

func testOutcomeReportsStale(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	submitN(t, b, "rep", 2)
	ms := claim(t, b, "w1", 2, "rep")
	stale := func(m broker.Message) broker.Message {
		m.Token = "00000000000000000000000000000000"
		return m
	}

	// In one Ack, the applied outcome stores its report and the stale
	// one stores none.
	bad := stale(ms[1])
	errs, err := b.Ack(ctx, []broker.Outcome{
		{Claim: ms[0].ClaimOf(), Report: reportOf(ms[0], broker.ReportSuccess)},
		{Claim: bad.ClaimOf(), Report: reportOf(bad, broker.ReportSuccess)},
	})
	if err != nil || len(errs) != 2 || errs[0] != nil || !errors.Is(errs[1], broker.ErrClaimLost) {
		t.Fatalf("Ack of a held and a stale claim = %v, %v; want [nil ErrClaimLost]", errs, err)
	}
	wantReports(t, b, ms[0].ID, broker.ReportSuccess)
	wantReports(t, b, ms[1].ID)

	// Ack, Nack and DeadLetter of a claim already ended, and with a wrong
	// token: ErrClaimLost, no report.
	errs, err = b.Ack(ctx, []broker.Outcome{{Claim: ms[0].ClaimOf(), Report: reportOf(ms[0], broker.ReportSuccess)}})
	if err != nil || len(errs) != 1 || !errors.Is(errs[0], broker.ErrClaimLost) {
		t.Fatalf("Ack again with a report = %v, %v; want [ErrClaimLost]", errs, err)
	}
	wantErr(t, "Nack of an acked claim with a report", b.Nack(ctx, broker.NackRequest{Claim: ms[0].ClaimOf(), Requeue: true,
		Report: reportOf(ms[0], broker.ReportFailed)}), broker.ErrClaimLost)
	wantErr(t, "DeadLetter of an acked claim with a report", b.DeadLetter(ctx, ms[0].ClaimOf(), "late",
		reportOf(ms[0], broker.ReportFailed)), broker.ErrClaimLost)
	wantReports(t, b, ms[0].ID, broker.ReportSuccess)
	wantErr(t, "Nack with a wrong token and a report", b.Nack(ctx, broker.NackRequest{Claim: bad.ClaimOf(),
		Report: reportOf(bad, broker.ReportFailed)}), broker.ErrClaimLost)
	wantErr(t, "Nack (cancel) with a wrong token and a report", b.Nack(ctx, broker.NackRequest{Claim: bad.ClaimOf(), Cancel: true,
		Report: reportOf(bad, broker.ReportCancelled)}), broker.ErrClaimLost)
	wantErr(t, "DeadLetter with a wrong token and a report", b.DeadLetter(ctx, bad.ClaimOf(), "x",
		reportOf(bad, broker.ReportError)), broker.ErrClaimLost)
	wantState(t, b, ms[1].ID, broker.StateRunning)
	wantReports(t, b, ms[1].ID)
}

func testOutcomeReportRefused(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	submitN(t, b, "rep", 2)
	ms := claim(t, b, "w1", 2, "rep")
	unknown := reportOf(ms[0], "fine")
	other := reportOf(ms[0], broker.ReportSuccess)
	other.MessageID = ms[1].ID

	// One refused report fails the whole Ack: neither outcome applies,
	// neither report is stored.
	for _, bad := range []*broker.Report{unknown, other} {
		_, err := b.Ack(ctx, []broker.Outcome{
			{Claim: ms[1].ClaimOf(), Report: reportOf(ms[1], broker.ReportSuccess)},
			{Claim: ms[0].ClaimOf(), Report: bad},
		})
		wantErr(t, fmt.Sprintf("Ack with the report %+v", *bad), err, broker.ErrInvalid)
		wantErr(t, "Nack with a refused report", b.Nack(ctx, broker.NackRequest{Claim: ms[0].ClaimOf(), Requeue: true, Report: bad}),
			broker.ErrInvalid)
		wantErr(t, "DeadLetter with a refused report", b.DeadLetter(ctx, ms[0].ClaimOf(), "x", bad), broker.ErrInvalid)
	}
	for _, m := range ms {
		wantState(t, b, m.ID, broker.StateRunning)
		wantReports(t, b, m.ID)
	}
	// The claims still hold: the outcomes apply with valid reports.
	errs, err := b.Ack(ctx, []broker.Outcome{{Claim: ms[0].ClaimOf(), Report: reportOf(ms[0], broker.ReportSuccess)}})
	if err != nil || errs[0] != nil {
		t.Fatalf("Ack after the refusals = %v, %v", errs, err)
	}
	wantReports(t, b, ms[0].ID, broker.ReportSuccess)
}

// testOutcomeReportsAtomic acks messages with their reports while a
// reader watches: a message the reader sees done already has its report
// (the reader looks at the message first, then at its reports), so the
// two were never apart.
func testOutcomeReportsAtomic(t *testing.T, b broker.Broker) {
	ctx := ctxOf(t)
	const n, batch = 120, 6
	submitN(t, b, "rep", n)
	var ms []broker.Message
	for len(ms) < n {
		ms = append(ms, claim(t, b, "w1", n-len(ms), "rep")...)
	}
	ended := make(chan error, 1) // the acks' error, once they are all written
	go func() {
		var err error
		for i := 0; i < n && err == nil; i += batch {
			var outcomes []broker.Outcome
			for _, m := range ms[i:min(i+batch, n)] {
				outcomes = append(outcomes, broker.Outcome{Claim: m.ClaimOf(), Report: reportOf(m, broker.ReportSuccess)})
			}
			var errs []error
			if errs, err = b.Ack(ctx, outcomes); err == nil {
				err = errors.Join(errs...)
			}
		}
		ended <- err
	}()
	seen, acking := 0, true
	for left := ms; len(left) > 0; {
		var next []broker.Message
		for _, m := range left {
			if get(t, b, m.ID).State != broker.StateDone {
				next = append(next, m)
				continue
			}
			seen++
			if rs := reportsOf(t, b, m.ID); len(rs) != 1 {
				t.Fatalf("message %d was read done with %d reports, want 1: the report is not stored with its ack", m.ID, len(rs))
			}
		}
		left = next
		if acking {
			select {
			case err := <-ended:
				if err != nil {
					t.Fatalf("Ack: %v", err)
				}
				acking = false
			default:
			}
		} else if len(left) > 0 {
			t.Fatalf("%d messages are not done after every ack returned", len(left))
		}
	}
	if acking {
		if err := <-ended; err != nil {
			t.Fatalf("Ack: %v", err)
		}
	}
	if seen != n {
		t.Fatalf("read %d messages done, want %d", seen, n)
	}
}
