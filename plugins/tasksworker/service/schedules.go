package service

// Schedules: checking a declared one, creating, changing, enabling,
// disabling and deleting them, applying the config's, and the beat's
// lookup of where a schedule fires.

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/scheduler/timing"
)

// ScheduleSpec is a schedule as the API and the config declare it.
type ScheduleSpec struct {
	Name            string          `json:"name"`
	Task            string          `json:"task"`
	Topic           string          `json:"topic"`
	Payload         json.RawMessage `json:"payload"`
	IntervalSeconds int             `json:"interval_seconds"`
	Cron            string          `json:"cron"`
	Enabled         *bool           `json:"enabled"`
	MissedPolicy    string          `json:"missed_policy"`
	// UniqueKey: the unique key of the tasks it submits (a fire while an
	// earlier fire's task still holds it submits nothing); nil for none.
	// A key given empty is refused, as a submit's.
	UniqueKey *string `json:"unique_key,omitempty"`
}

// ScheduleExample is a good schedule, for messages.
const ScheduleExample = `{"name": "nightly-report", "task": "demo.echo", "payload": {}, "cron": "0 3 * * *", "enabled": true}`

// Schedule sources: who declared a schedule.
const (
	SourceAPI    = broker.SourceAPI
	SourceConfig = "config"
)

var scheduleName = regexp.MustCompile(fmt.Sprintf(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,%d}$`, broker.MaxScheduleNameLen-1))

// Check makes the checks that need no running worker: name, a task name
// that a task can have, timing, missed policy and payload (as the store
// checks it, and at most maxPayload bytes, max_payload_bytes, as a
// submit's; 0 means broker.MaxPayloadSize); it returns the payload to
// store, compacted. Its error says which field is wrong and why.
func (b ScheduleSpec) Check(maxPayload int) (json.RawMessage, error) {
	if !scheduleName.MatchString(b.Name) {
		return nil, invalid("name %q: use letters, digits and . _ : -, starting with a letter or digit, at most %d characters", b.Name, broker.MaxScheduleNameLen)
	}
	if b.Task == "" {
		return nil, invalid("task is required")
	}
	if err := checkTaskName(b.Task); err != nil {
		return nil, err
	}
	if _, err := timing.Parse(b.IntervalSeconds, b.Cron); err != nil {
		return nil, invalid("%v", err)
	}
	switch b.MissedPolicy {
	case "", broker.MissedSkip, broker.MissedFireOnce:
	default:
		return nil, invalid("missed_policy %q: use %q or %q", b.MissedPolicy, broker.MissedSkip, broker.MissedFireOnce)
	}
	if err := checkUniqueKey(b.uniqueKey(), b.UniqueKey != nil); err != nil {
		return nil, err
	}
	// The payload of the tasks it submits, checked as a submit's: as
	// every store checks it (broker.CheckJSON, as
	// broker.NormalizeSchedule does), so that a config check passes only
	// what the store takes at start, and within maxPayload.
	return checkPayload(b.Payload, maxPayload)
}

// Timing is when a schedule of intervalSeconds or cron fires, in words
// ("every 1m0s", "cron 0 3 * * *"); the error says why the two make no
// timing, as Check refuses them.
func Timing(intervalSeconds int, cron string) (string, error) {
	tm, err := timing.Parse(intervalSeconds, cron)
	if err != nil {
		return "", err
	}
	return tm.String(), nil
}

// ScheduleOf checks a declared schedule and returns it as it is stored,
// or a *Problem that says which field is wrong and why. Its task need not
// be run by a live worker yet: the schedule then waits for one
// (ScheduleWaiting). Without a topic it goes to the task's own, or while
// the task is not registered here to scheduleTopic's choice. A topic from
// source SourceAPI is checked as CheckTopic does.
func (s *Service) ScheduleOf(b ScheduleSpec, source string) (broker.Schedule, error) {
	if b.Task == "" {
		return broker.Schedule{}, invalid("task is required; the tasks are %s", strings.Join(s.reg.Names(), ", "))
	}
	payload, err := b.Check(s.settings.MaxPayloadBytes)
	if err != nil {
		return broker.Schedule{}, err
	}
	topic, err := s.scheduleTopic(context.Background(), b, source == SourceAPI)
	if err != nil {
		return broker.Schedule{}, err
	}
	enabled := true
	if b.Enabled != nil {
		enabled = *b.Enabled
	}
	return broker.Schedule{
		Name: b.Name, Task: b.Task, Topic: topic, Payload: payload,
		IntervalSeconds: b.IntervalSeconds, Cron: strings.TrimSpace(b.Cron),
		Enabled: enabled, MissedPolicy: b.MissedPolicy, Source: source, UniqueKey: b.uniqueKey(),
	}, nil
}

// uniqueKey is the unique key of b's tasks, "" for none.
func (b ScheduleSpec) uniqueKey() string {
	if b.UniqueKey == nil {
		return ""
	}
	return *b.UniqueKey
}

// SpecOf is the declaration of a stored schedule.
func SpecOf(s broker.Schedule) ScheduleSpec {
	enabled := s.Enabled
	spec := ScheduleSpec{Name: s.Name, Task: s.Task, Topic: s.Topic, Payload: s.Payload, IntervalSeconds: s.IntervalSeconds,
		Cron: s.Cron, Enabled: &enabled, MissedPolicy: s.MissedPolicy}
	if s.UniqueKey != "" {
		key := s.UniqueKey
		spec.UniqueKey = &key
	}
	return spec
}

// Schedules lists the stored schedules.
func (s *Service) Schedules(ctx context.Context) ([]broker.Schedule, error) {
	return s.b.ListSchedules(ctx)
}

// Schedule is the schedule named name.
func (s *Service) Schedule(ctx context.Context, name string) (broker.Schedule, error) {
	return s.b.GetSchedule(ctx, name)
}

// CreateSchedule stores a new schedule; a *Problem of kind ErrConflict
// when one of that name exists.
func (s *Service) CreateSchedule(ctx context.Context, b ScheduleSpec) (broker.Schedule, error) {
	if _, err := s.b.GetSchedule(ctx, b.Name); err == nil {
		return broker.Schedule{}, &Problem{Kind: ErrConflict, Msg: fmt.Sprintf("schedule %q exists", b.Name)}
	}
	sc, err := s.ScheduleOf(b, SourceAPI)
	if err != nil {
		return broker.Schedule{}, err
	}
	return s.b.PutSchedule(ctx, sc)
}

// UpdateSchedule replaces the schedule named b.Name, which must exist
// (the broker's ErrNotFound otherwise).
func (s *Service) UpdateSchedule(ctx context.Context, b ScheduleSpec) (broker.Schedule, error) {
	if _, err := s.b.GetSchedule(ctx, b.Name); err != nil {
		return broker.Schedule{}, err
	}
	sc, err := s.ScheduleOf(b, SourceAPI)
	if err != nil {
		return broker.Schedule{}, err
	}
	return s.b.PutSchedule(ctx, sc)
}

// ToggleSchedule disables the schedule named name if it is enabled, and
// enables it otherwise. Disabling always works, even for a task that is
// gone; enabling checks the schedule as ScheduleOf does (a *Problem when
// it fails, and the schedule stays disabled). It returns the schedule as
// stored.
func (s *Service) ToggleSchedule(ctx context.Context, name string) (broker.Schedule, error) {
	sc, err := s.b.GetSchedule(ctx, name)
	if err != nil {
		return broker.Schedule{}, err
	}
	if sc.Enabled {
		sc.Enabled = false
	} else {
		b := SpecOf(sc)
		enabled := true
		b.Enabled = &enabled
		if sc, err = s.ScheduleOf(b, sc.Source); err != nil {
			return broker.Schedule{}, err
		}
	}
	return s.b.PutSchedule(ctx, sc)
}

// DeleteSchedule deletes the schedule named name.
func (s *Service) DeleteSchedule(ctx context.Context, name string) error {
	return s.b.DeleteSchedule(ctx, name)
}

// SpecError is a declared schedule that ApplySchedules refused.
type SpecError struct {
	Index int // in the list given
	Err   error
}

func (e *SpecError) Error() string { return fmt.Sprintf("schedules[%d]: %v", e.Index, e.Err) }
func (e *SpecError) Unwrap() error { return e.Err }

// ApplySchedules upserts the schedules the config declares: a *SpecError
// names one that is wrong. A schedule of a task no live worker runs yet
// (a provider plugin registers its tasks after this) is stored and waits
// for one.
func (s *Service) ApplySchedules(ctx context.Context, specs []ScheduleSpec) error {
	for i, b := range specs {
		sc, err := s.ScheduleOf(b, SourceConfig)
		if err != nil {
			return &SpecError{Index: i, Err: err}
		}
		if _, err := s.b.PutSchedule(ctx, sc); err != nil {
			return fmt.Errorf("store schedule %q: %w", sc.Name, err)
		}
	}
	return nil
}

// ScheduleLookup says where the beat fires a schedule of task (topic
// when set, else the task's own) and whether it fires now: the beat
// leader need not run every scheduled task; a schedule fires when some
// live worker runs its task on its topic, and waits for one otherwise
// (ScheduleWaiting says why).
func (s *Service) ScheduleLookup(task, topic string) (string, bool) {
	if topic == "" {
		t, ok := s.reg.Lookup(task)
		if !ok {
			return "", false
		}
		topic = t.Topic
	}
	_, waiting := s.waitingFor(task, topic)
	return topic, !waiting
}
