package postgres

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
)

// doneFixture: messages of two topics and two tasks, acked with plain
// success reports in acks whose id ranges overlap (so their batches'
// ranges do), and a few that stay in tw_messages: failed ones, one acked
// with a report that has logs, and queued ones.
type doneFixture struct {
	b       *Broker
	all     map[int64]broker.Message // every message as stored now, by id
	batched map[int64]bool           // the messages acked into batches
	reports map[int64]int64          // report id of each batched message
}

func newDoneFixture(t *testing.T, n int) doneFixture {
	t.Helper()
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	var reqs []broker.SubmitRequest
	for i := range n {
		reqs = append(reqs, broker.SubmitRequest{Topic: fmt.Sprintf("t%d", i%2), Task: fmt.Sprintf("k%d", i%3),
			Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
	}
	if _, err := b.SubmitMany(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	var claimed []broker.Message
	for _, topic := range []string{"t0", "t1"} {
		msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{topic}, Max: n})
		if err != nil {
			t.Fatal(err)
		}
		claimed = append(claimed, msgs...)
	}
	slices.SortFunc(claimed, func(a, b broker.Message) int { return int(a.ID - b.ID) })
	f := doneFixture{b: b, batched: map[int64]bool{}}
	res := json.RawMessage(`{"ok":1}`)
	end := time.Now()
	plain := func(m broker.Message) broker.Outcome {
		return broker.Outcome{Claim: m.ClaimOf(), Result: res, Report: &broker.Report{MessageID: m.ID, Task: m.Task,
			Topic: m.Topic, Attempt: m.Attempts, Worker: "w", Status: broker.ReportSuccess, StartedAt: end.Add(-time.Second),
			EndedAt: end, Duration: 1, Result: res, Progress: 1, Key: broker.ReportKey(*m.ClaimedAt, m.Token)}}
	}
	// Acks of plain reports: the even positions in groups of 7, then the
	// odd ones in groups of 5, so each ack's range spans the others'.
	// Every 10th message is left out for the other outcomes.
	var groups [][]broker.Outcome
	for _, parity := range []int{0, 1} {
		size := 7 - 2*parity
		var g []broker.Outcome
		for i, m := range claimed {
			if i%2 != parity || i%10 == 9 {
				continue
			}
			g = append(g, plain(m))
			f.batched[m.ID] = true
			if len(g) == size {
				groups, g = append(groups, g), nil
			}
		}
		if len(g) > 0 {
			groups = append(groups, g)
		}
	}
	for _, g := range groups {
		if errs, err := b.Ack(ctx, g); err != nil || errors.Join(errs...) != nil {
			t.Fatalf("ack: %v, %v", errs, err)
		}
	}
	for i, m := range claimed {
		if i%10 != 9 {
			continue
		}
		switch i % 20 {
		case 9:
			if err := b.Nack(ctx, broker.NackRequest{Claim: m.ClaimOf(), Error: "boom"}); err != nil {
				t.Fatal(err)
			}
		default:
			o := plain(m)
			o.Report.Logs = []string{"a line"}
			if errs, err := b.Ack(ctx, []broker.Outcome{o}); err != nil || errs[0] != nil {
				t.Fatalf("ack with logs: %v, %v", errs, err)
			}
		}
	}
	var batches, inRows int
	c := schemaConn(t, b)
	if err := c.QueryRow(ctx, `SELECT (SELECT count(*) FROM tw_done), (SELECT count(*) FROM tw_messages WHERE id = ANY ($1))`,
		slices.Collect(func(yield func(int64) bool) {
			for id := range f.batched {
				if !yield(id) {
					return
				}
			}
		})).Scan(&batches, &inRows); err != nil {
		t.Fatal(err)
	}
	if batches < len(groups) || inRows != 0 {
		t.Fatalf("%d batches for %d acks, %d of their messages still in tw_messages; want at least one a topic and task each, and none", batches, len(groups), inRows)
	}
	f.all = map[int64]broker.Message{}
	f.reports = map[int64]int64{}
	for id := int64(1); id <= int64(n); id++ {
		m, err := b.GetMessage(ctx, id)
		if err != nil {
			t.Fatalf("GetMessage(%d): %v", id, err)
		}
		f.all[id] = m
	}
	rows, err := c.Query(ctx, `SELECT id, report_id FROM tw_messages_all WHERE report_id IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, rid int64
		if err := rows.Scan(&id, &rid); err != nil {
			t.Fatal(err)
		}
		if f.batched[id] {
			f.reports[id] = rid
		}
	}
	if len(f.reports) != len(f.batched) {
		t.Fatalf("%d of %d batched messages keep a report", len(f.reports), len(f.batched))
	}
	return f
}

// TestDoneBatchesReadAsMessages: a message acked into a batch reads as it
// would from its row: GetMessage, Cancel (finished) and Requeue (refused).
func TestDoneBatchesReadAsMessages(t *testing.T) {
	f := newDoneFixture(t, 60)
	ctx := t.Context()
	for id := range f.batched {
		m := f.all[id]
		if m.State != broker.StateDone || string(m.Result) != `{"ok": 1}` || m.Attempts != 1 || m.ClaimedBy != "w" ||
			m.FinishedAt == nil || m.ClaimedAt == nil || m.Topic != fmt.Sprintf("t%d", (id-1)%2) ||
			m.Task != fmt.Sprintf("k%d", (id-1)%3) || string(m.Payload) != fmt.Sprintf(`{"i": %d}`, id-1) {
			t.Fatalf("batched message %d reads as %+v", id, m)
		}
		got, err := f.b.Cancel(ctx, id)
		if !errors.Is(err, broker.ErrFinished) || got.ID != id || got.State != broker.StateDone {
			t.Fatalf("Cancel(%d) = %+v, %v; want it finished", id, got, err)
		}
		if err := f.b.Requeue(ctx, id); !errors.Is(err, broker.ErrInvalid) {
			t.Fatalf("Requeue(%d) = %v; want invalid (it is done)", id, err)
		}
	}
	if _, err := f.b.GetMessage(ctx, 1000); !errors.Is(err, broker.ErrNotFound) {
		t.Fatalf("GetMessage of no message: %v", err)
	}
}

// TestDoneBatchesListNewestFirst: every filter of ListMessages, paged
// with small limits, gives exactly the messages it selects from
// tw_messages and the batches, newest first, though the batches' id
// ranges overlap.
func TestDoneBatchesListNewestFirst(t *testing.T) {
	f := newDoneFixture(t, 90)
	ctx := t.Context()
	for _, state := range []string{"", broker.StateDone, broker.StateFailed} {
		for _, topic := range []string{"", "t1"} {
			for _, task := range []string{"", "k2"} {
				var want []int64
				for id := int64(90); id >= 1; id-- {
					m := f.all[id]
					if (state == "" || m.State == state) && (topic == "" || m.Topic == topic) && (task == "" || m.Task == task) {
						want = append(want, id)
					}
				}
				for _, limit := range []int{1, 4, 50} {
					var got []int64
					filter := broker.MessageFilter{State: state, Topic: topic, Task: task, Limit: limit}
					for {
						page, err := f.b.ListMessages(ctx, filter)
						if err != nil {
							t.Fatalf("%+v: %v", filter, err)
						}
						for _, m := range page {
							got = append(got, m.ID)
							if m.State != f.all[m.ID].State || m.Task != f.all[m.ID].Task {
								t.Fatalf("%+v: message %d reads as %+v, alone as %+v", filter, m.ID, m, f.all[m.ID])
							}
						}
						if len(page) < limit {
							break
						}
						filter.Before = page[len(page)-1].ID
					}
					if !slices.Equal(got, want) {
						t.Fatalf("state %q topic %q task %q limit %d:\n got %v\nwant %v", state, topic, task, limit, got, want)
					}
				}
			}
		}
	}
}

// TestDoneBatchesReports: the reports kept in batches read by id, and list
// newest first under every filter, paged, merged with the others.
func TestDoneBatchesReports(t *testing.T) {
	f := newDoneFixture(t, 60)
	ctx := t.Context()
	for id, rid := range f.reports {
		r, err := f.b.GetReport(ctx, rid)
		if err != nil || r.MessageID != id || r.Status != broker.ReportSuccess || r.Worker != "w" || r.Attempt != 1 ||
			r.Duration != 1 || r.Progress != 1 || string(r.Result) != `{"ok": 1}` || r.Task != f.all[id].Task {
			t.Fatalf("report %d of message %d: %+v, %v", rid, id, r, err)
		}
	}
	all, err := f.b.ListReports(ctx, broker.ReportFilter{Limit: broker.MaxReportLimit})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(f.reports)+3 {
		t.Fatalf("%d reports, want %d kept in batches and 3 with logs", len(all), len(f.reports))
	}
	for _, filter := range []broker.ReportFilter{{}, {Task: "k1"}, {Status: broker.ReportSuccess}, {Status: broker.ReportFailed},
		{MessageID: 7}, {MessageID: 10}, {Schedule: "s"}} {
		var want []int64
		for _, r := range all {
			if (filter.Task == "" || r.Task == filter.Task) && (filter.Status == "" || r.Status == filter.Status) &&
				(filter.MessageID == 0 || r.MessageID == filter.MessageID) && filter.Schedule == "" {
				want = append(want, r.ID)
			}
		}
		for _, limit := range []int{1, 3, 100} {
			var got []int64
			page := filter
			page.Limit = limit
			for {
				list, err := f.b.ListReports(ctx, page)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range list {
					got = append(got, r.ID)
				}
				if len(list) < limit {
					break
				}
				page.Before = list[len(list)-1].ID
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%+v limit %d:\n got %v\nwant %v", filter, limit, got, want)
			}
		}
	}
	// A report stored again with the key of one kept in a batch (its
	// ack's answer was lost) gets that report's id, and nothing more is
	// stored.
	m := f.all[1]
	id, err := f.b.AddReport(ctx, broker.Report{MessageID: 1, Task: m.Task, Topic: m.Topic, Attempt: 1, Worker: "w",
		Status: broker.ReportLost, Error: "claim lost", Key: "another key of the same attempt"})
	if err != nil || id != f.reports[1] {
		t.Fatalf("a lost report of an attempt kept in a batch = %d, %v; want %d", id, err, f.reports[1])
	}
	if list, err := f.b.ListReports(ctx, broker.ReportFilter{MessageID: 1}); err != nil || len(list) != 1 {
		t.Fatalf("reports of message 1: %+v, %v; want one", list, err)
	}
}

// TestDoneBatchesPurges: PurgeReports clears the reports of a batch that
// ended before the cutoff and keeps the others and the messages;
// PurgeFinished deletes the batches that finished before the cutoff and
// moves the reports they still hold to tw_report_rows, with their ids.
func TestDoneBatchesPurges(t *testing.T) {
	f := newDoneFixture(t, 60)
	ctx := t.Context()
	c := schemaConn(t, f.b)
	// Half the batched reports (the odd messages') ended 10 days ago.
	execAll(t, c, `UPDATE tw_done d SET messages = ARRAY (
			SELECT CASE WHEN x.id % 2 = 1 THEN jsonb_populate_record(x, jsonb_build_object('report_ended_at', now() - interval '10 days'))
				ELSE x END
			FROM unnest(d.messages) x),
		first_ended = now() - interval '10 days'
		WHERE EXISTS (SELECT 1 FROM unnest(d.messages) x WHERE x.id % 2 = 1)`)
	var old []int64
	for id := range f.reports {
		if id%2 == 1 {
			old = append(old, id)
		}
	}
	n, err := f.b.PurgeReports(ctx, time.Now().Add(-24*time.Hour))
	if err != nil || n != len(old) {
		t.Fatalf("PurgeReports = %d, %v; want %d", n, err, len(old))
	}
	for id, rid := range f.reports {
		_, err := f.b.GetReport(ctx, rid)
		if id%2 == 1 && !errors.Is(err, broker.ErrNotFound) {
			t.Fatalf("purged report %d of message %d: %v", rid, id, err)
		}
		if id%2 == 0 && err != nil {
			t.Fatalf("report %d of message %d: %v", rid, id, err)
		}
		if m, err := f.b.GetMessage(ctx, id); err != nil || m.State != broker.StateDone {
			t.Fatalf("message %d after its report's purge: %+v, %v", id, m, err)
		}
	}
	list, err := f.b.ListReports(ctx, broker.ReportFilter{Limit: 2})
	if err != nil || len(list) != 2 {
		t.Fatalf("newest reports after the purge: %+v, %v", list, err)
	}
	if n, err := f.b.PurgeReports(ctx, time.Now().Add(-24*time.Hour)); err != nil || n != 0 {
		t.Fatalf("PurgeReports again = %d, %v; want 0", n, err)
	}
	// The batches finished 10 days ago; their messages go, their reports
	// move.
	execAll(t, c, `UPDATE tw_done SET finished_at = now() - interval '10 days'`)
	n, err = f.b.PurgeFinished(ctx, time.Now().Add(-24*time.Hour))
	if err != nil || n != len(f.batched) {
		t.Fatalf("PurgeFinished = %d, %v; want %d", n, err, len(f.batched))
	}
	for id, rid := range f.reports {
		if _, err := f.b.GetMessage(ctx, id); !errors.Is(err, broker.ErrNotFound) {
			t.Fatalf("purged message %d: %v", id, err)
		}
		r, err := f.b.GetReport(ctx, rid)
		if id%2 == 0 && (err != nil || r.MessageID != id) {
			t.Fatalf("report %d of purged message %d: %+v, %v", rid, id, r, err)
		}
	}
	var batches int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM tw_done`).Scan(&batches); err != nil || batches != 0 {
		t.Fatalf("%d batches left, %v", batches, err)
	}
}

// TestDoneKeyedMessagesStayInTheirRows: a message that keeps its unique key
// while done stays in tw_messages, so the key still refuses a second
// submit; its report is kept in its row.
func TestDoneKeyedMessagesStayInTheirRows(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	req := broker.SubmitRequest{Topic: "t", Task: "x", UniqueKey: "once", UniqueStates: []string{broker.StateQueued,
		broker.StateRunning, broker.StateDone}}
	first, err := b.SubmitBatch(ctx, []broker.SubmitRequest{req, {Topic: "t", Task: "x"}})
	if err != nil {
		t.Fatal(err)
	}
	claimAndAckPlain(t, b, "t", 2)
	c := schemaConn(t, b)
	var keyedInRow, plainInRow bool
	if err := c.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM tw_messages WHERE id = $1 AND state = 'done' AND report_id IS NOT NULL),
		EXISTS (SELECT 1 FROM tw_messages WHERE id = $2)`, first[0].ID, first[1].ID).Scan(&keyedInRow, &plainInRow); err != nil {
		t.Fatal(err)
	}
	if !keyedInRow || plainInRow {
		t.Fatalf("keyed message in its row with its report: %v; unkeyed one still in tw_messages: %v", keyedInRow, plainInRow)
	}
	again, err := b.SubmitBatch(ctx, []broker.SubmitRequest{req})
	if err != nil || again[0].ID != first[0].ID || !again[0].Duplicate {
		t.Fatalf("second submit of the key = %+v, %v; want the done holder %d", again, err, first[0].ID)
	}
}

// TestDoneBatchRangesStayNarrow: an ack of messages far apart in id (a
// retry of an old one among new ones) writes a batch per block of ids,
// so no batch's range spans the batches acked in between.
func TestDoneBatchRangesStayNarrow(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	c := schemaConn(t, b)
	if _, err := b.SubmitMany(ctx, []broker.SubmitRequest{{Topic: "t", Task: "x"}, {Topic: "t", Task: "x"}}); err != nil {
		t.Fatal(err)
	}
	execAll(t, c, `SELECT setval('tw_messages_id_seq', 100000)`)
	if _, err := b.SubmitMany(ctx, []broker.SubmitRequest{{Topic: "t", Task: "x"}}); err != nil {
		t.Fatal(err)
	}
	claimAndAckPlain(t, b, "t", 3)
	var ranges []string
	rows, err := c.Query(ctx, `SELECT ids::text FROM tw_done ORDER BY max_id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var r string
		if err := rows.Scan(&r); err != nil {
			t.Fatal(err)
		}
		ranges = append(ranges, r)
	}
	if want := []string{"[1,3)", "[100001,100002)"}; !slices.Equal(ranges, want) {
		t.Fatalf("batch ranges %v, want %v", ranges, want)
	}
	list, err := b.ListMessages(ctx, broker.MessageFilter{Limit: 2})
	if err != nil || len(list) != 2 || list[0].ID != 100001 || list[1].ID != 2 {
		t.Fatalf("newest two: %+v, %v", list, err)
	}
}

// claimAndAckPlain claims the n messages of topic as worker w and acks them
// in one ack, each with a plain success report, failing t unless all n
// are claimed and acked.
func claimAndAckPlain(t *testing.T, b *Broker, topic string, n int) {
	t.Helper()
	msgs, err := b.Claim(t.Context(), broker.ClaimRequest{WorkerID: "w", Topics: []string{topic}, Max: n})
	if err != nil || len(msgs) != n {
		t.Fatalf("claim: %v, %v", msgs, err)
	}
	var outs []broker.Outcome
	for _, m := range msgs {
		outs = append(outs, broker.Outcome{Claim: m.ClaimOf(), Report: &broker.Report{MessageID: m.ID, Task: m.Task,
			Topic: m.Topic, Attempt: 1, Worker: "w", Status: broker.ReportSuccess}})
	}
	if errs, err := b.Ack(t.Context(), outs); err != nil || errors.Join(errs...) != nil {
		t.Fatalf("ack: %v, %v", errs, err)
	}
}

// TestDoneBatchesStayInTheirRow: a batch of 100 messages compresses with
// lz4 where the server has it (migration 021) and stays in its row of
// tw_done, not in the TOAST table, and reads back whole.
func TestDoneBatchesStayInTheirRow(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	c := schemaConn(t, b)
	const n = 100
	var reqs []broker.SubmitRequest
	for i := range n {
		reqs = append(reqs, broker.SubmitRequest{Topic: "t", Task: "x",
			Payload: json.RawMessage(fmt.Sprintf(`{"i":%d,"pad":"%0100d"}`, i, i))})
	}
	if _, err := b.SubmitMany(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	claimAndAckPlain(t, b, "t", n)
	var (
		count, toasted int
		compression    string
	)
	err := c.QueryRow(ctx, `SELECT cardinality(messages), coalesce(pg_column_compression(messages), 'none'),
		(SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE oid = 'tw_done'::regclass)
		FROM tw_done`).Scan(&count, &compression, &toasted)
	if err != nil {
		t.Fatal(err)
	}
	var lz4 bool
	if err := c.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_settings
		WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals))`).Scan(&lz4); err != nil {
		t.Fatal(err)
	}
	want := "pglz"
	if lz4 {
		want = "lz4"
	}
	if count != n || compression != want || toasted != 0 {
		t.Fatalf("batch of %d messages, compression %s, TOAST table %d bytes; want %d, %s, 0", count, compression, toasted, n, want)
	}
	list, err := b.ListMessages(ctx, broker.MessageFilter{Topic: "t", Limit: n})
	if err != nil || len(list) != n {
		t.Fatalf("listing: %d messages, %v", len(list), err)
	}
	for _, m := range list {
		var p struct{ I int64 }
		if err := json.Unmarshal(m.Payload, &p); err != nil || p.I != m.ID-list[n-1].ID || m.State != broker.StateDone {
			t.Fatalf("message %d read back as %s %s (%v)", m.ID, m.State, m.Payload, err)
		}
	}
}

// TestLookupsByID: tw_message(id) and tw_report(id) (migration 022)
// return what filtering tw_messages_all and tw_reports by id returns, for
// a message and a report in each place they can be (a done batch,
// tw_messages, tw_report_rows), and reach the batches through their
// ranges' indexes, which filtering the views cannot.
func TestLookupsByID(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	keyed := broker.SubmitRequest{Topic: "t", Task: "x", UniqueKey: "once", UniqueStates: []string{broker.StateQueued,
		broker.StateRunning, broker.StateDone}}
	subs, err := b.SubmitBatch(ctx, []broker.SubmitRequest{keyed, {Topic: "t", Task: "x"}, {Topic: "t", Task: "x"}})
	if err != nil {
		t.Fatal(err)
	}
	claimAndAckPlain(t, b, "t", 3)
	queued, err := b.Submit(ctx, broker.SubmitRequest{Topic: "t", Task: "x"})
	if err != nil {
		t.Fatal(err)
	}
	ended := time.Now()
	reportIDs, err := b.AddReports(ctx, []broker.Report{{MessageID: queued, Task: "x", Topic: "t", Attempt: 1,
		Worker: "w", Status: broker.ReportFailed, Error: "boom", StartedAt: ended, EndedAt: ended}})
	if err != nil {
		t.Fatal(err)
	}
	c := schemaConn(t, b)
	// In a batch: subs[1] and subs[2]; in tw_messages: subs[0] (done,
	// keyed, its report in its row) and queued; the failure report in
	// tw_report_rows.
	ids := []int64{subs[0].ID, subs[1].ID, subs[2].ID, queued}
	var reports []int64
	if err := c.QueryRow(ctx, `SELECT array_agg(report_id ORDER BY id) FROM tw_messages_all WHERE report_id IS NOT NULL`).
		Scan(&reports); err != nil {
		t.Fatal(err)
	}
	if len(reports) != 3 {
		t.Fatalf("held reports %v, want 3", reports)
	}
	reports = append(reports, reportIDs...)
	same := func(fn, view string, id int64) {
		t.Helper()
		var got, want []string
		if err := c.QueryRow(ctx, `SELECT coalesce(array_agg(to_jsonb(f)::text), '{}') FROM `+fn+`($1) f`, id).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if err := c.QueryRow(ctx, `SELECT coalesce(array_agg(to_jsonb(v)::text), '{}') FROM `+view+` v WHERE id = $1`, id).Scan(&want); err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || len(want) != 1 || got[0] != want[0] {
			t.Fatalf("%s(%d) = %v; the view has %v", fn, id, got, want)
		}
	}
	for _, id := range ids {
		same("tw_message", "tw_messages_all", id)
	}
	for _, id := range reports {
		same("tw_report", "tw_reports", id)
	}
	// Through the indexes: with sequential scans priced out, the batches
	// are read by their ranges; a filtered view still reads them all.
	if _, err := c.Exec(ctx, `SET enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	for _, q := range []struct{ sql, index string }{
		{`SELECT * FROM tw_message($1)`, "tw_done_ids"},
		{`SELECT * FROM tw_report($1)`, "tw_done_reports"},
	} {
		if plan := explain(t, c, q.sql, int64(1)); !strings.Contains(plan, q.index) || strings.Contains(plan, "Seq Scan") {
			t.Errorf("%s does not read tw_done through %s:\n%s", q.sql, q.index, plan)
		}
	}
	if plan := explain(t, c, `SELECT * FROM tw_messages_all WHERE id = $1`, int64(1)); strings.Contains(plan, "tw_done_ids") {
		t.Errorf("the view reads tw_done through its index after all; tw_message is not needed:\n%s", plan)
	}
	// Called from a session whose search_path leads elsewhere, they still
	// read their own schema's tables.
	if _, err := c.Exec(ctx, `SET search_path = pg_catalog`); err != nil {
		t.Fatal(err)
	}
	s := pgx.Identifier{b.schema}.Sanitize()
	var messages, reps int
	if err := c.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+s+`.tw_message($1)), (SELECT count(*) FROM `+s+`.tw_report($2))`,
		ids[1], reports[0]).Scan(&messages, &reps); err != nil || messages != 1 || reps != 1 {
		t.Fatalf("from another search_path: %d messages, %d reports, %v; want 1, 1", messages, reps, err)
	}
}

// TestAckLocksKeyedMessagesInIDOrder: an ack of a keyed message and of an
// unkeyed one with a higher id, told which is keyed (Outcome.Keyed), locks
// them in id order, as the reaper does, alone (Ack) or with a claim
// (AckAndClaim). While another transaction holds the keyed row, the ack
// waits for it holding nothing, so that transaction can still take the
// unkeyed row: before, the ack deleted the unkeyed row first and then
// waited, and the two deadlocked.
func TestAckLocksKeyedMessagesInIDOrder(t *testing.T) {
	acks := map[string]func(ctx context.Context, b *Broker, outs []broker.Outcome) ([]error, error){
		"Ack": func(ctx context.Context, b *Broker, outs []broker.Outcome) ([]error, error) {
			return b.Ack(ctx, outs)
		},
		"AckAndClaim": func(ctx context.Context, b *Broker, outs []broker.Outcome) ([]error, error) {
			errs, _, err := b.AckAndClaim(ctx, outs, broker.ClaimRequest{WorkerID: "w", Topics: []string{"t"}, Max: 1})
			return errs, err
		},
	}
	for name, ack := range acks {
		t.Run(name, func(t *testing.T) { testAckLocksInIDOrder(t, ack) })
	}
}

func testAckLocksInIDOrder(t *testing.T, ack func(ctx context.Context, b *Broker, outs []broker.Outcome) ([]error, error)) {
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	keyed := broker.SubmitRequest{Topic: "t", Task: "x", UniqueKey: "k", UniqueStates: []string{broker.StateQueued,
		broker.StateRunning, broker.StateDone}}
	if _, err := b.SubmitBatch(ctx, []broker.SubmitRequest{keyed, {Topic: "t", Task: "x"}}); err != nil {
		t.Fatal(err)
	}
	msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"t"}, Max: 2})
	if err != nil || len(msgs) != 2 {
		t.Fatalf("claim: %v, %v", msgs, err)
	}
	slices.SortFunc(msgs, func(x, y broker.Message) int { return cmp.Compare(x.ID, y.ID) })
	if msgs[0].UniqueKey != "k" || msgs[1].UniqueKey != "" {
		t.Fatalf("want the keyed message first: %+v", msgs)
	}
	var outs []broker.Outcome
	for _, m := range msgs {
		outs = append(outs, broker.Outcome{Claim: m.ClaimOf(), Keyed: m.UniqueKey != "", Report: &broker.Report{
			MessageID: m.ID, Task: m.Task, Topic: m.Topic, Attempt: 1, Worker: "w", Status: broker.ReportSuccess}})
	}

	c := schemaConn(t, b)
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `SELECT 1 FROM tw_messages WHERE id = $1 FOR UPDATE`, msgs[0].ID); err != nil {
		t.Fatal(err)
	}
	type acked struct {
		errs []error
		err  error
	}
	done := make(chan acked, 1)
	go func() {
		errs, err := ack(ctx, b, outs)
		done <- acked{errs, err}
	}()
	waitFor(t, "the ack to wait for the keyed message's row", func() bool {
		var waiting bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
			WHERE NOT granted AND locktype = 'transactionid' AND transactionid = pg_current_xact_id()::xid)`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting
	})
	if _, err := tx.Exec(ctx, `SELECT 1 FROM tw_messages WHERE id = $1 FOR UPDATE NOWAIT`, msgs[1].ID); err != nil {
		t.Fatalf("the unkeyed message's row, while the ack waits for the keyed one's: %v (the ack took it first)", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || errors.Join(r.errs...) != nil {
		t.Fatalf("ack: %v, %v", r.errs, r.err)
	}
	for _, m := range msgs {
		got, err := b.GetMessage(ctx, m.ID)
		if err != nil || got.State != broker.StateDone {
			t.Fatalf("message %d: %+v, %v", m.ID, got, err)
		}
	}
}
