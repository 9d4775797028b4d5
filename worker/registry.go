package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// DefaultTopic is the topic of a task that names none.
//
// Deprecated: use broker.DefaultTopic, which this names.
const DefaultTopic = broker.DefaultTopic

// CheckTaskName reports whether name can name a task.
//
// Deprecated: use broker.CheckTaskName, which this calls.
func CheckTaskName(name string) error { return broker.CheckTaskName(name) }

// What a task does when its lock is held by another message.
const (
	// LockSkip ends the message as done with the result
	// {"skipped":"lock held"}: the run is dropped.
	LockSkip = "skip"
	// LockRequeue puts the message back in the queue for
	// Task.LockRetryDelay.
	LockRequeue = "requeue"
)

// DefaultLockRetryDelay is the requeue delay of LockRequeue.
const DefaultLockRetryDelay = 5 * time.Second

// Func runs one attempt of a task. Its result is stored as JSON: a
// json.RawMessage as it is, any other value through encoding/json. It must
// return soon after ctx is cancelled: that is how a stopping pool takes its
// work back.
type Func func(ctx context.Context, tc *TaskContext) (any, error)

// Task is the definition of a task.
type Task struct {
	// Name is what a message's task field names, such as "demo.echo".
	Name string
	// Description is for people.
	Description string
	// Topic is where messages of this task go when the submitter names
	// none; "" means broker.DefaultTopic.
	Topic string
	// MaxAttempts bounds error retries: 1 (the default) means no retry.
	// A message submitted with its own max_attempts overrides it.
	MaxAttempts int
	// Backoff is the requeue delay after failed attempt n (1-based); nil
	// means 1s*2^(n-1), capped at 5 minutes.
	Backoff func(attempt int) time.Duration
	// Timeout bounds one attempt; 0 means none. An attempt that runs out
	// of time fails like one that returned an error.
	Timeout time.Duration
	// NonConcurrent runs one message of this task at a time, across every
	// worker sharing the broker: the task name is the lock name.
	NonConcurrent bool
	// LockKey, when set, names the lock from the payload (so "one at a
	// time per customer" is possible). It overrides the task name; an
	// empty key means no lock for that message.
	LockKey func(payload json.RawMessage) string
	// OnLockConflict is LockSkip (the default) or LockRequeue.
	OnLockConflict string
	// LockRetryDelay is LockRequeue's delay; 0 means
	// DefaultLockRetryDelay.
	LockRetryDelay time.Duration
	// Handler does the work.
	Handler Func
	// Offload says the handler only waits for work done in another
	// process (a provider plugin's task, which bounds its own
	// concurrency): while Options.OffloadSlots has room, the pool runs
	// such an attempt on a goroutine of its own, without holding one of
	// its Concurrency workers, which go on to the next message.
	Offload bool
}

// BackoffFor returns the requeue delay after failed attempt n.
func (t Task) BackoffFor(attempt int) time.Duration {
	if t.Backoff != nil {
		d := t.Backoff(attempt)
		if d < 0 {
			return 0
		}
		return d
	}
	return DefaultBackoff(attempt)
}

// RetryAfter wraps err so that, when the attempt is retried, it waits at
// least d, whatever the task's backoff says: a handler that knows its
// failure needs time to pass (a service restarting, a rate limit) says so.
func RetryAfter(err error, d time.Duration) error {
	return &retryAfterError{err: err, after: d}
}

type retryAfterError struct {
	err   error
	after time.Duration
}

func (e *retryAfterError) Error() string { return e.err.Error() }
func (e *retryAfterError) Unwrap() error { return e.err }

// retryDelay is the delay before retrying after failed attempt n that
// ended with err: the task's backoff, or longer when err asks for it
// (RetryAfter).
func (t Task) retryDelay(attempt int, err error) time.Duration {
	d := t.BackoffFor(attempt)
	var ra *retryAfterError
	if errors.As(err, &ra) {
		d = max(d, ra.after)
	}
	return d
}

// DefaultBackoff is 1s*2^(attempt-1), capped at 5 minutes.
func DefaultBackoff(attempt int) time.Duration {
	const limit = 5 * time.Minute
	if attempt < 1 {
		attempt = 1
	}
	if attempt > 10 { // 2^9 s is already past the cap
		return limit
	}
	d := time.Second << (attempt - 1)
	if d > limit {
		return limit
	}
	return d
}

// lockName returns the lock a message of t must hold, or "".
func (t Task) lockName(payload json.RawMessage) string {
	if t.LockKey != nil {
		if k := t.LockKey(payload); k != "" {
			return k
		}
		if !t.NonConcurrent {
			return ""
		}
	}
	if t.NonConcurrent {
		return t.Name
	}
	return ""
}

// ErrDuplicateTask is returned by Register for a name already taken.
var ErrDuplicateTask = errors.New("task already registered")

// Registry holds task definitions. It is safe for concurrent use.
type Registry struct {
	mu    sync.RWMutex
	tasks map[string]Task
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{tasks: map[string]Task{}} }

// Register adds t after filling in its defaults. It refuses a duplicate
// name, a bad name or topic, a negative MaxAttempts, an unknown
// OnLockConflict and a missing handler.
func (r *Registry) Register(t Task) error {
	switch {
	case t.Name == "":
		return errors.New("register task: the name is empty")
	case len(t.Name) > broker.MaxTaskLen:
		return fmt.Errorf("register task %.40q...: the name is %d bytes long, the limit is %d", t.Name, len(t.Name), broker.MaxTaskLen)
	case broker.CheckTaskName(t.Name) != nil: // its characters: the cases above check the rest
		return fmt.Errorf("register task %q: a name may hold only letters, digits and _ . : / - (and not start with a punctuation mark)", t.Name)
	case t.Handler == nil:
		return fmt.Errorf("register task %q: no handler", t.Name)
	case t.MaxAttempts < 0:
		return fmt.Errorf("register task %q: max attempts is negative (%d); use 1 for no retry", t.Name, t.MaxAttempts)
	case t.Timeout < 0:
		return fmt.Errorf("register task %q: timeout is negative", t.Name)
	case t.LockRetryDelay < 0:
		return fmt.Errorf("register task %q: lock retry delay is negative", t.Name)
	}
	if t.Topic == "" {
		t.Topic = broker.DefaultTopic
	}
	if err := broker.ValidateTopicName(t.Topic); err != nil {
		return fmt.Errorf("register task %q: %w", t.Name, err)
	}
	if t.MaxAttempts == 0 {
		t.MaxAttempts = 1
	}
	switch t.OnLockConflict {
	case "":
		t.OnLockConflict = LockSkip
	case LockSkip, LockRequeue:
	default:
		return fmt.Errorf("register task %q: on lock conflict is %q; use %q or %q", t.Name, t.OnLockConflict, LockSkip, LockRequeue)
	}
	if t.LockRetryDelay == 0 {
		t.LockRetryDelay = DefaultLockRetryDelay
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.tasks[t.Name]; dup {
		return fmt.Errorf("register task %q: %w", t.Name, ErrDuplicateTask)
	}
	r.tasks[t.Name] = t
	return nil
}

// MustRegister is Register for definitions known at compile time; it
// panics on error.
func (r *Registry) MustRegister(t Task) {
	if err := r.Register(t); err != nil {
		panic(err)
	}
}

// Lookup returns the task named name, with its defaults filled in.
func (r *Registry) Lookup(name string) (Task, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	t, ok := r.tasks[name]
	return t, ok
}

// Tasks lists the registered tasks by name.
func (r *Registry) Tasks() []Task {
	r.mu.RLock()
	out := make([]Task, 0, len(r.tasks))
	for _, t := range r.tasks {
		out = append(out, t)
	}
	r.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Names lists the registered task names, sorted.
func (r *Registry) Names() []string {
	tasks := r.Tasks()
	out := make([]string, len(tasks))
	for i, t := range tasks {
		out[i] = t.Name
	}
	return out
}

// Topics lists the topics of the registered tasks, sorted, without
// duplicates.
func (r *Registry) Topics() []string {
	seen := map[string]bool{}
	for _, t := range r.Tasks() {
		seen[t.Topic] = true
	}
	return sortedKeys(seen)
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
