package worker

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/memory"
)

// countingStore counts the AddReports calls that reach the store.
type countingStore struct {
	broker.ScheduleStore
	calls atomic.Int64
}

func (c *countingStore) AddReports(ctx context.Context, rs []broker.Report) ([]int64, error) {
	c.calls.Add(1)
	return c.ScheduleStore.AddReports(ctx, rs)
}

func writerReport(msg int64, status string) broker.Report {
	return broker.Report{MessageID: msg, Task: "t", Topic: "q", Attempt: 1, Worker: "w", Status: status}
}

// The report writer stores reports in batches, so it keeps up with a burst
// of them (one call per report would not), and stores every one.
func TestReportWriterBatches(t *testing.T) {
	b := memory.New()
	store := &countingStore{ScheduleStore: b}
	var dropped atomic.Int64
	w := NewReportWriter(store, hclog.NewNullLogger(), func(n int) { dropped.Add(int64(n)) })
	const n = 5000
	for i := range n {
		w.Report(writerReport(int64(i+1), broker.ReportSuccess))
	}
	w.Close(context.Background())
	if d := dropped.Load(); d != 0 {
		t.Fatalf("%d reports dropped", d)
	}
	seen := map[int64]bool{}
	for before := int64(0); ; {
		rs, err := b.ListReports(context.Background(), broker.ReportFilter{Limit: broker.MaxReportLimit, Before: before})
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) == 0 {
			break
		}
		for _, r := range rs {
			seen[r.MessageID] = true
			before = r.ID
		}
	}
	if len(seen) != n {
		t.Fatalf("%d of %d reports stored", len(seen), n)
	}
	if calls := store.calls.Load(); calls < n/ReportBatch || calls >= n/2 {
		t.Fatalf("%d AddReports calls for %d reports: want them batched (at most %d each)", calls, n, ReportBatch)
	}
}

// A report the store refuses costs only itself: the rest of its batch is
// stored, and the refused one is counted as dropped.
func TestReportWriterIsolatesABadReport(t *testing.T) {
	b := memory.New()
	var dropped atomic.Int64
	w := NewReportWriter(b, hclog.NewNullLogger(), func(n int) { dropped.Add(int64(n)) })
	for i := range 10 {
		status := broker.ReportSuccess
		if i == 4 {
			status = "bogus"
		}
		w.Report(writerReport(int64(i+1), status))
	}
	w.Close(context.Background())
	rs, err := b.ListReports(context.Background(), broker.ReportFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 9 {
		t.Fatalf("%d reports stored, want the 9 valid ones", len(rs))
	}
	for _, r := range rs {
		if r.MessageID == 5 {
			t.Fatal("the invalid report was stored")
		}
	}
	if d := dropped.Load(); d != 1 {
		t.Fatalf("dropped = %d, want 1", d)
	}
}

// hangingStore never answers AddReports: each call waits for its context.
type hangingStore struct {
	broker.ScheduleStore
	calls atomic.Int64
}

func (h *hangingStore) AddReports(ctx context.Context, _ []broker.Report) ([]int64, error) {
	h.calls.Add(1)
	<-ctx.Done()
	return nil, ctx.Err()
}

// Close gives up when its context ends: a database that does not answer
// cannot hold a stopping worker, and every report not stored is counted.
func TestReportWriterCloseIsBounded(t *testing.T) {
	store := &hangingStore{ScheduleStore: memory.New()}
	var dropped atomic.Int64
	w := NewReportWriter(store, hclog.NewNullLogger(), func(n int) { dropped.Add(int64(n)) })
	const n = 1200
	for i := range n {
		w.Report(writerReport(int64(i+1), broker.ReportSuccess))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	w.Close(ctx)
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Close took %s with a 500ms context", took)
	}
	if store.calls.Load() == 0 {
		t.Fatal("no write was tried")
	}
	if d := dropped.Load(); d != n {
		t.Fatalf("%d reports counted as dropped, want all %d", d, n)
	}
}

// storedOnce checks that b holds one report of each message 1..n.
func storedOnce(t *testing.T, b broker.ScheduleStore, n int) {
	t.Helper()
	count := map[int64]int{}
	for before := int64(0); ; {
		rs, err := b.ListReports(context.Background(), broker.ReportFilter{Limit: broker.MaxReportLimit, Before: before})
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) == 0 {
			break
		}
		for _, r := range rs {
			count[r.MessageID]++
			before = r.ID
		}
	}
	for i := range n {
		if c := count[int64(i+1)]; c != 1 {
			t.Errorf("message %d: %d reports stored, want 1", i+1, c)
		}
	}
	if len(count) != n {
		t.Errorf("reports of %d messages stored, want %d", len(count), n)
	}
}

// unheardStore stores the first AddReports call's reports and then fails
// it, as a connection broken after the commit does.
type unheardStore struct {
	broker.ScheduleStore
	calls atomic.Int64
}

func (u *unheardStore) AddReports(ctx context.Context, rs []broker.Report) ([]int64, error) {
	ids, err := u.ScheduleStore.AddReports(ctx, rs)
	if u.calls.Add(1) == 1 && err == nil {
		return nil, errors.New("read tcp 127.0.0.1:5432: connection reset by peer")
	}
	return ids, err
}

// A batch whose write committed but whose answer was lost is retried, and
// the retry stores nothing twice: one report per attempt.
func TestReportWriterStoresOnceWhenTheCommitIsNotHeard(t *testing.T) {
	b := memory.New()
	store := &unheardStore{ScheduleStore: b}
	var dropped atomic.Int64
	w := NewReportWriter(store, hclog.NewNullLogger(), func(n int) { dropped.Add(int64(n)) })
	const n = 50
	for i := range n {
		w.Report(writerReport(int64(i+1), broker.ReportSuccess))
	}
	w.Close(context.Background())
	if c := store.calls.Load(); c < 2 {
		t.Fatalf("%d AddReports calls, want the failed one retried", c)
	}
	if d := dropped.Load(); d != 0 {
		t.Fatalf("%d reports dropped", d)
	}
	storedOnce(t, b, n)
}

// downStore fails every AddReports call until up is closed.
type downStore struct {
	broker.ScheduleStore
	up    chan struct{}
	fails atomic.Int64
}

func (d *downStore) AddReports(ctx context.Context, rs []broker.Report) ([]int64, error) {
	select {
	case <-d.up:
		return d.ScheduleStore.AddReports(ctx, rs)
	default:
		d.fails.Add(1)
		return nil, errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
	}
}

// A database restart of a few seconds loses no reports: the writer keeps
// retrying until it is back.
func TestReportWriterRidesOutARestart(t *testing.T) {
	b := memory.New()
	store := &downStore{ScheduleStore: b, up: make(chan struct{})}
	var dropped atomic.Int64
	w := NewReportWriter(store, hclog.NewNullLogger(), func(n int) { dropped.Add(int64(n)) })
	const n = 100
	for i := range n {
		w.Report(writerReport(int64(i+1), broker.ReportSuccess))
	}
	// Down for 3s and at least five tries (the old writer gave up after
	// four, about 1.2s).
	start := time.Now()
	for deadline := start.Add(time.Minute); time.Now().Before(deadline) && store.fails.Load() < 5; {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Until(start.Add(3 * time.Second)))
	close(store.up)
	w.Close(context.Background())
	if d := dropped.Load(); d != 0 {
		t.Fatalf("%d reports dropped over a restart (%d failed tries)", d, store.fails.Load())
	}
	storedOnce(t, b, n)
}

// A store that stays down is not retried for ever: past retryFor the
// reports are dropped and counted, and Close returns.
func TestReportWriterGivesUpOnALongOutage(t *testing.T) {
	store := &downStore{ScheduleStore: memory.New(), up: make(chan struct{})}
	var dropped atomic.Int64
	w := NewReportWriter(store, hclog.NewNullLogger(), func(n int) { dropped.Add(int64(n)) })
	w.retryFor, w.retryMax = 500*time.Millisecond, 200*time.Millisecond
	const n = 30
	for i := range n {
		w.Report(writerReport(int64(i+1), broker.ReportSuccess))
	}
	done := make(chan struct{})
	go func() {
		w.Close(context.Background())
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("Close did not return with the store down")
	}
	if d := dropped.Load(); d != n {
		t.Fatalf("%d reports counted as dropped, want all %d", d, n)
	}
}
