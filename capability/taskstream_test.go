package capability_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/capabilitytest"
)

// streamProvider is a task provider whose tasks the tests steer:
//
//	"echo"      returns its payload
//	"hold"      holds until release is closed, ignoring its context
//	"wait"      returns when its context ends, with the cause
//	"chatty"    logs 3,000 lines (fewer than a provider queues), then returns
//	"retry"     fails asking for a retry after 42 s
//	"submit"    submits a task from its context and returns its id
//	"headers"   returns the attempt's headers
type streamProvider struct {
	lifecycleOnly
	capacity int
	release  chan struct{}

	running, most atomic.Int32
	started       chan string // each attempt's message id as it starts (when not nil)
}

func (p *streamProvider) TaskCapacity() int { return p.capacity }

func (p *streamProvider) ListTasks(context.Context) ([]capability.TaskSpec, error) { return nil, nil }

func (p *streamProvider) RunTask(ctx context.Context, run capability.TaskRun, ev capability.TaskEvents) (json.RawMessage, error) {
	n := p.running.Add(1)
	defer p.running.Add(-1)
	for {
		m := p.most.Load()
		if n <= m || p.most.CompareAndSwap(m, n) {
			break
		}
	}
	if p.started != nil {
		p.started <- run.MessageID
	}
	switch run.Task {
	case "echo":
		return run.Payload, nil
	case "hold":
		<-p.release
		return json.RawMessage(`"released"`), nil
	case "wait":
		<-ctx.Done()
		return nil, context.Cause(ctx)
	case "chatty":
		for i := range 3000 {
			ev.Log(fmt.Sprintf("line %d", i))
		}
		return json.RawMessage(`"said it all"`), nil
	case "retry":
		return nil, capability.RetryAfter(errors.New("rate limited"), 42*time.Second)
	case "submit":
		got, err := capability.Submit(ctx, capability.TaskSubmission{Task: "child", Payload: json.RawMessage(`{"n":1}`)})
		if err != nil {
			return nil, err
		}
		return json.Marshal(got[0].ID)
	case "headers":
		return json.Marshal(run.Headers)
	}
	return nil, fmt.Errorf("no task %q", run.Task)
}

// streamSetup is a provider plugin, a host that connects the caller to it
// directly (or, after relayOnly, relays its streams), and a runner in a
// caller plugin, all over the real gRPC adapters.
type streamSetup struct {
	provider *streamProvider
	client   *capability.Client
	kill     func() // closes the provider's connection, as its death does
	host     *capabilitytest.Host
	runner   *capability.TaskRunner
	refused  atomic.Int32
	dropped  atomic.Int32
	legacy   atomic.Int32 // attempts run one call each
	direct   atomic.Int32 // direct connections the host brokered
	relayed  atomic.Int32 // streams the host relayed
}

func newStreamSetup(t *testing.T, p *streamProvider) *streamSetup {
	t.Helper()
	s := &streamSetup{provider: p}
	s.client, s.kill = capabilitytest.Dial(t, p)
	s.host = &capabilitytest.Host{
		StreamProviderFunc: func(context.Context, string) (*capability.Client, error) {
			s.relayed.Add(1)
			return s.client, nil
		},
		ConnectTasksFunc: func(ctx context.Context, _ string, cert []byte) (capability.TaskListener, error) {
			s.direct.Add(1)
			return s.client.OpenTaskListener(ctx, cert)
		},
		RunTaskFunc: func(ctx context.Context, _ string, run capability.TaskRun, ev capability.TaskEvents) (json.RawMessage, error) {
			s.legacy.Add(1)
			return s.client.RunTask(ctx, run, ev)
		},
	}
	s.runner = capability.NewTaskRunner(capabilitytest.HostServices(t, s.host), capability.TaskRunnerOptions{
		Refused: func(string) { s.refused.Add(1) },
		Dropped: func(_ string, n int) { s.dropped.Add(int32(n)) },
	})
	t.Cleanup(s.runner.Close)
	return s
}

// relayOnly makes the host relay every stream, as for a provider that
// lists no direct capability.
func (s *streamSetup) relayOnly() { s.host.ConnectTasksFunc = nil }

// paths runs test on a direct stream, then on a relayed one.
func paths(t *testing.T, test func(t *testing.T, relayed bool)) {
	for _, relayed := range []bool{false, true} {
		name := "direct"
		if relayed {
			name = "relayed"
		}
		t.Run(name, func(t *testing.T) { test(t, relayed) })
	}
}

type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Log(line string) {
	l.mu.Lock()
	l.lines = append(l.lines, line)
	l.mu.Unlock()
}
func (l *logLines) Progress(float64) {}

func (l *logLines) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestManyAttemptsShareOneStream: attempts run at once on the stream, each
// gets its own result, and none goes the old way.
func TestManyAttemptsShareOneStream(t *testing.T) {
	paths(t, testManyAttemptsShareOneStream)
}

func testManyAttemptsShareOneStream(t *testing.T, relayed bool) {
	s := newStreamSetup(t, &streamProvider{capacity: 64})
	if relayed {
		s.relayOnly()
	}
	var wg sync.WaitGroup
	errs := make(chan error, 500)
	for i := range 500 {
		wg.Go(func() {
			payload := fmt.Sprintf(`{"i":%d}`, i)
			res, err := s.runner.RunTask(context.Background(), "prov", capability.TaskRun{Task: "echo", Payload: json.RawMessage(payload), MessageID: fmt.Sprint(i), Attempt: 1}, nil)
			if err != nil {
				errs <- err
			} else if string(res) != payload {
				errs <- fmt.Errorf("attempt %d got %s", i, res)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := s.legacy.Load(); n != 0 {
		t.Fatalf("%d attempts ran one call each; want all on the stream", n)
	}
	if n := s.refused.Load(); n != 0 {
		t.Fatalf("%d events refused from a provider that keeps the protocol", n)
	}
	wantDirect, wantRelayed := int32(1), int32(0)
	if relayed {
		wantDirect, wantRelayed = 0, 1
	}
	if d, r := s.direct.Load(), s.relayed.Load(); d != wantDirect || r != wantRelayed {
		t.Fatalf("%d direct connections and %d relayed streams; want %d and %d", d, r, wantDirect, wantRelayed)
	}
}

// TestTheProvidersCapacityBoundsWhatRuns: a provider that takes 3 at a time
// never runs more, however many callers wait.
func TestTheProvidersCapacityBoundsWhatRuns(t *testing.T) {
	p := &streamProvider{capacity: 3, release: make(chan struct{})}
	s := newStreamSetup(t, p)
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Go(func() {
			if _, err := s.runner.RunTask(context.Background(), "prov", capability.TaskRun{Task: "hold", MessageID: fmt.Sprint(i)}, nil); err != nil {
				t.Error(err)
			}
		})
	}
	waitFor(t, "3 attempts running", func() bool { return p.running.Load() == 3 })
	close(p.release)
	wg.Wait()
	if m := p.most.Load(); m != 3 {
		t.Fatalf("at most %d ran at once in a provider of capacity 3", m)
	}
}

// TestACancelledAttemptHoldsItsPlaceUntilItsCodeEnds: when the caller's
// context ends, the cancel reaches the provider, but RunTask returns only
// once the provider's handler has returned.
func TestACancelledAttemptHoldsItsPlaceUntilItsCodeEnds(t *testing.T) {
	p := &streamProvider{capacity: 8, release: make(chan struct{}), started: make(chan string, 1)}
	s := newStreamSetup(t, p)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s.runner.RunTask(ctx, "prov", capability.TaskRun{Task: "hold", MessageID: "1"}, nil)
		done <- err
	}()
	<-p.started
	cancel()
	// The handler ignores its context: the attempt must not end while
	// it runs, however long that is. Give a cancel's round trip time to
	// come back wrongly.
	select {
	case err := <-done:
		t.Fatalf("RunTask returned (%v) while the handler still ran", err)
	case <-time.After(500 * time.Millisecond):
	}
	if p.running.Load() != 1 {
		t.Fatalf("the handler is not running")
	}
	close(p.release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("a handler that returned success after its cancel: %v; success wins", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("RunTask did not return once the handler did")
	}
}

// TestACancelReachesTheHandler: a handler that watches its context ends
// with the cancel's reason.
func TestACancelReachesTheHandler(t *testing.T) {
	p := &streamProvider{capacity: 8, started: make(chan string, 1)}
	s := newStreamSetup(t, p)
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s.runner.RunTask(ctx, "prov", capability.TaskRun{Task: "wait", MessageID: "1"}, nil)
		done <- err
	}()
	<-p.started
	cancel(errors.New("the operator cancelled it"))
	select {
	case err := <-done:
		var te *capability.TaskError
		if !errors.As(err, &te) || !strings.Contains(te.Msg, "the operator cancelled it") {
			t.Fatalf("err = %v; want the task's error carrying the cancel's reason", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the cancel did not end the attempt")
	}
}

// TestAProviderThatGoesAwayFailsItsAttemptsInFlight: attempts in flight
// when the provider's side ends fail as unavailable, and the next attempt
// opens a new stream.
func TestAProviderThatGoesAwayFailsItsAttemptsInFlight(t *testing.T) {
	paths(t, testAProviderThatGoesAwayFailsItsAttemptsInFlight)
}

func testAProviderThatGoesAwayFailsItsAttemptsInFlight(t *testing.T, relayed bool) {
	p := &streamProvider{capacity: 8, release: make(chan struct{}), started: make(chan string, 4)}
	s := newStreamSetup(t, p)
	if relayed {
		s.relayOnly()
	}
	other := capabilitytest.Connect(t, &streamProvider{capacity: 8})
	done := make(chan error, 4)
	for i := range 4 {
		go func() {
			_, err := s.runner.RunTask(context.Background(), "prov", capability.TaskRun{Task: "hold", MessageID: fmt.Sprint(i)}, nil)
			done <- err
		}()
	}
	for range 4 {
		<-p.started
	}
	// The provider process "restarts": its connection goes, a new one
	// serves the next stream.
	s.client = other
	s.kill()
	capability.StopDirectListeners()
	for range 4 {
		select {
		case err := <-done:
			if !errors.Is(err, capability.ErrUnavailable) {
				t.Fatalf("err = %v; want ErrUnavailable", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("attempts in flight did not fail when their provider went away")
		}
	}
	res, err := s.runner.RunTask(context.Background(), "prov", capability.TaskRun{Task: "echo", Payload: json.RawMessage(`1`)}, nil)
	if err != nil || string(res) != "1" {
		t.Fatalf("after the provider came back: %s, %v", res, err)
	}
	close(p.release)
}

// TestAPluginWithoutTheStreamRunsOneCallEach: a host that relays no stream
// to a plugin (an older plugin binary) runs its attempts the old way.
func TestAPluginWithoutTheStreamRunsOneCallEach(t *testing.T) {
	s := newStreamSetup(t, &streamProvider{capacity: 8})
	s.host.StreamProviderFunc = nil
	s.relayOnly()
	res, err := s.runner.RunTask(context.Background(), "prov", capability.TaskRun{Task: "echo", Payload: json.RawMessage(`"old"`)}, nil)
	if err != nil || string(res) != `"old"` {
		t.Fatalf("RunTask = %s, %v", res, err)
	}
	if n := s.legacy.Load(); n != 1 {
		t.Fatalf("%d attempts ran one call each, want 1", n)
	}
}

// TestALogFloodIsBoundedAndCounted: an attempt keeps at most 1,000 lines;
// the rest are counted and said in one last line.
func TestALogFloodIsBoundedAndCounted(t *testing.T) {
	s := newStreamSetup(t, &streamProvider{capacity: 8})
	var ev logLines
	if _, err := s.runner.RunTask(context.Background(), "prov", capability.TaskRun{Task: "chatty"}, &ev); err != nil {
		t.Fatal(err)
	}
	lines := ev.get()
	if len(lines) != 1001 {
		t.Fatalf("%d lines kept; want 1,000 and a line that counts the rest", len(lines))
	}
	if got := s.dropped.Load(); got != 2000 {
		t.Fatalf("%d lines counted as dropped, want 2,000", got)
	}
	if !strings.Contains(lines[1000], "2000 log lines dropped") {
		t.Fatalf("last line %q does not count the dropped lines", lines[1000])
	}
}

// TestRetryAfterCrossesTheStream: a provider's retry delay reaches the
// caller with its failure.
func TestRetryAfterCrossesTheStream(t *testing.T) {
	s := newStreamSetup(t, &streamProvider{capacity: 8})
	_, err := s.runner.RunTask(context.Background(), "prov", capability.TaskRun{Task: "retry"}, nil)
	var te *capability.TaskError
	if !errors.As(err, &te) || te.Outcome != capability.OutcomeError || te.RetryAfter != 42*time.Second || te.Msg != "rate limited" {
		t.Fatalf("err = %#v; want a failure retried after 42s", err)
	}
}

// TestHeadersCrossTheStream: the task's headers reach the provider.
func TestHeadersCrossTheStream(t *testing.T) {
	s := newStreamSetup(t, &streamProvider{capacity: 8})
	res, err := s.runner.RunTask(context.Background(), "prov", capability.TaskRun{Task: "headers", Headers: map[string]string{"traceparent": "00-abc-def-01"}}, nil)
	if err != nil || string(res) != `{"traceparent":"00-abc-def-01"}` {
		t.Fatalf("RunTask = %s, %v", res, err)
	}
}

// TestATaskSubmitsWithItselfAsParent: Submit from a task's context goes to
// the host's SubmitTasks with the running task as the parent.
func TestATaskSubmitsWithItselfAsParent(t *testing.T) {
	s := newStreamSetup(t, &streamProvider{capacity: 8})
	var got []capability.TaskSubmission
	var mu sync.Mutex
	s.host.SubmitTasksFunc = func(_ context.Context, tasks []capability.TaskSubmission) ([]capability.SubmittedTask, error) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, tasks...)
		return []capability.SubmittedTask{{ID: "77"}}, nil
	}
	// The provider's host services are the ones its Configure got: give
	// it a host that takes submits.
	p := &streamProvider{capacity: 8}
	client := capabilitytest.Start(t, p, nil, s.host)
	s.client = client
	res, err := s.runner.RunTask(context.Background(), "prov", capability.TaskRun{Task: "submit", MessageID: "12"}, nil)
	if err != nil || string(res) != `"77"` {
		t.Fatalf("RunTask = %s, %v", res, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0].Task != "child" || got[0].ParentTaskID != "12" || string(got[0].Payload) != `{"n":1}` {
		t.Fatalf("the host got %+v; want one child of task 12", got)
	}
}

// TestSubmitOutsideATaskSaysSo: Submit needs a task's context.
func TestSubmitOutsideATaskSaysSo(t *testing.T) {
	if _, err := capability.Submit(context.Background(), capability.TaskSubmission{Task: "x"}); !errors.Is(err, capability.ErrNotInTask) {
		t.Fatalf("err = %v, want ErrNotInTask", err)
	}
}

// TestACallerThatGoesAwayCancelsItsAttemptsInTheProvider: when the
// caller's end of the stream goes (tasks_worker stops or dies), the
// provider cancels the handlers of its attempts.
func TestACallerThatGoesAwayCancelsItsAttemptsInTheProvider(t *testing.T) {
	paths(t, func(t *testing.T, relayed bool) {
		p := &streamProvider{capacity: 8, started: make(chan string, 3)}
		s := newStreamSetup(t, p)
		if relayed {
			s.relayOnly()
		}
		done := make(chan error, 3)
		for i := range 3 {
			go func() {
				_, err := s.runner.RunTask(context.Background(), "prov", capability.TaskRun{Task: "wait", MessageID: fmt.Sprint(i)}, nil)
				done <- err
			}()
		}
		for range 3 {
			<-p.started
		}
		s.runner.Close()
		for range 3 {
			if err := <-done; !errors.Is(err, capability.ErrUnavailable) {
				t.Fatalf("an attempt of a closed runner: %v; want ErrUnavailable", err)
			}
		}
		waitFor(t, "the provider's handlers to see their cancel", func() bool { return p.running.Load() == 0 })
	})
}
