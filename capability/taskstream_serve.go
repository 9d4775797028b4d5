package capability

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"time"

	"github.com/taskhost/taskhost/capability/internal/pb"
)

// This file serves RunTasks in a provider plugin: many attempts on one
// stream. One goroutine reads the caller's frames and starts each attempt
// on a goroutine of its own; one sends the attempts' events, as many as
// are ready in one frame. An attempt's final event is queued only once its
// RunTask has returned: until then the caller counts it as running.

// errStreamGone is the cause of an attempt's context when its stream ends.
var errStreamGone = errors.New("the stream of attempts ended (tasks_worker stopped, or the host restarts this plugin's caller)")

// errCancelled is the cause of an attempt's context when the caller
// cancels it without a reason.
var errCancelled = errors.New("attempt cancelled by tasks_worker")

// Bounds of the events waiting to be sent: one log line is cut at
// maxLogLine bytes; past maxQueuedEvents log and progress events waiting
// (the caller reads slower than the tasks report), more are dropped, and
// an attempt's dropped log lines are counted in a line before its final
// event. Final events are never dropped.
const (
	maxLogLine      = 64 << 10
	maxQueuedEvents = 4096
)

// serveTaskStream runs the attempts of one RunTasks stream.
type serveTaskStream struct {
	impl TaskProvider
	ctx  context.Context
	host HostServices // for the tasks' Submit

	mu       sync.Mutex
	running  map[uint64]context.CancelCauseFunc
	out      []*pb.TaskAttemptEvent // events not sent yet
	queued   int                    // log and progress events in out
	wake     chan struct{}          // a send is due (capacity 1)
	jobs     chan job               // attempts, to an idle runner
	capacity uint32                 // not sent yet when not zero
}

func (s *taskServer) RunTasks(stream pb.TaskProvider_RunTasksServer) error {
	return s.runTasks(stream)
}

// attemptsServer is the provider's end of a stream of attempts: a gRPC
// RunTasks call (relayed by the host), or a direct connection's frames.
type attemptsServer interface {
	Context() context.Context
	Recv() (*pb.TaskDispatch, error)
	Send(*pb.TaskReturn) error
}

// runTasks runs the attempts of one stream until it ends.
func (s *taskServer) runTasks(stream attemptsServer) error {
	capacity := DefaultTaskCapacity
	if c, ok := s.impl.(TaskCapacity); ok {
		capacity = c.TaskCapacity()
	}
	capacity = max(1, min(capacity, 1<<20))
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(errStreamGone)
	st := &serveTaskStream{
		impl: s.impl, ctx: ctx, host: s.host.get(),
		running:  map[uint64]context.CancelCauseFunc{},
		wake:     make(chan struct{}, 1),
		jobs:     make(chan job),
		capacity: uint32(capacity),
	}
	st.kick()
	sendErr := make(chan error, 1)
	go func() { sendErr <- st.sendLoop(stream) }()
	recvErr := st.recvLoop(stream)
	// The caller closed its side or the stream broke: the attempts still
	// running are cancelled; their events have nowhere to go.
	cancel(errStreamGone)
	st.mu.Lock()
	for _, stop := range st.running {
		stop(errStreamGone)
	}
	st.mu.Unlock()
	if recvErr != nil {
		return recvErr
	}
	return <-sendErr
}

// recvLoop starts and cancels attempts as the caller's frames say, until
// the caller closes its side (nil) or the stream fails.
func (st *serveTaskStream) recvLoop(stream attemptsServer) error {
	for {
		d, err := stream.Recv()
		if err != nil {
			if st.ctx.Err() != nil || isEOF(err) {
				return nil
			}
			return err
		}
		for _, a := range d.Attempts {
			st.start(a)
		}
		for _, c := range d.Cancels {
			st.cancel(c)
		}
	}
}

func (st *serveTaskStream) start(a *pb.TaskAttempt) {
	ctx, stop := context.WithCancelCause(st.ctx)
	st.mu.Lock()
	if _, dup := st.running[a.Id]; dup {
		// An id still running: the caller broke the protocol. The first
		// attempt keeps it.
		st.mu.Unlock()
		stop(nil)
		return
	}
	st.running[a.Id] = stop
	st.mu.Unlock()
	if a.TimeoutSeconds > 0 {
		// The caller enforces the timeout with a cancel; the deadline
		// tells the handler when that comes.
		var done context.CancelFunc
		ctx, done = context.WithTimeout(ctx, secondsToDuration(a.TimeoutSeconds))
		inner := stop
		stop = func(cause error) { inner(cause); done() }
	}
	j := job{ctx: withTaskScope(ctx, st.host, a.MessageId), stop: stop, id: a.Id,
		run: TaskRun{Task: a.Task, Payload: a.PayloadJson, MessageID: a.MessageId, Attempt: int(a.Attempt), Headers: a.Headers}}
	select {
	case st.jobs <- j: // a runner waits for one
	default:
		go st.runner(j)
	}
}

// job is one attempt for a runner.
type job struct {
	ctx  context.Context
	stop context.CancelCauseFunc
	id   uint64
	run  TaskRun
}

// runnerIdle is how long a runner waits for another attempt before it
// ends: a busy stream reuses its runners (and their grown stacks) rather
// than start a goroutine per attempt.
const runnerIdle = time.Second

// runner runs attempts, j first, until none comes for runnerIdle or the
// stream ends.
func (st *serveTaskStream) runner(j job) {
	idle := time.NewTimer(runnerIdle)
	defer idle.Stop()
	for {
		st.run(j.ctx, j.stop, j.id, j.run)
		idle.Reset(runnerIdle)
		select {
		case j = <-st.jobs:
		case <-idle.C:
			return
		case <-st.ctx.Done():
			return
		}
	}
}

func (st *serveTaskStream) run(ctx context.Context, stop context.CancelCauseFunc, id uint64, run TaskRun) {
	ev := &attemptEvents{st: st, id: id}
	res, err := runProvided(ctx, st.impl, run, ev)
	final := finalEvent(res, err)
	st.mu.Lock()
	delete(st.running, id)
	ev.ended = true
	if ev.dropped > 0 {
		st.out = append(st.out, &pb.TaskAttemptEvent{Id: id, Event: &pb.RunTaskEvent{
			LogLine: fmt.Sprintf("(%d log lines dropped: the task logged faster than they could be sent)", ev.dropped)}})
	}
	st.out = append(st.out, &pb.TaskAttemptEvent{Id: id, Event: final})
	st.mu.Unlock()
	stop(nil)
	st.kick()
}

// runProvided calls impl.RunTask and turns a panic into the attempt's
// failure, so that one task's bug does not end the plugin and every
// attempt it runs.
func runProvided(ctx context.Context, impl TaskProvider, run TaskRun, ev TaskEvents) (res []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			res, err = nil, panicError(r)
		}
	}()
	return impl.RunTask(ctx, run, ev)
}

func (st *serveTaskStream) cancel(c *pb.TaskCancel) {
	st.mu.Lock()
	stop := st.running[c.Id]
	st.mu.Unlock()
	if stop == nil {
		return // ended already: its final event is on its way
	}
	cause := errCancelled
	if c.Reason != "" {
		cause = errors.New(c.Reason)
	}
	stop(cause)
}

func (st *serveTaskStream) kick() {
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// sendLoop sends what is queued, all of it in one frame, whenever there is
// something; gRPC's flow control holds it back while the caller does not
// read, and the attempts' events wait in the queue meanwhile.
func (st *serveTaskStream) sendLoop(stream attemptsServer) error {
	for {
		select {
		case <-st.ctx.Done():
			return nil
		case <-st.wake:
		}
		// Let what else is ready run first: the attempts (or events) it
		// adds go in this frame.
		runtime.Gosched()
		st.mu.Lock()
		f := &pb.TaskReturn{Capacity: st.capacity, Events: st.out}
		st.capacity, st.out, st.queued = 0, nil, 0
		st.mu.Unlock()
		if f.Capacity == 0 && len(f.Events) == 0 {
			continue
		}
		if err := stream.Send(f); err != nil {
			return err
		}
	}
}

// attemptEvents queues one attempt's log lines and progress.
type attemptEvents struct {
	st      *serveTaskStream
	id      uint64
	ended   bool // under st.mu: the final event is queued, nothing more goes
	dropped int  // under st.mu: log lines dropped (maxQueuedLogs)
}

func (e *attemptEvents) Log(line string) {
	if line == "" {
		return
	}
	if len(line) > maxLogLine {
		line = line[:maxLogLine]
	}
	e.queue(&pb.RunTaskEvent{LogLine: line}, true)
}

func (e *attemptEvents) Progress(f float64) {
	e.queue(&pb.RunTaskEvent{Progress: f, HasProgress: true}, false)
}

func (e *attemptEvents) queue(ev *pb.RunTaskEvent, isLog bool) {
	e.st.mu.Lock()
	if e.ended {
		e.st.mu.Unlock()
		return
	}
	if e.st.queued >= maxQueuedEvents {
		if isLog {
			e.dropped++
		}
		e.st.mu.Unlock()
		return
	}
	e.st.queued++
	e.st.out = append(e.st.out, &pb.TaskAttemptEvent{Id: e.id, Event: ev})
	e.st.mu.Unlock()
	e.st.kick()
}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }

// panicError is the failure of an attempt whose RunTask panicked.
func panicError(r any) error { return fmt.Errorf("panic: %v", r) }
