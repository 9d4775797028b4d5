// Package service is the task system's operations as plain Go functions:
// submitting a task and placing it on its topic, schedules, topics,
// locks, dead letters, requeue, cancel, purge, drain and the orphan reclaim. The
// tasks_worker JSON API, its web UI (package ui), the config's schedules,
// the beat's schedule firing and the plugin's actions all go through one
// Service, so they check and do exactly the same things.
//
// Each call takes Go values and returns Go values and errors: a refusal
// of the service's own is a *Problem (errors.Is it against ErrInvalid,
// ErrConflict or ErrUnavailable); a broker's failure comes back as the
// broker gave it (errors.Is it against broker.ErrInvalid, ErrNotFound,
// ErrClosed). The API maps them to HTTP statuses, the UI to messages.
//
// The service reads the running worker through small interfaces (Tasks,
// Pool, Fleet, Leader) that the plugin fills with package worker's and
// package scheduler's types, so that neither the service nor the UI over
// it links the worker or the beat.
//
// This file holds the Service type and its read-only views of the
// running worker.
package service

import (
	"context"
	"strconv"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/reaper"
)

// BodySlack is what a request body (a JSON body or a form) may hold
// besides its payload.
const BodySlack = 64 << 10

// MessageStates are the states a message may be in, as filters name them.
var MessageStates = []string{broker.StateQueued, broker.StateRunning, broker.StateDone, broker.StateFailed, broker.StateDead, broker.StateCancelled}

// ReportStatuses are the statuses a task report may have.
var ReportStatuses = broker.ReportStatuses

// Settings are the parts of the plugin's config the service reads.
type Settings struct {
	// MaxPayloadBytes bounds a submitted payload (max_payload_bytes).
	MaxPayloadBytes int
	// Beat: this process is a candidate for the beat.
	Beat bool
	// HeartbeatInterval is how often the worker's row is stamped.
	HeartbeatInterval time.Duration
	// Reaper holds the orphan_* settings.
	Reaper reaper.Settings
}

// Tasks are the tasks registered in this process (package worker's
// Registry).
type Tasks interface {
	// Lookup is the task registered under name.
	Lookup(name string) (TaskInfo, bool)
	// Names are the names of the registered tasks, sorted.
	Names() []string
}

// Pool is this process's worker pool (package worker's Pool).
type Pool interface {
	// WorkerID is the id the pool registers under.
	WorkerID() string
	// Topics are the topics it claims from.
	Topics() []string
	// Running is how many tasks it runs now.
	Running() int
	// Concurrency is how many tasks it may run at once.
	Concurrency() int
	// LastHeartbeat is when its worker last stamped its heartbeat, and
	// the error of the last stamp, if it failed.
	LastHeartbeat() (time.Time, error)
	// Wake makes it claim at once: a topic may have work.
	Wake()
}

// Fleet is this worker's view of the other live workers that share its
// broker (package worker's Fleet, the pool's).
type Fleet interface {
	// RunsElsewhere says whether a live worker other than this one runs
	// task and claims from topic, or the error reading the broker's
	// worker list.
	RunsElsewhere(task, topic string) (bool, error)
}

// Leader is the beat's leader election of this process (package
// scheduler's Leader).
type Leader interface {
	// Fence is the fence of the current term while this process leads.
	Fence() (broker.Fence, bool)
}

// Deps is what one running tasks_worker is made of. Each is required,
// but for the hooks that say they may be nil.
type Deps struct {
	Broker   broker.Broker
	Tasks    Tasks
	Pool     Pool
	Fleet    Fleet // which tasks other live workers run: the pool's
	Reaper   *reaper.Reaper
	Settings Settings
	// Submitted counts a message submitted to topic; may be nil.
	Submitted func(topic string)
	// Cancelled counts n queued messages of topic ("" when unknown) that
	// a cancel ended; may be nil. (Running ones that end cancelled are
	// counted by the pool's observer.)
	Cancelled func(topic string, n int)
	// OnCancelRequested is called after the cancel of running message id
	// was requested, to stop it at once if this process runs it; may be
	// nil.
	OnCancelRequested func(id int64)
}

// Service is the task system of one running tasks_worker (one Configure):
// a new configuration makes a new Service.
type Service struct {
	b         broker.Broker
	reg       Tasks
	pool      Pool
	fleet     Fleet // who else runs a task
	reaper    *reaper.Reaper
	leader    Leader           // nil: none (SetLeader)
	pending   PendingProviders // nil: none (SetPendingProviders)
	settings  Settings
	submitted func(topic string)

	cancelledHook     func(topic string, n int)
	onCancelRequested func(id int64)
}

// New returns the service over d.
func New(d Deps) *Service {
	s := &Service{b: d.Broker, reg: d.Tasks, pool: d.Pool, fleet: d.Fleet, reaper: d.Reaper, settings: d.Settings, submitted: d.Submitted,
		cancelledHook: d.Cancelled, onCancelRequested: d.OnCancelRequested}
	if s.submitted == nil {
		s.submitted = func(string) {}
	}
	return s
}

// SetLeader names the beat's leader election of this process (none by
// default). Call it before the service is used.
func (s *Service) SetLeader(l Leader) { s.leader = l }

// Settings are the config's settings the service runs with.
func (s *Service) Settings() Settings { return s.settings }

// Kind is the broker's kind: memory, local, postgres or rabbitmq.
func (s *Service) Kind() string { return s.b.Kind() }

// WorkerID is this process's worker id.
func (s *Service) WorkerID() string { return s.pool.WorkerID() }

// Served are the topics this worker claims from.
func (s *Service) Served() []string { return s.pool.Topics() }

// Running is how many tasks run in this process now.
func (s *Service) Running() int { return s.pool.Running() }

// Concurrency is how many tasks may run in this process at once.
func (s *Service) Concurrency() int { return s.pool.Concurrency() }

// LastHeartbeat is when this worker last stamped its heartbeat, and the
// error of the last stamp, if it failed.
func (s *Service) LastHeartbeat() (time.Time, error) { return s.pool.LastHeartbeat() }

// TaskNames are the names of the tasks registered here, sorted.
func (s *Service) TaskNames() []string { return s.reg.Names() }

// TaskInfo is what the UI shows of a task registered here.
type TaskInfo struct {
	Name        string
	Description string // for people
	Topic       string // where its messages go when the submitter names none
	MaxAttempts int    // the attempt limit of its messages that name none
}

// Tasks are the tasks registered here, sorted by name.
func (s *Service) Tasks() []TaskInfo {
	names := s.reg.Names()
	out := make([]TaskInfo, 0, len(names))
	for _, name := range names {
		if t, ok := s.reg.Lookup(name); ok {
			out = append(out, t)
		}
	}
	return out
}

// Task is the task registered here under name.
func (s *Service) Task(name string) (TaskInfo, bool) {
	t, ok := s.reg.Lookup(name)
	if !ok {
		return TaskInfo{}, false
	}
	return t, true
}

// MaxAttempts is m's attempt limit: its own, or its task's default when
// it has none and the task is registered here.
func (s *Service) MaxAttempts(m broker.Message) int {
	if m.MaxAttempts == 0 {
		if t, ok := s.reg.Lookup(m.Task); ok {
			return t.MaxAttempts
		}
	}
	return m.MaxAttempts
}

// BeatState says whether this process leads the beat, and at which term.
type BeatState struct {
	Enabled   bool // the config makes this process a beat candidate
	Candidate bool // it runs for leader (its broker can elect one)
	Leader    bool
	Term      int64
}

// Beat is the state of this process's beat.
func (s *Service) Beat() BeatState {
	st := BeatState{Enabled: s.settings.Beat, Candidate: s.leader != nil}
	if s.leader != nil {
		f, ok := s.leader.Fence()
		st.Leader, st.Term = ok, f.Term
	}
	return st
}

// ReclaimsOrphans says whether the broker can reclaim orphaned messages.
func (s *Service) ReclaimsOrphans() bool {
	_, ok := s.b.(broker.OrphanReclaimer)
	return ok
}

// Stats are the broker's counts, by topic.
func (s *Service) Stats(ctx context.Context) (broker.Stats, error) { return s.b.Stats(ctx) }

// Topics are the topics' stored settings.
func (s *Service) Topics(ctx context.Context) ([]broker.TopicConfig, error) { return s.b.Topics(ctx) }

// Workers are the workers the broker knows.
func (s *Service) Workers(ctx context.Context) ([]broker.WorkerInfo, error) { return s.b.Workers(ctx) }

// LiveWorkers are the ids of the workers whose heartbeat is fresher than
// orphan_reclaim_after_seconds, by the broker's clock; known is false
// when the broker cannot tell (then every listed worker counts as live).
func (s *Service) LiveWorkers(ctx context.Context) (live []string, known bool, err error) {
	rec, ok := s.b.(broker.OrphanReclaimer)
	if !ok {
		return nil, false, nil
	}
	live, err = rec.LiveWorkers(ctx, s.settings.Reaper.After)
	return live, true, err
}

// LiveWorkerCount is the number of live workers, as Stats counts them,
// read at a cost that follows the workers alone, never the queue: what a
// health check reads. A broker that cannot list its live workers (memory)
// answers from its Stats, which count nothing stored.
func (s *Service) LiveWorkerCount(ctx context.Context) (int, error) {
	live, known, err := s.LiveWorkers(ctx)
	if err != nil {
		return 0, err
	}
	if known {
		return len(live), nil
	}
	st, err := s.b.Stats(ctx)
	return st.Workers, err
}

// Locks are the locks held now.
func (s *Service) Locks(ctx context.Context) ([]broker.Lock, error) { return s.b.Locks(ctx) }

// Message is the message with id.
func (s *Service) Message(ctx context.Context, id int64) (broker.Message, error) {
	return s.b.GetMessage(ctx, id)
}

// Messages lists messages, newest first.
func (s *Service) Messages(ctx context.Context, f broker.MessageFilter) ([]broker.Message, error) {
	return s.b.ListMessages(ctx, f)
}

// Reports lists task reports, newest first.
func (s *Service) Reports(ctx context.Context, f broker.ReportFilter) ([]broker.Report, error) {
	return s.b.ListReports(ctx, f)
}

// Report is the task report with id.
func (s *Service) Report(ctx context.Context, id int64) (broker.Report, error) {
	return s.b.GetReport(ctx, id)
}

// Reclaim runs one orphan-reclaim pass now.
func (s *Service) Reclaim(ctx context.Context) reaper.Result { return s.reaper.Pass(ctx) }

// ParseID reads a task or report id: a positive whole number written
// plainly (not "+1" or "01", which name the same id another way).
func ParseID(raw string) (int64, bool) {
	id, err := strconv.ParseInt(raw, 10, 64)
	return id, err == nil && id > 0 && strconv.FormatInt(id, 10) == raw
}
