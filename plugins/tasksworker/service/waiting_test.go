package service

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/worker"
)

func registerTask(t *testing.T, s *Service, name, topic string) {
	t.Helper()
	if err := s.reg.(registry).Register(worker.Task{Name: name, Topic: topic,
		Handler: func(_ context.Context, tc *worker.TaskContext) (any, error) { return tc.Payload, nil }}); err != nil {
		t.Fatal(err)
	}
}

// TestScheduleOfATaskNotRegisteredYetWaits: a config or API schedule of a
// task no live worker runs is stored and waits for one, saying why; once
// the task is registered here it no longer waits and the beat fires it.
func TestScheduleOfATaskNotRegisteredYetWaits(t *testing.T) {
	ctx := context.Background()
	s := newTestService(t, nil)
	err := s.ApplySchedules(ctx, []ScheduleSpec{
		{Name: "resize", Task: "images.resize", IntervalSeconds: 60},
		{Name: "report", Task: "reports.build", Topic: "reports", Cron: "0 3 * * *"},
	})
	if err != nil {
		t.Fatalf("ApplySchedules of tasks not registered yet = %v, want them stored", err)
	}
	api, err := s.CreateSchedule(ctx, ScheduleSpec{Name: "api", Task: "images.resize", IntervalSeconds: 60})
	if err != nil {
		t.Fatalf("CreateSchedule of a task not registered yet = %v", err)
	}
	resize, err := s.Schedule(ctx, "resize")
	if err != nil || resize.Topic != broker.DefaultTopic || api.Topic != broker.DefaultTopic || resize.Source != SourceConfig {
		t.Fatalf("stored %+v, %v and %+v; want the default topic without one named", resize, err, api)
	}
	w := s.ScheduleWaiting(resize)
	if w == nil || !strings.Contains(w.Why, `no live worker runs task "images.resize" on topic "default"`) || !strings.Contains(w.Why, "fires once") {
		t.Fatalf("waiting = %+v, want it waiting and saying why", w)
	}
	if w.Since == nil {
		t.Errorf("an interval schedule due at once waits with no since: %+v", w)
	}
	report, _ := s.Schedule(ctx, "report")
	if w := s.ScheduleWaiting(report); w == nil || w.Since != nil || !strings.Contains(w.Why, `on topic "reports"`) {
		t.Errorf("a cron schedule not due yet: waiting %+v, want waiting without since", w)
	}
	if _, ok := s.ScheduleLookup("images.resize", broker.DefaultTopic); ok {
		t.Error("ScheduleLookup says a worker runs a task none runs")
	}
	if st := s.StatusOf(resize); st.Waiting == nil || st.Name != "resize" {
		t.Errorf("StatusOf = %+v", st)
	}

	// The provider comes: the schedule no longer waits.
	registerTask(t, s, "images.resize", "")
	if w := s.ScheduleWaiting(resize); w != nil {
		t.Errorf("still waiting after the task was registered: %+v", w)
	}
	if topic, ok := s.ScheduleLookup("images.resize", broker.DefaultTopic); !ok || topic != broker.DefaultTopic {
		t.Errorf("ScheduleLookup = %q, %v; want default, true", topic, ok)
	}

	// A disabled schedule does not wait.
	off, err := s.ToggleSchedule(ctx, "report")
	if err != nil || off.Enabled || s.ScheduleWaiting(off) != nil {
		t.Errorf("disabled: %+v, %v, waiting %+v", off, err, s.ScheduleWaiting(off))
	}
	// Enabling one whose task is not registered works too.
	if on, err := s.ToggleSchedule(ctx, "report"); err != nil || !on.Enabled {
		t.Errorf("enable: %+v, %v", on, err)
	}
}

// TestScheduleTopicWhileTheTaskIsUnknown: a stored schedule keeps the
// topic it was placed on when its task was known; a task registered here
// with a topic this worker does not claim from waits, saying so; a name
// no task can have is refused.
func TestScheduleTopicWhileTheTaskIsUnknown(t *testing.T) {
	ctx := context.Background()
	s := newTestService(t, nil)
	if _, err := s.CreateSchedule(ctx, ScheduleSpec{Name: "thumbs", Task: "images.thumb", Topic: "images", IntervalSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	// At the next start the config names no topic and the task is not
	// registered yet: the stored topic stays.
	if err := s.ApplySchedules(ctx, []ScheduleSpec{{Name: "thumbs", Task: "images.thumb", IntervalSeconds: 60}}); err != nil {
		t.Fatal(err)
	}
	if sc, _ := s.Schedule(ctx, "thumbs"); sc.Topic != "images" {
		t.Errorf("topic = %q, want the stored images", sc.Topic)
	}

	sc, err := s.CreateSchedule(ctx, ScheduleSpec{Name: "elsewhere", Task: "t.echo", Topic: "other", IntervalSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	if w := s.ScheduleWaiting(sc); w == nil || !strings.Contains(w.Why, `does not claim from topic "other"`) {
		t.Errorf("a schedule on a topic this worker does not claim: waiting %+v", w)
	}

	for _, task := range []string{"no such task", "-dash", strings.Repeat("x", 300)} {
		if _, err := s.CreateSchedule(ctx, ScheduleSpec{Name: "bad", Task: task, IntervalSeconds: 60}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "can never run") {
			t.Errorf("task %.20q: %v, want ErrInvalid saying it can never run", task, err)
		}
	}
	if _, err := s.CreateSchedule(ctx, ScheduleSpec{Name: "badtopic", Task: "images.thumb", Topic: " x", IntervalSeconds: 60}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "bad topic") {
		t.Errorf("a bad topic: %v", err)
	}
}

// TestSubmitWhileProvidersArePending: during the start-up grace a submit
// of a task not registered yet is accepted while a task provider may
// still register it; a provider that registers it when asked places it
// on its own topic; without pending providers it is refused at once.
func TestSubmitWhileProvidersArePending(t *testing.T) {
	ctx := context.Background()
	s := newTestService(t, nil)
	if _, _, err := s.Submit(ctx, SubmitRequest{Task: "images.resize"}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `unknown task "images.resize"`) {
		t.Fatalf("no provider pending: %v, want unknown task", err)
	}

	asked := 0
	s.SetPendingProviders(func(context.Context) []string { asked++; return []string{"images"} })
	id, topic, err := s.Submit(ctx, SubmitRequest{Task: "images.resize"})
	if err != nil || topic != broker.DefaultTopic {
		t.Fatalf("Submit while a provider is pending = %d, %q, %v; want accepted on the default topic", id, topic, err)
	}
	if m, err := s.Message(ctx, id); err != nil || m.Task != "images.resize" || m.State != "queued" {
		t.Errorf("stored %+v, %v", m, err)
	}
	if _, topic, err := s.Submit(ctx, SubmitRequest{Task: "images.resize", Topic: "images"}); err != nil || topic != "images" {
		t.Errorf("with its topic: %q, %v", topic, err)
	}
	if _, _, err := s.Submit(ctx, SubmitRequest{Task: "bad name"}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "can never run") {
		t.Errorf("a name no task can have: %v", err)
	}
	if _, _, err := s.Submit(ctx, SubmitRequest{Task: "images.resize", Topic: " x"}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "bad topic") {
		t.Errorf("a bad topic: %v", err)
	}
	if _, _, err := s.Submit(ctx, SubmitRequest{Task: "t.echo"}); err != nil || asked != 4 {
		t.Errorf("a registered task: %v; providers asked %d times, want 4 (not for a registered task)", err, asked)
	}

	// A provider that is up registers its task when asked: the submit
	// goes to the task's own topic.
	s.SetPendingProviders(func(context.Context) []string {
		if _, ok := s.reg.Lookup("images.crop"); !ok {
			registerTask(t, s, "images.crop", "default")
		}
		return nil
	})
	if _, topic, err := s.Submit(ctx, SubmitRequest{Task: "images.crop"}); err != nil || topic != "default" {
		t.Errorf("a task registered when asked: %q, %v", topic, err)
	}
	// After the grace (no pending provider), an unknown task is refused.
	if _, _, err := s.Submit(ctx, SubmitRequest{Task: "images.resize"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("after the grace: %v, want ErrInvalid", err)
	}
}
