package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/taskhost/taskhost/broker"
)

// TaskLookup tells the ticker whether a worker runs task, on topic when
// the schedule names one (this process or another live one), and the
// topic to submit to (the task's default when topic is empty).
type TaskLookup func(task, topic string) (string, bool)

// Ticker fires due schedules. It runs on the beat leader only, and every
// fire is a fenced write: a deposed leader fires nothing.
type Ticker struct {
	Store  broker.ScheduleStore
	Lookup TaskLookup
	Logger hclog.Logger
	// Submitted, when set, is told of every message a fire submitted
	// (the task telemetry counts scheduled submissions too).
	Submitted func(topic string)
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// NextRun is when the beat fires s next: its expected next run once it has
// fired, else its first slot (its first cron time after it was stored, or
// at once for an interval). false for a timing that does not parse.
func NextRun(s broker.Schedule) (time.Time, bool) {
	tm, err := ParseTiming(s.IntervalSeconds, s.Cron)
	if err != nil {
		return time.Time{}, false
	}
	return slotOf(s, tm), true
}

// slotOf returns the schedule's due slot: the stored next run, or for a
// schedule that never fired, a slot derived from its stored update time,
// so that every leader computes the same slot.
func slotOf(s broker.Schedule, tm Timing) time.Time {
	if s.ExpectedNextRun != nil {
		return s.ExpectedNextRun.UTC()
	}
	base := s.UpdatedAt.UTC().Truncate(time.Second)
	if tm.cron != nil {
		return tm.Next(base.Add(-time.Second))
	}
	return base
}

// Tick fires every due, enabled schedule once. It returns ErrNotLeader
// when the lease moved on.
func (t *Ticker) Tick(ctx context.Context, fence broker.Fence) error {
	log := t.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	now := time.Now
	if t.Now != nil {
		now = t.Now
	}
	scheds, err := t.Store.ListSchedules(ctx)
	if err != nil {
		return fmt.Errorf("list schedules: %w", err)
	}
	for _, s := range scheds {
		if !s.Enabled {
			continue
		}
		tm, err := ParseTiming(s.IntervalSeconds, s.Cron)
		if err != nil {
			log.Error("schedule has an invalid timing; it does not fire", "schedule", s.Name, "error", err)
			continue
		}
		at := now().UTC()
		slot := slotOf(s, tm)
		if slot.After(at) {
			continue
		}
		latest, missed := tm.latestDue(slot, at)
		next := tm.Next(latest)
		req := broker.FireRequest{Name: s.Name, Slot: latest, Next: next, Fence: &fence}
		topic, known := t.Lookup(s.Task, s.Topic)
		if s.Topic != "" {
			topic = s.Topic
		}
		known = known && topic != ""
		switch {
		case !known:
			// As the specification's scheduler does, the attempt is
			// stamped before the task is looked up: the beat tried.
			log.Error("no live worker runs the scheduled task; nothing submitted", "schedule", s.Name, "task", s.Task, "topic", s.Topic)
		case missed > 0 && s.MissedPolicy == broker.MissedSkip:
			log.Warn("schedule missed slots while no beat ran; skipping them", "schedule", s.Name, "missed", missed+1, "next", next)
		default:
			if missed > 0 {
				log.Warn("schedule missed slots while no beat ran; firing once late", "schedule", s.Name, "missed", missed)
			}
			payload := s.Payload
			if len(payload) == 0 {
				payload = json.RawMessage("{}")
			}
			req.Submit = &broker.SubmitRequest{Topic: topic, Task: s.Task, Payload: payload}
		}
		res, err := t.Store.FireSchedule(ctx, req)
		switch {
		case errors.Is(err, broker.ErrNotLeader):
			return err
		case errors.Is(err, broker.ErrNotFound):
			continue // deleted meanwhile
		case err != nil:
			log.Error("schedule could not fire", "schedule", s.Name, "error", err)
			continue
		}
		if res.Fired && res.MessageID != 0 {
			log.Debug("schedule fired", "schedule", s.Name, "slot", latest, "message_id", res.MessageID)
			if t.Submitted != nil && req.Submit != nil {
				t.Submitted(req.Submit.Topic)
			}
		}
	}
	return nil
}

// HealthCollector exports the schedule health gauges at scrape time, from
// the stored schedules.
type HealthCollector struct {
	Store  func() broker.ScheduleStore // nil result: nothing to export
	Logger hclog.Logger
	Now    func() time.Time
}

var (
	overdueDesc = prometheus.NewDesc("fastpluggy_schedule_overdue_seconds",
		"Worst lateness across enabled schedules, from expected_next_run, which derives from last_attempt: "+
			"it answers \"is the beat beating?\", not \"is the task running?\".", nil, nil)
	sinceSuccessDesc = prometheus.NewDesc("fastpluggy_scheduled_task_since_success_seconds",
		"Seconds since the schedule of this task last produced a successful report (the report status, not the payload). "+
			"No series until the first success.", []string{"task"}, nil)
	intervalDesc = prometheus.NewDesc("fastpluggy_scheduled_task_interval_seconds",
		"The period the schedule of this task runs at (for cron, the gap between two successive occurrences).", []string{"task"}, nil)
)

// Describe implements prometheus.Collector.
func (c *HealthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- overdueDesc
	ch <- sinceSuccessDesc
	ch <- intervalDesc
}

// Collect implements prometheus.Collector. When several schedules run the
// same task, the task's series is that of the schedule worst off (highest
// since-success to interval ratio), so one label per task stays one series.
func (c *HealthCollector) Collect(ch chan<- prometheus.Metric) {
	store := c.Store()
	if store == nil {
		return
	}
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	scheds, err := store.ListSchedules(ctx)
	if err != nil {
		if c.Logger != nil {
			c.Logger.Warn("schedule gauges skipped: cannot list schedules", "error", err)
		}
		return
	}
	at := now().UTC()
	overdue := 0.0
	type health struct{ since, period float64 }
	worst := map[string]health{}
	for _, s := range scheds {
		if !s.Enabled {
			continue
		}
		tm, err := ParseTiming(s.IntervalSeconds, s.Cron)
		if err != nil {
			continue
		}
		if s.ExpectedNextRun != nil {
			overdue = max(overdue, at.Sub(*s.ExpectedNextRun).Seconds())
		}
		if s.LastSuccess == nil {
			continue // never succeeded: no series, by design
		}
		h := health{since: max(0, at.Sub(*s.LastSuccess).Seconds()), period: tm.Period(at).Seconds()}
		if old, ok := worst[s.Task]; !ok || h.since/h.period > old.since/old.period {
			worst[s.Task] = h
		}
	}
	ch <- prometheus.MustNewConstMetric(overdueDesc, prometheus.GaugeValue, overdue)
	for task, h := range worst {
		ch <- prometheus.MustNewConstMetric(sinceSuccessDesc, prometheus.GaugeValue, h.since, task)
		ch <- prometheus.MustNewConstMetric(intervalDesc, prometheus.GaugeValue, h.period, task)
	}
}
