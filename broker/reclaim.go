package broker

import (
	"context"
	"time"
)

// OrphanedErrorPrefix starts the last error of every message the reaper
// requeued or dead-lettered as an orphan (its worker died holding it), in
// every store, for the people who read it. Code tells such a message by
// Message.Suspect, never by this text.
const OrphanedErrorPrefix = "orphaned:"

// ReclaimRequest is one reaper pass's instruction. Live is the live-worker
// set the caller read (and checked with its guards) with LiveWorkers.
type ReclaimRequest struct {
	Live []string
	// Grace: only claims (and locks) at least this old are touched.
	Grace time.Duration
	// Dead names workers known dead (DeadReclaimer.ReclaimDead): only
	// their claims and locks are touched, whatever their age. Set, Live
	// and Grace must be empty; a reaper pass (ReclaimOrphans) leaves it
	// empty.
	Dead []string
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
	// Cancelled counts the reclaimed messages whose cancel was requested:
	// they end cancelled instead of going back to the queue (they are
	// counted in IDs, not in Reclaimed or DeadLettered).
	Cancelled int `json:"cancelled,omitempty"`
}

// FinishedPurger is implemented by brokers that keep finished messages
// until told to drop them (postgres; memory and local keep a fixed number,
// see their Retain option).
type FinishedPurger interface {
	// PurgeFinished deletes the done and cancelled messages that finished
	// before the cutoff, and the record of schedule fires older than it;
	// dead and failed messages stay for an operator. It returns how many messages
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
	// they have been orphaned req.MaxAttempts times, or to cancelled when
	// their cancel was requested; locks whose holder is not in
	// req.Live, acquired at least req.Grace ago, are deleted.
	ReclaimOrphans(ctx context.Context, req ReclaimRequest) (ReclaimResult, error)
	// ExpireWorker marks a worker's heartbeat as long past, so it leaves
	// the live set at once (used when its process is known to be gone).
	ExpireWorker(ctx context.Context, workerID string) error
}

// DeadReclaimer is implemented by the brokers whose running messages stay
// running until a reclaim brings them back (local and postgres). It
// reclaims the work of workers the caller knows are dead: their process
// was seen to end by its parent, so no guard that tells a dead worker from
// a live one that looks dead applies.
type DeadReclaimer interface {
	// ReclaimDead, in one transaction: the running messages (and claims)
	// of the workers named in req.Dead go back to queued, or to dead, or
	// to cancelled, as ReclaimOrphans does an orphan, whatever their age;
	// their locks, and the locks held under the claims it ends, are
	// deleted. req.Live and req.Grace must be empty (ErrInvalid, as is an
	// empty req.Dead). Naming a worker that is alive takes its work from
	// it: only a caller that saw the process end may name it.
	ReclaimDead(ctx context.Context, req ReclaimRequest) (ReclaimResult, error)
}
