package broker

import (
	"context"
	"encoding/json"
	"strconv"
	"time"
)

// Missed-slot policies of a schedule: after downtime, skip the slots that
// passed, or fire once late and go on from now.
const (
	MissedSkip     = "skip"
	MissedFireOnce = "fire_once"
)

// Schedule is a recurring submission: every IntervalSeconds, or on a
// 5-field Cron expression (UTC); exactly one of the two is set.
type Schedule struct {
	Name            string          `json:"name"`
	Task            string          `json:"task"`
	Topic           string          `json:"topic"`
	Payload         json.RawMessage `json:"payload"`
	IntervalSeconds int             `json:"interval_seconds,omitempty"`
	Cron            string          `json:"cron,omitempty"`
	Enabled         bool            `json:"enabled"`
	MissedPolicy    string          `json:"missed_policy"`
	// Source is "api" or "config" (config ones are upserted at start).
	Source string `json:"source"`
	// UniqueKey, when set, is the unique key of the tasks the schedule
	// submits: a fire while the task of an earlier one still holds it
	// submits nothing (see SubmitRequest.UniqueKey).
	UniqueKey string `json:"unique_key,omitempty"`
	// LastAttempt is stamped when the beat fires the schedule, before the
	// message is submitted (so it says "the beat tried"); a schedule whose
	// task no live worker runs is not fired (it waits for one).
	LastAttempt *time.Time `json:"last_attempt,omitempty"`
	// LastSuccess is the end of the last attempt whose report said success.
	LastSuccess *time.Time `json:"last_success,omitempty"`
	// ExpectedNextRun is the next slot, derived when the schedule fires.
	ExpectedNextRun *time.Time `json:"expected_next_run,omitempty"`
	// NextFireAt is the store's index of due schedules (DueSchedules):
	// never after the schedule's due slot. It is ExpectedNextRun once the
	// schedule has fired; before, the start of the second of UpdatedAt,
	// which is the first slot of an interval schedule and at most that of
	// a cron one (the store does not parse cron: the scheduler moves it
	// to the first slot with DeferSchedule). Maintained by the store;
	// ignored by PutSchedule; nil when the schedule is never due again.
	NextFireAt *time.Time `json:"-"`
	CreatedAt  time.Time  `json:"created_at"`
	UpdatedAt  time.Time  `json:"updated_at"`
}

// FireRequest fires one slot of a schedule.
type FireRequest struct {
	Name string
	// Slot is the slot time being fired; (Name, Slot) fires at most once,
	// across every process and leader change.
	Slot time.Time
	// Next is the slot after this one: the new ExpectedNextRun.
	Next time.Time
	// Submit is the message to submit; nil stamps the attempt and
	// advances the schedule without submitting (a skipped slot).
	Submit *SubmitRequest
	// Fence makes the fire a leader-only write.
	Fence *Fence
}

// FireResult says what FireSchedule did.
type FireResult struct {
	// Fired is false when this slot had already fired (nothing changed).
	Fired bool
	// MessageID is the submitted message (0 when none was submitted).
	MessageID int64
	// Duplicate: the schedule's unique key was held, nothing was
	// submitted, and MessageID is the message that holds it.
	Duplicate bool
	// Missing, from FireSchedules only: the schedule does not exist
	// (deleted meanwhile); nothing changed for it.
	Missing bool
}

// MaxFireBatch bounds the requests of one FireSchedules call.
const MaxFireBatch = 1000

// Report is one attempt of one message: the task's own account.
//
// In JSON it also carries task_id: MessageID as a string, the id the tasks
// API answers a submit with and serves at tasks/{id}. message_id, the same
// value as a number, is deprecated: it stays until 2027-06-30 and may go
// after, so clients read task_id.
type Report struct {
	ID        int64           `json:"id"`
	MessageID int64           `json:"message_id"` // deprecated: read task_id
	Task      string          `json:"task"`
	Topic     string          `json:"topic"`
	Schedule  string          `json:"schedule,omitempty"`
	Attempt   int             `json:"attempt"`
	Worker    string          `json:"worker"`
	Status    string          `json:"status"`
	StartedAt time.Time       `json:"started_at"`
	EndedAt   time.Time       `json:"ended_at"`
	Duration  float64         `json:"duration_seconds"`
	Error     string          `json:"error,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Progress  float64         `json:"progress"`
	Logs      []string        `json:"logs,omitempty"`
	// Key, when not empty, is unique to the attempt (the worker uses the
	// attempt's claim token): AddReports stores a report whose key is
	// already stored only once, returning the stored report's id, so a
	// writer may retry a batch whose commit it did not hear of. It is
	// stored only; reads leave it empty.
	Key string `json:"-"`
}

// MarshalJSON writes the report with task_id beside message_id.
func (r Report) MarshalJSON() ([]byte, error) {
	type fields Report // without this method
	return json.Marshal(struct {
		fields
		TaskID string `json:"task_id"`
	}{fields(r), strconv.FormatInt(r.MessageID, 10)})
}

// Report statuses. Success is the status, never the returned payload: a
// task that returns {"skipped": "healthy"} ran successfully.
const (
	ReportSuccess   = "success"
	ReportFailed    = "failed"
	ReportError     = "error"
	ReportTimeout   = "timeout"
	ReportCancelled = "cancelled"
	ReportSkipped   = "skipped"
	ReportLost      = "lost"
	ReportSnoozed   = "snoozed"
)

// ReportFilter selects reports; zero fields match all.
type ReportFilter struct {
	MessageID int64
	Task      string
	Status    string
	Schedule  string
	Limit     int
	Before    int64
}

// DueFilter selects the schedules DueSchedules returns: enabled ones whose
// NextFireAt is not after At, in (NextFireAt, Name) order, at most Limit
// (DefaultDueLimit when not positive, MaxDueLimit at most). With AfterName
// set, the listing goes on after the schedule (AfterNext, AfterName) of a
// previous call: a pass reads the due schedules in bounded batches and
// sees each at most once, even one it failed to fire.
type DueFilter struct {
	At        time.Time
	AfterNext time.Time
	AfterName string
	Limit     int
}

// DueSchedules limits.
const (
	DefaultDueLimit = 500
	MaxDueLimit     = 5000
)

// DueLimit returns the limit DueSchedules applies for f.
func DueLimit(f DueFilter) int {
	if f.Limit <= 0 {
		return DefaultDueLimit
	}
	return min(f.Limit, MaxDueLimit)
}

// ScheduleStore keeps schedules and task reports. Every broker implements
// it: the memory broker in memory, local and postgres in their database.
type ScheduleStore interface {
	// PutSchedule creates or replaces a schedule's definition (task,
	// topic, payload, interval or cron, enabled, missed policy, source),
	// keeping its run state (last attempt, last success, next run) unless
	// the timing changed, in which case ExpectedNextRun is cleared.
	// NextFireAt becomes ExpectedNextRun as kept, or when there is none
	// the start of the second of the new UpdatedAt.
	PutSchedule(ctx context.Context, s Schedule) (Schedule, error)
	GetSchedule(ctx context.Context, name string) (Schedule, error)
	ListSchedules(ctx context.Context) ([]Schedule, error)
	// DueSchedules returns the enabled schedules due by f.At by their
	// NextFireAt, oldest first, from an index: its cost follows the
	// number returned, not the number of schedules.
	DueSchedules(ctx context.Context, f DueFilter) ([]Schedule, error)
	// DeferSchedule moves the NextFireAt of a schedule that has never
	// fired (ExpectedNextRun nil) forward to until, its first slot, as
	// long as it is unchanged since s was read (same UpdatedAt) and until
	// is later; it reports whether it did. The scheduler calls it for a
	// cron schedule whose first slot, which only it can compute, is not
	// due yet, so that DueSchedules stops returning it.
	DeferSchedule(ctx context.Context, s Schedule, until time.Time) (bool, error)
	// DeleteSchedule removes it; ErrNotFound if there is none.
	DeleteSchedule(ctx context.Context, name string) error
	// FireSchedule, in one transaction: if (Name, Slot) has not fired,
	// record it, stamp LastAttempt = now and ExpectedNextRun = Next (and
	// NextFireAt = Next), and
	// submit req.Submit (header "schedule" = Name) if given. With a fence,
	// nothing happens unless the lease is held at that term (ErrNotLeader).
	FireSchedule(ctx context.Context, req FireRequest) (FireResult, error)
	// FireSchedules fires each request as FireSchedule does, all in one
	// transaction, and returns their results in order: a beat with many
	// due schedules pays one commit per batch, not per schedule. The
	// requests are checked first (an invalid one, or more than
	// MaxFireBatch, is ErrInvalid and nothing happens); the fence, when
	// one request has it (they all have the same or none), is checked
	// once (ErrNotLeader, nothing happens); a missing schedule gets
	// Missing, not an error. Any other error rolls the whole batch back.
	FireSchedules(ctx context.Context, reqs []FireRequest) ([]FireResult, error)
	// AddReport stores one attempt's report; a success report of a
	// message submitted by a schedule also stamps that schedule's
	// LastSuccess = EndedAt, in the same transaction.
	AddReport(ctx context.Context, r Report) (int64, error)
	// AddReports stores reports as AddReport does, all in one
	// transaction, and returns their ids in order. When one is invalid
	// nothing is stored (ErrInvalid, naming it). A report whose Key is
	// stored already (by an earlier call, or earlier in rs) is not
	// stored again; its id is the stored report's.
	AddReports(ctx context.Context, rs []Report) ([]int64, error)
	ListReports(ctx context.Context, f ReportFilter) ([]Report, error)
	GetReport(ctx context.Context, id int64) (Report, error)
	// PurgeReports deletes reports that ended before the cutoff.
	PurgeReports(ctx context.Context, before time.Time) (int, error)
}
