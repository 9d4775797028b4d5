package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// External is what a SQL store offers a broker whose messages travel
// outside it (broker/rabbitmq), for which the store keeps each message's
// row (its state, its claim and token, its unique key), the outbox of
// messages still to be published, and everything else a Broker keeps.
//
// The row is the fence: a delivery from outside runs only once
// TakeMessages has made its row running with a fresh token, and an outcome lands only
// through the store's own token-checked Ack, Nack and DeadLetter.
type External interface {
	// StoreID returns the store's identity, the same for every process
	// that uses the store (see Store.StoreID). A message's id means
	// something only in the store that made it: the broker stamps its
	// messages with this id and takes only its own.
	StoreID(ctx context.Context) (string, error)

	// The outbox entries a writer arms carry its arm (see OutboxEntry):
	// OutboxDone deletes an entry only while it carries the arm of the
	// publish it follows, so an entry armed again meanwhile (its queue was
	// lost, its message requeued, another process leased it) stays.
	//
	// SubmitOutbox stores reqs as SubmitBatch does (the same validation,
	// unique keys and answers) and, in the same transaction, puts each
	// stored message in the outbox with arm: due at lease from now when it
	// is available at once (its submitter publishes it and calls
	// OutboxDone), else when it becomes available.
	SubmitOutbox(ctx context.Context, reqs []broker.SubmitRequest, lease time.Duration, arm int64) ([]broker.Submitted, error)
	// OutboxAdd puts messages ids in the outbox with arm, due after delay
	// (an entry already there takes the earlier time, and arm).
	OutboxAdd(ctx context.Context, ids []int64, delay time.Duration, arm int64) error
	// OutboxAddQueued puts every queued message of topic submitted at
	// least age ago in the outbox, due when it is available (at once when
	// it is already), armed by no one (arm 0: the publisher loop's), and
	// counts them: for a topic whose messages outside were lost.
	OutboxAddQueued(ctx context.Context, topic string, age time.Duration) (int, error)
	// QueuedOutside reads up to limit queued rows of topic, in the order
	// of its queued index (priority, then availability, then id), and
	// returns the ids of those that should be outside the store now, in
	// that order: available for at least age, and without an outbox entry
	// (their publish was confirmed, or they are not due yet); and how many
	// rows it read. A look costs what it may return, however long the
	// queue. Within a priority the available rows come first; rows passed
	// over (delayed, or with an entry) count toward limit.
	QueuedOutside(ctx context.Context, topic string, age time.Duration, limit int) (ids []int64, read int, err error)
	// OutboxDue takes up to limit outbox entries that are due: entries of
	// available queued messages move lease ahead with arm (so that no
	// other process takes them meanwhile) and are returned, to publish;
	// entries of queued messages not available yet move to when they are;
	// entries of running messages move lease ahead; entries of messages
	// that ended or are gone are deleted.
	OutboxDue(ctx context.Context, lease time.Duration, limit int, arm int64) ([]OutboxEntry, error)
	// OutboxDone deletes the outbox entries of published messages: each
	// entry whose message id still carries the entry's Arm.
	OutboxDone(ctx context.Context, published []OutboxEntry) error
	// TakeMessages decides deliveries to worker, in order, in one
	// transaction (see Take; the takes before a delivery count toward its
	// topic's limit): with TakeOK the message is running under a fresh
	// token, claimed by worker, one attempt more, and returned with its
	// token. It returns one Taken per delivery. A running row taken again
	// is logged (see TakeOrphanLog).
	TakeMessages(ctx context.Context, worker string, ds []Delivery) ([]Taken, error)
	// TakeOrphanLog returns and forgets what happened to dead workers'
	// messages outside the store since it was last called: the ids of
	// messages taken again from a redelivery (TakeMessages of a running
	// row) and of those EndUndeliverable ended.
	TakeOrphanLog(ctx context.Context) (reclaimed, deadLettered []int64, err error)
	// Admits returns how many more messages each of topics admits now
	// (see Admits). Unknown topics are left out (they admit none).
	Admits(ctx context.Context, topics []string) (map[string]int, error)
	// EndUndeliverable ends message id dead with reason when it is queued
	// or running (its deliveries ran out outside: a worker died holding it
	// each time), releasing the locks of its claim, and logs it (see
	// TakeOrphanLog); it reports whether it did.
	EndUndeliverable(ctx context.Context, id int64, reason string) (bool, error)
}

// Delivery is a message that arrived from outside: its id, and whether
// it was delivered before (its holder's channel closed).
type Delivery struct {
	ID          int64
	Redelivered bool
}

// Taken is what a take did with one delivery.
type Taken struct {
	Message broker.Message // with TakeOK
	Verdict Verdict
}

// TopicFacts are a topic's facts as a batch of takes reads them once:
// Running counts the takes of the batch too.
type TopicFacts struct {
	Paused         bool
	Limit, Running int
}

// OutboxEntry is a message to publish, or one published.
type OutboxEntry struct {
	ID    int64
	Topic string
	// Arm marks who armed the entry last: a submit, a requeue or a lease
	// of the publisher loop (a random number of its own), or no one (0).
	Arm int64
}

// Verdict is what TakeMessages did with a delivery.
type Verdict int

const (
	// TakeOK: the message is running under the new claim.
	TakeOK Verdict = iota
	// TakeDrop: the delivery is stale (its message ended, or a live claim
	// holds it: the delivery is a duplicate): it is to be dropped.
	TakeDrop
	// TakeWait: the message is queued but not available yet (requeued
	// with a delay, or published early): the delivery is to be dropped
	// once the message has an outbox entry, which publishes it when due.
	TakeWait
	// TakeLater: the message is queued but its topic takes nothing now
	// (paused, or at its concurrency limit): the delivery is to go back
	// to the end of the queue.
	TakeLater
	// TakeGone: the store has no message row of that id. The message
	// ended and its row was cleared (postgres keeps done messages in
	// batches, the local store drops its oldest finished ones), or was
	// purged; or the delivery is not this store's, which only its
	// publisher's stamp can tell (see broker/rabbitmq).
	TakeGone
)

func (v Verdict) String() string {
	switch v {
	case TakeOK:
		return "taken"
	case TakeDrop:
		return "dropped"
	case TakeWait:
		return "wait"
	case TakeLater:
		return "later"
	case TakeGone:
		return "gone"
	}
	return fmt.Sprintf("verdict(%d)", int(v))
}

// TakeFacts are what a store reads, in the transaction of a take, about
// the message and its topic (TopicFacts).
type TakeFacts struct {
	Found       bool // the message exists
	State       string
	Available   bool // its available_at is not after now
	Paused      bool
	Limit       int // its topic's concurrency limit (0: none)
	Running     int // its topic's running messages (read when Limit > 0)
	Redelivered bool
}

// Take is the rule of TakeMessages, written once for every store:
//
//   - a queued message that is available is taken, unless its topic is
//     paused or at its limit (TakeLater);
//   - a queued message that is not available yet waits (TakeWait): its
//     outbox entry publishes it again when it is due;
//   - a running message is taken again only by a redelivery (its holder's
//     channel closed, so RabbitMQ brought the delivery back): the old
//     claim ends, and its holder's late outcome is refused with
//     broker.ErrClaimLost. The slot of the topic passes from the old
//     claim to the new one, so the limit is not checked. A running
//     message met by a first delivery is a duplicate and is dropped;
//   - a finished message is dropped;
//   - a message without a row is gone (TakeGone), which its caller tells
//     apart from a drop: a row deleted after it ended, or a delivery that
//     is not this store's.
func Take(f TakeFacts) Verdict {
	switch {
	case !f.Found:
		return TakeGone
	case f.State == broker.StateRunning:
		if f.Redelivered {
			return TakeOK
		}
		return TakeDrop
	case f.State != broker.StateQueued:
		return TakeDrop
	case !f.Available:
		return TakeWait
	case f.Paused || f.Limit > 0 && f.Running >= f.Limit:
		return TakeLater
	}
	return TakeOK
}

// RetakenError is the last error of a running message taken again from a
// worker whose delivery came back: it starts with
// broker.OrphanedErrorPrefix, as the reaper's reclaims do.
func RetakenError(worker string, attempt int) string {
	return fmt.Sprintf(broker.OrphanedErrorPrefix+" worker %q lost its delivery during attempt %d (its connection closed); taken again from the redelivery", worker, attempt)
}

// What Admits says of a topic without a concurrency limit, and of a
// paused one.
const (
	Unlimited = -1
	Paused    = -2
)

// Admits is how many more messages a topic admits now: Paused while it is
// paused, Unlimited without a limit, else its limit less its running
// messages (never below 0).
func Admits(paused bool, limit, running int) int {
	switch {
	case paused:
		return Paused
	case limit <= 0:
		return Unlimited
	}
	return max(limit-running, 0)
}

// ScanRows is what ReadOrphanLog reads: database/sql's and pgx's rows
// alike (Rows without Close, whose form differs between them).
type ScanRows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// ReadOrphanLog splits the rows (message_id, kind) of the orphan log that
// TakeOrphanLog deletes into the messages RabbitMQ redelivered and those
// it dead-lettered.
func ReadOrphanLog(rows ScanRows) (reclaimed, deadLettered []int64, err error) {
	for rows.Next() {
		var (
			id   int64
			kind string
		)
		if err := rows.Scan(&id, &kind); err != nil {
			return nil, nil, err
		}
		if kind == "reclaimed" {
			reclaimed = append(reclaimed, id)
		} else {
			deadLettered = append(deadLettered, id)
		}
	}
	return reclaimed, deadLettered, rows.Err()
}

// AdmitsSQL reads, for the topics its condition names (the dialect's
// form of a list parameter), the facts Admits decides on: the name,
// whether paused, the limit, and the running count of a limited topic.
func AdmitsSQL(topicsIn string) string {
	return `SELECT t.name, t.paused, t.concurrency_limit,
			CASE WHEN t.concurrency_limit > 0 THEN
				(SELECT count(*) FROM tw_messages m WHERE m.topic = t.name AND m.state = 'running') ELSE 0 END
		FROM tw_topics t WHERE t.name ` + topicsIn
}

// ReadAdmits reads the rows of AdmitsSQL into out, by topic, as Admits
// decides.
func ReadAdmits(rows ScanRows, out map[string]int) error {
	for rows.Next() {
		var (
			name           string
			paused         bool
			limit, running int
		)
		if err := rows.Scan(&name, &paused, &limit, &running); err != nil {
			return err
		}
		out[name] = Admits(paused, limit, running)
	}
	return rows.Err()
}
