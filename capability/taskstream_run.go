package capability

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/taskhost/taskhost/capability/internal/pb"
)

// This file is the caller's side of RunTasks (tasks_worker's): a
// TaskRunner keeps one stream of attempts per provider plugin, through the
// host, and runs each attempt on it. A sender goroutine per stream sends
// whatever attempts and cancels are ready in one frame; a receiver
// goroutine hands each event to its attempt. An attempt is in flight from
// its frame until its final event, and the provider's capacity bounds what
// is in flight: past it, RunTask waits, and so does the worker that called
// it.

// legacyFor is how long a TaskRunner runs a plugin's attempts one call
// each (RunTask) after it found that the plugin, or the host, does not
// serve RunTasks; then it tries the stream again (the plugin may have been
// replaced by a newer binary).
const legacyFor = 30 * time.Second

// capacityWait bounds how long a new stream may go without the provider's
// first frame, which says its capacity, before the stream counts as
// broken.
const capacityWait = 15 * time.Second

// The most an attempt's log may hold when it comes from a provider: lines
// past either bound are dropped and counted (TaskRunnerOptions.Dropped),
// and their number is logged with the attempt's last line.
const (
	maxAttemptLogLines = 1000
	maxAttemptLogBytes = 1 << 20
)

// DroppedLogs is optional for the TaskEvents given to TaskRunner.RunTask:
// it is told how many of the attempt's log lines were dropped, instead of
// a last line that says so.
type DroppedLogs interface {
	LogsDropped(n int)
}

// TaskRunnerOptions configure NewTaskRunner. Every field may be left zero.
type TaskRunnerOptions struct {
	// Logger gets broken streams and refused events.
	Logger hclog.Logger
	// Refused is called for each event a provider sent that no attempt
	// in flight can take: for an attempt it was never given, one that has
	// ended, or that is not a log, progress or final event.
	Refused func(plugin string)
	// Dropped is called with the number of log lines of a provider's
	// attempt dropped past the bounds of one attempt's log.
	Dropped func(plugin string, lines int)
}

// TaskRunner runs attempts of provided tasks in their plugins, many at a
// time on one long-lived stream per plugin (RunTasks, relayed by the
// host), or one call each (HostServices.RunTask) for a plugin or host
// built before the stream existed. Create it with NewTaskRunner, stop it
// with Close.
type TaskRunner struct {
	host HostServices
	opts TaskRunnerOptions
	log  hclog.Logger
	ctx  context.Context
	stop context.CancelFunc

	// capacity is the sum of the capacities of the streams open now.
	capacity atomic.Int64

	mu      sync.Mutex
	streams map[string]*attemptStream
	legacy  map[string]time.Time // plugin -> until when it runs one call each
	relayed map[string]time.Time // plugin -> until when its stream goes through the host
	cert    *tls.Certificate     // the client certificate of direct streams, made at the first one
	refuse  map[string]*refusals // plugin -> refusals not logged yet
}

// refusals counts one plugin's refused events between two log lines.
type refusals struct {
	n      int
	logged time.Time
}

// NewTaskRunner returns a runner over host, the HostServices the plugin
// got in Configure.
func NewTaskRunner(host HostServices, opts TaskRunnerOptions) *TaskRunner {
	log := opts.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	ctx, stop := context.WithCancel(context.Background())
	return &TaskRunner{
		host: host, opts: opts, log: log, ctx: ctx, stop: stop,
		streams: map[string]*attemptStream{}, legacy: map[string]time.Time{}, relayed: map[string]time.Time{},
		refuse: map[string]*refusals{},
	}
}

// Close ends every stream; attempts still in flight fail with
// ErrUnavailable. Safe to call twice.
func (r *TaskRunner) Close() {
	r.stop()
	r.mu.Lock()
	streams := r.streams
	r.streams = map[string]*attemptStream{}
	r.mu.Unlock()
	for _, st := range streams {
		st.fail(fmt.Errorf("the task runner stopped: %w", ErrUnavailable))
	}
}

// RunTask runs one attempt in plugin, as HostServices.RunTask does: its
// log lines and progress go to events, a task error comes back as a
// *TaskError, and a plugin that is not running is ErrUnavailable. When ctx
// ends, the attempt is cancelled in the plugin, and RunTask returns only
// once the plugin has ended it (its handler returned), or its stream
// broke.
func (r *TaskRunner) RunTask(ctx context.Context, plugin string, run TaskRun, events TaskEvents) (json.RawMessage, error) {
	for {
		st := r.stream(plugin)
		if st == nil {
			return r.host.RunTask(ctx, plugin, run, events)
		}
		res, err, sent := st.run(ctx, run, events)
		if !sent && errors.Is(err, ErrUnimplemented) {
			// Nothing was sent on a stream the plugin or the host does
			// not serve: run it the old way.
			r.runLegacy(plugin)
			continue
		}
		return res, err
	}
}

// Capacity is how many attempts the providers whose streams are open now
// take at once, together: what a worker pool may have out in them
// (worker.Options.OffloadSlots). It is 0 until a provider's first attempt
// opens its stream.
func (r *TaskRunner) Capacity() int { return int(r.capacity.Load()) }

// stream returns plugin's stream, opening one if needed; nil when the
// plugin's attempts run one call each for now. A new stream opens in the
// background: its attempts wait for the provider's capacity, or get the
// reason it could not open.
func (r *TaskRunner) stream(plugin string) *attemptStream {
	r.mu.Lock()
	defer r.mu.Unlock()
	if until, ok := r.legacy[plugin]; ok {
		if time.Now().Before(until) {
			return nil
		}
		delete(r.legacy, plugin)
	}
	if st := r.streams[plugin]; st != nil {
		return st
	}
	opener, ok := r.host.(taskStreamOpener)
	if !ok || r.ctx.Err() != nil {
		return nil
	}
	st := newAttemptStream(r, plugin)
	r.streams[plugin] = st
	go st.open(opener)
	return st
}

func (r *TaskRunner) runLegacy(plugin string) {
	r.mu.Lock()
	r.legacy[plugin] = time.Now().Add(legacyFor)
	r.mu.Unlock()
	r.log.Info("plugin runs its tasks one call each: it, or the host, predates the stream of attempts", "plugin", plugin)
}

// forget drops st, which broke, so that the next attempt opens another.
func (r *TaskRunner) forget(st *attemptStream) {
	r.mu.Lock()
	if r.streams[st.plugin] == st {
		delete(r.streams, st.plugin)
	}
	r.mu.Unlock()
}

// refused counts an event nothing could take, and logs it at most every
// ten seconds per plugin.
func (r *TaskRunner) refused(plugin string, why string, id uint64) {
	if r.opts.Refused != nil {
		r.opts.Refused(plugin)
	}
	r.mu.Lock()
	rf := r.refuse[plugin]
	if rf == nil {
		rf = &refusals{}
		r.refuse[plugin] = rf
	}
	rf.n++
	n := rf.n
	due := time.Since(rf.logged) >= 10*time.Second
	if due {
		rf.n, rf.logged = 0, time.Now()
	}
	r.mu.Unlock()
	if due {
		r.log.Warn("refused an event from a task plugin; nothing changed", "plugin", plugin, "why", why, "attempt_id", id, "refused", n)
	}
}

// taskStreamOpener is a HostServices that can open a RunTasks stream to a
// plugin: the gRPC client a plugin gets in Configure.
type taskStreamOpener interface {
	openTaskStream(ctx context.Context) (dispatchStream, error)
}

// dispatchStream is the caller's end of a stream of attempts.
type dispatchStream interface {
	Send(*pb.HostTaskDispatch) error
	Recv() (*pb.TaskReturn, error)
}

func (h *hostServicesClient) openTaskStream(ctx context.Context) (dispatchStream, error) {
	s, err := h.c.RunTasks(ctx)
	if err != nil {
		return nil, fromStatus("open the stream of attempts", err)
	}
	return s, nil
}

// attemptStream is one stream of attempts to one plugin.
type attemptStream struct {
	r      *TaskRunner
	plugin string
	ctx    context.Context
	cancel context.CancelFunc
	wake   chan struct{} // a frame is due (capacity 1)

	mu       sync.Mutex
	s        dispatchStream
	pending  map[uint64]*attemptCall
	nextID   uint64
	capacity int           // 0 until the provider says
	inflight int           // attempts sent or queued, not ended
	room     chan struct{} // closed when capacity or inflight change, then replaced
	// roomWanted: someone waits on room (waitRoom), so a change closes it.
	roomWanted bool
	attempts   []*pb.TaskAttempt
	cancels    []*pb.TaskCancel
	err        error         // why the stream broke
	broken     chan struct{} // closed when it breaks
}

// attemptCall is one attempt in flight.
type attemptCall struct {
	events       TaskEvents
	final        chan *pb.RunTaskEvent // capacity 1
	lines, bytes int                   // log kept
	dropped      int                   // log lines dropped
}

func newAttemptStream(r *TaskRunner, plugin string) *attemptStream {
	ctx, cancel := context.WithCancel(r.ctx)
	return &attemptStream{
		r: r, plugin: plugin, ctx: ctx, cancel: cancel,
		wake: make(chan struct{}, 1), pending: map[uint64]*attemptCall{},
		room: make(chan struct{}), broken: make(chan struct{}),
	}
}

// open opens the stream and starts its goroutines, or fails it. It
// connects to the provider directly when the host and the provider can,
// else through the host, whose first frame names the plugin; either way
// the provider's first frame gives its capacity.
func (st *attemptStream) open(o taskStreamOpener) {
	go st.awaitCapacity()
	s, how, err := st.connect(o)
	if err != nil {
		st.fail(err)
		return
	}
	st.mu.Lock()
	st.s = s
	st.mu.Unlock()
	st.r.log.Info("opened a stream of attempts to a task plugin", "plugin", st.plugin, "path", how)
	go st.sendLoop()
	go st.recvLoop()
}

// connect opens the caller's end of the stream; how says which path it
// takes ("direct" or "host").
func (st *attemptStream) connect(o taskStreamOpener) (s dispatchStream, how string, err error) {
	if s, err := st.r.connectDirect(st.ctx, st.plugin); err == nil {
		return s, "direct", nil
	} else if !errors.Is(err, ErrUnimplemented) {
		return nil, "", err
	}
	s, err = o.openTaskStream(st.ctx)
	if err != nil {
		return nil, "", err
	}
	if err := s.Send(&pb.HostTaskDispatch{Plugin: st.plugin}); err != nil {
		return nil, "", fromStatus("open the stream of attempts", err)
	}
	return s, "host", nil
}

// run runs one attempt; sent says whether it reached the stream (when not,
// nothing of it ran).
func (st *attemptStream) run(ctx context.Context, run TaskRun, events TaskEvents) (res json.RawMessage, err error, sent bool) {
	a := &attemptCall{events: events, final: make(chan *pb.RunTaskEvent, 1)}
	id, err := st.enter(ctx, a, run)
	if err != nil {
		return nil, err, false
	}
	done := ctx.Done()
	for {
		select {
		case ev := <-a.final:
			if a.dropped > 0 && events != nil {
				if c, ok := events.(DroppedLogs); ok {
					c.LogsDropped(a.dropped)
				} else {
					events.Log(fmt.Sprintf("(%d log lines dropped: an attempt keeps at most %d lines, %d bytes)", a.dropped, maxAttemptLogLines, maxAttemptLogBytes))
				}
			}
			if ev.Error != "" {
				return ev.ResultJson, taskErrorOf(ev), true
			}
			return ev.ResultJson, nil, true
		case <-st.broken:
			return nil, st.err, true
		case <-done:
			// Stop the attempt in the plugin, then wait for it to end:
			// until its handler returns it holds its place.
			done = nil
			reason := "cancelled"
			if cause := context.Cause(ctx); cause != nil {
				reason = cause.Error()
			}
			st.mu.Lock()
			if _, ok := st.pending[id]; ok {
				st.cancels = append(st.cancels, &pb.TaskCancel{Id: id, Reason: reason})
			}
			st.mu.Unlock()
			st.kick()
		}
	}
}

// enter waits for room in the provider's capacity, then queues the
// attempt; an error when ctx ends first or the stream breaks.
func (st *attemptStream) enter(ctx context.Context, a *attemptCall, run TaskRun) (uint64, error) {
	for {
		st.mu.Lock()
		if st.err != nil {
			err := st.err
			st.mu.Unlock()
			return 0, err
		}
		if st.capacity > 0 && st.inflight < st.capacity {
			st.nextID++
			id := st.nextID
			st.inflight++
			st.pending[id] = a
			st.attempts = append(st.attempts, attemptToPB(id, run))
			st.mu.Unlock()
			st.kick()
			return id, nil
		}
		room := st.waitRoom()
		st.mu.Unlock()
		select {
		case <-room:
		case <-ctx.Done():
			return 0, fmt.Errorf("waiting for room in plugin %s, which runs at most %d tasks at once: %w", st.plugin, st.capacity, context.Cause(ctx))
		}
	}
}

func attemptToPB(id uint64, run TaskRun) *pb.TaskAttempt {
	return &pb.TaskAttempt{Id: id, Task: run.Task, PayloadJson: run.Payload, MessageId: run.MessageID,
		Attempt: int32(run.Attempt), Headers: run.Headers}
}

// waitRoom is the channel moreRoom closes next; st.mu is held.
func (st *attemptStream) waitRoom() <-chan struct{} {
	st.roomWanted = true
	return st.room
}

// moreRoom wakes those waiting for room, if any; st.mu is held.
func (st *attemptStream) moreRoom() {
	if !st.roomWanted {
		return
	}
	st.roomWanted = false
	close(st.room)
	st.room = make(chan struct{})
}

func (st *attemptStream) kick() {
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// fail breaks the stream for err: every attempt in flight, and every
// caller waiting for room, gets err. The first error wins.
func (st *attemptStream) fail(err error) {
	// Forget it before anyone learns it broke: an attempt that comes
	// after then opens a new stream instead of finding this one.
	st.r.forget(st)
	st.mu.Lock()
	if st.err != nil {
		st.mu.Unlock()
		return
	}
	st.err = err
	close(st.broken)
	st.moreRoom()
	st.r.capacity.Add(-int64(st.capacity))
	n := len(st.pending)
	st.mu.Unlock()
	st.cancel()
	if n > 0 && !errors.Is(err, ErrUnimplemented) && st.r.ctx.Err() == nil {
		st.r.log.Warn("the stream of attempts to a task plugin broke; its attempts in flight fail and are retried", "plugin", st.plugin, "in_flight", n, "error", err)
	}
}

// streamError is what an attempt in flight gets when its stream breaks
// with err: the plugin stopped or died (ErrUnavailable), or it does not
// serve the stream (ErrUnimplemented).
func (st *attemptStream) streamError(err error) error {
	if s, ok := status.FromError(err); ok && s.Code() == codes.Unimplemented {
		return fmt.Errorf("plugin %s: %s: %w", st.plugin, s.Message(), ErrUnimplemented)
	}
	if errors.Is(err, ErrUnimplemented) {
		return err
	}
	return fmt.Errorf("plugin %s: the stream of attempts broke (%v): %w", st.plugin, fromStatus("stream of attempts", err), ErrUnavailable)
}

func (st *attemptStream) sendLoop() {
	for {
		select {
		case <-st.ctx.Done():
			return
		case <-st.wake:
		}
		// Let what else is ready run first: the attempts (or events) it
		// adds go in this frame.
		runtime.Gosched()
		st.mu.Lock()
		d := &pb.TaskDispatch{Attempts: st.attempts, Cancels: st.cancels}
		st.attempts, st.cancels = nil, nil
		st.mu.Unlock()
		if len(d.Attempts) == 0 && len(d.Cancels) == 0 {
			continue
		}
		if err := st.s.Send(&pb.HostTaskDispatch{Dispatch: d}); err != nil {
			// The receiver learns why from Recv; without it, say this.
			st.fail(st.streamError(err))
			return
		}
	}
}

func (st *attemptStream) recvLoop() {
	for {
		f, err := st.s.Recv()
		if err != nil {
			if isEOF(err) {
				err = fmt.Errorf("plugin %s ended the stream of attempts: %w", st.plugin, ErrUnavailable)
			} else {
				err = st.streamError(err)
			}
			st.fail(err)
			return
		}
		st.take(f)
	}
}

// take applies one frame from the provider.
func (st *attemptStream) take(f *pb.TaskReturn) {
	st.mu.Lock()
	if f.Capacity > 0 && st.err == nil {
		c := int(min(f.Capacity, 1<<20))
		st.r.capacity.Add(int64(c - st.capacity))
		st.capacity = c
		st.moreRoom()
	}
	type refusal struct {
		why string
		id  uint64
	}
	var refused []refusal
	for _, e := range f.Events {
		a := st.pending[e.Id]
		switch {
		case a == nil:
			refused = append(refused, refusal{"an event for an attempt that is not in flight (never given, or ended)", e.Id})
		case e.Event == nil:
			refused = append(refused, refusal{"an empty event", e.Id})
		case e.Event.Done:
			delete(st.pending, e.Id)
			st.inflight--
			st.moreRoom()
			a.final <- e.Event
		case e.Event.HasProgress:
			if a.events != nil {
				a.events.Progress(e.Event.Progress)
			}
		case e.Event.LogLine != "":
			st.logLine(a, e.Event.LogLine)
		default:
			refused = append(refused, refusal{"an event that is neither a log line, progress nor a final event", e.Id})
		}
	}
	st.mu.Unlock()
	for _, rf := range refused {
		st.r.refused(st.plugin, rf.why, rf.id)
	}
}

// logLine hands a provider's log line to its attempt, within the bounds of
// one attempt's log; st.mu is held.
func (st *attemptStream) logLine(a *attemptCall, line string) {
	if len(line) > maxLogLine {
		line = line[:maxLogLine]
	}
	if a.lines >= maxAttemptLogLines || a.bytes+len(line) > maxAttemptLogBytes {
		a.dropped++
		if st.r.opts.Dropped != nil {
			st.r.opts.Dropped(st.plugin, 1)
		}
		return
	}
	a.lines++
	a.bytes += len(line)
	if a.events != nil {
		a.events.Log(line)
	}
}

// awaitCapacity breaks a stream whose provider has not said its capacity
// within capacityWait.
func (st *attemptStream) awaitCapacity() {
	t := time.NewTimer(capacityWait)
	defer t.Stop()
	for {
		st.mu.Lock()
		known, room := st.capacity > 0, st.waitRoom()
		st.mu.Unlock()
		if known {
			return
		}
		select {
		case <-t.C:
			st.fail(fmt.Errorf("plugin %s opened a stream of attempts but did not say how many it takes at once within %s: %w", st.plugin, capacityWait, ErrUnavailable))
			return
		case <-st.broken:
			return
		case <-room:
		}
	}
}
