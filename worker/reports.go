package worker

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
)

// ReportWriter is a Reporter that stores task reports in a
// broker.ScheduleStore off the workers' path: the pool hands reports over
// without blocking, and one goroutine writes them, everything
// queued at once (up to ReportBatch) in one AddReports call. When the
// database falls far behind, reports are dropped and counted rather than
// slowing the tasks down.
//
// It is a StoringReporter: a pool whose broker is the writer's store
// stores every report that has an outcome with that outcome, in one
// transaction, and the writer gets only the reports of lost attempts
// (StatusLost), which have no outcome to ride on. Only those can be
// dropped then. A pool on another broker hands it every report.
//
// Each report gets a key (broker.Report.Key) before its first write, so a
// batch retried after an error whose write committed anyway (a connection
// broken after the commit) is stored once. That makes retrying safe, so a
// failure that may pass is retried with a growing pause (up to
// reportRetryMax) until the writer is closed or the store has failed for
// reportRetryFor: a database restart loses no reports. Meanwhile the
// queue fills and what does not fit is dropped and counted, as ever.
type ReportWriter struct {
	store   broker.ScheduleStore
	log     hclog.Logger
	dropped func(n int) // counts reports not stored
	ch      chan broker.Report
	done    chan struct{}
	once    sync.Once
	// stopCtx ends when Close gives up: the write under way is cut short
	// and what is left is dropped and counted.
	stopCtx context.Context
	stop    context.CancelFunc
	full    atomic.Int64 // reports dropped because the queue was full
	// retryFor and retryMax are reportRetryFor and reportRetryMax, but in
	// tests.
	retryFor, retryMax time.Duration
	// failingSince is when the store began failing, zero while it works;
	// run's goroutine only. Once it has failed for retryFor, each batch
	// gets one try until a write succeeds, so a long outage does not
	// hold every queued batch for retryFor.
	failingSince time.Time
}

// reportRetryFor bounds how long a ReportWriter retries a failure that
// may pass before it drops the batch; reportRetryMax bounds the pause
// between tries, and is how long each batch is still tried once the store
// has failed for reportRetryFor.
const (
	reportRetryFor = 2 * time.Minute
	reportRetryMax = 5 * time.Second
)

// ReportBatch bounds the reports one AddReports call of a ReportWriter
// stores.
const ReportBatch = 500

// NewReportWriter starts a writer into store; dropped, when not nil, is
// told of every report not stored, from several goroutines at once. Close
// it after the pool stopped.
func NewReportWriter(store broker.ScheduleStore, log hclog.Logger, dropped func(n int)) *ReportWriter {
	if dropped == nil {
		dropped = func(int) {}
	}
	w := &ReportWriter{store: store, log: log, dropped: dropped, ch: make(chan broker.Report, 10000), done: make(chan struct{}),
		retryFor: reportRetryFor, retryMax: reportRetryMax}
	w.stopCtx, w.stop = context.WithCancel(context.Background())
	go w.run()
	return w
}

// ReportStore implements StoringReporter: a pool on the same broker
// stores the reports of its attempts with their outcomes, and hands this
// writer only those of lost attempts (see StoringReporter).
func (w *ReportWriter) ReportStore() broker.ScheduleStore { return w.store }

// Report implements Reporter.
func (w *ReportWriter) Report(r broker.Report) {
	select {
	case w.ch <- r:
	default:
		w.dropped(1)
		if n := w.full.Add(1); n == 1 || n%1000 == 0 {
			w.log.Warn("task reports are being dropped: the database cannot keep up", "dropped", n)
		}
	}
}

func (w *ReportWriter) run() {
	defer close(w.done)
	batch := make([]broker.Report, 0, ReportBatch)
	for r := range w.ch {
		batch = gather(w.ch, append(batch[:0], r), ReportBatch)
		for i := range batch {
			if batch[i].Key == "" {
				batch[i].Key = broker.NewToken()
			}
		}
		w.write(batch)
	}
}

// write stores a batch, retrying a failure that may pass (the reports'
// keys make that safe) until the store has failed for w.retryFor (and
// the batch was tried for w.retryMax), or the writer is closed. When
// the batch is refused as invalid, each report is stored on its own, so
// one bad report costs only itself.
func (w *ReportWriter) write(batch []broker.Report) {
	pause, start := 200*time.Millisecond, time.Now()
	for {
		if w.stopCtx.Err() != nil {
			w.dropped(len(batch))
			return
		}
		ctx, cancel := context.WithTimeout(w.stopCtx, 30*time.Second)
		_, err := w.store.AddReports(ctx, batch)
		cancel()
		switch {
		case err == nil:
			w.failingSince = time.Time{}
			return
		case w.stopCtx.Err() != nil:
			w.log.Warn("task reports not stored: the writer was closed before the database answered", "reports", len(batch), "error", err)
			w.dropped(len(batch))
			return
		case errors.Is(err, broker.ErrInvalid) && len(batch) > 1:
			for _, r := range batch {
				w.write([]broker.Report{r})
			}
			return
		case errors.Is(err, broker.ErrInvalid) || errors.Is(err, broker.ErrClosed):
			w.log.Warn("task reports not stored", "reports", len(batch), "first_message_id", batch[0].MessageID, "error", err)
			w.dropped(len(batch))
			return
		}
		if w.failingSince.IsZero() {
			w.failingSince = time.Now()
		}
		// Past retryFor, a batch still gets tries for retryMax, which
		// bounds how fast a long outage drops batches and warns.
		if failing := time.Since(w.failingSince); failing >= w.retryFor && time.Since(start) >= w.retryMax {
			w.log.Warn("task reports not stored: the database has been failing too long", "reports", len(batch),
				"first_message_id", batch[0].MessageID, "failing_for", failing.Round(time.Second), "error", err)
			w.dropped(len(batch))
			return
		}
		select {
		case <-time.After(pause):
		case <-w.stopCtx.Done():
		}
		pause = min(2*pause, w.retryMax)
	}
}

// Close stores what is queued and stops; call it after the pool stopped.
// When ctx ends first, the write under way is cut short and the reports
// not stored yet are dropped and counted.
func (w *ReportWriter) Close(ctx context.Context) {
	w.once.Do(func() { close(w.ch) })
	select {
	case <-w.done:
	case <-ctx.Done():
		w.stop()
		<-w.done
	}
	w.stop()
}
