package worker

import (
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
)

// This file owns a pool's configuration: Options, their defaults, and how
// NewPool fills in the zero values.

// Defaults of Options.
const (
	DefaultConcurrency       = 8
	DefaultHeartbeatInterval = 5 * time.Second
	DefaultClaimIdleInterval = 100 * time.Millisecond
	DefaultClaimIdleFallback = 5 * time.Second
	DefaultDrainTimeout      = 30 * time.Second
	DefaultAbandonAfter      = 5 * time.Second
)

// Options configure a Pool. Zero values mean the defaults.
type Options struct {
	// WorkerID names this worker in the broker; default
	// "<host>-<pid>-<random6>".
	WorkerID string
	// Host and PID describe the process; default os.Hostname and
	// os.Getpid.
	Host string
	PID  int
	// Roles default to [broker.RoleWorker].
	Roles []string
	// Topics to claim from, in addition to every registered task's topic.
	Topics []string
	// Concurrency is how many handlers run at once; default 8.
	Concurrency int
	// OffloadSlots says how many attempts of offloaded tasks (Task.Offload)
	// may be out at once besides the Concurrency handlers: the room of the
	// processes they run in. Nil, or 0, offloads none.
	OffloadSlots func() int
	// HeartbeatInterval is how often the worker's row is stamped;
	// default 5s.
	HeartbeatInterval time.Duration
	// ClaimIdleInterval is how long the dispatcher waits after a claim
	// that found nothing; Wake cuts it short. Default
	// DefaultClaimIdleInterval.
	ClaimIdleInterval time.Duration
	// ClaimIdleFallback replaces ClaimIdleInterval while the broker
	// announces submitted messages (broker.Notifier: postgres, whose
	// listening connection is up): the dispatcher then claims when an
	// announcement for one of its topics comes, and polls this often only
	// in case one was lost, or for messages that become available without
	// one (a retry's backoff, a requeue by another worker or the reaper, a
	// freed concurrency slot). Default 5s.
	ClaimIdleFallback time.Duration
	// DrainTimeout is how long Stop lets running handlers finish before
	// cancelling them; default 30s, negative means cancel at once.
	DrainTimeout time.Duration
	// AbandonAfter is how long Stop waits, after cancelling, for handlers
	// to return before requeueing their messages anyway; default 5s.
	AbandonAfter time.Duration
	// Logger defaults to a null logger.
	Logger hclog.Logger
	// Observer is told about every attempt; may be nil.
	Observer Observer
	// Reporter, if set, gets one report per attempt (task reports); a
	// StoringReporter into this broker gets only those of lost attempts,
	// the others being stored with their outcomes.
	Reporter Reporter
	// StrayCheckInterval is how often the pool looks for strays: messages
	// running in the broker under its worker id that it does not hold,
	// because their claim's answer was lost (see strayCheck). Default
	// 30s; negative turns the check off. The check assumes that this pool
	// is the only one claiming under its worker id.
	StrayCheckInterval time.Duration
	// StrayAfter is how long a running message the pool does not hold must
	// stay so before the pool requeues it; default 60s. Shorter than the
	// time a claim's answer may take (30s), it would requeue messages on
	// their way to the pool.
	StrayAfter time.Duration
	// Strays, if set, is told how many strays each check requeued.
	Strays func(n int)
	// UnknownTaskGrace: for this long after Start, a message of a task the
	// registry does not know is requeued (every few seconds, its attempt
	// given back) instead of failed, for tasks registered after Start
	// (tasks of other plugins, found by polling) to show up. Default 0:
	// such a message fails at once.
	UnknownTaskGrace time.Duration
	// UnknownTaskWait: a message of a task that no live worker runs (not
	// this one, not another) is requeued (its attempt given back, every
	// unknownWaitRetry) until the task has been so for this long, as this
	// pool saw it, and fails as unknown only then: the only host that runs
	// it may be restarting, or its provider plugin. Default 0: such a
	// message fails at once.
	UnknownTaskWait time.Duration
}

// withDefaults returns opts with every zero value replaced by its default.
func (opts Options) withDefaults() Options {
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if opts.Host == "" {
		opts.Host, _ = os.Hostname()
		if opts.Host == "" {
			opts.Host = "unknown"
		}
	}
	if opts.PID == 0 {
		opts.PID = os.Getpid()
	}
	if opts.WorkerID == "" {
		opts.WorkerID = fmt.Sprintf("%s-%d-%s", opts.Host, opts.PID, randomSuffix())
	}
	if len(opts.Roles) == 0 {
		opts.Roles = []string{broker.RoleWorker}
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = DefaultConcurrency
	}
	if opts.HeartbeatInterval <= 0 {
		opts.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if opts.ClaimIdleInterval <= 0 {
		opts.ClaimIdleInterval = DefaultClaimIdleInterval
	}
	if opts.ClaimIdleFallback <= 0 {
		opts.ClaimIdleFallback = DefaultClaimIdleFallback
	}
	opts.ClaimIdleFallback = max(opts.ClaimIdleFallback, opts.ClaimIdleInterval)
	switch {
	case opts.DrainTimeout == 0:
		opts.DrainTimeout = DefaultDrainTimeout
	case opts.DrainTimeout < 0:
		opts.DrainTimeout = 0
	}
	if opts.AbandonAfter <= 0 {
		opts.AbandonAfter = DefaultAbandonAfter
	}
	if opts.StrayCheckInterval == 0 {
		opts.StrayCheckInterval = DefaultStrayCheckInterval
	}
	if opts.StrayAfter <= 0 {
		opts.StrayAfter = DefaultStrayAfter
	}
	return opts
}

// randomSuffix returns 6 random hex digits.
func randomSuffix() string {
	var b [3]byte
	_, _ = crand.Read(b[:]) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b[:])
}
