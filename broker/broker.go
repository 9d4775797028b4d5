// Package broker defines the message broker contract of the task system
// and the types it speaks in.
//
// A message is submitted to a topic, claimed by a worker (which marks it
// running and hands out a claim token unique to that attempt), and then
// acked, nacked or dead-lettered by naming that token. A write with a stale
// token changes nothing and returns ErrClaimLost: the claim was reclaimed
// and belongs to someone else now.
//
// A topic's concurrency limit is the count of its running rows, as the
// specification says. That is why an orphaned running row burns a slot
// until the reaper (package reaper) reclaims it, and why every
// implementation must make check-and-claim race-free.
//
// # Rules
//
// Every implementation keeps these rules, beyond the method docs of Broker
// (broker/brokertest states them as tests):
//
//   - Submit validates with ValidateSubmit, creates the topic's config when
//     it is missing (no concurrency limit, dead-lettering on, not paused),
//     stores an empty payload as {} and queues the message, available after
//     Delay. An invalid request stores nothing (no message, no topic
//     config).
//   - SubmitMany stores each request as Submit does, all in one
//     transaction, ids in request order; one invalid request (the error
//     names its index) or more than MaxSubmitBatch store nothing.
//   - Claim serves the requested topics round-robin: each pass takes at most
//     one message per topic, and the topic that starts the passes rotates
//     from one call to the next. Within a topic the available messages go
//     by (priority descending, available_at, id): the highest priority
//     first, the oldest first within a priority. The rabbitmq broker is the
//     exception: its quorum queues have no priorities, so a topic's
//     messages go in the order they were published (its NotApplicable in
//     brokertest says so). Paused topics, topics at
//     their concurrency limit (the count of their running messages) and
//     unknown topics yield nothing. Max below 1 counts as 1; an empty worker
//     id is invalid. Each claimed message gets a fresh random 128-bit token
//     and one more attempt.
//   - Only Claim returns a token; GetMessage and ListMessages never do.
//   - A report given with an outcome (Outcome.Report, NackRequest.Report,
//     DeadLetter's report) is stored in the transaction that applies the
//     outcome, and only when it applies: with a stale claim neither the
//     outcome nor the report is stored. It is stored as AddReports stores
//     it (its key, its schedule's LastSuccess) and must name the claim's
//     message (ErrInvalid otherwise, nothing changed).
//   - Ack, Nack, DeadLetter, AcquireLock and ReleaseLock act only when the
//     message is running under the claim they name; otherwise (wrong token,
//     already ended, unknown id) they change nothing and return
//     ErrClaimLost. Locks held under a claim are released when the claim
//     ends (ack, nack, dead letter, reclaim).
//   - Nack with Requeue puts the message back (available after Delay, claim
//     fields cleared, attempts kept); without it the message ends dead when
//     its topic dead-letters and failed otherwise. Nack with Cancel ends it
//     cancelled whatever Requeue says (never retried; its last error is
//     Error, or "cancelled"). DeadLetter always ends it dead.
//   - Finished messages (done, failed, dead, cancelled) stay readable by id.
//     Requeue brings a dead or failed one back to the queue, keeping its
//     attempts and last error, and clearing CancelRequestedAt; a cancelled
//     one is ErrInvalid (it is submitted again instead).
//   - Cancel of a queued message ends it cancelled at once (FinishedAt
//     set, last error "cancelled"). Cancel of a running message only sets
//     CancelRequestedAt (once; later cancels keep the first time): the
//     claim, its slot, its locks and its token stay until its holder ends
//     the attempt. Cancel of a finished message changes nothing and
//     returns the message with an error wrapping ErrFinished that names its
//     state; of an unknown id, ErrNotFound. CancelQueued cancels the queued
//     messages matching its filter (topic and/or task; an empty filter is
//     ErrInvalid) and counts them; running ones are not touched.
//   - A running message whose cancel was requested ends cancelled when its
//     holder nacks it with Cancel, or with Requeue (it is never requeued);
//     an Ack (success), a Nack without Requeue (a permanent failure) or a
//     DeadLetter still ends it done, failed or dead: whichever write its valid token
//     makes first wins, and after it Cancel returns ErrFinished.
//     CancelRequests lists a worker's running claims whose cancel was
//     requested: the worker polls it at its heartbeat. A cancel request is
//     also announced at once to the brokers that implement CancelNotifier
//     (postgres), from every process sharing the store.
//   - The orphan reclaim of a message whose cancel was requested ends it
//     cancelled (not requeued, not dead), counted in
//     ReclaimResult.Cancelled.
//   - ListMessages is newest first, Limit 50 by default (1000 at most),
//     Before pages; an unknown state is invalid.
//   - A worker is live while its last heartbeat is within the broker's
//     LiveAfter, by the broker's clock.
//   - Leases (Leaser): the holder renews at its term; a free, released or
//     expired lease goes to the next taker at the next term (its own
//     holder retaking it after expiry too); leases are independent by name.
//   - Orphan reclaim (OrphanReclaimer, the stores whose messages outlive
//     their workers): a pass fails closed on an empty live set; a reclaimed
//     message is marked Suspect and its last error starts with
//     OrphanedErrorPrefix (for people: no code reads it); only orphanings
//     count toward ReclaimRequest.MaxAttempts, error retries do not; a
//     fenced pass lands only while its lease term holds, unexpired. A
//     reclaim of named dead workers (DeadReclaimer) takes their claims
//     and locks whatever their age, and nothing of any other worker.
//   - After Close, calls return ErrClosed; closing twice is allowed.
//
// # Schedules and reports
//
// Every broker keeps these rules of ScheduleStore:
//
//   - PutSchedule validates with NormalizeSchedule (ErrInvalid
//     saying what is wrong, nothing stored): a name of 1 to 200
//     characters, a task, a valid topic, a JSON payload ({} when empty), a
//     unique key of at most MaxUniqueKeyLen bytes (none when empty),
//     exactly one of IntervalSeconds > 0 and Cron, a known missed policy
//     (skip when empty), source "api" when empty.
//   - PutSchedule upserts by name and returns the stored schedule: the run
//     state (LastAttempt, LastSuccess, ExpectedNextRun) and CreatedAt are
//     kept, ExpectedNextRun is cleared when the interval or cron changed,
//     UpdatedAt is the time of the put. Run-state fields in the argument
//     are ignored.
//   - ListSchedules is by name; GetSchedule and DeleteSchedule of a missing
//     schedule are ErrNotFound. Deleting a schedule deletes its fired slots:
//     created again, it fires them again.
//   - FireSchedule fires a (name, slot) once: of any number of concurrent
//     fires exactly one reports Fired and submits; the others report
//     Fired false and change nothing. A fire stamps LastAttempt (broker
//     time) and ExpectedNextRun = Next, and submits Submit (if not nil)
//     with header "schedule" = name, returning its id; when Submit's
//     unique key is held, it stores no message, sets Duplicate and
//     returns the holder's id. With a Fence whose lease is not held at
//     that term nothing changes and the error is ErrNotLeader; a missing
//     schedule is ErrNotFound.
//   - NextFireAt, the due index, is never after a schedule's due slot:
//     ExpectedNextRun once it has fired (a fire sets both to Next), else
//     the start of the second of UpdatedAt. DueSchedules returns the
//     enabled schedules whose NextFireAt is not after At, by (NextFireAt,
//     Name), in pages of at most DueLimit that go on after a given
//     schedule; DeferSchedule moves a never-fired, unchanged schedule's
//     NextFireAt forward only.
//   - AddReport stores a report with a known status (ErrInvalid
//     otherwise); a success report naming a schedule moves its LastSuccess
//     up to EndedAt (never back). The status decides: a success whose
//     result says {"skipped": ...} is a success, a failed or skipped
//     report is not.
//   - AddReports stores several reports as AddReport does, in one
//     transaction, and returns their ids in order; the latest success of a
//     schedule among them sets its LastSuccess. One invalid report fails
//     the call with ErrInvalid and stores none of them; no reports store
//     nothing.
//   - ListReports is newest first with filters on message, task, status and
//     schedule, Limit 50 by default, Before pages; GetReport of a missing
//     id is ErrNotFound; PurgeReports deletes the reports that ended before
//     the cutoff and counts them.
//
// Implementations: memory (in-process), local (embedded SQLite) and
// postgres; local and postgres share their rules through broker/sqlstore.
// broker/brokertest holds the conformance suite they all pass.
package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Message states.
const (
	StateQueued  = "queued"
	StateRunning = "running"
	StateDone    = "done"
	StateFailed  = "failed"
	StateDead    = "dead"
	// StateCancelled: the message was cancelled (Broker.Cancel while
	// queued, CancelQueued, or a running attempt that ended with
	// NackRequest.Cancel). Terminal, like done, failed and dead.
	StateCancelled = "cancelled"
)

// Worker roles.
const (
	RoleWorker = "worker"
	RoleBeat   = "beat"
)

// Errors. Test with errors.Is.
var (
	// ErrClaimLost: the claim token no longer owns the message (it was
	// reclaimed, or already acked). The write changed nothing.
	ErrClaimLost = errors.New("claim lost: the message is no longer held by this claim")
	// ErrNotFound: no such message, topic, worker or lock.
	ErrNotFound = errors.New("not found")
	// ErrInvalid: the request is malformed; nothing was stored.
	ErrInvalid = errors.New("invalid request")
	// ErrClosed: the broker was closed.
	ErrClosed = errors.New("broker closed")
)

// Invalid returns an error wrapping ErrInvalid with a message for a person.
func Invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Headers the task system sets on a message a plugin submits from one of
// its tasks (capability.Submit): the plugin that submitted it, and the id
// of the task whose attempt did (its parent).
const (
	SubmitterHeader = "submitted_by"
	ParentHeader    = "parent_task_id"
)

// SubmitRequest is one message to enqueue.
type SubmitRequest struct {
	Topic   string
	Task    string
	Payload json.RawMessage
	Headers map[string]string
	// Delay postpones the first claim.
	Delay time.Duration
	// MaxAttempts bounds error retries (0: the task's default).
	MaxAttempts int
	// RunAt, when set, is when the message becomes available (at once
	// when it is past, but never more than MaxRunAtPast before the
	// submit); exclusive with Delay.
	RunAt time.Time
	// Priority orders a topic's claims: higher first (MinPriority to
	// MaxPriority, 0 by default).
	Priority int
	// UniqueKey, when set, makes the submit a duplicate (ErrDuplicate,
	// nothing stored) while another message with the same key holds it:
	// that message is in one of its UniqueStates, or was created less
	// than this request's UniqueFor ago, whatever its state. Keys are
	// global, across topics and tasks.
	UniqueKey string
	// UniqueFor is the window of UniqueKey (0: none).
	UniqueFor time.Duration
	// UniqueStates are the states the message holds its key in
	// (DefaultUniqueStates when empty); they must include queued and
	// running.
	UniqueStates []string
}

// Message is a stored message. Token is set only on a claimed message
// returned by Claim.
type Message struct {
	ID      int64             `json:"id"`
	Topic   string            `json:"topic"`
	Task    string            `json:"task"`
	Payload json.RawMessage   `json:"payload"`
	Headers map[string]string `json:"headers,omitempty"`
	State   string            `json:"state"`
	// Priority: higher is claimed first (see SubmitRequest).
	Priority int `json:"priority"`
	// UniqueKey is the unique key the message was submitted with.
	UniqueKey   string          `json:"unique_key,omitempty"`
	Attempts    int             `json:"attempts"`
	MaxAttempts int             `json:"max_attempts"`
	ClaimedBy   string          `json:"claimed_by,omitempty"`
	ClaimedAt   *time.Time      `json:"claimed_at,omitempty"`
	Token       string          `json:"-"`
	AvailableAt time.Time       `json:"available_at"`
	CreatedAt   time.Time       `json:"created_at"`
	FinishedAt  *time.Time      `json:"finished_at,omitempty"`
	LastError   string          `json:"last_error,omitempty"`
	Result      json.RawMessage `json:"result,omitempty"`
	// Suspect says the message's last claim ended with its worker dead:
	// the reaper requeued (or dead-lettered) it as an orphan, and no
	// attempt has ended since, except requeues that did not run it
	// (NackRequest.Suspect). It may be what killed that worker, so a
	// worker runs it alone.
	Suspect bool `json:"suspect,omitempty"`
	// WaitingSince is when the message began to wait for a live worker
	// that runs its task (nil when it is not waiting). It is kept across
	// requeues, so the wait counts across processes and hosts.
	WaitingSince *time.Time `json:"waiting_since,omitempty"`
	// CancelRequestedAt is when a cancel of the running message was first
	// requested (Broker.Cancel); its worker is to stop the attempt, which
	// then ends cancelled. Kept on the finished message as a record.
	CancelRequestedAt *time.Time `json:"cancel_requested_at,omitempty"`
	// ClaimGroup, when not zero, names the claim that took the message,
	// for a broker whose writes of outcomes lock the claim of the messages
	// they end until they commit (the PostgreSQL broker's claim rows): two
	// writes in flight that carry outcomes of one claim wait for each
	// other. The worker pool keeps such outcomes out of a write while
	// another write in flight carries outcomes of the same claim. Set by
	// Claim; zero when outcomes of one claim do not wait for each other.
	ClaimGroup int64 `json:"-"`
}

// Claim names one attempt of one message: the fencing token that ack, nack
// and lock release must present.
type Claim struct {
	ID    int64
	Token string
}

// ClaimOf returns m's claim.
func (m *Message) ClaimOf() Claim { return Claim{ID: m.ID, Token: m.Token} }

// ClaimRequest asks for up to Max messages from Topics for WorkerID.
type ClaimRequest struct {
	WorkerID string
	Topics   []string
	// Max is the most messages to return (at least 1). Fewer come back
	// when the queues are short or the topics' limits are reached.
	Max int
}

// Outcome is how an attempt ended, for Ack.
type Outcome struct {
	Claim  Claim
	Result json.RawMessage
	// Report, when set, is the attempt's report: the broker stores it in
	// the transaction that applies the outcome, and only when the outcome
	// applies (a stale claim stores no report). It must name the claim's
	// message; an invalid report fails the call with ErrInvalid, as an
	// invalid result does, before anything changes.
	Report *Report
	// Keyed says the claim's message has a unique key (Message.UniqueKey).
	// It is a hint: the PostgreSQL broker, which acks keyed messages
	// apart from the others, then locks every message of the call in id
	// order first, as the reaper does, so the two cannot deadlock. Left
	// unset on a keyed message, the ack still applies.
	Keyed bool
}

// NackRequest ends an attempt without success.
type NackRequest struct {
	Claim Claim
	// Requeue puts the message back in the queue after Delay; otherwise
	// it ends failed (or dead if its topic dead-letters).
	Requeue bool
	Delay   time.Duration
	Error   string
	// NotRun, with Requeue, says the attempt never ran the task (a lock
	// was held, the worker was stopping, the task is not known to it yet,
	// the claim never reached it): the claim's count in the message's
	// attempts is taken back, so waiting does not use up its retries.
	NotRun bool
	// Suspect keeps the message a suspect (Message.Suspect) when it is
	// requeued without running; any other Nack clears the mark.
	Suspect bool
	// WaitingSince, with Requeue, is when the message began to wait for a
	// worker that runs its task (Message.WaitingSince); nil clears it.
	WaitingSince *time.Time
	// Cancel ends the attempt and the message cancelled, never retried,
	// whatever Requeue says (Error, or "cancelled" when empty, is its last
	// error).
	Cancel bool
	// Report, when set, is the attempt's report, stored as
	// Outcome.Report is: in the nack's transaction, only when it applies.
	Report *Report
}

// WorkerInfo describes a worker process.
type WorkerInfo struct {
	ID       string   `json:"id"`
	Host     string   `json:"host"`
	PID      int      `json:"pid"`
	Roles    []string `json:"roles"`
	Topics   []string `json:"topics"`
	Capacity int      `json:"capacity"`
	// Tasks are the names of the tasks the worker can run.
	Tasks       []string  `json:"tasks"`
	StartedAt   time.Time `json:"started_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
	// Running is computed by the broker from running rows.
	Running int `json:"running"`
}

// HasRole reports whether w has role.
func (w WorkerInfo) HasRole(role string) bool {
	for _, r := range w.Roles {
		if r == role {
			return true
		}
	}
	return false
}

// TopicConfig is a topic's settings. ConcurrencyLimit 0 means unlimited.
type TopicConfig struct {
	Name              string `json:"name"`
	ConcurrencyLimit  int    `json:"concurrency_limit"`
	DeadLetterEnabled bool   `json:"dead_letter_enabled"`
	Paused            bool   `json:"paused"`
}

// TopicPatch changes some of a topic's settings; nil fields stay.
type TopicPatch struct {
	ConcurrencyLimit  *int  `json:"concurrency_limit,omitempty"`
	DeadLetterEnabled *bool `json:"dead_letter_enabled,omitempty"`
	Paused            *bool `json:"paused,omitempty"`
}

// TopicStats is a topic's counts.
type TopicStats struct {
	TopicConfig
	Queued      int `json:"queued"`
	Running     int `json:"running"`
	DeadLetter  int `json:"dead_letter"`
	Subscribers int `json:"subscribers"`
	// OldestClaimAge is the age of the oldest running claim, zero with
	// none running (database time).
	OldestClaimAge time.Duration `json:"oldest_claim_age_ns"`
}

// Stats is a snapshot of the whole broker.
type Stats struct {
	Topics  []TopicStats `json:"topics"`
	Workers int          `json:"workers"`
	// Beats is the number of live workers with the beat role.
	Beats int `json:"beats"`
	Locks int `json:"locks"`
}

// MessageFilter selects messages for ListMessages. Zero fields match all.
type MessageFilter struct {
	State  string
	Topic  string
	Task   string
	Limit  int
	Before int64 // page: ids below this
}

// PurgeResult says what Purge removed.
type PurgeResult struct {
	Queued     int `json:"purged_queued"`
	DeadLetter int `json:"purged_dead_letter"`
}

// Lock is a held lock.
type Lock struct {
	Name       string    `json:"name"`
	Holder     string    `json:"holder"`
	MessageID  int64     `json:"message_id"`
	AcquiredAt time.Time `json:"acquired_at"`
}

// Broker is the contract every implementation meets. Methods are safe for
// concurrent use. Times that decide ownership are the broker's own clock
// (database time for the SQL brokers).
type Broker interface {
	// Kind is "memory", "local", "postgres" or "rabbitmq".
	Kind() string

	Submit(ctx context.Context, req SubmitRequest) (int64, error)
	// BatchSubmitter queues many messages in one call and one
	// transaction (SubmitMany).
	BatchSubmitter
	// Claim takes up to req.Max available messages of req.Topics, never
	// exceeding a topic's concurrency limit, skipping paused and draining
	// topics, and returns them running with fresh tokens.
	Claim(ctx context.Context, req ClaimRequest) ([]Message, error)
	// Ack marks attempts done. It returns one error per outcome (nil or
	// ErrClaimLost), in order.
	Ack(ctx context.Context, outcomes []Outcome) ([]error, error)
	Nack(ctx context.Context, req NackRequest) error
	// DeadLetter ends the attempt and its message dead with reason as its
	// last error, whatever its topic's dead-letter setting; report, when
	// not nil, is stored as Outcome.Report is.
	DeadLetter(ctx context.Context, c Claim, reason string, report *Report) error

	// RegisterWorker records w, replacing a worker with the same id; a
	// registration again from the same host and pid (a worker whose tasks
	// changed) keeps its StartedAt.
	RegisterWorker(ctx context.Context, w WorkerInfo) error
	Heartbeat(ctx context.Context, workerID string) error
	UnregisterWorker(ctx context.Context, workerID string) error
	Workers(ctx context.Context) ([]WorkerInfo, error)
	// RunningClaims returns the claims of the messages running under
	// workerID, by message id. A worker compares them with the claims it
	// holds: one it does not hold was claimed for it but never reached it
	// (the claim committed and its answer was lost), and only that worker
	// can tell.
	RunningClaims(ctx context.Context, workerID string) ([]Claim, error)

	SetTopic(ctx context.Context, name string, patch TopicPatch) (TopicConfig, error)
	Topics(ctx context.Context) ([]TopicConfig, error)
	// Drain stops claims on a topic (it is paused); running ones finish.
	Drain(ctx context.Context, topic string) error
	// Purge deletes a topic's queued messages, and its dead letters when
	// deadLetters is set. Running messages are never touched.
	Purge(ctx context.Context, topic string, deadLetters bool) (PurgeResult, error)
	Stats(ctx context.Context) (Stats, error)

	ListMessages(ctx context.Context, f MessageFilter) ([]Message, error)
	GetMessage(ctx context.Context, id int64) (Message, error)
	// Requeue puts a dead or failed message back in the queue.
	Requeue(ctx context.Context, id int64) error

	// Canceller cancels messages (Cancel, CancelQueued) and tells workers
	// which of their running messages to stop (CancelRequests).
	Canceller

	// AcquireLock takes lock name for the claim c held by holder; false if
	// someone else holds it.
	AcquireLock(ctx context.Context, name, holder string, c Claim) (bool, error)
	// ReleaseLock releases a lock held under claim c; ErrClaimLost if the
	// lock is not held under that claim any more.
	ReleaseLock(ctx context.Context, name string, c Claim) error
	// ForceReleaseLock deletes a lock whoever holds it.
	ForceReleaseLock(ctx context.Context, name string) (bool, error)
	Locks(ctx context.Context) ([]Lock, error)

	// Leaser elects the beat.
	Leaser

	// ScheduleStore keeps schedules, the slots they fired and task
	// reports.
	ScheduleStore

	Close() error
}

// CheckOutcomeReport checks the report r given with an outcome of claim c
// (Outcome.Report, NackRequest.Report, DeadLetter's report): none, or a
// valid report (ValidateReport) of c's message; ErrInvalid otherwise.
func CheckOutcomeReport(c Claim, r *Report) error {
	if r == nil {
		return nil
	}
	if r.MessageID != c.ID {
		return Invalid("the report of the outcome of message %d names message %d", c.ID, r.MessageID)
	}
	if err := ValidateReport(*r); err != nil {
		return fmt.Errorf("the report of the outcome of message %d: %w", c.ID, err)
	}
	return nil
}
