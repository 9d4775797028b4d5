package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Schedule is a stored schedule: the beat submits Task every
// IntervalSeconds, or at each slot of Cron (5 fields, UTC).
type Schedule struct {
	Name            string          `json:"name"`
	Task            string          `json:"task"`
	Topic           string          `json:"topic"`
	Payload         json.RawMessage `json:"payload"`
	IntervalSeconds int             `json:"interval_seconds,omitempty"`
	Cron            string          `json:"cron,omitempty"`
	Enabled         bool            `json:"enabled"`
	// MissedPolicy is "skip" or "fire_once".
	MissedPolicy string `json:"missed_policy"`
	// Source is "api" or "config" (declared in the host's config).
	Source string `json:"source"`
	// UniqueKey is the unique key of the tasks it submits.
	UniqueKey string `json:"unique_key,omitempty"`
	// LastAttempt is when the beat last fired it, LastSuccess the end of
	// the last run that succeeded.
	LastAttempt     *time.Time `json:"last_attempt,omitempty"`
	LastSuccess     *time.Time `json:"last_success,omitempty"`
	ExpectedNextRun *time.Time `json:"expected_next_run,omitempty"`
	CreatedAt       time.Time  `json:"created_at"`
	UpdatedAt       time.Time  `json:"updated_at"`
	// Waiting is set while the schedule is enabled and no live worker
	// runs its task on its topic: the beat holds its due slot until one
	// does.
	Waiting *ScheduleWaiting `json:"waiting,omitempty"`

	// NextRun (the next slot the beat fires, also before the first; nil
	// when disabled) is filled by Schedules, GetSchedule, CreateSchedule
	// and UpdateSchedule; Timing ("every 30s", "cron 0 3 * * *") by all
	// but Schedules.
	Timing  string     `json:"-"`
	NextRun *time.Time `json:"-"`
}

// ScheduleWaiting says why a schedule waits for a worker.
type ScheduleWaiting struct {
	// Since is the due slot the beat holds; nil while the next slot is
	// still ahead.
	Since *time.Time `json:"since,omitempty"`
	Why   string     `json:"why"`
}

// ScheduleSpec is a schedule to create or replace. Name and Task are
// required, and one of IntervalSeconds and Cron.
type ScheduleSpec struct {
	Name            string          `json:"name"`
	Task            string          `json:"task"`
	Topic           string          `json:"topic,omitempty"`
	Payload         json.RawMessage `json:"payload,omitempty"`
	IntervalSeconds int             `json:"interval_seconds,omitempty"`
	Cron            string          `json:"cron,omitempty"`
	// Enabled: nil is true.
	Enabled *bool `json:"enabled,omitempty"`
	// MissedPolicy is "skip" (the default) or "fire_once".
	MissedPolicy string `json:"missed_policy,omitempty"`
	// UniqueKey, when set, is the unique key of the tasks it submits
	// (see Task.UniqueKey): a fire while the task of an earlier fire is
	// queued or running submits nothing.
	UniqueKey string `json:"unique_key,omitempty"`
}

// scheduleView is the answer of GET, POST and PUT of one schedule.
type scheduleView struct {
	Schedule Schedule   `json:"schedule"`
	Timing   string     `json:"timing"`
	NextRun  *time.Time `json:"next_run"`
}

func (v scheduleView) value() Schedule {
	s := v.Schedule
	s.Timing, s.NextRun = v.Timing, v.NextRun
	return s
}

func schedulePath(name string) string { return apiPrefix + "/schedules/" + url.PathEscape(name) }

// Schedules lists every schedule.
func (c *Client) Schedules(ctx context.Context) ([]Schedule, error) {
	var out struct {
		Schedules []struct {
			Schedule
			NextRun *time.Time `json:"next_run"`
		} `json:"schedules"`
	}
	err := c.call(ctx, request{method: http.MethodGet, path: apiPrefix + "/schedules"}, &out)
	if out.Schedules == nil {
		return nil, err
	}
	list := make([]Schedule, len(out.Schedules))
	for i, item := range out.Schedules {
		list[i] = item.Schedule
		list[i].NextRun = item.NextRun
	}
	return list, err
}

// GetSchedule reads one schedule; IsNotFound(err) when there is none.
func (c *Client) GetSchedule(ctx context.Context, name string) (Schedule, error) {
	var v scheduleView
	err := c.call(ctx, request{method: http.MethodGet, path: schedulePath(name)}, &v)
	return v.value(), err
}

// CreateSchedule creates a schedule; IsConflict(err) when one of that
// name exists (replace it with UpdateSchedule). Retried on a 503 (a
// second try of a create that was done answers a conflict).
func (c *Client) CreateSchedule(ctx context.Context, s ScheduleSpec) (Schedule, error) {
	var v scheduleView
	err := c.call(ctx, request{method: http.MethodPost, path: apiPrefix + "/schedules", body: s, retry: true}, &v)
	return v.value(), err
}

// UpdateSchedule replaces the schedule named s.Name (enable or disable
// one with Enabled); IsNotFound(err) when there is none. Retried on a
// 503: replacing twice is replacing once.
func (c *Client) UpdateSchedule(ctx context.Context, s ScheduleSpec) (Schedule, error) {
	var v scheduleView
	err := c.call(ctx, request{method: http.MethodPut, path: schedulePath(s.Name), body: s, retry: true}, &v)
	return v.value(), err
}

// DeleteSchedule deletes a schedule; IsNotFound(err) when there is none.
// Retried on a 503.
func (c *Client) DeleteSchedule(ctx context.Context, name string) error {
	return c.call(ctx, request{method: http.MethodDelete, path: schedulePath(name), retry: true}, nil)
}

// Report is one attempt of a task, as the worker that ran it reported it.
type Report struct {
	ID        int64  `json:"id"`
	MessageID int64  `json:"message_id"`
	Task      string `json:"task"`
	Topic     string `json:"topic"`
	// Schedule is the schedule that submitted the task, if one did.
	Schedule string `json:"schedule,omitempty"`
	Attempt  int    `json:"attempt"`
	Worker   string `json:"worker"`
	// Status is success, failed, error, timeout, cancelled, skipped or
	// lost.
	Status    string          `json:"status"`
	StartedAt time.Time       `json:"started_at"`
	EndedAt   time.Time       `json:"ended_at"`
	Duration  float64         `json:"duration_seconds"`
	Error     string          `json:"error,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Progress  float64         `json:"progress"`
	Logs      []string        `json:"logs,omitempty"`
}

// ReportFilter selects the reports Reports returns; zero fields match
// everything.
type ReportFilter struct {
	Task, Status, Schedule string
	// TaskID: the reports of one task (its attempts).
	TaskID string
	// Limit is 1 to 1000; 0: the host's default (50).
	Limit int
	// Before: reports older than this report id.
	Before int64
}

// Reports lists reports, newest first.
func (c *Client) Reports(ctx context.Context, f ReportFilter) ([]Report, error) {
	q := url.Values{}
	for k, v := range map[string]string{"task": f.Task, "status": f.Status, "schedule": f.Schedule, "message_id": f.TaskID} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if f.Limit != 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	if f.Before != 0 {
		q.Set("before", strconv.FormatInt(f.Before, 10))
	}
	var out struct {
		Reports []Report `json:"reports"`
	}
	err := c.call(ctx, request{method: http.MethodGet, path: apiPrefix + "/reports", query: q}, &out)
	return out.Reports, err
}

// GetReport reads one report; IsNotFound(err) when there is none.
func (c *Client) GetReport(ctx context.Context, id int64) (Report, error) {
	var r Report
	err := c.call(ctx, request{method: http.MethodGet, path: apiPrefix + "/reports/" + strconv.FormatInt(id, 10)}, &r)
	return r, err
}
