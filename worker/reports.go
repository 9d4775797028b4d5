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
// queued at once (up to ReportBatch) in one AddReports call, so the writer
// keeps up with workers that finish thousands of tasks a second. When the
// database falls far behind anyway, reports are dropped and counted rather
// than slowing the tasks down.
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
}

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
	w := &ReportWriter{store: store, log: log, dropped: dropped, ch: make(chan broker.Report, 10000), done: make(chan struct{})}
	w.stopCtx, w.stop = context.WithCancel(context.Background())
	go w.run()
	return w
}

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
		w.write(batch)
	}
}

// write stores a batch, retrying a failure that may pass a few times.
// When the batch is refused as invalid, each report is stored on its own,
// so one bad report costs only itself.
func (w *ReportWriter) write(batch []broker.Report) {
	for attempt := 0; ; attempt++ {
		if w.stopCtx.Err() != nil {
			w.dropped(len(batch))
			return
		}
		ctx, cancel := context.WithTimeout(w.stopCtx, 30*time.Second)
		_, err := w.store.AddReports(ctx, batch)
		cancel()
		switch {
		case err == nil:
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
		case errors.Is(err, broker.ErrInvalid) || errors.Is(err, broker.ErrClosed) || attempt >= 3:
			w.log.Warn("task reports not stored", "reports", len(batch), "first_message_id", batch[0].MessageID, "error", err)
			w.dropped(len(batch))
			return
		}
		select {
		case <-time.After(time.Duration(attempt+1) * 200 * time.Millisecond):
		case <-w.stopCtx.Done():
		}
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
