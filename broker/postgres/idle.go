package postgres

import (
	"context"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"
)

// idleTopics are the topics whose last claim in this process took
// nothing. A claim does not claim them again until a look (peekSQL) finds
// that they may hold a message to claim: a claim of a topic takes its
// lock, a row lock, so it commits with a WAL flush even when it finds
// nothing, and a pool claims from every topic it serves (the topics of all
// its tasks) at each exchange; while one of them is busy, the others'
// empty claims would multiply the exchange's commits and split its share.
// The look goes in the batch of the call's first claim, before the topic's
// lock, or, when every topic is idle, in a read of its own; a topic it
// finds may hold a message is claimed in the call's next pass. The look is
// a snapshot: what it misses was queued after it, as after a claim made at
// that instant, and the next claim looks again. A topic whose messages
// are announced (listen.go) is no longer idle.
type idleTopics struct {
	mu sync.Mutex
	m  map[string]bool
}

// peekSQL returns, of the topics $1, those that may have a message to
// claim: known, not paused, and with more queued rows than their claim
// rows hold, by their kept counts (tw_topic_counts). A topic with delayed
// messages only is returned too; its claim then finds them not yet
// available.
var peekSQL = `SELECT t.name FROM tw_topics t
	WHERE t.name = ANY ($1::text[]) AND NOT t.paused
		AND (SELECT coalesce(sum(k.queued), 0) FROM tw_topic_counts k WHERE k.topic = t.name) > ` + heldCount("t.name")

// split returns topics (in their order) less the idle ones, and the idle
// ones.
func (it *idleTopics) split(topics []string) (busy, idle []string) {
	it.mu.Lock()
	defer it.mu.Unlock()
	if len(it.m) == 0 {
		return topics, nil
	}
	busy = make([]string, 0, len(topics))
	for _, t := range topics {
		if it.m[t] {
			idle = append(idle, t)
		} else {
			busy = append(busy, t)
		}
	}
	return busy, idle
}

// peek looks at the idle topics in a read of its own and returns those
// that may have a message to claim.
func (it *idleTopics) peek(ctx context.Context, b *Broker, idle []string) ([]string, error) {
	var woke []string
	err := b.run(ctx, "claim", func(c *pgx.Conn) error {
		rows, err := c.Query(ctx, peekSQL, idle)
		if err != nil {
			return err
		}
		woke, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		return nil, err
	}
	return it.looked(idle, woke), nil
}

// looked takes the topics a look found may have a message (woke) out of
// the idle ones, and returns them in the order of idle.
func (it *idleTopics) looked(idle, woke []string) []string {
	if len(woke) == 0 {
		return nil
	}
	it.mu.Lock()
	defer it.mu.Unlock()
	out := make([]string, 0, len(woke))
	for _, t := range idle {
		if slices.Contains(woke, t) {
			delete(it.m, t)
			out = append(out, t)
		}
	}
	return out
}

// heard takes topic out of the idle ones: messages of it were announced,
// so the next claim claims it without a look first.
func (it *idleTopics) heard(topic string) {
	it.mu.Lock()
	defer it.mu.Unlock()
	delete(it.m, topic)
}

// claimed records that a claim of topic took something (busy) or nothing.
func (it *idleTopics) claimed(topic string, busy bool) {
	it.mu.Lock()
	defer it.mu.Unlock()
	if busy {
		delete(it.m, topic)
		return
	}
	if it.m == nil {
		it.m = make(map[string]bool)
	}
	it.m[topic] = true
}
