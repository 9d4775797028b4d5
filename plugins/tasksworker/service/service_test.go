package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/memory"
	"github.com/taskhost/taskhost/worker"
)

// newTestService is a service over a memory broker (or b) whose worker
// serves topic "default" and runs task "t.echo" there.
func newTestService(t *testing.T, b broker.Broker) *Service {
	t.Helper()
	if b == nil {
		b = memory.New()
	}
	t.Cleanup(func() { _ = b.Close() })
	reg := worker.NewRegistry()
	reg.MustRegister(worker.Task{Name: "t.echo", Topic: "default", MaxAttempts: 3,
		Handler: func(_ context.Context, tc *worker.TaskContext) (any, error) { return tc.Payload, nil }})
	pool := worker.NewPool(b, reg, worker.Options{Topics: []string{"default"}})
	if err := pool.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pool.Stop(context.Background()) })
	return New(Deps{Broker: b, Tasks: registry{reg}, Pool: pool, Fleet: pool.Fleet(), Settings: Settings{MaxPayloadBytes: 100}})
}

// registry is a worker registry as the service reads it (Tasks), as the
// plugin hands it over.
type registry struct{ *worker.Registry }

func (r registry) Lookup(name string) (TaskInfo, bool) {
	t, ok := r.Registry.Lookup(name)
	return TaskInfo{Name: t.Name, Description: t.Description, Topic: t.Topic, MaxAttempts: t.MaxAttempts}, ok
}

func TestSubmitChecksAndStores(t *testing.T) {
	ctx := context.Background()
	s := newTestService(t, nil)
	for _, c := range []struct {
		name string
		req  SubmitRequest
		want string
	}{
		{"no task", SubmitRequest{}, "task is required"},
		{"unknown task", SubmitRequest{Task: "nope"}, `unknown task "nope"`},
		{"unknown task elsewhere", SubmitRequest{Task: "nope", Topic: "other"}, "no live worker runs it"},
		{"topic not served", SubmitRequest{Task: "t.echo", Topic: "other"}, `topic "other" is not served`},
		{"bad topic", SubmitRequest{Task: "t.echo", Topic: " x"}, "bad topic"},
		{"payload too big", SubmitRequest{Task: "t.echo", Payload: json.RawMessage(`"` + strings.Repeat("a", 100) + `"`)}, "the limit is 100"},
		{"delay too long", SubmitRequest{Task: "t.echo", DelaySeconds: broker.MaxDelay.Seconds() + 1}, "delay_seconds must be from 0"},
		{"negative delay", SubmitRequest{Task: "t.echo", DelaySeconds: -1}, "delay_seconds must be from 0"},
		{"too many attempts", SubmitRequest{Task: "t.echo", MaxAttempts: broker.MaxAttempts + 1}, "max_attempts must be from 0"},
		{"payload too deep", SubmitRequest{Task: "t.echo", Payload: json.RawMessage(strings.Repeat(`[`, 9999) + strings.Repeat(`]`, 9999))},
			"payload: it nests arrays and objects more than 100 levels deep"},
	} {
		_, _, err := s.Submit(ctx, c.req)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrInvalid saying %q", c.name, err, c.want)
		}
	}
	id, topic, err := s.Submit(ctx, SubmitRequest{Task: "t.echo", Payload: json.RawMessage(` {"a": 1} `)})
	if err != nil || topic != "default" {
		t.Fatalf("Submit = %d, %q, %v", id, topic, err)
	}
	m, err := s.Message(ctx, id)
	if err != nil || string(m.Payload) != `{"a":1}` || m.MaxAttempts != 3 {
		t.Errorf("stored %+v, %v; want the compact payload and the task's 3 attempts", m, err)
	}
}

// workersDown fails the worker list, so whether another worker runs a
// task cannot be told.
type workersDown struct{ broker.Broker }

func (workersDown) Workers(context.Context) ([]broker.WorkerInfo, error) {
	return nil, errors.New("connection refused")
}

func TestPlaceUnavailableWhenWorkersUnreadable(t *testing.T) {
	s := newTestService(t, workersDown{memory.New()})
	_, err := s.Place(context.Background(), "other.task", "elsewhere")
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "retry shortly") {
		t.Errorf("Place = %v, want ErrUnavailable", err)
	}
}

func TestSchedules(t *testing.T) {
	ctx := context.Background()
	s := newTestService(t, nil)
	spec := ScheduleSpec{Name: "every-minute", Task: "t.echo", IntervalSeconds: 60}
	if _, err := s.CreateSchedule(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateSchedule(ctx, spec); !errors.Is(err, ErrConflict) {
		t.Errorf("second create = %v, want ErrConflict", err)
	}
	if _, err := s.UpdateSchedule(ctx, ScheduleSpec{Name: "none", Task: "t.echo", IntervalSeconds: 60}); !errors.Is(err, broker.ErrNotFound) {
		t.Errorf("update of a missing schedule = %v, want broker.ErrNotFound", err)
	}
	if _, err := s.CreateSchedule(ctx, ScheduleSpec{Name: "bad", Task: "t.echo"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("create without timing = %v, want ErrInvalid", err)
	}
	deep := json.RawMessage(strings.Repeat(`{"a":`, broker.MaxJSONDepth+1) + `1` + strings.Repeat(`}`, broker.MaxJSONDepth+1))
	if _, err := s.CreateSchedule(ctx, ScheduleSpec{Name: "deep", Task: "t.echo", IntervalSeconds: 60, Payload: deep}); !errors.Is(err, ErrInvalid) ||
		!strings.Contains(err.Error(), "more than 100 levels deep") {
		t.Errorf("create with a payload over the depth limit = %v, want ErrInvalid naming the limit", err)
	}
	sc, err := s.ToggleSchedule(ctx, "every-minute")
	if err != nil || sc.Enabled {
		t.Fatalf("toggle = %+v, %v; want disabled", sc, err)
	}
	if sc, err = s.ToggleSchedule(ctx, "every-minute"); err != nil || !sc.Enabled {
		t.Fatalf("toggle again = %+v, %v; want enabled", sc, err)
	}
	err = s.ApplySchedules(ctx, []ScheduleSpec{spec, {Name: "x", Task: "no such task", IntervalSeconds: 60}})
	var bad *SpecError
	if !errors.As(err, &bad) || bad.Index != 1 || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "can never run") {
		t.Errorf("ApplySchedules = %v, want a *SpecError for index 1 saying its task can never run", err)
	}
	if topic, ok := s.ScheduleLookup("t.echo", ""); !ok || topic != "default" {
		t.Errorf("ScheduleLookup = %q, %v", topic, ok)
	}
}

func TestTopicControls(t *testing.T) {
	ctx := context.Background()
	s := newTestService(t, nil)
	neg := -1
	if _, err := s.SetTopic(ctx, "default", broker.TopicPatch{ConcurrencyLimit: &neg}); !errors.Is(err, ErrInvalid) {
		t.Errorf("negative limit = %v, want ErrInvalid", err)
	}
	two, paused := 2, true // paused: the message below stays queued
	if cfg, err := s.SetTopic(ctx, "default", broker.TopicPatch{ConcurrencyLimit: &two, Paused: &paused}); err != nil || cfg.ConcurrencyLimit != 2 {
		t.Errorf("SetTopic = %+v, %v", cfg, err)
	}
	if _, _, err := s.Submit(ctx, SubmitRequest{Task: "t.echo"}); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Purge(ctx, "default", false); err != nil || res.Queued != 1 {
		t.Errorf("Purge = %+v, %v", res, err)
	}
	if err := s.Drain(ctx, ""); !errors.Is(err, broker.ErrInvalid) {
		t.Errorf("Drain of no topic = %v, want broker.ErrInvalid", err)
	}
	if released, err := s.ReleaseLock(ctx, "none"); err != nil || released {
		t.Errorf("ReleaseLock = %v, %v", released, err)
	}
}

func TestSubmitManyChecksEachAndStoresAllOrNothing(t *testing.T) {
	ctx := context.Background()
	s := newTestService(t, nil)
	counted := map[string]int{}
	s.submitted = func(topic string) { counted[topic]++ }

	bad := []SubmitRequest{{Task: "t.echo"}, {Task: "t.echo"}, {Task: "t.echo", Topic: "other"}, {Task: "nope"}}
	out, err := s.SubmitMany(ctx, bad)
	var item *ItemError
	if !errors.As(err, &item) || item.Index != 2 || !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), `item 2: topic "other" is not served`) {
		t.Fatalf("SubmitMany with item 2 refused = %v, %v; want an ItemError naming item 2", out, err)
	}
	if msgs, _ := s.Messages(ctx, broker.MessageFilter{}); len(msgs) != 0 || len(counted) != 0 {
		t.Fatalf("a refused batch stored %d messages, counted %v", len(msgs), counted)
	}
	if _, err := s.SubmitMany(ctx, make([]SubmitRequest, broker.MaxSubmitBatch+1)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "the limit is 10000") {
		t.Fatalf("over the limit: %v", err)
	}

	out, err = s.SubmitMany(ctx, []SubmitRequest{
		{Task: "t.echo", Payload: json.RawMessage(` {"n": 1} `)},
		{Task: "t.echo", Topic: "default", MaxAttempts: 5, DelaySeconds: 60},
	})
	ids := broker.IDs(out)
	if err != nil || len(ids) != 2 || ids[0] >= ids[1] {
		t.Fatalf("SubmitMany = %v, %v", ids, err)
	}
	first, _ := s.Message(ctx, ids[0])
	second, _ := s.Message(ctx, ids[1])
	if string(first.Payload) != `{"n":1}` || first.MaxAttempts != 3 || first.Topic != "default" {
		t.Errorf("first = %+v, want the compact payload, the task's 3 attempts, its topic", first)
	}
	if string(second.Payload) != `{}` || second.MaxAttempts != 5 || !second.AvailableAt.After(second.CreatedAt.Add(59*time.Second)) {
		t.Errorf("second = %+v, want {}, 5 attempts, a minute's delay", second)
	}
	if counted["default"] != 2 {
		t.Errorf("counted %v, want 2 on default", counted)
	}

	// Check keeps what came before a refused request.
	b, err := s.Check(ctx, []SubmitRequest{{Task: "t.echo"}, {Task: "t.echo", DelaySeconds: -1}, {Task: "t.echo"}})
	if !errors.As(err, &item) || item.Index != 1 || b.Len() != 1 {
		t.Fatalf("Check = %d checked, %v; want 1 and item 1 refused", b.Len(), err)
	}
}

// A schedule's payload is bounded by max_payload_bytes as a submit's is:
// every task it fires must be one a client could submit.
func TestSchedulePayloadWithinTheSubmitLimit(t *testing.T) {
	ctx := context.Background()
	s := newTestService(t, nil)
	big := json.RawMessage(`"` + strings.Repeat("a", 100) + `"`)
	want := "payload is 102 bytes, the limit is 100 (max_payload_bytes)"
	if _, err := s.CreateSchedule(ctx, ScheduleSpec{Name: "big", Task: "t.echo", IntervalSeconds: 60, Payload: big}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
		t.Errorf("CreateSchedule: %v, want ErrInvalid saying %q", err, want)
	}
	if err := s.ApplySchedules(ctx, []ScheduleSpec{{Name: "big", Task: "t.echo", IntervalSeconds: 60, Payload: big}}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
		t.Errorf("ApplySchedules: %v, want ErrInvalid saying %q", err, want)
	}
	if _, err := (ScheduleSpec{Name: "big", Task: "t.echo", IntervalSeconds: 60, Payload: big}).Check(100); !strings.Contains(fmt.Sprint(err), want) {
		t.Errorf("Check: %v, want %q", err, want)
	}
	if list, _ := s.Schedules(ctx); len(list) != 0 {
		t.Errorf("stored %+v", list)
	}
	// Measured compacted, as a submit's.
	if _, err := s.CreateSchedule(ctx, ScheduleSpec{Name: "fits", Task: "t.echo", IntervalSeconds: 60,
		Payload: json.RawMessage(`{"a":   ` + `"` + strings.Repeat("a", 80) + `"   }`)}); err != nil {
		t.Errorf("a payload within the limit once compacted: %v", err)
	}
}
