package brokertest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
)

func testCancelledContext(t *testing.T, b broker.Broker) {
	ctx, cancel := context.WithCancel(ctxOf(t))
	cancel()
	if _, err := b.Submit(ctx, broker.SubmitRequest{Topic: "t", Task: "x"}); err == nil {
		t.Fatalf("Submit with a cancelled context succeeded")
	}
	if msgs := list(t, b, broker.MessageFilter{}); len(msgs) != 0 {
		t.Fatalf("Submit with a cancelled context stored %d messages", len(msgs))
	}
	submitN(t, b, "t", 1)
	if _, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"t"}, Max: 1}); err == nil {
		t.Fatalf("Claim with a cancelled context succeeded")
	}
	claimOne(t, b, "w", "t")
}

func testDelayed(t *testing.T, b broker.Broker) {
	const delay = 300 * time.Millisecond
	start := time.Now()
	id := submit(t, b, broker.SubmitRequest{Topic: "later", Task: "x", Delay: delay})
	m := wantState(t, b, id, broker.StateQueued)
	if d := m.AvailableAt.Sub(m.CreatedAt); d < delay-10*time.Millisecond {
		t.Fatalf("available_at - created_at = %v, want about %v", d, delay)
	}
	if n := topicStats(t, stats(t, b), "later").Queued; n != 1 {
		t.Fatalf("a delayed message counts as queued: Queued = %d, want 1", n)
	}

	var got broker.Message
	eventually(t, 5*time.Second, "delayed message becomes claimable", func() bool {
		msgs := claim(t, b, "w", 1, "later")
		if len(msgs) == 0 {
			return false
		}
		got = msgs[0]
		return true
	})
	// The broker's clock said available_at had passed; the process clock
	// agrees give or take clock rounding.
	if elapsed := time.Since(start); elapsed < delay-50*time.Millisecond {
		t.Fatalf("delayed message claimed after %v, before its %v delay", elapsed, delay)
	}
	if got.ID != id || got.Attempts != 1 {
		t.Fatalf("claimed %+v, want message %d attempt 1", got, id)
	}
}

func testFIFO(t *testing.T, b broker.Broker) {
	want := submitN(t, b, "fifo", 5)
	var got []int64
	for range want {
		got = append(got, claimOne(t, b, "w", "fifo").ID)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("claim order %v, want submit order %v", got, want)
	}
	// A Max-3 claim also returns the oldest first.
	more := submitN(t, b, "fifo", 4)
	if got := ids(claim(t, b, "w", 3, "fifo")); !slices.Equal(got, more[:3]) {
		t.Fatalf("Claim(Max 3) = %v, want %v", got, more[:3])
	}
	// A delayed message does not block older-but-later-available ones, and
	// a message requeued with a delay goes behind available ones.
	late := submit(t, b, broker.SubmitRequest{Topic: "fifo2", Task: "x", Delay: time.Hour})
	now := submit(t, b, broker.SubmitRequest{Topic: "fifo2", Task: "x"})
	if c := claimOne(t, b, "w", "fifo2"); c.ID != now {
		t.Fatalf("claimed %d, want the available %d (not the delayed %d)", c.ID, now, late)
	}
}

func testFairness(t *testing.T, b broker.Broker) {
	a := submitN(t, b, "a", 4) // all older than b's
	bb := submitN(t, b, "b", 4)

	// One Claim of Max 2 over two topics with work serves both.
	got := claim(t, b, "w", 2, "a", "b")
	if len(got) != 2 || got[0].Topic == got[1].Topic {
		t.Fatalf("Claim(Max 2, [a b]) = %v, want one message of each topic", got)
	}
	if !slices.Contains(ids(got), a[0]) || !slices.Contains(ids(got), bb[0]) {
		t.Fatalf("Claim(Max 2, [a b]) = %v, want the oldest of each (%d, %d)", ids(got), a[0], bb[0])
	}
	// Two Max-1 claims serve both topics: the first topic rotates.
	t1 := claimOne(t, b, "w", "a", "b").Topic
	t2 := claimOne(t, b, "w", "a", "b").Topic
	if t1 == t2 {
		t.Fatalf("two Max-1 claims over [a b] both served %q, want both topics", t1)
	}
	// With one topic empty the other gets the whole Max.
	rest := claim(t, b, "w", 10, "a", "b")
	if len(rest) != 4 {
		t.Fatalf("Claim(Max 10) returned %d, want the 4 left", len(rest))
	}
}

func testClaimEdgeCases(t *testing.T, b broker.Broker) {
	submitN(t, b, "e", 3)
	if _, err := b.Claim(ctxOf(t), broker.ClaimRequest{Topics: []string{"e"}, Max: 1}); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("Claim with an empty worker id: %v, want ErrInvalid", err)
	}
	claimNone(t, b, "unknown-topic")
	if msgs := claim(t, b, "w", 0, "e"); len(msgs) != 1 {
		t.Fatalf("Claim(Max 0) returned %d, want 1", len(msgs))
	}
	if msgs := claim(t, b, "w", -5, "e", "unknown-topic"); len(msgs) != 1 {
		t.Fatalf("Claim(Max -5) returned %d, want 1", len(msgs))
	}
	if msgs := claim(t, b, "w", 5, "e", "e"); len(msgs) != 1 {
		t.Fatalf("Claim over a repeated topic returned %d, want the 1 left", len(msgs))
	}
}

func testConcurrencyLimit(t *testing.T, b broker.Broker) {
	const (
		topic   = "limited"
		limit   = 2
		total   = 200
		workers = 16
	)
	setTopic(t, b, topic, broker.TopicPatch{ConcurrencyLimit: ptr(limit)})
	submitN(t, b, topic, total)
	ctx := ctxOf(t)

	var (
		mu       sync.Mutex
		running  int                      // claims held by the test, counted late and dropped early
		maxSeen  int                      // so running never over-reports the broker's count
		held     = make(map[int64]string) // id -> token currently held
		doneN    = make(map[int64]int)    // successful acks per id
		finished atomic.Int64
		stop     = make(chan struct{})
	)
	deadline := time.Now().Add(3 * time.Minute)

	// The broker's own view, sampled while the workers run.
	var pollWG sync.WaitGroup
	pollWG.Add(1)
	go func() {
		defer pollWG.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			st, err := b.Stats(ctx)
			if err != nil {
				t.Errorf("Stats: %v", err)
				return
			}
			for _, ts := range st.Topics {
				if ts.Name == topic && ts.Running > limit {
					t.Errorf("Stats reports %d running, limit %d", ts.Running, limit)
					return
				}
			}
			time.Sleep(time.Millisecond)
		}
	}()

	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			worker := fmt.Sprintf("w%d", w)
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			for finished.Load() < total {
				if time.Now().After(deadline) {
					t.Errorf("%s: gave up with %d of %d done", worker, finished.Load(), total)
					return
				}
				msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: worker, Topics: []string{topic}, Max: 1 + rng.IntN(3)})
				if err != nil {
					t.Errorf("Claim: %v", err)
					return
				}
				if len(msgs) == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				mu.Lock()
				running += len(msgs)
				maxSeen = max(maxSeen, running)
				for _, m := range msgs {
					if old, ok := held[m.ID]; ok {
						t.Errorf("message %d claimed with token %s while still held with %s", m.ID, m.Token, old)
					}
					held[m.ID] = m.Token
				}
				mu.Unlock()

				for _, m := range msgs {
					mu.Lock()
					running--
					delete(held, m.ID)
					mu.Unlock()
					if rng.IntN(5) == 0 && m.Attempts < 3 {
						if err := b.Nack(ctx, broker.NackRequest{Claim: m.ClaimOf(), Requeue: true, Error: "retry"}); err != nil {
							t.Errorf("Nack(%d): %v", m.ID, err)
						}
						continue
					}
					errs, err := b.Ack(ctx, []broker.Outcome{{Claim: m.ClaimOf()}})
					if err != nil || len(errs) != 1 || errs[0] != nil {
						t.Errorf("Ack(%d) = %v, %v", m.ID, errs, err)
						continue
					}
					mu.Lock()
					doneN[m.ID]++
					mu.Unlock()
					finished.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	pollWG.Wait()
	if t.Failed() {
		return
	}
	if maxSeen > limit {
		t.Fatalf("saw %d messages running at once, limit %d", maxSeen, limit)
	}
	if len(doneN) != total {
		t.Fatalf("%d distinct messages acked, want %d", len(doneN), total)
	}
	for id, n := range doneN {
		if n != 1 {
			t.Errorf("message %d acked %d times, want once", id, n)
		}
	}
	done := list(t, b, broker.MessageFilter{Topic: topic, State: broker.StateDone, Limit: 1000})
	if len(done) != total {
		t.Fatalf("%d messages done, want %d", len(done), total)
	}
	ts := topicStats(t, stats(t, b), topic)
	if ts.Queued != 0 || ts.Running != 0 {
		t.Fatalf("after the run: %d queued, %d running, want none", ts.Queued, ts.Running)
	}
}
