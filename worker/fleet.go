package worker

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
)

// elsewhereTTL is how long a Fleet keeps its view of which tasks other
// live workers run.
const elsewhereTTL = 5 * time.Second

// Fleet is one worker's view of the other live workers that share its
// broker: which tasks they run, on which topics. Several hosts on one
// broker need not run the same plugins or claim the same topics, so a
// message of a task this worker does not run may still have a worker. The
// pool asks it about the messages it claims of tasks it does not run (see
// Options.UnknownTaskWait); the tasks_worker service asks it where a
// client's task may go. Get it from Pool.Fleet. It is safe for concurrent
// use.
type Fleet struct {
	b         broker.Broker
	self      string        // this worker's id, which does not count
	heartbeat time.Duration // Options.HeartbeatInterval
	log       hclog.Logger

	mu    sync.Mutex
	tasks map[taskTopic]bool // what live workers elsewhere run
	at    time.Time          // when tasks was read
}

// taskTopic is a task a worker runs and a topic it claims from.
type taskTopic struct{ task, topic string }

func newFleet(b broker.Broker, self string, heartbeat time.Duration, log hclog.Logger) *Fleet {
	return &Fleet{b: b, self: self, heartbeat: heartbeat, log: log}
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
func (f *Fleet) RunsElsewhere(task, topic string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.tasks == nil || time.Since(f.at) >= elsewhereTTL {
		tasks, err := f.read()
		if err != nil {
			f.log.Warn("could not read which tasks other workers run", "task", task, "error", err)
			return false, err
		}
		f.tasks, f.at = tasks, time.Now()
	}
	return f.tasks[taskTopic{task, topic}], nil
}

// read reads from the broker which tasks the other live workers run, on
// which topics.
func (f *Fleet) read() (map[taskTopic]bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), brokerCallTimeout)
	defer cancel()
	ws, err := f.b.Workers(ctx)
	if err != nil {
		return nil, err
	}
	var live []string
	r, canTell := f.b.(broker.OrphanReclaimer)
	if canTell {
		if live, err = r.LiveWorkers(ctx, max(3*f.heartbeat, 15*time.Second)); err != nil {
			return nil, err
		}
	}
	tasks := map[taskTopic]bool{}
	for _, w := range ws {
		if w.ID == f.self || (canTell && !slices.Contains(live, w.ID)) {
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
