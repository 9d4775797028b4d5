package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// This file owns how a claim takes deliveries from a topic queue.
//
// A basic.get on a quorum queue is a Raft command of its own (about a
// millisecond each), while a consumer's deliveries stream. So a claim
// takes a topic's first delivery by basic.get, which also says how many
// messages are ready behind it; when that is batchMin or more, the rest
// of the topic's share comes as one batch through a short-lived consumer
// whose prefetch is the batch's size, and the claim asks no more of the
// topic. The claim waits for the batch, then cancels the consumer and
// reads every delivery it was sent (after basic.cancel-ok there are no
// more). When no delivery came for a while (batchWait for the first,
// batchGap for each next one) other processes took some of what was
// ready, or RabbitMQ was slow: the claim goes on with gets, which take
// what is still there. So a claim holds only the deliveries it takes,
// sees every message the queue held for it, and nothing waits in a buffer
// of this process.
//
// A cancelled consumer keeps its deliveries until they are acked: the
// running messages stay held by this process's connection, and come back
// when it closes.

// Tuning of the batches.
const (
	// batchMin is the least number of deliveries taken as a batch; fewer
	// are taken by basic.get one by one.
	batchMin = 3
	// batchWait bounds the wait for a batch's first delivery, and
	// batchGap the wait for each next one: another process may take some
	// of the messages that were ready.
	batchWait = 100 * time.Millisecond
	batchGap  = 10 * time.Millisecond
)

// maxDropsPerTake bounds the foreign deliveries (not tasks, or another
// store's) one fetch of a topic moves aside before it gives up on the
// topic for that claim.
const maxDropsPerTake = 200

var consumerSeq atomic.Uint64

// fetched is a delivery taken from a topic queue for a claim.
type fetched struct {
	topic   string
	ch      *amqp.Channel
	d       amqp.Delivery
	id      int64
	stamped bool // it carries this broker's store id (see store.go)
}

// fetch takes up to n deliveries round-robin over topics, each topic at
// most left[topic] (see Claim), lowering left as it goes; a topic whose
// queue is empty gets left 0. Each round gives each topic still asked an
// even share of what is still wanted. Foreign deliveries are moved aside.
func (b *Broker) fetch(ctx context.Context, s *session, topics []string, left map[string]int, n int) ([]fetched, error) {
	var got []fetched
	for len(got) < n {
		var asked []string
		for _, t := range topics {
			if left[t] != 0 {
				asked = append(asked, t)
			}
		}
		if len(asked) == 0 {
			break
		}
		progress := false
		for i, t := range asked {
			share := (n - len(got) + len(asked) - i - 1) / (len(asked) - i)
			switch {
			case left[t] == probeOne:
				share = 1
			case left[t] > 0:
				share = min(share, left[t])
			}
			if share <= 0 {
				continue
			}
			fs, err := b.fetchTopic(ctx, s, t, share)
			if err != nil {
				releaseAll(got)
				return nil, err
			}
			got = append(got, fs...)
			switch {
			case len(fs) < share || left[t] == probeOne:
				// The queue ran dry (or the probe is done).
				left[t] = 0
			case left[t] > 0:
				left[t] -= len(fs)
			}
			progress = progress || len(fs) > 0
		}
		if !progress {
			break
		}
	}
	return got, nil
}

// releaseAll gives deliveries back to RabbitMQ untaken.
func releaseAll(fs []fetched) {
	for _, f := range fs {
		_ = f.d.Reject(true)
	}
}

// fetchTopic takes up to k deliveries of topic that are the broker's
// messages: the first by basic.get, the rest (what it says is ready
// behind it, up to k-1) one by one or as a batch (see the file's
// comment).
func (b *Broker) fetchTopic(ctx context.Context, s *session, topic string, k int) ([]fetched, error) {
	ch, mu, err := s.topicChannel(topic)
	if err != nil {
		return nil, err
	}
	// The channel's prefetch is set for each batch.
	mu.Lock()
	defer mu.Unlock()
	queue := b.names.topic(topic)
	var (
		out   []fetched
		drops int
	)
	keep := func(d amqp.Delivery) {
		id, stamped, err := b.ours(d)
		if err != nil {
			b.reject(ctx, s, topic, d, err)
			drops++
			return
		}
		out = append(out, fetched{topic: topic, ch: ch, d: d, id: id, stamped: stamped})
	}
	for len(out) < k && drops < maxDropsPerTake {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			var ae *amqp.Error
			if errors.As(err, &ae) && ae.Code == amqp.NotFound {
				s.forget(topic)
				b.log.Warn("a topic queue is missing (deleted?); declaring it again and publishing its queued messages again", "queue", queue)
				b.republishTopic(topic)
				releaseAll(out)
				return nil, nil
			}
			releaseAll(out)
			return nil, err
		}
		if !ok {
			if len(out) == 0 && drops == 0 {
				// Empty: after deliveries, the reconcile looks at it.
				b.recon.fetched(topic, false)
			}
			break
		}
		if len(out) == 0 && drops == 0 {
			b.recon.fetched(topic, true)
		}
		keep(d)
		ready := min(k-len(out), int(d.MessageCount))
		if ready < batchMin {
			if d.MessageCount == 0 {
				break
			}
			continue
		}
		ds, err := consumeBatch(ch, queue, ready)
		for _, d := range ds {
			keep(d)
		}
		if err != nil {
			releaseAll(out)
			return nil, err
		}
		if len(ds) < ready {
			// Others took some of what was ready, or RabbitMQ was slow:
			// gets take what is still there.
			continue
		}
		// What arrived since the get is the next claim's: a claim does
		// not chase a stream.
		break
	}
	return out, nil
}

// consumeBatch takes up to k deliveries of queue on ch through a consumer
// of prefetch k: it waits for k or a gap (see batchWait and batchGap),
// then cancels the consumer and reads every delivery it was sent. On an
// error the deliveries it had go back to the queue.
func consumeBatch(ch *amqp.Channel, queue string, k int) (_ []amqp.Delivery, err error) {
	if err := ch.Qos(k, 0, false); err != nil {
		return nil, fmt.Errorf("prefetch: %w", err)
	}
	tag := fmt.Sprintf("taskhost-batch-%d", consumerSeq.Add(1))
	in, err := ch.Consume(queue, tag, false, false, false, false, nil)
	if err != nil {
		return nil, err
	}
	var got []amqp.Delivery
	defer func() {
		if err != nil {
			for _, d := range got {
				_ = d.Reject(true)
			}
		}
	}()
	t := time.NewTimer(batchWait)
	defer t.Stop()
wait:
	for len(got) < k {
		select {
		case d, ok := <-in:
			if !ok {
				// The channel closed: its deliveries went back.
				return nil, errors.New("topic channel closed while taking deliveries")
			}
			got = append(got, d)
			t.Reset(batchGap)
		case <-t.C:
			break wait
		}
	}
	if err := ch.Cancel(tag, false); err != nil {
		return nil, err
	}
	for d := range in {
		got = append(got, d)
	}
	return got, nil
}

// topicLocks holds a mutex per topic channel of a session: see
// fetchTopic.
type topicLocks struct {
	mu sync.Mutex
	m  map[string]*sync.Mutex
}

func (l *topicLocks) of(topic string) *sync.Mutex {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = make(map[string]*sync.Mutex)
	}
	mu := l.m[topic]
	if mu == nil {
		mu = new(sync.Mutex)
		l.m[topic] = mu
	}
	return mu
}
