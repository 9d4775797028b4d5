package worker

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// overlapWatch counts the writes of outcomes (Ack, AckAndClaim with
// outcomes) in flight at once. When hold is set, the first such write
// waits until a second one starts (or waitDeadline passes) before it goes
// to the broker (holdMax at most); delay slows every write down.
type overlapWatch struct {
	broker.Broker
	ac    broker.AckClaimer // nil when the broker is not one
	hold  bool
	delay time.Duration

	// ungroup clears the claimed messages' ClaimGroup, as a broker whose
	// outcomes of one claim do not wait for each other leaves it.
	ungroup bool

	mu       sync.Mutex
	now, max int
	second   chan struct{} // closed when two writes are in flight
	first    chan struct{} // closed when the first write is in flight
	held     bool
	// The claim groups of the messages claimed (by id), of the writes in
	// flight (how many carry each), and of all writes (how many carried
	// each); clash is set when two writes in flight carried one group.
	groupOf  map[int64]int64
	carrying map[int64]int
	carried  map[int64]int
	clash    string
}

// holdMax bounds the hold of the first write: a pool that never sends a
// second one is then seen to finish with one write at a time.
const holdMax = 10 * time.Second

func newOverlapWatch(inner broker.Broker, hold bool, delay time.Duration) *overlapWatch {
	w := &overlapWatch{Broker: inner, hold: hold, delay: delay, second: make(chan struct{}), first: make(chan struct{}),
		groupOf: map[int64]int64{}, carrying: map[int64]int{}, carried: map[int64]int{}}
	w.ac, _ = inner.(broker.AckClaimer)
	return w
}

// claimed notes the claim groups of msgs, or clears them (ungroup).
func (w *overlapWatch) claimed(msgs []broker.Message) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range msgs {
		if w.ungroup {
			msgs[i].ClaimGroup = 0
		}
		w.groupOf[msgs[i].ID] = msgs[i].ClaimGroup
	}
}

// carry notes a write of outcomes going out, and returns the claim groups
// it carries, for uncarry once it returns.
func (w *overlapWatch) carry(outcomes []broker.Outcome) []int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	var groups []int64
	for _, o := range outcomes {
		if g := w.groupOf[o.Claim.ID]; g != 0 && !slices.Contains(groups, g) {
			groups = append(groups, g)
		}
	}
	for _, g := range groups {
		if w.carrying[g]++; w.carrying[g] > 1 && w.clash == "" {
			w.clash = fmt.Sprintf("two writes in flight carried acks of claim %d", g)
		}
		w.carried[g]++
	}
	return groups
}

func (w *overlapWatch) uncarry(groups []int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, g := range groups {
		w.carrying[g]--
	}
}

// split is how many claims had their acks carried by more than one write.
func (w *overlapWatch) split() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, c := range w.carried {
		if c > 1 {
			n++
		}
	}
	return n
}

func (w *overlapWatch) clashed() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.clash
}

func (w *overlapWatch) Claim(ctx context.Context, req broker.ClaimRequest) ([]broker.Message, error) {
	msgs, err := w.Broker.Claim(ctx, req)
	w.claimed(msgs)
	return msgs, err
}

// enter notes a write going out and holds it as the watch says; leave
// notes its end.
func (w *overlapWatch) enter() {
	w.mu.Lock()
	w.now++
	w.max = max(w.max, w.now)
	if w.now == 2 {
		select {
		case <-w.second:
		default:
			close(w.second)
		}
	}
	first := w.hold && !w.held
	if !w.held {
		close(w.first)
	}
	w.held = true
	w.mu.Unlock()
	if first {
		t := time.NewTimer(holdMax)
		defer t.Stop()
		select {
		case <-w.second:
		case <-t.C:
		}
	}
	if w.delay > 0 {
		time.Sleep(w.delay)
	}
}

func (w *overlapWatch) leave() {
	w.mu.Lock()
	w.now--
	w.mu.Unlock()
}

func (w *overlapWatch) most() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.max
}

func (w *overlapWatch) Ack(ctx context.Context, outcomes []broker.Outcome) ([]error, error) {
	if len(outcomes) > 0 {
		w.enter()
		defer w.leave()
		defer w.uncarry(w.carry(outcomes))
	}
	return w.Broker.Ack(ctx, outcomes)
}

// ackClaimWatch is an overlapWatch that is a broker.AckClaimer.
type ackClaimWatch struct{ *overlapWatch }

func (w ackClaimWatch) AckAndClaim(ctx context.Context, outcomes []broker.Outcome, req broker.ClaimRequest) ([]error, []broker.Message, error) {
	if len(outcomes) > 0 {
		w.enter()
		defer w.leave()
		defer w.uncarry(w.carry(outcomes))
	}
	errs, msgs, err := w.ac.AckAndClaim(ctx, outcomes, req)
	w.claimed(msgs)
	return errs, msgs, err
}

// watched is w as a broker: an AckClaimer when its inner broker is one.
func (w *overlapWatch) watched() broker.Broker {
	if w.ac != nil {
		return ackClaimWatch{w}
	}
	return w
}

// TestSecondExchangeGoesOutWhileOneIsWritten: while the dispatcher's
// write of acks is held in the broker, the acks of the rest of the batch
// go out in a second write, never a third, and every message ends done.
// Half the first batch's tasks end only once the first write is out, so
// that write cannot carry every outcome however the machine schedules the
// handlers: their outcomes are the second write's. The batch is one
// claim, whose acks the pool keeps out of a second write when the broker
// names its claims (TestAcksOfOneClaimAreNeverInTwoWritesAtOnce): here
// the watch clears the names.
func TestSecondExchangeGoesOutWhileOneIsWritten(t *testing.T) {
	for name, newBroker := range testBrokers(t) {
		t.Run(name, func(t *testing.T) {
			w := newOverlapWatch(newBroker(t), true, 0)
			w.ungroup = true
			b := w.watched()
			reg := NewRegistry()
			var runs atomic.Int32
			reg.MustRegister(Task{Name: "x", Handler: func(ctx context.Context, _ *TaskContext) (any, error) {
				if runs.Add(1) > 5 {
					select {
					case <-w.first:
					case <-ctx.Done():
					}
				}
				return "ok", nil
			}})
			runDone(t, b, reg, 40, Options{Concurrency: 10})
			if got := w.most(); got != maxExchanges {
				t.Fatalf("at most %d writes of acks were in flight at once, want %d", got, maxExchanges)
			}
		})
	}
}

// TestLimitHoldsWithTwoExchangesInFlight: with the pool's writes slowed
// down so that two of its claims overlap, a topic's concurrency limit
// still bounds the handlers running at once.
func TestLimitHoldsWithTwoExchangesInFlight(t *testing.T) {
	for name, newBroker := range testBrokers(t) {
		t.Run(name, func(t *testing.T) {
			inner := newBroker(t)
			const limit = 3
			l := limit
			if _, err := inner.SetTopic(context.Background(), broker.DefaultTopic, broker.TopicPatch{ConcurrencyLimit: &l}); err != nil {
				t.Fatal(err)
			}
			w := newOverlapWatch(inner, false, 2*time.Millisecond)
			b := w.watched()
			var running, most atomic.Int32
			reg := NewRegistry()
			reg.MustRegister(Task{Name: "x", Handler: func(context.Context, *TaskContext) (any, error) {
				n := running.Add(1)
				defer running.Add(-1)
				for {
					m := most.Load()
					if n <= m || most.CompareAndSwap(m, n) {
						break
					}
				}
				time.Sleep(time.Millisecond)
				return "ok", nil
			}})
			runDone(t, b, reg, 150, Options{Concurrency: 12})
			if got := most.Load(); got > limit {
				t.Fatalf("%d handlers ran at once, limit %d", got, limit)
			}
			if got := w.most(); got < 2 {
				t.Fatalf("the pool's writes never overlapped (at most %d in flight): the case is not exercised", got)
			}
			if got := w.most(); got > maxExchanges {
				t.Fatalf("%d writes of acks were in flight at once, at most %d expected", got, maxExchanges)
			}
		})
	}
}

// TestAcksOfOneClaimAreNeverInTwoWritesAtOnce: with the PostgreSQL
// broker, whose acks lock their claim's row until they commit, the two
// writes in flight never carry acks of the same claim: the acks of a
// claim that one write carries wait for a later one. Every message ends
// done, and some claim's acks did go out in more than one write, so the
// case was met.
func TestAcksOfOneClaimAreNeverInTwoWritesAtOnce(t *testing.T) {
	w := newOverlapWatch(pgBroker(t), false, 2*time.Millisecond)
	reg := NewRegistry()
	var n atomic.Int32
	reg.MustRegister(Task{Name: "x", Handler: func(context.Context, *TaskContext) (any, error) {
		// Tasks of one claim end apart, so that its acks are ready at
		// different times.
		time.Sleep(time.Duration(n.Add(1)%4) * time.Millisecond)
		return "ok", nil
	}})
	runDone(t, w.watched(), reg, 400, Options{Concurrency: 20})
	if got := w.most(); got < 2 {
		t.Fatalf("the pool's writes never overlapped (at most %d in flight): the case is not exercised", got)
	}
	if c := w.clashed(); c != "" {
		t.Fatal(c)
	}
	if w.split() == 0 {
		t.Fatal("every claim's acks went out in one write: the case is not exercised")
	}
}

// runDone submits n messages of task "x", starts a pool of reg with opts
// on b, and waits until every one of them is done.
func runDone(t *testing.T, b broker.Broker, reg *Registry, n int, opts Options) {
	t.Helper()
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = submit(t, b, "x", `{}`)
	}
	startPool(t, b, reg, opts)
	for _, id := range ids {
		waitState(t, b, id, broker.StateDone)
	}
}
