package memory

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/brokertest"
)

func TestConformance(t *testing.T) {
	brokertest.Run(t, func(t *testing.T) broker.Broker {
		b := New()
		t.Cleanup(func() {
			checkBooks(t, b)
			_ = b.Close()
		})
		return b
	})
}

// checkBooks recomputes the broker's derived counts and indexes from its
// messages and fails t when they disagree.
func checkBooks(t *testing.T, b *Broker) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	finished, dead, running, queued := 0, map[string]int{}, map[string]int{}, map[string]int{}
	for id, e := range b.msgs {
		if e.m.ID != id {
			t.Errorf("message %d stored under %d", e.m.ID, id)
		}
		switch e.m.State {
		case broker.StateDone, broker.StateFailed, broker.StateDead, broker.StateCancelled:
			finished++
			if e.finSeq == 0 {
				t.Errorf("finished message %d has no finSeq", id)
			}
			if e.m.State == broker.StateDead {
				dead[e.m.Topic]++
			}
		case broker.StateRunning:
			running[e.m.Topic]++
			if b.running[id] != e || e.m.Token == "" {
				t.Errorf("running message %d not in the running set or has no token", id)
			}
		case broker.StateQueued:
			queued[e.m.Topic]++
		}
	}
	if finished != b.finished {
		t.Errorf("finished count %d, recount %d", b.finished, finished)
	}
	for _, m := range []struct {
		name       string
		have, want map[string]int
	}{{"dead", b.deadBy, dead}, {"running", b.runningBy, running}} {
		if len(m.have) != len(m.want) {
			t.Errorf("%s counts %v, recount %v", m.name, m.have, m.want)
		}
		for k, v := range m.want {
			if m.have[k] != v {
				t.Errorf("%s counts %v, recount %v", m.name, m.have, m.want)
			}
		}
	}
	for topic, q := range b.queues {
		if len(q) != queued[topic] {
			t.Errorf("topic %s queue holds %d, recount %d", topic, len(q), queued[topic])
		}
		for i, e := range q {
			if b.msgs[e.m.ID] != e || e.m.State != broker.StateQueued {
				t.Errorf("topic %s queue holds message %d in state %s", topic, e.m.ID, e.m.State)
			}
			if i > 0 && !before(q[i-1], e) {
				t.Errorf("topic %s queue out of order at %d", topic, i)
			}
		}
	}
	for _, l := range b.locks {
		if e := b.running[l.lock.MessageID]; e == nil || e.m.Token != l.token {
			t.Errorf("lock %s outlived its claim on message %d", l.lock.Name, l.lock.MessageID)
		}
	}
}

// fakeClock is a settable clock for the broker's now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newWithClock() (*Broker, *fakeClock) {
	clk := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	b := New()
	b.now = clk.now
	return b, clk
}

func TestKind(t *testing.T) {
	if k := New().Kind(); k != "memory" {
		t.Fatalf("Kind = %q", k)
	}
}

func TestLiveAfter(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		liveAfter time.Duration
		window    time.Duration
	}{
		{"default", 0, DefaultLiveAfter},
		{"custom", 5 * time.Second, 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, clk := newWithClock()
			b.LiveAfter = tc.liveAfter
			if _, err := b.Submit(ctx, broker.SubmitRequest{Topic: "a", Task: "x"}); err != nil {
				t.Fatal(err)
			}
			for _, w := range []broker.WorkerInfo{
				{ID: "beat", Roles: []string{broker.RoleBeat}, Topics: []string{"*"}},
				{ID: "w", Roles: []string{broker.RoleWorker}, Topics: []string{"a"}},
			} {
				if err := b.RegisterWorker(ctx, w); err != nil {
					t.Fatal(err)
				}
			}
			check := func(workers, beats, subs int) {
				t.Helper()
				st, err := b.Stats(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if st.Workers != workers || st.Beats != beats || st.Topics[0].Subscribers != subs {
					t.Fatalf("workers %d beats %d subscribers %d, want %d %d %d",
						st.Workers, st.Beats, st.Topics[0].Subscribers, workers, beats, subs)
				}
			}
			check(2, 1, 2)
			clk.advance(tc.window)
			check(2, 1, 2) // exactly at the window: still live
			if err := b.Heartbeat(ctx, "w"); err != nil {
				t.Fatal(err)
			}
			clk.advance(time.Second)
			check(1, 0, 1) // the beat went stale, w heartbeated
			ws, err := b.Workers(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(ws) != 2 {
				t.Fatalf("Workers lists %d, want stale ones too (2)", len(ws))
			}
		})
	}
}

func TestOldestClaimAge(t *testing.T) {
	ctx := context.Background()
	b, clk := newWithClock()
	for range 2 {
		if _, err := b.Submit(ctx, broker.SubmitRequest{Topic: "a", Task: "x"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"a"}}); err != nil {
		t.Fatal(err)
	}
	clk.advance(time.Minute)
	if _, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"a"}}); err != nil {
		t.Fatal(err)
	}
	clk.advance(time.Minute)
	st, _ := b.Stats(ctx)
	if got := st.Topics[0].OldestClaimAge; got != 2*time.Minute {
		t.Fatalf("OldestClaimAge = %v, want 2m", got)
	}
}

func TestRetain(t *testing.T) {
	ctx := context.Background()
	b := New()
	b.Retain = 3
	var ids []int64
	for range 10 {
		id, err := b.Submit(ctx, broker.SubmitRequest{Topic: "r", Task: "x"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	// The first one ends dead and is requeued, so it finishes last.
	msgs, _ := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"r"}})
	if err := b.DeadLetter(ctx, msgs[0].ClaimOf(), "x", nil); err != nil {
		t.Fatal(err)
	}
	if err := b.Requeue(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	for {
		msgs, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"r"}, Max: 4})
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) == 0 {
			break
		}
		var outs []broker.Outcome
		for _, m := range msgs {
			outs = append(outs, broker.Outcome{Claim: m.ClaimOf()})
		}
		if _, err := b.Ack(ctx, outs); err != nil {
			t.Fatal(err)
		}
	}
	kept, err := b.ListMessages(ctx, broker.MessageFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, m := range kept {
		got = append(got, m.ID)
	}
	// Ack order: 2..10, then 1 (requeued behind them). The last three
	// finished are 9, 10 and 1.
	want := []int64{ids[9], ids[8], ids[0]}
	if len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("kept %v, want %v", got, want)
	}
	if _, err := b.GetMessage(ctx, ids[1]); !errors.Is(err, broker.ErrNotFound) {
		t.Fatalf("dropped message: %v, want ErrNotFound", err)
	}
	if b.finished != 3 {
		t.Fatalf("finished count %d, want 3", b.finished)
	}
	checkBooks(t, b)
}

// TestRetainCompaction drives many finishes and requeues through a small
// cap and checks the books stay consistent and bounded.
func TestRetainCompaction(t *testing.T) {
	ctx := context.Background()
	b := New()
	b.Retain = 10
	for i := range 5000 {
		id, err := b.Submit(ctx, broker.SubmitRequest{Topic: "r", Task: "x"})
		if err != nil {
			t.Fatal(err)
		}
		msgs, _ := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"r"}})
		if i%2 == 0 {
			_ = b.DeadLetter(ctx, msgs[0].ClaimOf(), "x", nil)
			_ = b.Requeue(ctx, id)
			msgs, _ = b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"r"}})
		}
		if _, err := b.Ack(ctx, []broker.Outcome{{Claim: msgs[0].ClaimOf()}}); err != nil {
			t.Fatal(err)
		}
	}
	if len(b.msgs) != 10 || b.finished != 10 {
		t.Fatalf("kept %d messages, %d finished, want 10", len(b.msgs), b.finished)
	}
	checkBooks(t, b)
	if len(b.finQ) > 2*10+1024+1 || len(b.ids) > 2*1024+100 {
		t.Fatalf("books grew: finQ %d, ids %d", len(b.finQ), len(b.ids))
	}

	// Dead letters past the cap are dropped too, and their count follows.
	for range 25 {
		if _, err := b.Submit(ctx, broker.SubmitRequest{Topic: "d", Task: "x"}); err != nil {
			t.Fatal(err)
		}
		msgs, _ := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"d"}})
		_ = b.DeadLetter(ctx, msgs[0].ClaimOf(), "x", nil)
	}
	checkBooks(t, b)
	st, _ := b.Stats(ctx)
	if st.Topics[0].Name != "d" || st.Topics[0].DeadLetter != 10 {
		t.Fatalf("stats %+v, want 10 dead letters kept in d", st.Topics[0])
	}
	if len(b.finQ) > 2*10+1024+1 || len(b.ids) > 2*1024+100 {
		t.Fatalf("books grew: finQ %d, ids %d", len(b.finQ), len(b.ids))
	}
}

func TestAckInvalidResult(t *testing.T) {
	ctx := context.Background()
	b := New()
	if _, err := b.Submit(ctx, broker.SubmitRequest{Topic: "a", Task: "x"}); err != nil {
		t.Fatal(err)
	}
	msgs, _ := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"a"}})
	if _, err := b.Ack(ctx, []broker.Outcome{{Claim: msgs[0].ClaimOf(), Result: []byte("{oops")}}); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("Ack(bad result): %v, want ErrInvalid", err)
	}
	if m, _ := b.GetMessage(ctx, msgs[0].ID); m.State != broker.StateRunning {
		t.Fatalf("refused ack changed state to %s", m.State)
	}
}
