package reaper

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/taskhost/taskhost/broker"
)

// Settings are the reaper's knobs; DefaultSettings has the specification's
// defaults.
type Settings struct {
	// Enabled runs the reaper from the beat.
	Enabled bool
	// Interval is how often the beat runs a pass.
	Interval time.Duration
	// After is the heartbeat staleness after which a claimer counts as
	// dead. It is deliberately not WorkerTTL.
	After time.Duration
	// Grace is the minimum age of a claim (or lock) before it is eligible.
	Grace time.Duration
	// MaxAttempts: orphaned claims (its worker died holding it) before
	// dead-lettering instead of requeueing. Error retries and requeues of
	// a task that never ran do not count: they have the task's own limit.
	MaxAttempts int
	// WorkerTTL only purges dead worker rows (bookkeeping).
	WorkerTTL time.Duration
}

// DefaultSettings returns the specification's defaults.
func DefaultSettings() Settings {
	return Settings{
		Enabled:     true,
		Interval:    300 * time.Second,
		After:       120 * time.Second,
		Grace:       60 * time.Second,
		MaxAttempts: 5,
		WorkerTTL:   86400 * time.Second,
	}
}

// Validate refuses settings that would make the reaper unsafe or useless.
// heartbeat is the workers' heartbeat interval: a claimer must miss at
// least two heartbeats before it counts as dead.
func (s Settings) Validate(heartbeat time.Duration) error {
	switch {
	case s.Interval <= 0:
		return fmt.Errorf("orphan_reclaim_interval_seconds must be positive, got %s", s.Interval)
	case s.After <= 0:
		return fmt.Errorf("orphan_reclaim_after_seconds must be positive, got %s", s.After)
	case s.After < 2*heartbeat:
		return fmt.Errorf("orphan_reclaim_after_seconds (%s) must be at least two heartbeat intervals (%s): a live worker would look dead between two heartbeats", s.After, 2*heartbeat)
	case s.Grace < 0:
		return fmt.Errorf("orphan_claim_grace_seconds must not be negative, got %s", s.Grace)
	case s.MaxAttempts < 1:
		return fmt.Errorf("orphan_max_attempts must be at least 1, got %d", s.MaxAttempts)
	case s.WorkerTTL < s.After:
		return fmt.Errorf("postgres_worker_ttl_seconds (%s) must not be shorter than orphan_reclaim_after_seconds (%s)", s.WorkerTTL, s.After)
	}
	return nil
}

// Guard names a fail-closed guard.
type Guard string

// The four guards of the specification.
const (
	GuardLiveSetUnreadable Guard = "live_set_unreadable"
	GuardLiveSetEmpty      Guard = "live_set_empty"
	GuardCallerNotLive     Guard = "caller_not_live"
	GuardWithinGrace       Guard = "claim_within_grace"
	// GuardReclaimFailed is not one of them but ends the same way: the
	// reclaim transaction failed and was rolled back, so nothing changed.
	GuardReclaimFailed Guard = "reclaim_failed"
)

// Result is what one pass did.
type Result struct {
	broker.ReclaimResult
	// Skipped names the guard that refused the whole pass; empty when the
	// pass ran.
	Skipped Guard `json:"skipped,omitempty"`
	// Reason says why, for a person.
	Reason string `json:"reason,omitempty"`
	// Unsupported is set when the broker cannot orphan anything (memory).
	Unsupported bool `json:"unsupported,omitempty"`
	// NotLeader is set when a fenced pass came after the lease moved on.
	NotLeader bool `json:"not_leader,omitempty"`
}

// Summary is a one-line account of the result.
func (r Result) Summary() string {
	switch {
	case r.Unsupported, r.NotLeader:
		return r.Reason
	case r.Skipped != "":
		return fmt.Sprintf("reclaimed nothing: %s", r.Reason)
	}
	s := fmt.Sprintf("reclaimed %d, dead-lettered %d, released %d lock(s)", r.Reclaimed, r.DeadLettered, r.LocksReleased)
	if r.Cancelled > 0 {
		s += fmt.Sprintf("; ended %d cancelled, as their cancel was requested", r.Cancelled)
	}
	if r.WithinGrace > 0 {
		s += fmt.Sprintf("; left %d orphan(s) younger than the grace", r.WithinGrace)
	}
	return s
}

// Metrics are the reaper's process-local counters (spec names).
type Metrics struct {
	Reclaimed    prometheus.Counter
	DeadLettered prometheus.Counter
	Skipped      prometheus.Counter
	// Cancelled, when set, counts the orphans ended cancelled because
	// their cancel was requested (NewMetrics leaves it nil: it is the task
	// system's cancelled counter, which its owner registers).
	Cancelled prometheus.Counter
}

// NewMetrics registers the reaper counters on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Reclaimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fastpluggy_broker_orphans_reclaimed_total",
			Help: "Orphaned running messages requeued by the reaper (process-local). Expected after a crash; a steady stream is not.",
		}),
		DeadLettered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fastpluggy_broker_orphans_dead_lettered_total",
			Help: "Orphaned messages dead-lettered by the reaper once orphaned orphan_max_attempts times: poison tasks retired (process-local).",
		}),
		Skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fastpluggy_broker_orphan_reclaim_skipped_total",
			Help: "Reaper refusals by a fail-closed guard (process-local). Rising means orphans are NOT being recovered.",
		}),
	}
	reg.MustRegister(m.Reclaimed, m.DeadLettered, m.Skipped)
	return m
}

// Reaper runs passes for one worker process.
type Reaper struct {
	b        broker.Broker
	self     string
	settings Settings
	log      hclog.Logger
	metrics  *Metrics
}

// New returns a reaper acting as worker self. metrics may be nil.
func New(b broker.Broker, self string, s Settings, log hclog.Logger, metrics *Metrics) *Reaper {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Reaper{b: b, self: self, settings: s, log: log, metrics: metrics}
}

// Pass runs one reclaim pass and says what it did. It is what an operator
// triggers; the beat uses PassAsLeader.
func (r *Reaper) Pass(ctx context.Context) Result { return r.pass(ctx, nil) }

// PassAsLeader runs a pass as a leader-only write under fence: if the
// lease has moved on, the broker refuses it and nothing changes.
func (r *Reaper) PassAsLeader(ctx context.Context, fence broker.Fence) Result {
	return r.pass(ctx, &fence)
}

func (r *Reaper) pass(ctx context.Context, fence *broker.Fence) Result {
	rec, ok := r.b.(broker.OrphanReclaimer)
	if !ok {
		return Result{Unsupported: true, Reason: fmt.Sprintf("the %s broker cannot orphan anything: its messages and locks die with the process", r.b.Kind())}
	}
	live, err := rec.LiveWorkers(ctx, r.settings.After)
	if err != nil {
		return r.skip(GuardLiveSetUnreadable, fmt.Sprintf("the live-worker set could not be read (%v); a failed query must not read as nobody is alive", err))
	}
	if len(live) == 0 {
		return r.skip(GuardLiveSetEmpty, "the live-worker set is empty while this process is alive: the liveness signal is broken, not the fleet dead")
	}
	if !slices.Contains(live, r.self) {
		return r.skip(GuardCallerNotLive, fmt.Sprintf("this worker (%s) is not in the live set: heartbeats are not being written, or clocks disagree, so every worker may look dead", r.self))
	}
	res, err := rec.ReclaimOrphans(ctx, broker.ReclaimRequest{Live: live, Grace: r.settings.Grace, MaxAttempts: r.settings.MaxAttempts, Fence: fence})
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return Result{Reason: "cancelled"}
		}
		if errors.Is(err, broker.ErrNotLeader) {
			// Not a guard: leadership moved on, and the new leader reaps.
			r.log.Warn("reaper pass refused: this process no longer leads", "term", fence.Term)
			return Result{NotLeader: true, Reason: "this process is no longer the beat leader"}
		}
		return r.skip(GuardReclaimFailed, fmt.Sprintf("the reclaim transaction failed and was rolled back: %v", err))
	}
	out := Result{ReclaimResult: res}
	if r.metrics != nil {
		r.metrics.Reclaimed.Add(float64(res.Reclaimed))
		r.metrics.DeadLettered.Add(float64(res.DeadLettered))
		if r.metrics.Cancelled != nil {
			r.metrics.Cancelled.Add(float64(res.Cancelled))
		}
	}
	if res.WithinGrace > 0 {
		// The grace guard refused part of the pass: say so and count it,
		// like the other guards.
		r.log.Error("reaper left orphans alone: claimed less than the grace ago",
			"guard", string(GuardWithinGrace), "count", res.WithinGrace, "grace", r.settings.Grace.String())
		if r.metrics != nil {
			r.metrics.Skipped.Inc()
		}
	}
	if res.Reclaimed+res.DeadLettered+res.Cancelled+res.LocksReleased > 0 {
		r.log.Warn("reaper reclaimed orphans of dead workers", "reclaimed", res.Reclaimed,
			"dead_lettered", res.DeadLettered, "cancelled", res.Cancelled, "locks_released", res.LocksReleased, "ids", fmt.Sprint(res.IDs))
	}
	return out
}

// ReclaimDead takes back at once what the named workers left: their
// running messages go back to the queue (or are dead-lettered past
// MaxAttempts, or end cancelled when their cancel was requested) and their
// locks are released, whatever their age. It is for workers whose process
// is known to have ended: its parent saw it exit (the host tells a
// plugin's next process which of its processes ended,
// capability.EndedEnv). A worker that is merely silent is the pass's to
// judge, never this.
//
// No guard of the pass applies, and none is run. The live-set guards
// (unreadable, empty, caller not in it) keep a broken liveness signal from
// making live workers look dead; nothing here is inferred from heartbeats,
// so no live set is read. The grace keeps a worker that just claimed, and
// has not heartbeaten yet, from losing its claim; a worker known dead
// claims nothing more, and its newest claim is as orphaned as its oldest.
// MaxAttempts still applies: a task that kills its process is retired as
// it is by a pass.
//
// The counters are the pass's. A failure (ErrUnsupported when the broker
// cannot reclaim by worker) changes nothing and is not counted as a
// skip: no guard refused, and the passes recover the same work later.
func (r *Reaper) ReclaimDead(ctx context.Context, workers []string) (Result, error) {
	dr, ok := r.b.(broker.DeadReclaimer)
	if !ok {
		return Result{}, fmt.Errorf("the %s broker does not reclaim by worker: %w", r.b.Kind(), errors.ErrUnsupported)
	}
	res, err := dr.ReclaimDead(ctx, broker.ReclaimRequest{Dead: workers, MaxAttempts: r.settings.MaxAttempts})
	if err != nil {
		return Result{}, fmt.Errorf("reclaim the work of dead workers %v: %w", workers, err)
	}
	if r.metrics != nil {
		r.metrics.Reclaimed.Add(float64(res.Reclaimed))
		r.metrics.DeadLettered.Add(float64(res.DeadLettered))
		if r.metrics.Cancelled != nil {
			r.metrics.Cancelled.Add(float64(res.Cancelled))
		}
	}
	if res.Reclaimed+res.DeadLettered+res.Cancelled+res.LocksReleased > 0 {
		r.log.Info("reclaimed the work of dead workers", "workers", fmt.Sprint(workers), "reclaimed", res.Reclaimed,
			"dead_lettered", res.DeadLettered, "cancelled", res.Cancelled, "locks_released", res.LocksReleased, "ids", fmt.Sprint(res.IDs))
	}
	return Result{ReclaimResult: res}, nil
}

func (r *Reaper) skip(g Guard, reason string) Result {
	r.log.Error("reaper failed closed: reclaimed nothing", "guard", string(g), "reason", reason)
	if r.metrics != nil {
		r.metrics.Skipped.Inc()
	}
	return Result{Skipped: g, Reason: reason}
}
