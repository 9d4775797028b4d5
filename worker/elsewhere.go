package worker

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// This file owns the unknown-task policy: what the pool does with a
// message of a task it does not run. Within Options.UnknownTaskGrace of
// Start it waits for the task to be registered here; when another live
// worker runs the task, the message is requeued for that one (tasks run
// elsewhere, RunsElsewhere); when none does, it waits up to
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
	// elsewhereTTL is how long the pool keeps its view of which tasks other
	// live workers run.
	elsewhereTTL = 5 * time.Second
	// unknownWaitRetry is the requeue delay of a message whose task no
	// live worker runs, while Options.UnknownTaskWait lasts.
	unknownWaitRetry = 5 * time.Second
)

// elsewhereView is the pool's view of which tasks other live workers run,
// and of the tasks none runs.
type elsewhereView struct {
	mu    sync.Mutex
	tasks map[taskTopic]bool // what live workers elsewhere run (see RunsElsewhere)
	at    time.Time
	// unknown: since when this pool finds no live worker running a task
	// on a topic (see UnknownTaskWait).
	unknown map[taskTopic]sighting
}

// taskTopic is a task a worker runs and a topic it claims from.
type taskTopic struct{ task, topic string }

// unknownTask decides the outcome of c, a message of a task the registry
// does not know (see the file's comment).
func (p *Pool) unknownTask(c *completion, log *msgLogger) *completion {
	m := *c.msg
	// Another live worker that runs the task gets it at once, even during
	// this worker's start-up grace: holding it here for the grace would
	// only delay it, and could keep it from that worker for as long.
	runs, err := p.RunsElsewhere(m.Task, m.Topic)
	if err == nil && runs {
		p.knownAgain(m.Task, m.Topic)
		log.Info("claimed a message of a task this worker does not run but another live worker does; requeueing it for that one",
			"retry_in", elsewhereRetry.String())
		return c.notRun(elsewhereRetry, fmt.Sprintf("task %q is not registered in worker %s; another live worker runs it; requeued", m.Task, p.opts.WorkerID), StatusDeferred)
	}
	if wait := p.opts.UnknownTaskGrace - time.Since(p.startedAt); wait > 0 {
		wait = min(wait, unknownTaskRetry)
		log.Info("claimed a message of a task not registered yet; requeueing it", "retry_in", wait.String())
		return c.notRun(wait, fmt.Sprintf("task %q is not registered in worker %s yet (it started moments ago); requeued", m.Task, p.opts.WorkerID)+p.carriedWait(m), StatusDeferred).waiting(m.WaitingSince)
	}
	if err != nil {
		// Failing it over a passing error would lose it.
		return c.notRun(elsewhereRetry, fmt.Sprintf("task %q is not registered in worker %s, and which tasks other workers run could not be read (%v); requeued", m.Task, p.opts.WorkerID, err)+p.carriedWait(m), StatusDeferred).waiting(m.WaitingSince)
	}
	if since, wait, first := p.unknownWait(m.Task, m.Topic, unknownSinceOf(m)); wait > 0 {
		if first {
			log.Warn("no live worker runs this task: its messages wait for one (the host or plugin that runs it may be restarting) and fail as unknown if none comes",
				"wait", p.opts.UnknownTaskWait.String())
		}
		return c.notRun(min(wait, unknownWaitRetry), p.waitNote(m, since), StatusDeferred).waiting(&since)
	}
	log.Warn("claimed a message of an unknown task; ending it")
	return c.fail(fmt.Sprintf("unknown task %q: no task of that name is registered in worker %s", m.Task, p.opts.WorkerID), false, 0)
}

// RunsElsewhere reports whether a live worker other than this one has
// registered task and claims from topic, so that a message of it that this
// worker does not know waits for that one instead of failing as unknown
// (several hosts on one broker need not run the same plugins), or the
// error reading the broker's worker list. A worker that runs the task but
// does not claim the topic would never take the message: that does not
// count. Live is a heartbeat within three heartbeat intervals (at least
// 15s), by the broker's clock; every registered worker counts when the
// broker cannot tell (memory). The answer is kept for a few seconds.
func (p *Pool) RunsElsewhere(task, topic string) (bool, error) {
	p.elsewhere.mu.Lock()
	defer p.elsewhere.mu.Unlock()
	if p.elsewhere.tasks == nil || time.Since(p.elsewhere.at) >= elsewhereTTL {
		tasks, err := p.tasksElsewhere()
		if err != nil {
			p.log.Warn("could not read which tasks other workers run", "task", task, "error", err)
			return false, err
		}
		p.elsewhere.tasks, p.elsewhere.at = tasks, time.Now()
	}
	return p.elsewhere.tasks[taskTopic{task, topic}], nil
}

func (p *Pool) tasksElsewhere() (map[taskTopic]bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), brokerCallTimeout)
	defer cancel()
	ws, err := p.b.Workers(ctx)
	if err != nil {
		return nil, err
	}
	var live []string
	r, canTell := p.b.(broker.OrphanReclaimer)
	if canTell {
		if live, err = r.LiveWorkers(ctx, max(3*p.opts.HeartbeatInterval, 15*time.Second)); err != nil {
			return nil, err
		}
	}
	tasks := map[taskTopic]bool{}
	for _, w := range ws {
		if w.ID == p.opts.WorkerID || (canTell && !slices.Contains(live, w.ID)) {
			continue
		}
		for _, t := range w.Tasks {
			for _, topic := range w.Topics {
				tasks[taskTopic{t, topic}] = true
			}
		}
	}
	return tasks, nil
}

// sighting is when the pool first and last found no live worker running
// a task on a topic.
type sighting struct{ first, last time.Time }

// sightingGap: a task last found unknown longer ago than this was run
// meanwhile, as far as this pool can tell (while none runs it, its
// messages come back every unknownWaitRetry, to this worker or another):
// the wait starts afresh.
const sightingGap = 2 * time.Minute

// unknownWait returns since when no live worker runs task on topic, and
// how much longer its messages wait for one (Options.UnknownTaskWait),
// and whether this starts the wait. carried is the time a message says
// the wait began (see unknownSinceOf; zero for none): the wait outlives
// this process's restarts and counts what other workers saw.
func (p *Pool) unknownWait(task, topic string, carried time.Time) (time.Time, time.Duration, bool) {
	if p.opts.UnknownTaskWait <= 0 {
		return time.Time{}, 0, false
	}
	p.elsewhere.mu.Lock()
	defer p.elsewhere.mu.Unlock()
	key, now := taskTopic{task, topic}, time.Now()
	s, seen := p.elsewhere.unknown[key]
	if !seen || now.Sub(s.last) > sightingGap {
		if p.elsewhere.unknown == nil {
			p.elsewhere.unknown = map[taskTopic]sighting{}
		}
		s, seen = sighting{first: now}, false
	}
	if !carried.IsZero() && carried.Before(s.first) && now.Sub(carried) < p.opts.UnknownTaskWait+sightingGap {
		s.first = carried
	}
	s.last = now
	p.elsewhere.unknown[key] = s
	return s.first, p.opts.UnknownTaskWait - now.Sub(s.first), !seen
}

// knownAgain notes that a live worker runs task on topic (again).
func (p *Pool) knownAgain(task, topic string) {
	p.elsewhere.mu.Lock()
	delete(p.elsewhere.unknown, taskTopic{task, topic})
	p.elsewhere.mu.Unlock()
}

// waitNote is the error of a message requeued to wait for a worker that
// runs its task, since since, for the people who read it (the time is
// kept in broker.Message.WaitingSince).
func (p *Pool) waitNote(m broker.Message, since time.Time) string {
	return fmt.Sprintf("no live worker runs task %q on topic %q since %s; requeued to wait up to %s for one",
		m.Task, m.Topic, since.UTC().Format(time.RFC3339), p.opts.UnknownTaskWait)
}

// carriedWait keeps, in the error of a message requeued for another
// reason before its wait is decided (this worker's start-up grace, a
// worker list that could not be read), when its wait for a worker that
// runs its task began: "" when it was not waiting.
func (p *Pool) carriedWait(m broker.Message) string {
	since := unknownSinceOf(m)
	if since.IsZero() {
		return ""
	}
	return "; before that, " + p.waitNote(m, since)
}

// unknownSinceOf returns when m's wait for a worker that runs its task
// began; zero when it is not waiting.
func unknownSinceOf(m broker.Message) time.Time {
	if m.WaitingSince == nil {
		return time.Time{}
	}
	return *m.WaitingSince
}
