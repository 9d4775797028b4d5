package service

// Tasks no live worker runs yet: where a schedule of one goes, whether a
// schedule waits for a worker and why, and the task providers that may
// still register a task (the start-up grace of a submit).
//
// A schedule is accepted whenever its names are well formed: whether a
// worker runs its task is its status, not a validation, since the plugin
// that provides the task may register it after the config's schedules are
// applied, or the host that runs it may be down for a while. Until a live
// worker runs the task on the schedule's topic, the beat holds the
// schedule's due slot (it submits nothing and stamps nothing) and the API
// and UI show it waiting, saying why; the slot fires once a worker is
// live.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/scheduler/timing"
)

// Waiting says that an enabled schedule waits for a live worker that runs
// its task on its topic, and why.
type Waiting struct {
	// Since is the due slot the beat holds for a worker; nil while the
	// schedule's next slot is still ahead.
	Since *time.Time `json:"since,omitempty"`
	// Why is for people: what is missing and what to do.
	Why string `json:"why"`
}

// ScheduleStatus is a stored schedule with its waiting status, as the API
// shows it: the schedule's fields, and "waiting" while it waits.
type ScheduleStatus struct {
	broker.Schedule
	Waiting *Waiting `json:"waiting,omitempty"`
}

// PendingProviders, when set, names the task providers whose tasks are
// not registered yet while they may still be (tasks_worker's start-up
// grace): a submit of a task none of the registered ones has is then
// accepted and waits, as its message would. It may refresh the registry
// first, and must return soon.
type PendingProviders func(ctx context.Context) []string

// SetPendingProviders names how the service learns of task providers that
// may still register tasks (none by default). Call it before the service
// is used.
func (s *Service) SetPendingProviders(f PendingProviders) { s.pending = f }

// ScheduleWaiting is the waiting status of sc: nil when it is disabled or
// a live worker runs its task on its topic (or when that cannot be told:
// the beat then fires it all the same).
func (s *Service) ScheduleWaiting(sc broker.Schedule) *Waiting {
	if !sc.Enabled {
		return nil
	}
	why, waiting := s.waitingFor(sc.Task, sc.Topic)
	if !waiting {
		return nil
	}
	w := &Waiting{Why: why}
	if next, ok := timing.NextRun(sc); ok && !next.After(time.Now()) {
		w.Since = &next
	}
	return w
}

// StatusOf is sc with its waiting status.
func (s *Service) StatusOf(sc broker.Schedule) ScheduleStatus {
	return ScheduleStatus{Schedule: sc, Waiting: s.ScheduleWaiting(sc)}
}

// waitingFor says whether no live worker runs task on topic, and why: not
// this one (the task is not registered here, or this worker does not
// claim the topic), nor another live one. When the broker's worker list
// cannot be read it says no: a slot fired without a worker ends as a
// message that waits and then fails as unknown, where a held one would
// be lost unseen.
func (s *Service) waitingFor(task, topic string) (string, bool) {
	_, local := s.reg.Lookup(task)
	served := s.pool.Topics()
	if local && slices.Contains(served, topic) {
		return "", false
	}
	if runs, err := s.fleet.RunsElsewhere(task, topic); err != nil || runs {
		return "", false
	}
	if local {
		return fmt.Sprintf("task %q is registered here, but this worker does not claim from topic %q (it claims from %s) and no other live worker runs the task there: "+
			"add the topic under topics in the plugin config, or give the schedule the task's own topic; it fires once a worker runs the task on that topic",
			task, topic, strings.Join(served, ", ")), true
	}
	return fmt.Sprintf("no live worker runs task %q on topic %q: the plugin or host that provides it is not up yet, or it is not registered anywhere (the tasks here are %s); "+
		"the schedule fires once a worker that runs the task on that topic is live",
		task, topic, strings.Join(s.reg.Names(), ", ")), true
}

// scheduleTopic is the topic a schedule of b goes to: the one it names;
// else the task's own when it is registered here; else the topic a
// stored schedule of the same name and task has (placed when its task was
// known); else broker.DefaultTopic, the topic of every task that names
// none. A topic a client names is checked as CheckTopic does.
func (s *Service) scheduleTopic(ctx context.Context, b ScheduleSpec, client bool) (string, error) {
	topic := b.Topic
	if topic == "" {
		if t, ok := s.reg.Lookup(b.Task); ok {
			return t.Topic, nil
		}
		if stored, err := s.b.GetSchedule(ctx, b.Name); err == nil && stored.Task == b.Task && stored.Topic != "" {
			return stored.Topic, nil
		}
		return broker.DefaultTopic, nil
	}
	check := broker.ValidateTopicName
	if client {
		check = func(topic string) error { return s.CheckTopic(ctx, topic) }
	}
	if err := check(topic); err != nil {
		return "", invalid("bad topic: %v", err)
	}
	return topic, nil
}

// checkTaskName refuses a task name no task can ever have.
func checkTaskName(task string) error {
	if err := broker.CheckTaskName(task); err != nil {
		return invalid("task %.200q can never run: %v", task, err)
	}
	return nil
}

// placePending places a submit of task, which no live worker runs, while
// task providers may still register it (PendingProviders): on topic, or
// on broker.DefaultTopic when it names none and this worker claims from
// it. The message then waits as messages of a task not registered yet do
// (package worker). false when no provider is pending.
func (s *Service) placePending(ctx context.Context, task, topic string, pending []string) (string, bool, error) {
	if len(pending) == 0 {
		return "", false, nil
	}
	if err := checkTaskName(task); err != nil {
		return "", true, err
	}
	if topic != "" {
		return topic, true, nil // checked by Place
	}
	if !slices.Contains(s.pool.Topics(), broker.DefaultTopic) {
		return "", true, invalid("task %q is not registered yet (plugins %s are still starting) and this worker does not claim from topic %q: name the task's topic in the request",
			task, strings.Join(pending, ", "), broker.DefaultTopic)
	}
	return broker.DefaultTopic, true, nil
}

// lookupSoon looks task up; when it is not registered and task providers
// are pending, it asks them first (which may register it) and returns
// them.
func (s *Service) lookupSoon(ctx context.Context, task string) (TaskInfo, bool, []string) {
	if t, ok := s.reg.Lookup(task); ok || s.pending == nil {
		return t, ok, nil
	}
	pending := s.pending(ctx)
	t, ok := s.reg.Lookup(task)
	if ok {
		return t, true, nil
	}
	return t, false, pending
}
