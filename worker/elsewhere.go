package worker

import (
	"fmt"
	"sync"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// This file owns the unknown-task policy: what the pool does with a
// message of a task it does not run. Within Options.UnknownTaskGrace of
// Start it waits for the task to be registered here; when another live
// worker runs the task, the message is requeued for that one (tasks run
// elsewhere, Fleet.RunsElsewhere); when none does, it waits up to
// Options.UnknownTaskWait for one (the wait for a worker that runs the
// task); then it fails as unknown.

// Timings of the unknown-task policy.
const (
	// unknownTaskRetry is the longest requeue delay of a message whose task
	// is not registered here yet (Options.UnknownTaskGrace).
	unknownTaskRetry = 5 * time.Second
	// elsewhereRetry is the requeue delay of a message whose task another
	// live worker runs and this one does not: short, as the message may
	// come back to a worker that does not run it a few times before one
	// that does claims it.
	elsewhereRetry = time.Second
	// unknownWaitRetry is the requeue delay of a message whose task no
	// live worker runs, while Options.UnknownTaskWait lasts.
	unknownWaitRetry = 5 * time.Second
)

// unknownTasks applies the unknown-task policy (see the file's comment)
// to the messages the pool claims of tasks its registry does not know.
type unknownTasks struct {
	fleet    *Fleet // who else runs a task
	workerID string
	grace    time.Duration // Options.UnknownTaskGrace
	wait     time.Duration // Options.UnknownTaskWait
	started  time.Time     // when the pool started (set by Start)

	mu sync.Mutex
	// since: since when this pool finds no live worker running a task on
	// a topic (see UnknownTaskWait).
	since map[taskTopic]sighting
}

// decide decides the outcome of c, a message of a task the registry does
// not know (see the file's comment).
func (u *unknownTasks) decide(c *completion, log *msgLogger) *completion {
	m := *c.msg
	// Another live worker that runs the task gets it at once, even during
	// this worker's start-up grace: holding it here for the grace would
	// only delay it, and could keep it from that worker for as long.
	runs, err := u.fleet.RunsElsewhere(m.Task, m.Topic)
	if err == nil && runs {
		u.knownAgain(m.Task, m.Topic)
		log.Info("claimed a message of a task this worker does not run but another live worker does; requeueing it for that one",
			"retry_in", elsewhereRetry.String())
		return c.notRun(elsewhereRetry, fmt.Sprintf("task %q is not registered in worker %s; another live worker runs it; requeued", m.Task, u.workerID), StatusDeferred)
	}
	if wait := u.grace - time.Since(u.started); wait > 0 {
		wait = min(wait, unknownTaskRetry)
		log.Info("claimed a message of a task not registered yet; requeueing it", "retry_in", wait.String())
		return c.notRun(wait, fmt.Sprintf("task %q is not registered in worker %s yet (it started moments ago); requeued", m.Task, u.workerID)+u.carriedWait(m), StatusDeferred).waiting(m.WaitingSince)
	}
	if err != nil {
		// Failing it over a passing error would lose it.
		return c.notRun(elsewhereRetry, fmt.Sprintf("task %q is not registered in worker %s, and which tasks other workers run could not be read (%v); requeued", m.Task, u.workerID, err)+u.carriedWait(m), StatusDeferred).waiting(m.WaitingSince)
	}
	if since, wait, first := u.waitFor(m.Task, m.Topic, unknownSinceOf(m)); wait > 0 {
		if first {
			log.Warn("no live worker runs this task: its messages wait for one (the host or plugin that runs it may be restarting) and fail as unknown if none comes",
				"wait", u.wait.String())
		}
		return c.notRun(min(wait, unknownWaitRetry), u.waitNote(m, since), StatusDeferred).waiting(&since)
	}
	log.Warn("claimed a message of an unknown task; ending it")
	return c.fail(fmt.Sprintf("unknown task %q: no task of that name is registered in worker %s", m.Task, u.workerID), false, 0)
}

// sighting is when the pool first and last found no live worker running
// a task on a topic.
type sighting struct{ first, last time.Time }

// sightingGap: a task last found unknown longer ago than this was run
// meanwhile, as far as this pool can tell (while none runs it, its
// messages come back every unknownWaitRetry, to this worker or another):
// the wait starts afresh.
const sightingGap = 2 * time.Minute

// waitFor returns since when no live worker runs task on topic, and
// how much longer its messages wait for one (Options.UnknownTaskWait),
// and whether this starts the wait. carried is the time a message says
// the wait began (see unknownSinceOf; zero for none): the wait outlives
// this process's restarts and counts what other workers saw.
func (u *unknownTasks) waitFor(task, topic string, carried time.Time) (time.Time, time.Duration, bool) {
	if u.wait <= 0 {
		return time.Time{}, 0, false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	key, now := taskTopic{task, topic}, time.Now()
	s, seen := u.since[key]
	if !seen || now.Sub(s.last) > sightingGap {
		if u.since == nil {
			u.since = map[taskTopic]sighting{}
		}
		s, seen = sighting{first: now}, false
	}
	if !carried.IsZero() && carried.Before(s.first) && now.Sub(carried) < u.wait+sightingGap {
		s.first = carried
	}
	s.last = now
	u.since[key] = s
	return s.first, u.wait - now.Sub(s.first), !seen
}

// knownAgain notes that a live worker runs task on topic (again).
func (u *unknownTasks) knownAgain(task, topic string) {
	u.mu.Lock()
	delete(u.since, taskTopic{task, topic})
	u.mu.Unlock()
}

// waitNote is the error of a message requeued to wait for a worker that
// runs its task, since since, for the people who read it (the time is
// kept in broker.Message.WaitingSince).
func (u *unknownTasks) waitNote(m broker.Message, since time.Time) string {
	return fmt.Sprintf("no live worker runs task %q on topic %q since %s; requeued to wait up to %s for one",
		m.Task, m.Topic, since.UTC().Format(time.RFC3339), u.wait)
}

// carriedWait keeps, in the error of a message requeued for another
// reason before its wait is decided (this worker's start-up grace, a
// worker list that could not be read), when its wait for a worker that
// runs its task began: "" when it was not waiting.
func (u *unknownTasks) carriedWait(m broker.Message) string {
	since := unknownSinceOf(m)
	if since.IsZero() {
		return ""
	}
	return "; before that, " + u.waitNote(m, since)
}

// unknownSinceOf returns when m's wait for a worker that runs its task
// began; zero when it is not waiting.
func unknownSinceOf(m broker.Message) time.Time {
	if m.WaitingSince == nil {
		return time.Time{}
	}
	return *m.WaitingSince
}
