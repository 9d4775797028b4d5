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
// Implementations: memory (in-process), local (embedded SQLite) and
// postgres. broker/brokertest holds the conformance suite they all pass.
package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Message states.
const (
	StateQueued  = "queued"
	StateRunning = "running"
	StateDone    = "done"
	StateFailed  = "failed"
	StateDead    = "dead"
)

// Worker roles.
const (
	RoleWorker = "worker"
	RoleBeat   = "beat"
)

// CheckDelay refuses a delay that is negative or over MaxDelay.
func CheckDelay(d time.Duration) error {
	if d < 0 {
		return Invalid("delay is negative")
	}
	if d > MaxDelay {
		return Invalid("delay is %s, the limit is %s (%s)", d, MaxDelay, maxDelayText)
	}
	return nil
}

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
}

// Message is a stored message. Token is set only on a claimed message
// returned by Claim.
type Message struct {
	ID          int64             `json:"id"`
	Topic       string            `json:"topic"`
	Task        string            `json:"task"`
	Payload     json.RawMessage   `json:"payload"`
	Headers     map[string]string `json:"headers,omitempty"`
	State       string            `json:"state"`
	Attempts    int               `json:"attempts"`
	MaxAttempts int               `json:"max_attempts"`
	ClaimedBy   string            `json:"claimed_by,omitempty"`
	ClaimedAt   *time.Time        `json:"claimed_at,omitempty"`
	Token       string            `json:"-"`
	AvailableAt time.Time         `json:"available_at"`
	CreatedAt   time.Time         `json:"created_at"`
	FinishedAt  *time.Time        `json:"finished_at,omitempty"`
	LastError   string            `json:"last_error,omitempty"`
	Result      json.RawMessage   `json:"result,omitempty"`
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
	// Kind is "memory", "local" or "postgres".
	Kind() string

	Submit(ctx context.Context, req SubmitRequest) (int64, error)
	// Claim takes up to req.Max available messages of req.Topics, never
	// exceeding a topic's concurrency limit, skipping paused and draining
	// topics, and returns them running with fresh tokens.
	Claim(ctx context.Context, req ClaimRequest) ([]Message, error)
	// Ack marks attempts done. It returns one error per outcome (nil or
	// ErrClaimLost), in order.
	Ack(ctx context.Context, outcomes []Outcome) ([]error, error)
	Nack(ctx context.Context, req NackRequest) error
	DeadLetter(ctx context.Context, c Claim, reason string) error

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

// ValidateTopicName checks a topic name.
func ValidateTopicName(topic string) error {
	if topic == "" {
		return Invalid("topic is empty")
	}
	if len(topic) > MaxTopicLen {
		return Invalid("topic is %d bytes long, the limit is %d", len(topic), MaxTopicLen)
	}
	return nil
}

// ValidateNewTopicName checks a topic name a client gives for something
// new (a submit, a schedule, a topic's first settings) more strictly than
// ValidateTopicName, which names that earlier versions stored must keep
// passing: valid UTF-8, no control characters, no white space at either
// end.
func ValidateNewTopicName(topic string) error {
	if err := ValidateTopicName(topic); err != nil {
		return err
	}
	if !utf8.ValidString(topic) {
		return Invalid("topic %q is not valid UTF-8", topic)
	}
	if strings.ContainsFunc(topic, unicode.IsControl) {
		return Invalid("topic %q holds a control character", topic)
	}
	if strings.TrimSpace(topic) != topic {
		return Invalid("topic %q starts or ends with white space", topic)
	}
	return nil
}

// ValidateSubmit checks a submit request; maxPayload 0 means MaxPayloadSize.
func ValidateSubmit(req SubmitRequest, maxPayload int) error {
	if maxPayload <= 0 {
		maxPayload = MaxPayloadSize
	}
	if err := ValidateTopicName(req.Topic); err != nil {
		return err
	}
	if req.Task == "" {
		return Invalid("task is empty")
	}
	if len(req.Task) > MaxTaskLen {
		return Invalid("task name is %d bytes long, the limit is %d", len(req.Task), MaxTaskLen)
	}
	if len(req.Payload) > maxPayload {
		return Invalid("payload is %d bytes, the limit is %d", len(req.Payload), maxPayload)
	}
	if len(req.Payload) > 0 {
		if err := CheckJSON(req.Payload); err != nil {
			return Invalid("payload: %v", err)
		}
	}
	if err := CheckDelay(req.Delay); err != nil {
		return err
	}
	if req.MaxAttempts < 0 {
		return Invalid("max_attempts is negative")
	}
	if req.MaxAttempts > MaxAttempts {
		return Invalid("max_attempts is %d, the limit is %d", req.MaxAttempts, MaxAttempts)
	}
	return nil
}

// ValidatePatch checks a topic patch.
func ValidatePatch(p TopicPatch) error {
	if p.ConcurrencyLimit != nil && *p.ConcurrencyLimit < 0 {
		return Invalid("concurrency_limit is negative (%d); use 0 for unlimited", *p.ConcurrencyLimit)
	}
	return nil
}

// OrphanedErrorPrefix starts the last error of every message the reaper
// requeued or dead-lettered as an orphan (its worker died holding it), in
// every store: a worker tells by it that the message may be what killed
// that worker.
const OrphanedErrorPrefix = "orphaned:"

// ReclaimRequest is one reaper pass's instruction. Live is the live-worker
// set the caller read (and checked with its guards) with LiveWorkers.
type ReclaimRequest struct {
	Live []string
	// Grace: only claims (and locks) at least this old are touched.
	Grace time.Duration
	// MaxAttempts: a reclaimed message whose claims have now been
	// orphaned this many times (this one included) is dead-lettered
	// instead of requeued. Error retries do not count: they have their own
	// limit (the task's max attempts).
	MaxAttempts int
	// Fence, when set, makes the pass a leader-only write: it lands only
	// while the lease is held at that term (ErrNotLeader otherwise).
	Fence *Fence
}

// ReclaimResult says what a pass did.
type ReclaimResult struct {
	Reclaimed     int     `json:"reclaimed"`
	DeadLettered  int     `json:"dead_lettered"`
	LocksReleased int     `json:"locks_released"`
	IDs           []int64 `json:"ids,omitempty"`
	// WithinGrace counts running messages of non-live claimers (and locks
	// of non-live holders) left alone because they are younger than the
	// grace: the fourth fail-closed guard at work.
	WithinGrace int `json:"within_grace"`
}

// FinishedPurger is implemented by brokers that keep finished messages
// until told to drop them (postgres; memory and local keep a fixed number,
// see their Retain option).
type FinishedPurger interface {
	// PurgeFinished deletes the done messages that finished before the
	// cutoff, and the record of schedule fires older than it; dead and
	// failed messages stay for an operator. It returns how many messages
	// it deleted (with the error, after one, the count of those deleted
	// before it).
	PurgeFinished(ctx context.Context, before time.Time) (int, error)
}

// OrphanReclaimer is implemented by brokers whose running messages can
// outlive the worker that claimed them (local and postgres). The memory
// broker does not implement it: its messages die with the process.
type OrphanReclaimer interface {
	// LiveWorkers returns the ids of workers whose heartbeat is fresher
	// than after, by the broker's clock.
	LiveWorkers(ctx context.Context, after time.Duration) ([]string, error)
	// ReclaimOrphans, in one transaction: running messages whose claimer
	// is not in req.Live and that were claimed at least req.Grace ago go
	// back to queued (claim fields and token cleared), or to dead once
	// they have been orphaned req.MaxAttempts times; locks whose holder is not in
	// req.Live, acquired at least req.Grace ago, are deleted.
	ReclaimOrphans(ctx context.Context, req ReclaimRequest) (ReclaimResult, error)
	// ExpireWorker marks a worker's heartbeat as long past, so it leaves
	// the live set at once (used when its process is known to be gone).
	ExpireWorker(ctx context.Context, workerID string) error
}

// ErrNotLeader: a leader-only write was refused because the lease it named
// is no longer held at that term. The write changed nothing.
var ErrNotLeader = errors.New("not the leader: the lease is held by another term")

// Lease is a named lease as it stands: who holds it, at which term, until
// when (broker time).
type Lease struct {
	Name      string    `json:"name"`
	Holder    string    `json:"holder"`
	Term      int64     `json:"term"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Fence names the lease a leader-only write is made under. The write lands
// only if Holder still holds Name at Term, checked in the same transaction.
type Fence struct {
	Name   string
	Holder string
	Term   int64
}

// Leaser is implemented by every broker: it elects one leader (the beat)
// among every process sharing the broker.
type Leaser interface {
	// TryLease acquires or renews lease name for holder, for ttl from now
	// (broker time). The current holder renews at its term; anyone takes
	// a free or expired lease at the next term. It returns the lease as it
	// stands and whether holder holds it.
	TryLease(ctx context.Context, name, holder string, ttl time.Duration) (Lease, bool, error)
	// ReleaseLease gives the lease up if holder holds it at term, so a
	// standby can take it at once; otherwise it does nothing.
	ReleaseLease(ctx context.Context, name, holder string, term int64) error
}
